# amaranth: UnusedElaboratable=no
"""The horizontal filter, fed by its line buffer, against the golden model's horizontal fold
(:func:`npu_model.planar.pool_rows`): each H word it writes holds ``FL`` output columns of one
input row."""

from dataclasses import dataclass

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module

from npu.planar.geometry import Geometry
from npu.planar.hfilter import HFilter
from npu.planar.line_buffer import LineBuffer
from npu_model import fp
from npu_model import planar as pl
from npu_spec.config import NPUConfig
from npu_spec.planar import make_task, pool_fits
from tests.support.planar import pool_sizes, pool_task, run, set_task


class FilterWithBuffer(Elaboratable):
    def __init__(self, geometry):
        self.buffer = LineBuffer(geometry)
        self.filter = HFilter(geometry)

    def elaborate(self, platform):
        m = Module()
        m.submodules.buffer = lb = self.buffer
        m.submodules.filter = hf = self.filter
        m.d.comb += [hf.loaded.eq(lb.loaded), lb.keep.eq(hf.keep), hf.data.eq(lb.data),
                     lb.read.eq(hf.read)]
        return m


def run_filter(g, task, x, *, seed, stall=0.3, ring_limit=None, record=None):
    """Load ``x`` (binary32 ``(C, H, W)``) and walk the task; returns the H words written
    ``{word: values}``, the order of the words and the final count (and appends each word's
    values to ``record`` in the order written)."""
    dut = FilterWithBuffer(g)
    lb, hf = dut.buffer, dut.filter
    rng = np.random.default_rng(seed)
    c, h, w = x.shape
    L = g.lanes
    words = {}
    order = []
    state = {"count": None}

    async def feed(ctx):
        set_task(ctx, hf.task, task)
        for name, value in pool_sizes(task, L, g.filter_lanes).items():
            ctx.set(getattr(hf.sizes, name), value)
        ctx.set(lb.load_shape.planes, c)
        ctx.set(lb.load_shape.rows, h)
        ctx.set(lb.load_shape.length, w)
        ctx.set(lb.load_start, 1)
        ctx.set(hf.start, 1)
        if ring_limit is not None:
            ctx.set(hf.ring_keep.valid, 1)
            ctx.set(hf.ring_keep.word, 0)
        await ctx.tick()
        ctx.set(lb.load_start, 0)
        ctx.set(hf.start, 0)
        for row in x.reshape(c * h, w):
            wb = -(-w // L)
            padded = np.zeros(wb * L, dtype=np.uint32)
            padded[:w] = row
            for beat in padded.reshape(wb, L):
                while rng.random() < stall:
                    ctx.set(lb.load.valid, 0)
                    await ctx.tick()
                ctx.set(lb.load.valid, 1)
                for i, v in enumerate(beat):
                    ctx.set(lb.load.payload[i], int(v))
                await ctx.tick().until(lb.load.ready)
        ctx.set(lb.load.valid, 0)
        if ring_limit is not None:
            # The filter stops before a word HD past the vertical filter's first word.
            await ctx.tick().repeat(200)
            assert max(order) < g.h_depth and ctx.get(hf.busy)
            ctx.set(hf.ring_keep.valid, 0)
        while ctx.get(hf.busy):
            await ctx.tick()
        state["count"] = ctx.get(hf.count)

    async def collect(ctx):
        async for _, _, valid, word, values in ctx.tick().sample(hf.write.valid, hf.write.word,
                                                                 hf.fold):
            if valid:
                words[word] = [int(values[i]) for i in range(g.filter_lanes)]
                order.append(word)
                if record is not None:
                    record.append(words[word])

    run(dut, feed, background=[collect])
    return words, order, state["count"]


def random_x(rng, shape):
    v = rng.standard_normal(shape) * rng.choice([1.0, 1e3], shape)
    return fp.f32_bits(v.astype(np.float32))


@pytest.mark.parametrize("p,k,seed", [(1, 1, 1), (2, 1, 2), (2, 3, 3), (1, 4, 4)])
def test_hfilter(p, k, seed):
    config = NPUConfig(planar_lanes=p, planar_pool_beats=k)
    g = Geometry.of(config, 1024)
    rng = np.random.default_rng(seed)
    for _ in range(4):
        task = pool_task(rng, max_dim=11)
        assert pool_fits(task, config)
        x = random_x(rng, (task["channels"], task["height"], task["width"]))
        words, order, count = run_filter(g, task, x, seed=seed)
        rows = pl.pool_rows(x, task["op"], task["kw"], task["sx"], task["px"])
        rows = rows.reshape(-1, rows.shape[-1])
        ow = rows.shape[-1]
        owb = -(-ow // g.filter_lanes)
        assert order == list(range(rows.shape[0] * owb)) and count == len(order), task
        for r, row in enumerate(rows):
            for b in range(owb):
                cols = row[b * g.filter_lanes:(b + 1) * g.filter_lanes]
                assert words[r * owb + b][:len(cols)] == cols.tolist(), (task, r, b)


def test_hfilter_waits_for_the_ring():
    """While the vertical filter still reads H word 0, no word from HD on is written."""
    config = NPUConfig(planar_lanes=1, planar_pool_beats=1)
    g = Geometry.of(config, 64)     # HD = 64 words
    task = make_task(mode=1, op=0, channels=1, height=40, width=3, kh=1, kw=1)
    x = random_x(np.random.default_rng(5), (1, 40, 3))
    words, order, count = run_filter(g, task, x, seed=5, ring_limit=True)
    assert order == list(range(40 * 3)) and count == 120


@dataclass(frozen=True)
class NarrowCounters(Geometry):
    """A geometry whose walk counters are narrower than the build's, so that a small task
    wraps them (the bounds of ``Geometry.count_bits`` and ``hword_bits`` still hold for the
    small shapes of the test)."""
    narrow: tuple = (9, 9)

    @property
    def count_bits(self):
        return self.narrow[0]

    @property
    def hword_bits(self):
        return self.narrow[1]


def narrow(config, depth, count_bits, hword_bits):
    g = Geometry.of(config, depth)
    return NarrowCounters(g.lanes, g.pool_beats, g.plane_depth, g.integer,
                          (count_bits, hword_bits))


def test_hfilter_counters_wrap():
    """Element counts of 9 bits (512) and H word indices of 8 bits over a task of 560
    elements and 560 H words (``DR + 4 W`` = 141 stays below half the modulus): the loader's
    limit and the walk compare them modulo, and every H word is written, in order, with the
    golden values, at its index modulo 256."""
    config = NPUConfig(planar_lanes=1, planar_pool_beats=1)
    g = narrow(config, 64, 9, 8)
    task = make_task(mode=1, op=0, channels=8, height=5, width=14, kh=2, kw=3, sx=1, px=1)
    assert pool_fits(task, config, 64)
    rng = np.random.default_rng(11)
    x = random_x(rng, (8, 5, 14))
    dut_words = []
    words, order, count = run_filter(g, task, x, seed=11, record=dut_words)
    rows = pl.pool_rows(x, task["op"], task["kw"], task["sx"], task["px"]).reshape(40, -1)
    total = rows.shape[0] * rows.shape[1]
    assert order == [n % 256 for n in range(total)] and count == total % 256
    assert [values[0] for values in dut_words] == rows.reshape(-1).tolist()
