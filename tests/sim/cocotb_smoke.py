"""cocotb tests for ``RegisteredAdder`` in ``test_runner_smoke.py``.

Run inside the simulator by ``npu_sim.cocotb_runner.run_cocotb``; pytest does not collect this
file. With ``SMOKE_WRONG_MODEL=1`` the reference model is off by one, so ``test_sums`` must fail.
"""

import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge

WRONG_MODEL = os.environ.get("SMOKE_WRONG_MODEL") == "1"


def ref_sum(a, b):
    return (a + b + (1 if WRONG_MODEL else 0)) % 256


async def reset(dut):
    """Start the clock and hold the synchronous reset for two cycles; leave just after an edge."""
    Clock(dut.clk, 10, unit="ns").start()
    dut.i__valid.value = 0
    dut.i__payload.value = 0
    dut.o__ready.value = 0
    dut.rst.value = 1
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    await RisingEdge(dut.clk)


@cocotb.test()
async def test_reset(dut):
    await reset(dut)
    await ReadOnly()
    assert int(dut.o__valid.value) == 0
    assert int(dut.i__ready.value) == 1


@cocotb.test()
async def test_sums(dut):
    """Random operands with random valid and backpressure; outputs arrive in order."""
    await reset(dut)
    rng = random.Random(int(os.environ.get("COCOTB_RANDOM_SEED", "1")))
    expected, received = [], []
    for _ in range(400):
        # Drive this cycle's inputs just after the rising edge ...
        a, b = rng.randrange(256), rng.randrange(256)
        valid, ready = rng.random() < 0.7, rng.random() < 0.7
        dut.i__valid.value = int(valid)
        dut.i__payload.value = a | (b << 8)
        dut.o__ready.value = int(ready)
        # ... and record the transfers of this cycle once everything has settled.
        await ReadOnly()
        if valid and int(dut.i__ready.value):
            expected.append(ref_sum(a, b))
        if ready and int(dut.o__valid.value):
            received.append(int(dut.o__payload.value))
        await RisingEdge(dut.clk)
    assert len(received) > 100
    assert received == expected[:len(received)]
    assert len(expected) - len(received) <= 1
