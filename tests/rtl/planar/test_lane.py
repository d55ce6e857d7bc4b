# amaranth: UnusedElaboratable=no
"""The lane pipeline against the golden model's lane operation (:func:`npu_model.planar.lane_op`),
with the pipeline stalled at random."""

import numpy as np
import pytest

from npu.planar.lane import LANE_LATENCY, Lane, LanePipeline
from npu_model import planar as pl
from npu_spec.planar import ELT_ARITY, EltOp
from tests.support.planar import f32_classes, run


def same_f32(got, expected):
    """Equal bit patterns, NaNs compared as a class (the output formats canonicalise NaN)."""
    got = np.asarray(got, dtype=np.uint32)
    expected = np.asarray(expected, dtype=np.uint32)
    nan = lambda v: ((v >> 23) & 0xFF == 0xFF) & ((v & 0x7F_FFFF) != 0)  # noqa: E731
    return (got == expected) | (nan(got) & nan(expected))


@pytest.mark.parametrize("op", list(EltOp))
def test_lane(op):
    rng = np.random.default_rng(int(op) + 1)
    n = 60
    a, b, c = (rng.permutation(f32_classes(rng, n))[:n] for _ in range(3))
    scale, bias = (int(v) for v in f32_classes(rng, 2)[:2])
    dut = Lane()
    got = []

    async def tb(ctx):
        ctx.set(dut.op, op.value)
        ctx.set(dut.scale, scale)
        ctx.set(dut.bias, bias)
        taken = 0       # en-cycles so far: sample k enters in en-cycle k + 1
        while len(got) < n:
            en = rng.random() < 0.7
            if en and taken < n:
                for port, values in ((dut.a, a), (dut.b, b), (dut.c, c)):
                    ctx.set(port, int(values[taken]))
            ctx.set(dut.en, en)
            await ctx.tick()
            if en:
                taken += 1
                if taken >= LANE_LATENCY:
                    got.append(ctx.get(dut.result))

    run(dut, tb)
    arity = ELT_ARITY[op]
    expected = pl.lane_op(op, a, b if arity >= 2 else None, c if arity == 3 else None,
                          scale=scale, bias=bias)
    ok = same_f32(got, expected)
    assert ok.all(), [f"{a[i]:08x} {b[i]:08x} {c[i]:08x}: {got[i]:08x} != {expected[i]:08x}"
                      for i in np.nonzero(~ok)[0][:4]]


@pytest.mark.parametrize("share", [1, 2, 4])
def test_lane_pipeline(share):
    """Beats of mixed operations, masks and B sources (stream, SCALAR register, the line
    buffer's data one cycle after the beat enters) through four lanes, with each lane's units
    serving ``share`` lanes (a beat every ``share`` advancing cycles), stalled at random."""
    lanes = 4
    rng = np.random.default_rng(7 + share)
    n = 80
    beats = []
    for _ in range(n):
        op = EltOp(int(rng.integers(0, 14)))
        source = rng.choice(["stream", "scalar", "vector"]) if ELT_ARITY[op] >= 2 else "stream"
        beats.append({"valid": int(rng.random() < 0.8), "op": op,
                      "mask": int(rng.integers(0, 1 << lanes)),
                      "vector": int(source == "vector"), "scalar": int(source == "scalar"),
                      "a": f32_classes(rng, lanes)[:lanes], "b": f32_classes(rng, lanes)[:lanes],
                      "c": f32_classes(rng, lanes)[:lanes],
                      "line": f32_classes(rng, lanes)[:lanes]})
    scale, bias, scalar = (int(v) for v in f32_classes(rng, 3)[:3])
    dut = LanePipeline(lanes, share=share)
    assert share > 1 or dut.latency == LANE_LATENCY
    got = []
    cycles = []

    async def tb(ctx):
        for port, value in ((dut.scale, scale), (dut.bias, bias), (dut.scalar, scalar)):
            ctx.set(port, value)
        taken = 0      # beats taken so far
        steps = 0
        cycle = 0
        while len(got) < n:
            en = rng.random() < 0.7
            if taken < n:
                beat = beats[taken]
                for name in ("valid", "op", "mask", "vector", "scalar"):
                    ctx.set(getattr(dut.i, name), beat[name])
                for name in ("a", "b", "c"):
                    for k in range(lanes):
                        ctx.set(getattr(dut.i, name)[k], int(beat[name][k]))
            else:
                ctx.set(dut.i.valid, 0)
            ctx.set(dut.en, en)
            step = ctx.get(dut.step)
            assert not (ctx.get(dut.o.valid) and en) or step
            if step:
                steps += 1
                cycles.append(cycle)
                # Beat j is taken on step j + 1, held in the input register until step j + 2,
                # and leaves `latency` steps later.
                if steps > dut.latency + 1:
                    got.append((ctx.get(dut.o.valid), ctx.get(dut.o.mask),
                                [ctx.get(dut.o.value[k]) for k in range(lanes)]))
            await ctx.tick()
            cycle += 1
            taken += step
            # The line buffer's data for the beat in the input register.
            if taken and taken <= n:
                for k in range(lanes):
                    ctx.set(dut.vector[k], int(beats[taken - 1]["line"][k]))

    run(dut, tb)
    # A beat every `share` advancing cycles.
    assert all(b - a >= share for a, b in zip(cycles, cycles[1:]))
    for beat, (valid, mask, values) in zip(beats, got):
        assert (valid, mask) == (beat["valid"], beat["mask"])
        b = (beat["line"] if beat["vector"] else np.full(lanes, scalar, dtype=np.uint32)
             if beat["scalar"] else beat["b"])
        expected = pl.lane_op(beat["op"], beat["a"], b, beat["c"], scale=scale, bias=bias)
        assert same_f32(values, expected).all(), beat["op"]


def test_lane_pipeline_rejects_bad_share():
    with pytest.raises(ValueError, match="power of two dividing lanes"):
        LanePipeline(4, share=3)
    with pytest.raises(ValueError, match="power of two dividing lanes"):
        LanePipeline(4, share=8)
    with pytest.raises(ValueError, match="integer lanes"):
        LanePipeline(4, share=2, word=16)
