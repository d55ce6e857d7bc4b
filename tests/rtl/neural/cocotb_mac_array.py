"""cocotb test of the MAC array's generated Verilog (run by ``test_mac_array_netlist.py``).

Drives a random program (``MAC_FORMAT``, ``MAC_COUNT``, ``MAC_SEED`` from the environment)
into ``cmd`` with random stalls, takes every ``res`` beat with random backpressure, and
compares each with the golden model bit for bit.
"""

import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge

from npu.neural.layouts import mac_command_layout, mac_result_layout
from npu_model.mac import run_mac_program
from npu_sim.mac import command_words, compare_results, random_program, results_from_words
from npu_spec.config import preset


@cocotb.test()
async def test_random_program(dut):
    cfg = preset(os.environ["MAC_PRESET"])
    fmt = os.environ["MAC_FORMAT"]
    seed = int(os.environ["MAC_SEED"])
    prog = random_program(cfg.macs, cfg.acc_slots, fmt, int(os.environ["MAC_COUNT"]), seed)
    words = command_words(mac_command_layout(cfg.macs, cfg.acc_slots), prog)
    expected, _ = run_mac_program(prog, cfg.macs, cfg.acc_slots, cfg.formats)
    rng = random.Random(seed)

    Clock(dut.clk, 10, unit="ns").start()
    dut.cmd__valid.value = 0
    # Toggle every payload bit during reset: Icarus evaluates a combinational `always @*`
    # block only when one of its inputs changes.
    dut.cmd__payload.value = (1 << len(dut.cmd__payload)) - 1
    dut.res__ready.value = 0
    dut.error_clear.value = 0
    dut.flush.value = 0
    dut.rst.value = 1
    await ClockCycles(dut.clk, 1)
    dut.cmd__payload.value = 0
    await ClockCycles(dut.clk, 1)
    dut.rst.value = 0

    got = []
    sent = 0
    cycles = 0
    while len(got) < len(expected):
        if not int(dut.cmd__valid.value) and sent < len(words) and rng.random() > 0.3:
            dut.cmd__payload.value = words[sent]
            dut.cmd__valid.value = 1
        dut.res__ready.value = int(rng.random() > 0.3)
        await ReadOnly()
        cmd_fire = int(dut.cmd__valid.value) and int(dut.cmd__ready.value)
        if int(dut.res__valid.value) and int(dut.res__ready.value):
            got.append(int(dut.res__payload.value))
        await RisingEdge(dut.clk)
        if cmd_fire:
            sent += 1
            dut.cmd__valid.value = 0
        cycles += 1
        assert cycles < 100 * (len(words) + 10), "MAC array stopped producing results"
    results = results_from_words(mac_result_layout(cfg.macs, cfg.acc_slots), got)
    bad = compare_results(expected, results)
    assert not bad, "\n".join(bad)
    assert int(dut.error.value) == 0
    assert len(got) == int(np.count_nonzero(prog["last"]))
