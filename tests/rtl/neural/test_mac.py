# amaranth: UnusedElaboratable=no
"""MAC unit and array in the Amaranth simulator against the golden model (npu_model.mac)."""

import numpy as np
import pytest

from npu.neural.mac import MacArray, pipeline_stages
from npu_model import fp
from npu_model.mac import FMT, OP, empty_program, run_mac_program
from npu_sim.mac import command_words, compare_results, random_program, run_amaranth, run_timed
from npu_sim.streams import run_simulation, stream_get, stream_put
from npu_spec.config import NPUConfig, preset


def check(config, program, *, seed=0, stall=0.3):
    expected, _ = run_mac_program(program, config.macs, config.acc_slots, config.formats)
    got, cycles = run_amaranth(config, program, seed=seed, stall=stall)
    bad = compare_results(expected, got)
    assert not bad, "\n".join(bad)
    assert len(got) == int(np.count_nonzero(program["last"])) > 0
    return got, cycles


@pytest.mark.parametrize("fmt", ["int8", "fp16", "mixed"])
@pytest.mark.parametrize("seed", [1, 2])
def test_random_small(fmt, seed):
    cfg = preset("small")
    check(cfg, random_program(cfg.macs, cfg.acc_slots, fmt, 1600, seed), seed=seed)


@pytest.mark.parametrize("cfg", [
    NPUConfig(macs=6, acc_slots=3, formats=("int8", "fp16", "mixed")),  # non-power-of-two
    NPUConfig(macs=2, acc_slots=1, formats=("fp16",)),                  # one slot: all hazards
    preset("ice40"),                                                    # int8-only pipeline
], ids=["6x3", "2x1-fp16", "ice40"])
def test_other_shapes(cfg):
    for fmt in ("int8", "fp16", "mixed"):
        if fmt in cfg.formats:
            check(cfg, random_program(cfg.macs, cfg.acc_slots, fmt, 60 * cfg.macs, 7))


def _directed(lanes, cases, fmt, op="mac"):
    """One sequence per case: bias then one product per (data, coef) pair, last at the end."""
    rows = sum(len(c[1]) for c in cases)
    prog = empty_program(rows, lanes)
    i = 0
    for slot, (bias, pairs) in enumerate(cases):
        for k, (d, c) in enumerate(pairs):
            prog["op"][i], prog["fmt"][i] = OP[op], FMT[fmt]
            prog["slot"][i] = slot % 8
            prog["first"][i] = k == 0
            prog["last"][i] = k == len(pairs) - 1
            prog["bias"][i] = bias
            prog["data"][i] = d
            prog["coef"][i] = (c, c)
            i += 1
    return prog


F16 = {"one": 0x3C00, "mone": 0xBC00, "max": 0x7BFF, "mmax": 0xFBFF, "sub1": 0x0001,
       "subm": 0x03FF, "zero": 0x0000, "mzero": 0x8000, "inf": 0x7C00, "minf": 0xFC00,
       "nan": 0x7E01, "snan": 0x7C01, "half": 0x3800}


