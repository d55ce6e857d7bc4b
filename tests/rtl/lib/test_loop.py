# amaranth: UnusedElaboratable=no
"""The loop-nest counter against nested Python loops."""

import itertools
import random

import pytest

from npu.lib.loop import LoopNest
from tests.support.csr import run


def positions(levels, limits):
    """Every position of the nest, in order (a limit of 0 runs once)."""
    ranges = [range(0, max(limits[name], 1), step) for name, _, step in levels]
    return [dict(zip(limits, p)) for p in itertools.product(*ranges)]


@pytest.mark.parametrize("levels", [
    [("tx", 4)],
    [("ty", 4), ("tx", 5)],
    [("base", 7, 3), ("ty", 3), ("tx", 3)],
    [("c", 6), ("ky", 5), ("y", 3, 2)],
])
def test_nest_against_loops(levels):
    dut = LoopNest(levels)
    rng = random.Random(len(levels))

    async def tb(ctx):
        for trial in range(6):
            limits = {name: rng.randrange(0, min(6 if step == 1 else 20, 1 << shape.width))
                      for name, shape, step in dut.levels}
            for name, value in limits.items():
                ctx.set(getattr(dut.limit, name), value)
            ctx.set(dut.restart, 1)
            await ctx.tick()
            ctx.set(dut.restart, 0)
            expect = positions(dut.levels, limits)
            k = 0
            while k < len(expect):
                index = {n: ctx.get(getattr(dut.index, n)) for n in limits}
                assert index == expect[k], (trial, k)
                assert ctx.get(dut.done) == (k == len(expect) - 1)
                for name, _, step in dut.levels:
                    last = index[name] + step >= limits[name]
                    assert ctx.get(getattr(dut.last, name)) == last
                nxt = {n: ctx.get(getattr(dut.next, n)) for n in limits}
                assert nxt == (expect[k + 1] if k + 1 < len(expect) else expect[0])
                stall = rng.random() < 0.3
                ctx.set(dut.advance, not stall)
                await ctx.tick()
                ctx.set(dut.advance, 0)
                k += not stall
            # Advancing from the last position wrapped to the start.
            assert {n: ctx.get(getattr(dut.index, n)) for n in limits} == expect[0]

    run(dut, tb)


def test_restart_wins_over_advance():
    dut = LoopNest([("a", 4), ("b", 4)])

    async def tb(ctx):
        ctx.set(dut.limit.a, 3)
        ctx.set(dut.limit.b, 3)
        ctx.set(dut.advance, 1)
        await ctx.tick().repeat(4)
        assert (ctx.get(dut.index.a), ctx.get(dut.index.b)) == (1, 1)
        ctx.set(dut.restart, 1)
        await ctx.tick()
        assert (ctx.get(dut.index.a), ctx.get(dut.index.b)) == (0, 0)

    run(dut, tb)


@pytest.mark.parametrize("levels, message", [
    ([], "at least one level"),
    ([("a", 4), ("a", 4)], "distinct"),
    ([("a", 4, 0)], "step of level 'a'"),
    ([("a", -4)], "unsigned"),
    (["a"], "a level must be"),
])
def test_bad_levels(levels, message):
    with pytest.raises((TypeError, ValueError), match=message):
        LoopNest(levels)
