# amaranth: UnusedElaboratable=no
"""The result queue: vertical filter results leave as output beats of ``L`` lanes with the
average's divisors of the golden model (:func:`npu_model.planar.pool_divisors`)."""

import numpy as np
import pytest

from npu.planar.geometry import QUEUE_DEPTH, Geometry
from npu.planar.layouts import EltOp
from npu.planar.result_queue import ResultQueue
from npu_model import planar as pl
from npu_spec.config import NPUConfig
from npu_spec.planar import pool_output_size, recip_bits
from tests.support.planar import pool_sizes, pool_task, run, set_task


def test_recip_rom():
    n = np.arange(1, 65)
    assert [recip_bits(int(k)) for k in n] == pl.recip_count(n).tolist()


@pytest.mark.parametrize("p,k,seed", [(1, 1, 1), (2, 1, 2), (2, 3, 3), (1, 4, 4), (2, 2, 5)])
def test_result_queue(p, k, seed):
    g = Geometry.of(NPUConfig(planar_lanes=p, planar_pool_beats=k), 1024)
    L, K, FL = g.lanes, g.pool_beats, g.filter_lanes
    rng = np.random.default_rng(seed)
    for _ in range(3):
        task = pool_task(rng, max_dim=12, op=2 if _ == 0 else None)
        oh, ow = pool_output_size(task)
        owb = -(-ow // FL)
        order = [(ch, oy, ob) for ch in range(task["channels"]) for oy in range(oh)
                 for ob in range(owb)]
        values = rng.integers(0, 1 << 32, (len(order), FL), dtype=np.uint64).astype(np.uint32)
        dut = ResultQueue(g)
        beats = []

        async def push(ctx):
            set_task(ctx, dut.task, task)
            for name, value in pool_sizes(task, L, FL).items():
                ctx.set(getattr(dut.sizes, name), value)
            for first in range(0, len(order), 3):
                # A group: reserve three entries when there is room, then the results and
                # (past the end) empty beats.
                while not ctx.get(dut.room):
                    await ctx.tick()
                ctx.set(dut.push.start, 1)
                await ctx.tick()
                ctx.set(dut.push.start, 0)
                assert ctx.get(dut.busy)
                for n in range(first, first + 3):
                    for _ in range(int(rng.integers(0, 3))):
                        await ctx.tick()
                    if n < len(order):
                        ch, oy, ob = order[n]
                        ctx.set(dut.push.valid, 1)
                        ctx.set(dut.push.entry.oyb, oy * task["sy"] - task["py"])
                        ctx.set(dut.push.entry.gxb, ob * FL * task["sx"] - task["px"])
                        for i, v in enumerate(values[n]):
                            ctx.set(dut.push.entry.value[i], int(v))
                    else:
                        ctx.set(dut.push.empty, 1)
                    await ctx.tick()
                    ctx.set(dut.push.valid, 0)
                    ctx.set(dut.push.empty, 0)
            while ctx.get(dut.busy):
                await ctx.tick()

        async def drain(ctx):
            async for _, _, en, beat in ctx.tick().sample(dut.en, dut.beat):
                if en and beat.valid:
                    beats.append((int(beat.mask), [int(beat.a[i]) for i in range(L)],
                                  [int(beat.b[i]) for i in range(L)], beat.op))
                ctx.set(dut.en, int(rng.random() < 0.6))

        run(dut, push, background=[drain])
        divisors = pl.pool_divisors(task["op"], task["height"], task["width"], task["kh"],
                                    task["kw"], task["sy"], task["sx"], task["py"], task["px"])
        expected = []
        for n, (ch, oy, ob) in enumerate(order):
            for j in range(K):
                col = ob * FL + j * L
                if j and col >= ow:
                    break
                lanes = [i for i in range(L) if col + i < ow]
                expected.append((sum(1 << i for i in lanes),
                                 {i: int(values[n][j * L + i]) for i in lanes},
                                 {i: int(divisors[oy, col + i]) for i in lanes}))
        assert len(beats) == len(expected), task
        for (mask, a, b, op), (e_mask, e_a, e_b) in zip(beats, expected):
            assert op == EltOp.MUL and mask == e_mask
            assert {i: a[i] for i in e_a} == e_a and {i: b[i] for i in e_b} == e_b, task


def test_room():
    """Room for a group while at most ``QUEUE_DEPTH - 3`` entries are held or reserved."""
    g = Geometry.of(NPUConfig(planar_lanes=1), 64)
    dut = ResultQueue(g)

    async def tb(ctx):
        ctx.set(dut.task.mode, 1)
        for held in range(0, QUEUE_DEPTH, 3):
            assert ctx.get(dut.room) == (held <= QUEUE_DEPTH - 3)
            ctx.set(dut.push.start, 1)
            await ctx.tick()
        ctx.set(dut.push.start, 0)
        for _ in range(9):
            ctx.set(dut.push.empty, 1)
            await ctx.tick()
        ctx.set(dut.push.empty, 0)
        assert ctx.get(dut.room) and not ctx.get(dut.busy)

    run(dut, tb)