def test_fp16_corner_cases():
    """Every corner class: subnormal products, signed zeros, inf - inf, NaN payloads, overflow
    of the binary32 accumulator, exact cancellation, and rounding ties."""
    cfg = preset("small")
    lanes = cfg.macs
    rng = np.random.default_rng(5)
    f32max = 0x7F7F_FFFF
    cases = [
        (0x0000_0000, [(F16["sub1"], F16["sub1"])] * 3),       # 2**-48 products
        (0x8000_0000, [(F16["mzero"], F16["one"])]),            # -0 + -0 = -0
        (0x8000_0000, [(F16["zero"], F16["one"])]),             # -0 + +0 = +0
        (0x0000_0000, [(F16["inf"], F16["one"]), (F16["minf"], F16["one"])]),  # inf - inf
        (0x0000_0000, [(F16["inf"], F16["zero"])]),             # inf * 0
        (0x3F80_0000, [(F16["snan"], F16["one"])]),             # NaN payload -> canonical
        (f32max, [(F16["max"], F16["max"])] * 4),               # below half an ulp: stays
        (0xFF7F_FFFF, [(F16["mmax"], F16["max"])] * 2),         # likewise, negative
        (0x0000_0000, [(F16["max"], F16["half"]), (F16["mmax"], F16["half"])]),  # cancel
        (0x4B80_0000, [(F16["one"], F16["one"])]),              # 2**24 + 1: tie to even
        (0x4B80_0001, [(F16["one"], F16["one"])]),              # 2**24 + 2 + 1: tie up
        (0x0080_0000, [(F16["sub1"], F16["sub1"])]),            # min normal + tiny
        (0x807F_FFFF, [(F16["subm"], F16["sub1"])]),            # subnormal accumulator
    ]
    pairs = []
    for bias, seq in cases:
        # Same case on every lane, plus random lanes for variety.
        pairs.append((bias, [(np.array([d] * (lanes // 2) + list(
            rng.integers(0, 1 << 16, lanes - lanes // 2)), np.uint16), c) for d, c in seq]))
    prog = _directed(lanes, pairs, "fp16")
    got, _ = check(cfg, prog, stall=0.2)
    # Independent spot checks against float64 / IEEE facts, not the golden model.
    values = [int(v[0]) for _, _, v in got]
    assert values[1] == 0x8000_0000 and values[2] == 0x0000_0000
    assert values[3] == fp.F32_QNAN and values[4] == fp.F32_QNAN and values[5] == fp.F32_QNAN
    # FLT_MAX + 4 * 65504**2 rounds back to FLT_MAX: the addend is far below half an ulp
    # (2**103), so RNE does not overflow.
    assert values[6] == 0x7F7F_FFFF and values[7] == 0xFF7F_FFFF
    assert values[8] == 0x0000_0000
    assert values[9] == 0x4B80_0000 and values[10] == 0x4B80_0002
    assert np.float32(np.uint32(values[0]).view(np.float32)) == np.float32(3 * 2.0 ** -48)


def test_int8_wrap_and_ops():
    cfg = preset("small")
    lanes = cfg.macs
    prog = _directed(lanes, [(0x7FFF_FFFF, [(np.full(lanes, 0x80, np.uint16), 0x80)])], "int8")
    got, _ = check(cfg, prog)
    assert int(got[0][2][0]) == (0x7FFF_FFFF + 16384) & 0xFFFF_FFFF   # int32 wrap
    for op in ("max", "min", "cmp"):
        data = np.arange(lanes, dtype=np.uint16) * 17 % 256
        check(cfg, _directed(lanes, [(0x0000_0000, [(data, 0x01), (data[::-1], 0xFF)])],
                             "int8", op))


def test_dual_kernel_mode():
    """Lane 2i and 2i+1 take data[i] with coef[0] and coef[1]."""
    cfg = preset("small")
    prog = empty_program(1, cfg.macs)
    prog["fmt"][0], prog["first"][0], prog["last"][0], prog["dual"][0] = FMT["int8"], 1, 1, 1
    prog["data"][0] = np.arange(1, cfg.macs + 1)
    prog["coef"][0] = (3, 5)
    got, _ = check(cfg, prog, stall=0.0)
    vals = got[0][2].view(np.int32)
    for lane in range(cfg.macs):
        assert vals[lane] == (lane // 2 + 1) * (3 if lane % 2 == 0 else 5)


@pytest.mark.parametrize("name, fmt", [("small", "fp16"), ("ice40", "int8")])
def test_full_rate_and_latency(name, fmt):
    """Rotating over the slots, the array takes one command per cycle; a result is valid
    `latency` cycles after its command's handshake."""
    cfg = preset(name)
    _, write_stage, hazard = pipeline_stages(cfg)
    n = 64
    prog = empty_program(n, cfg.macs)
    prog["fmt"][:] = FMT[fmt]
    prog["slot"][:] = np.arange(n) % cfg.acc_slots
    prog["first"][:] = np.arange(n) < cfg.acc_slots
    prog["last"][:] = np.arange(n) >= n - cfg.acc_slots
    prog["data"][:] = 0x3C00 if fmt == "fp16" else 1
    prog["coef"][:, :] = 0x3C00 if fmt == "fp16" else 1
    dut = MacArray(cfg)
    accepted, results, _ = run_timed(dut, prog, cfg.acc_slots)
    assert accepted == list(range(accepted[0], accepted[0] + n)), "array stalled"
    assert hazard < cfg.acc_slots
    # The handshake cycle plus `latency` cycles later the result is valid.
    assert results[0] - accepted[n - cfg.acc_slots] == dut.latency == write_stage + 1


def test_hazard_stalls_same_slot():
    """Back-to-back commands on one slot wait for the write-back and stay correct."""
    cfg = preset("small")
    _, _, hazard = pipeline_stages(cfg)
    prog = empty_program(12, cfg.macs)
    prog["fmt"][:] = FMT["fp16"]
    prog["first"][0] = 1
    prog["last"][-1] = 1
    prog["data"][:] = 0x3C00
    prog["coef"][:, :] = 0x3C00
    got, cycles = check(cfg, prog, stall=0.0)
    assert got[0][2][0] == 0x4140_0000  # 12.0
    assert cycles >= 11 * (hazard + 1)


def test_unsupported_format_sets_error_and_continues():
    cfg = preset("ice40")
    prog = random_program(cfg.macs, cfg.acc_slots, "int8", 40 * cfg.macs, 3)
    prog["fmt"][5] = FMT["fp16"]
    prog["last"][5] = True
    dut = MacArray(cfg)
    words = command_words(dut.cmd.payload.shape(), prog)
    got = []
    seen_error = []

    async def producer(ctx):
        for w in words:
            await stream_put(ctx, dut.cmd, w)

    async def consumer(ctx):
        while len(got) < int(np.count_nonzero(prog["last"])):
            got.append(await stream_get(ctx, dut.res))
            seen_error.append(ctx.get(dut.error))

    run_simulation(dut, [producer, consumer])
    expected, _ = run_mac_program(prog, cfg.macs, cfg.acc_slots, cfg.formats)
    from npu_sim.mac import results_from_words
    assert not compare_results(expected, results_from_words(dut.res.payload.shape(), got))
    assert seen_error[-1] == 1


def test_flush_drops_the_commands_in_flight():
    """A flush while a sequence is in the pipeline: its result never appears, and the program
    after it gives the golden model's results (``flush`` is what clears shared units)."""
    cfg = preset("small")
    before = _directed(cfg.macs, [(0x3F80_0000, [([0x3C00] * cfg.macs, 0x3C00)] * 3)], "fp16")
    after = random_program(cfg.macs, cfg.acc_slots, "fp16", 40 * cfg.macs, 5)
    dut = MacArray(cfg)
    layout = dut.cmd.payload.shape()
    got = []

    async def bench(ctx):
        for w in command_words(layout, before):
            await stream_put(ctx, dut.cmd, w)
        ctx.set(dut.flush, 1)
        await ctx.tick()
        ctx.set(dut.flush, 0)
        for w in command_words(layout, after):
            await stream_put(ctx, dut.cmd, w)

    async def consumer(ctx):
        # Hold the results back until the flush is over.
        await ctx.tick().repeat(30)
        while len(got) < int(np.count_nonzero(after["last"])):
            got.append(await stream_get(ctx, dut.res))

    run_simulation(dut, [bench, consumer])
    from npu_sim.mac import results_from_words
    expected, _ = run_mac_program(after, cfg.macs, cfg.acc_slots, cfg.formats)
    assert not compare_results(expected, results_from_words(dut.res.payload.shape(), got))


def test_bad_config_rejected():
    with pytest.raises(TypeError, match="NPUConfig"):
        MacArray("small")
