# amaranth: UnusedElaboratable=no
"""The vertical filter, reading its H ring, against the golden model's vertical fold
(:func:`npu_model.planar.pool_columns`): each result holds ``FL`` outputs of one output row,
in raster order, with the window position of its lane 0."""

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module

from npu.planar.geometry import Geometry
from npu.planar.h_ring import HRing
from npu.planar.vfilter import VFilter
from npu_model import fp
from npu_model import planar as pl
from npu_spec.config import NPUConfig
from npu_spec.planar import make_task
from tests.rtl.planar.test_hfilter import narrow
from tests.support.planar import pool_sizes, pool_task, run, set_task


class FilterWithRing(Elaboratable):
    def __init__(self, geometry):
        self.ring = HRing(geometry)
        self.filter = VFilter(geometry)

    def elaborate(self, platform):
        m = Module()
        m.submodules.ring = ring = self.ring
        m.submodules.filter = vf = self.filter
        m.d.comb += [ring.filter_read.eq(vf.ring_read), vf.ring_data.eq(ring.read_data)]
        return m


@pytest.mark.parametrize("p,k,seed", [(1, 1, 1), (2, 1, 2), (2, 3, 3), (1, 4, 4)])
def test_vfilter(p, k, seed):
    """The H words are written one by one (``count`` follows) while the filter runs, and the
    result queue's room comes and goes."""
    g = Geometry.of(NPUConfig(planar_lanes=p, planar_pool_beats=k), 1024)
    FL = g.filter_lanes
    rng = np.random.default_rng(seed)
    for _ in range(4):
        task = pool_task(rng, max_dim=10)
        c, h, w = task["channels"], task["height"], task["width"]
        x = fp.f32_bits((rng.standard_normal((c, h, w)) * 100).astype(np.float32))
        hrows = pl.pool_rows(x, task["op"], task["kw"], task["sx"], task["px"])  # (C, H, OW)
        ow = hrows.shape[-1]
        owb = -(-ow // FL)
        hwords = np.zeros((c * h * owb, FL), dtype=np.uint32)
        flat = np.zeros((c, h, owb * FL), dtype=np.uint32)
        flat[..., :ow] = hrows
        hwords[:] = flat.reshape(-1, FL)
        assert len(hwords) <= g.h_depth
        dut = FilterWithRing(g)
        ring, vf = dut.ring, dut.filter
        results = []
        counts = {"start": 0, "empty": 0}

        async def tb(ctx):
            set_task(ctx, vf.task, task)
            for name, value in pool_sizes(task, g.lanes, FL).items():
                ctx.set(getattr(vf.sizes, name), value)
            ctx.set(vf.start, 1)
            await ctx.tick()
            ctx.set(vf.start, 0)
            for n, word in enumerate(hwords):
                ctx.set(ring.filter_write.valid, 1)
                ctx.set(ring.filter_write.word, n)
                for i, v in enumerate(word):
                    ctx.set(ring.data[i], int(v))
                ctx.set(vf.room, int(rng.random() < 0.7))
                await ctx.tick()
                ctx.set(vf.count, n + 1)
                ctx.set(ring.filter_write.valid, 0)
                for _ in range(int(rng.integers(0, 3))):
                    await ctx.tick()
            ctx.set(vf.room, 1)
            while ctx.get(vf.busy):
                await ctx.tick()

        async def collect(ctx):
            async for _, _, result in ctx.tick().sample(vf.result):
                counts["start"] += result.start
                counts["empty"] += result.empty
                if result.valid:
                    results.append((int(result.entry.oyb), int(result.entry.gxb),
                                    [int(result.entry.value[i]) for i in range(FL)]))

        run(dut, tb, background=[collect])
        expected = pl.pool_columns(hrows, task["op"], task["kh"], task["sy"], task["py"])
        oh = expected.shape[1]
        order = [(ch, oy, ob) for ch in range(c) for oy in range(oh) for ob in range(owb)]
        assert len(results) == len(order), task
        for (ch, oy, ob), (oyb, gxb, values) in zip(order, results):
            assert (oyb, gxb) == (oy * task["sy"] - task["py"],
                                  ob * FL * task["sx"] - task["px"]), task
            cols = expected[ch, oy, ob * FL:(ob + 1) * FL]
            assert values[:len(cols)] == cols.tolist(), (task, ch, oy, ob)
        # Every started group reserved three entries: its results and its empty beats.
        assert 3 * counts["start"] == len(results) + counts["empty"]


def test_vfilter_counters_wrap():
    """H word indices of 9 bits (512) over a task of 12 planes of 60 H words (720): the ring is
    written only below the filter's ``keep`` plus ``HD`` (as the horizontal filter does), the
    indices and ``count`` wrap, and every result is the golden one, in raster order. The
    distances the walk compares stay below 256 (``(H + kh + py + sy) owb + HD``)."""
    g = narrow(NPUConfig(planar_lanes=1, planar_pool_beats=1), 64, 16, 9)
    mod, HD = 1 << 9, g.h_depth
    task = make_task(mode=1, op=1, channels=12, height=6, width=10, kh=3, kw=1, sy=1, sx=1,
                     py=1)
    rng = np.random.default_rng(21)
    x = fp.f32_bits((rng.standard_normal((12, 6, 10)) * 100).astype(np.float32))
    hrows = pl.pool_rows(x, task["op"], task["kw"], task["sx"], task["px"])
    hwords = hrows.reshape(-1, 1)
    dut = FilterWithRing(g)
    ring, vf = dut.ring, dut.filter
    results = []

    async def tb(ctx):
        set_task(ctx, vf.task, task)
        for name, value in pool_sizes(task, g.lanes, 1).items():
            ctx.set(getattr(vf.sizes, name), value)
        ctx.set(vf.room, 1)
        ctx.set(vf.start, 1)
        await ctx.tick()
        ctx.set(vf.start, 0)
        for n, word in enumerate(hwords):
            # Word n is written once it is below keep + HD (modulo).
            while ctx.get(vf.keep.valid) and (n - ctx.get(vf.keep.word) - HD) % mod < mod // 2:
                await ctx.tick()
            ctx.set(ring.filter_write.valid, 1)
            ctx.set(ring.filter_write.word, n % mod)
            ctx.set(ring.data[0], int(word[0]))
            await ctx.tick()
            ctx.set(vf.count, (n + 1) % mod)
            ctx.set(ring.filter_write.valid, 0)
        while ctx.get(vf.busy):
            await ctx.tick()

    async def collect(ctx):
        async for _, _, result in ctx.tick().sample(vf.result):
            if result.valid:
                results.append(int(result.entry.value[0]))

    run(dut, tb, background=[collect])
    expected = pl.pool_columns(hrows, task["op"], task["kh"], task["sy"], task["py"])
    assert results == expected.reshape(-1).tolist()
