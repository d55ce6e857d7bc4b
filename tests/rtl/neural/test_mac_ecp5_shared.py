# amaranth: UnusedElaboratable=no
"""The shared-float ECP5 MAC array (``mac_impl="ecp5_shared"``, behavioural twin of
MULT18X18D) in the Amaranth simulator, against the golden model; its rates (int8 one command
a cycle, float one every ``fp_share`` cycles), latency, credits and errors."""

import numpy as np
import pytest

from npu.neural.mac_ecp5_shared import MacArrayECP5Shared, shared_stages
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
from .test_mac_ecp5 import check_credits_hold, run_noting_error

ULX3S = preset("ulx3s")
EIGHT = ULX3S.replace(macs=8, fp_share=4)      # two float units of 4 lanes


def test_hook_and_config():
    dut = mac_array(ULX3S, primitives=False)
    dut._MustUse__silence = True        # created in the hook, never elaborated here
    assert isinstance(dut, MacArrayECP5Shared)
    assert ULX3S.mac_impl == "ecp5_shared" and ULX3S.fp_share == 16 and ULX3S.macs == 32
    assert dut.fp_rate == 16 and dut.latency == 13
    assert MacArrayECP5Shared(ULX3S.replace(formats=("int8",)), primitive=False).fp_rate == 1
    with pytest.raises(ValueError, match="fp_share must divide macs"):
        NPUConfig(macs=8, fp_share=3, mac_impl="ecp5_shared")
    with pytest.raises(ValueError, match="fp_share must divide macs"):
        NPUConfig(macs=8, fp_share=0, mac_impl="ecp5_shared")
    with pytest.raises(ValueError, match="needs mac_impl 'ecp5_shared'"):
        NPUConfig(macs=8, fp_share=2, mac_impl="ecp5")


@pytest.mark.parametrize("fmt", ["int8", "fp16", "mixed"])
def test_random_shared(fmt):
    check(EIGHT, random_program(EIGHT.macs, EIGHT.acc_slots, fmt, 800, 11), seed=11)


@pytest.mark.parametrize("fmt", ["fp16", "mixed"])
def test_random_ulx3s_shape(fmt):
    """The preset's own shape: 32 lanes, two float units of 16 lanes each."""
    check(ULX3S, random_program(ULX3S.macs, ULX3S.acc_slots, fmt, 64 * ULX3S.macs, 5), seed=5)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [
    NPUConfig(macs=6, acc_slots=3, mac_impl="ecp5_shared", fp_share=3),   # non-power-of-two
    NPUConfig(macs=2, acc_slots=1, formats=("fp16",), mac_impl="ecp5_shared",
              fp_share=2),                                               # one slot: hazards
    NPUConfig(macs=4, acc_slots=2, mac_impl="ecp5_shared"),              # a unit per lane
    NPUConfig(macs=4, acc_slots=8, formats=("int8",), mac_impl="ecp5_shared"),  # no float
], ids=["6x3-share3", "2x1-fp16-share2", "4x2-share1", "4x8-int8"])
def test_other_shapes_shared(cfg):
    for fmt in ("int8", "fp16", "mixed"):
        if fmt in cfg.formats:
            check(cfg, random_program(cfg.macs, cfg.acc_slots, fmt, 40 * cfg.macs, 7))


def test_early_gather_one_slot():
    """Two float units of three lanes each and one slot: every float command reads the slot the
    command before it writes, the closest case of the float gather's early reads (lane 2
    read with sub-beat 0, one cycle after the interlock lets the earlier command's write
    land); int8 commands between them write every lane at once."""
    cfg = NPUConfig(macs=6, acc_slots=1, mac_impl="ecp5_shared", fp_share=3)
    prog = random_program(cfg.macs, cfg.acc_slots, "fp16", 120, 3)
    int8 = random_program(cfg.macs, cfg.acc_slots, "int8", 120, 4)
    for field in prog:
        prog[field][::7] = int8[field][::7]
    beats = len(prog["first"])
    prog["first"][:] = np.arange(beats) % 13 == 0
    prog["last"][:] = True
    check(cfg, prog, seed=3, stall=0)


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_formats_mixed_on_the_same_slots(seed):
    """Int8 and float commands interleaved on the same slots: the int8 path and the float
    units write the same slots and result registers, in command order."""
    prog = random_program(EIGHT.macs, EIGHT.acc_slots, "fp16", 1200, seed)
    rng = np.random.default_rng(seed)
    pick = rng.random(len(prog["fmt"]))
    prog["fmt"][pick < 0.35] = FMT["int8"]
    prog["fmt"][(pick >= 0.35) & (pick < 0.5)] = FMT["i8f16"]
    prog["fmt"][(pick >= 0.5) & (pick < 0.6)] = FMT["f16i8"]
    assert len(set(prog["fmt"].tolist())) == 4
    check(EIGHT, prog, seed=seed)


def test_corner_cases_shared(monkeypatch):
    # The generic tests' directed cases on the shared array (16 lanes, 4 float units).
    monkeypatch.setattr(generic, "preset", lambda name: preset(name).replace(
        mac_impl="ecp5_shared", fp_share=4))
    generic.test_fp16_corner_cases()
    generic.test_int8_wrap_and_ops()
    generic.test_dual_kernel_mode()


def _rotating_program(cfg, n, last_from, fmt):
    prog = empty_program(n, cfg.macs)
    prog["fmt"][:] = FMT[fmt]
    prog["slot"][:] = np.arange(n) % cfg.acc_slots
    prog["first"][:] = np.arange(n) < cfg.acc_slots
    prog["last"][:] = np.arange(n) >= last_from
    prog["data"][:] = 0x3C00 if fmt == "fp16" else 3
    prog["coef"][:, :] = 0x3C00 if fmt == "fp16" else 5
    return prog


