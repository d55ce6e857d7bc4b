# amaranth: UnusedElaboratable=no
"""The reduction (tree, retention registers, scale, post-processor) against the golden model's
reduction of a group's beats (:func:`npu_model.planar.reduce_beats`); the tree alone against
:func:`npu_model.planar.reduce_tree`."""

import numpy as np
import pytest

from npu.planar.reduction import Reduction
from npu_model import fp
from npu_model import planar as pl
from npu_spec.formats import F32_NEG_INF, F32_NEG_ZERO, F32_POS_INF
from npu_spec.planar import Axis, PostFn, RedOp, make_task
from tests.support.planar import run, set_task

IDENTITY = {RedOp.SUM: F32_NEG_ZERO, RedOp.MAX: F32_NEG_INF, RedOp.MIN: F32_POS_INF}


def masked(values, mask, op):
    lanes = len(values)
    return np.array([values[i] if mask >> i & 1 else IDENTITY[op] for i in range(lanes)],
                    dtype=np.uint32)


@pytest.mark.parametrize("lanes,op,post,seed,share", [
    (1, RedOp.SUM, PostFn.NONE, 1, 1), (4, RedOp.MAX, PostFn.SQRT, 2, 1),
    (4, RedOp.SUM, PostFn.RSQRT, 3, 1), (8, RedOp.MIN, PostFn.RECIP, 4, 1),
    (2, RedOp.SUM, PostFn.NONE, 5, 1),
    (4, RedOp.SUM, PostFn.NONE, 6, 4), (4, RedOp.MIN, PostFn.RSQRT, 7, 4),
    (8, RedOp.SUM, PostFn.SQRT, 8, 4), (8, RedOp.MAX, PostFn.NONE, 9, 8),
])
def test_reduction(lanes, op, post, seed, share):
    """Groups of 1 to 9 beats (fewer and more than the retention registers), partial masks,
    the lane pipeline's output arriving with gaps (at least ``share`` cycles apart: with 4 or
    more the last tree node is the retention pipe) and results taken with back-pressure."""
    rng = np.random.default_rng(seed)
    groups = [int(n) for n in rng.integers(1, 10, 4)]
    scale = int(fp.f32_bits(np.float32(0.75)))
    task = make_task(mode=2, op=op, post=post, axis=Axis.PLANE, scale=scale)
    beats = [[(int(rng.integers(1, 1 << lanes)),
               fp.f32_bits((rng.standard_normal(lanes) * 10 + 20).astype(np.float32)))
              for _ in range(n)] for n in groups]
    dut = Reduction(lanes, share=share)
    got = []

    async def feed(ctx):
        set_task(ctx, dut.task, task)
        ctx.set(dut.busy, 1)
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        for n, group in zip(groups, beats):
            ctx.set(dut.sizes.beats_group, n)
            for mask, values in group:
                ctx.set(dut.lane.valid, 1)
                ctx.set(dut.lane.mask, mask)
                for i, v in enumerate(values):
                    ctx.set(dut.lane.value[i], int(v))
                while True:
                    en = rng.random() < 0.7
                    ctx.set(dut.en, en)
                    await ctx.tick()
                    if en:
                        break
                ctx.set(dut.en, 0)
                for _ in range(share - 1):
                    await ctx.tick()
            ctx.set(dut.lane.valid, 0)
            while True:     # the result, taken with back-pressure
                ctx.set(dut.result.ready, int(rng.random() < 0.5))
                if ctx.get(dut.done):
                    got.append(ctx.get(dut.result.payload))
                    await ctx.tick()
                    break
                await ctx.tick()
            ctx.set(dut.result.ready, 0)

    run(dut, feed)
    for group, result in zip(beats, got):
        expected = pl.reduce_beats(np.array([masked(v, mask, op) for mask, v in group]), op,
                                   scale=scale, post=post)
        assert result == int(expected), (group, f"{result:08x} {int(expected):08x}")


@pytest.mark.parametrize("share", [1, 4])
def test_tree_order(share):
    """The tree combines lane 2i with 2i + 1, level by level: on binary16-like values whose
    sum depends on the order, one beat's group result is the model's tree of it (also with
    the last node in the retention pipe)."""
    lanes = 8
    values = fp.f32_bits(np.array([2.0 ** 24, 1.0, -(2.0 ** 24), 1.0, 3.0, 2.0 ** -30, 0.5,
                                   -3.0], dtype=np.float32))
    tree = int(pl.reduce_tree(values, RedOp.SUM))
    dut = Reduction(lanes, share=share)
    got = []

    async def tb(ctx):
        set_task(ctx, dut.task, make_task(mode=2, op=RedOp.SUM, axis=Axis.TENSOR))
        ctx.set(dut.busy, 1)
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        ctx.set(dut.sizes.beats_group, 1)
        ctx.set(dut.lane.valid, 1)
        ctx.set(dut.lane.mask, (1 << lanes) - 1)
        for i, v in enumerate(values):
            ctx.set(dut.lane.value[i], int(v))
        ctx.set(dut.en, 1)
        await ctx.tick()
        ctx.set(dut.lane.valid, 0)
        ctx.set(dut.result.ready, 1)
        await ctx.tick().until(dut.done)
        got.append(ctx.get(dut.result.payload))

    run(dut, tb)
    # One beat: r0 = tree, r1 = r2 = -0, so the group result is the tree's value.
    assert got == [tree] and tree != int(fp.f32_bits(np.float32(np.sum(
        values.view(np.float32).astype(np.float64)))))


def test_rejects_bad_share():
    with pytest.raises(ValueError, match="share must divide lanes"):
        Reduction(4, share=8)
