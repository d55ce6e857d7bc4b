# amaranth: UnusedElaboratable=no
"""The ECP5 MAC array (behavioural twin of MULT18X18D) in the Amaranth simulator, against the
golden model; and its never-stalling pipeline (credit-counted result queue)."""

import numpy as np
import pytest

from npu.neural.mac_ecp5 import MacArrayECP5, MacLaneECP5, ecp5_stages
from npu.neural.mac_select import mac_array
from npu_model.mac import FMT, empty_program, run_mac_program
from npu_sim.mac import (
    command_words,
    compare_results,
    random_program,
    results_from_words,
    run_timed,
)
from npu_sim.streams import run_simulation, stream_get, stream_put
from npu_spec.config import NPUConfig, preset

from . import test_mac as generic
from .test_mac import check

ECP5 = preset("small").replace(mac_impl="ecp5")


def test_hook_builds_the_ecp5_array():
    built = [mac_array(ECP5, primitives=False), mac_array(preset("small"))]
    for dut in built:
        dut._MustUse__silence = True    # created in the hook, never elaborated here
    assert isinstance(built[0], MacArrayECP5) and not isinstance(built[1], MacArrayECP5)
    with pytest.raises(ValueError, match="mac_impl"):
        NPUConfig(mac_impl="xilinx")
    with pytest.raises(ValueError, match="float format"):
        MacArrayECP5(preset("ice40"))
    with pytest.raises(ValueError, match="float format"):
        MacLaneECP5(preset("ice40"))


@pytest.mark.parametrize("fmt", ["int8", "fp16", "mixed"])
def test_random_ecp5(fmt):
    cfg = ECP5.replace(macs=8)
    check(cfg, random_program(cfg.macs, cfg.acc_slots, fmt, 1200, 4), seed=4)


@pytest.mark.slow
def test_other_shapes_ecp5():
    for cfg in (NPUConfig(macs=6, acc_slots=3, mac_impl="ecp5"),
                NPUConfig(macs=2, acc_slots=1, formats=("fp16",), mac_impl="ecp5")):
        for fmt in ("int8", "fp16", "mixed"):
            if fmt in cfg.formats:
                check(cfg, random_program(cfg.macs, cfg.acc_slots, fmt, 60 * cfg.macs, 7))


def test_corner_cases_ecp5(monkeypatch):
    # The generic tests' directed cases, run on the ECP5 array (they take the preset by name).
    monkeypatch.setattr(generic, "preset", lambda name: preset(name).replace(mac_impl="ecp5"))
    generic.test_fp16_corner_cases()
    generic.test_int8_wrap_and_ops()


def _rotating_program(cfg, n, last_from):
    prog = empty_program(n, cfg.macs)
    prog["fmt"][:] = FMT["fp16"]
    prog["slot"][:] = np.arange(n) % cfg.acc_slots
    prog["first"][:] = np.arange(n) < cfg.acc_slots
    prog["last"][:] = np.arange(n) >= last_from
    prog["data"][:] = 0x3C00
    prog["coef"][:, :] = 0x3C00
    return prog


def test_full_rate_and_latency_ecp5():
    """Rotating over the slots with the consumer always ready, one command per cycle, results
    `latency` cycles after their commands (8 slots: the interlock never waits)."""
    cfg = ECP5
    n = 64
    prog = _rotating_program(cfg, n, n - 2 * cfg.acc_slots)
    dut = MacArrayECP5(cfg, primitive=False)
    read_stage, write_stage, hazard = ecp5_stages()
    assert dut.latency == write_stage + 1 == 13 and hazard + 1 == cfg.acc_slots
    accepted, results, _ = run_timed(dut, prog, 2 * cfg.acc_slots)
    assert accepted == list(range(accepted[0], accepted[0] + n)), "array stalled"
    first_last = n - 2 * cfg.acc_slots
    assert results == [accepted[first_last + k] + dut.latency for k in range(2 * cfg.acc_slots)]


def check_credits_hold(dut, prog, *, depth, wait):
    """Run ``prog`` with the consumer stopped for ``wait`` cycles: by then exactly ``depth``
    commands with `last` (every other command has it) and the ones without `last` between them
    are taken; afterwards every result arrives, bit for bit the golden model's."""
    cfg = dut.config
    words = command_words(dut.cmd.payload.shape(), prog)
    expected, _ = run_mac_program(prog, cfg.macs, cfg.acc_slots, cfg.formats)
    got = []
    sent = []

    async def producer(ctx):
        for w in words:
            await stream_put(ctx, dut.cmd, w)
            sent.append(w)

    async def consumer(ctx):
        ctx.set(dut.res.ready, 0)
        await ctx.tick().repeat(wait)
        # Blocked: exactly `depth` result commands and the ones without `last` between them.
        assert len(sent) == 2 * depth
        assert ctx.get(dut.res.valid)
        while len(got) < len(expected):
            got.append(await stream_get(ctx, dut.res))

    run_simulation(dut, [producer, consumer])
    assert len(sent) == len(words)
    bad = compare_results(expected, results_from_words(dut.res.payload.shape(), got))
    assert not bad, "\n".join(bad)


def test_credits_hold_only_result_commands():
    """With the consumer stopped, the array takes `queue_depth` commands with `last` and then
    refuses further ones (but still takes commands without `last`); every result arrives once
    the consumer resumes, bit for bit equal to the golden model's."""
    cfg = ECP5.replace(acc_slots=4)
    depth = 4
    dut = MacArrayECP5(cfg, primitive=False, queue_depth=depth)
    n = 24
    prog = _rotating_program(cfg, n, 0)          # every command has `last`
    prog["last"][:] = np.arange(n) % 2 == 0       # ... every other one
    check_credits_hold(dut, prog, depth=depth, wait=60)


def run_noting_error(dut, prog, beats):
    """Run ``prog`` until ``beats`` results have arrived; the decoded results and the value of
    ``error`` as each one was taken."""
    words = command_words(dut.cmd.payload.shape(), prog)
    got, errors = [], []

    async def producer(ctx):
        for w in words:
            await stream_put(ctx, dut.cmd, w)

    async def consumer(ctx):
        while len(got) < beats:
            got.append(await stream_get(ctx, dut.res))
            errors.append(ctx.get(dut.error))

    run_simulation(dut, [producer, consumer])
    return results_from_words(dut.res.payload.shape(), got), errors


def test_hazard_and_unsupported_format_ecp5():
    cfg = NPUConfig(macs=2, acc_slots=2, formats=("fp16",), mac_impl="ecp5")
    prog = empty_program(8, cfg.macs)
    prog["fmt"][:] = FMT["fp16"]
    prog["fmt"][3] = FMT["int8"]                  # not built: consumed, zeros, error
    prog["first"][0] = 1
    prog["last"][3] = prog["last"][7] = 1
    prog["data"][:] = 0x3C00
    prog["coef"][:, :] = 0x3C00
    dut = MacArrayECP5(cfg, primitive=False)
    values, errors = run_noting_error(dut, prog, 2)
    expected, _ = run_mac_program(prog, cfg.macs, cfg.acc_slots, cfg.formats)
    assert not compare_results(expected, values)
    assert list(values[0][2]) == [0, 0] and int(values[1][2][0]) == 0x40E0_0000  # 7.0
    assert errors[-1] == 1