@pytest.mark.parametrize("fmt", ["int8", "fp16"])
def test_rate_and_latency_shared(fmt):
    """Rotating over 8 slots: int8 commands one a cycle, float commands one every `fp_share`
    cycles; each result `latency` cycles after its command's handshake."""
    cfg = EIGHT
    n = 40
    prog = _rotating_program(cfg, n, n - 2 * cfg.acc_slots, fmt)
    dut = MacArrayECP5Shared(cfg, primitive=False)
    _, write_stage, hazard = shared_stages()
    assert write_stage == 11 and dut.latency == 13 and hazard + 1 == cfg.acc_slots
    accepted, results, got = run_timed(dut, prog, 2 * cfg.acc_slots)
    step = cfg.fp_share if fmt == "fp16" else 1
    assert accepted == [accepted[0] + step * k for k in range(n)], accepted
    first_last = n - 2 * cfg.acc_slots
    assert results == [accepted[first_last + k] + dut.latency for k in range(2 * cfg.acc_slots)]
    expected, _ = run_mac_program(prog, cfg.macs, cfg.acc_slots, cfg.formats)
    bad = compare_results(expected, got)
    assert not bad, "\n".join(bad)


def test_credits_hold_only_result_commands_shared():
    """With the consumer stopped, the array takes `queue_depth` float commands with `last` and
    then refuses further ones (still taking those without `last`); every result arrives once
    the consumer resumes, bit for bit the golden model's."""
    cfg = EIGHT.replace(acc_slots=4)
    depth = 4
    dut = MacArrayECP5Shared(cfg, primitive=False, queue_depth=depth)
    n = 24
    prog = _rotating_program(cfg, n, 0, "fp16")
    prog["last"][:] = np.arange(n) % 2 == 0
    check_credits_hold(dut, prog, depth=depth, wait=100)


@pytest.mark.parametrize("formats, bad_fmt", [(("fp16",), "int8"), (("int8",), "fp16")])
def test_unsupported_format_shared(formats, bad_fmt):
    """A command in a format the build leaves out is consumed in one cycle, writes no slot,
    yields zeros and sets `error`."""
    cfg = NPUConfig(macs=4, acc_slots=2, formats=formats, mac_impl="ecp5_shared",
                    fp_share=2 if "fp16" in formats else 1)
    good = formats[0]
    one = 0x3C00 if good == "fp16" else 1
    prog = empty_program(6, cfg.macs)
    prog["fmt"][:] = FMT[good]
    prog["fmt"][2] = FMT[bad_fmt]
    prog["first"][0] = 1
    prog["last"][2] = prog["last"][5] = 1
    prog["data"][:] = one
    prog["coef"][:, :] = one
    dut = MacArrayECP5Shared(cfg, primitive=False)
    values, errors = run_noting_error(dut, prog, 2)
    expected, _ = run_mac_program(prog, cfg.macs, cfg.acc_slots, cfg.formats)
    assert not compare_results(expected, values)
    assert list(values[0][2]) == [0] * cfg.macs
    assert int(values[1][2][0]) == (0x40A0_0000 if good == "fp16" else 5)   # 5 products
    assert errors == [1, 1]


def test_cell_or_twin_by_platform():
    """`primitive=None` (what the hook passes by default) instantiates MULT18X18D when the
    design is elaborated for an ECP5 device and builds the twin otherwise."""
    from amaranth.back import rtlil

    from npu.lib.ecp5_dsp import Mult18x18D, is_ecp5_platform

    class Platform:
        device = "LFE5U-85F"

    assert is_ecp5_platform(Platform()) and not is_ecp5_platform(None)
    assert "MULT18X18D" in rtlil.convert(Mult18x18D(primitive=None), platform=Platform())
    assert "MULT18X18D" not in rtlil.convert(Mult18x18D(primitive=None))
    assert "MULT18X18D" in rtlil.convert(Mult18x18D(primitive=True))


def test_flush_between_sub_beats():
    """`flush` in the middle of a float command's sub-beats drops it (no result, no slot
    write seen afterwards); the next program runs bit for bit as the golden model says."""
    cfg = EIGHT
    dut = MacArrayECP5Shared(cfg, primitive=False)
    dropped = _rotating_program(cfg, 1, 0, "fp16")
    prog = random_program(cfg.macs, cfg.acc_slots, "fp16", 200, 5)
    layout = dut.cmd.payload.shape()
    words = command_words(layout, prog)
    expected, _ = run_mac_program(prog, cfg.macs, cfg.acc_slots, cfg.formats)
    got = []

    async def producer(ctx):
        ctx.set(dut.cmd.payload.as_value(), command_words(layout, dropped)[0])
        ctx.set(dut.cmd.valid, 1)
        await ctx.tick().repeat(2)
        assert not ctx.get(dut.cmd.ready)              # sub-beat 2 of 4
        ctx.set(dut.flush, 1)
        await ctx.tick()
        ctx.set(dut.flush, 0)
        ctx.set(dut.cmd.valid, 0)
        await ctx.tick().repeat(20)
        assert not ctx.get(dut.res.valid)
        for w in words:
            await stream_put(ctx, dut.cmd, w)

    async def consumer(ctx):
        while len(got) < len(expected):
            got.append(await stream_get(ctx, dut.res))

    run_simulation(dut, [producer, consumer])
    bad = compare_results(expected, results_from_words(dut.res.payload.shape(), got))
    assert not bad, "\n".join(bad)
