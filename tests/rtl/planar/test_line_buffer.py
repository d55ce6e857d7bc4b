# amaranth: UnusedElaboratable=no
"""The line buffer: rows loaded as beats into the ring, read back at every spread and stride,
and the loader's limit (``keep``)."""

import numpy as np
import pytest

from npu.planar.geometry import Geometry
from npu.planar.layouts import Spread
from npu.planar.line_buffer import LineBuffer
from npu_spec.config import NPUConfig
from tests.support.planar import run


def geometry(p=2, k=3, depth=64, impl="float"):
    return Geometry.of(NPUConfig(planar_lanes=p, planar_pool_beats=k, planar_impl=impl,
                                 formats=("int8",) if impl == "int8" else ("int8", "fp16")),
                       depth)


def row_beats(values, lanes):
    """The beats of one row (the last one's extra lanes hold junk)."""
    wb = -(-len(values) // lanes)
    padded = np.concatenate([values, np.full(wb * lanes - len(values), 0xDEAD, np.uint32)])
    return padded.reshape(wb, lanes)


async def load(ctx, dut, rng, rows, lanes, stall=0.3):
    """Feed the beats of ``rows`` (a list of arrays), with random gaps."""
    for row in rows:
        for beat in row_beats(row, lanes):
            while rng.random() < stall:
                ctx.set(dut.load.valid, 0)
                await ctx.tick()
            ctx.set(dut.load.valid, 1)
            for i, v in enumerate(beat):
                ctx.set(dut.load.payload[i], int(v))
            await ctx.tick().until(dut.load.ready)
    ctx.set(dut.load.valid, 0)


def offsets(spread, stride, lanes):
    return [{Spread.SAME: 0, Spread.ROW: i, Spread.STEP: stride * i}[spread]
            for i in range(lanes)]


@pytest.mark.parametrize("p,k,depth,impl", [(2, 3, 64, "float"), (1, 1, 16, "float"),
                                            (2, 1, 100, "float"), (2, 1, 100, "int8"),
                                            (1, 3, 64, "int8")])
def test_load_and_read(p, k, depth, impl):
    """Planes of rows (shorter and longer than a beat) fill the ring, wrapping around it;
    every read (a base from -15 to twice the ring, each spread, strides 1 to 15) returns the
    elements at ring address ``base + offset mod DR`` two cycles later (the spread and stride
    are those of the cycle after the base). The integer build's elements are INT8
    sign-extended to 16 bits (what its converter gives): they come back whole although the
    banks keep one byte."""
    g = geometry(p, k, depth, impl)
    L, FL, DR = g.lanes, g.filter_lanes, g.ring_depth
    rng = np.random.default_rng(p * 10 + k)
    planes, rows, length = 3, 5, int(rng.integers(1, 3 * L + 2))
    total = planes * rows * length
    if impl == "int8":
        elements = rng.integers(-128, 128, total).astype(np.uint16).astype(np.uint32)
    else:
        elements = rng.integers(0, 1 << 32, total, dtype=np.uint64).astype(np.uint32)
    dut = LineBuffer(g)
    seen = {}

    async def tb(ctx):
        ctx.set(dut.load_shape.planes, planes)
        ctx.set(dut.load_shape.rows, rows)
        ctx.set(dut.load_shape.length, length)
        ctx.set(dut.load_start, 1)
        await ctx.tick()
        ctx.set(dut.load_start, 0)
        assert ctx.get(dut.loaded) == 0 and not ctx.get(dut.all_loaded)
        split = [elements[i:i + length] for i in range(0, total, length)]
        # The load's last beat: load_done in its cycle.
        for row in split[:-1]:
            await load(ctx, dut, rng, [row], L)
        last = row_beats(split[-1], L)
        await load(ctx, dut, rng, [split[-1][:(len(last) - 1) * L]], L) if len(last) > 1 \
            else None
        ctx.set(dut.load.valid, 1)
        for i, v in enumerate(last[-1]):
            ctx.set(dut.load.payload[i], int(v))
        assert ctx.get(dut.load.ready) and ctx.get(dut.load_done)
        await ctx.tick()
        ctx.set(dut.load.valid, 0)
        assert ctx.get(dut.loaded) == total and ctx.get(dut.all_loaded)
        assert not ctx.get(dut.load.ready)
        # Reads: the data of each read two cycles later.
        ring = {n % DR: elements[n] for n in range(max(0, total - DR), total)}
        ctx.set(dut.read.en, 1)
        reads = []
        for n in range(300):
            if n % 20 == 0:     # the spread and the stride hold for a task
                spread = Spread(int(rng.integers(0, 3)))
                stride = int(rng.integers(1, 16))
            base = int(rng.integers(-15, 2 * DR))
            ctx.set(dut.read.base, base)
            ctx.set(dut.read.spread, spread)
            ctx.set(dut.read.stride, stride)
            reads.append((base, spread, stride))
            await ctx.tick()
            if n % 20 != 0:
                base, spread, stride = reads[-2]
                for i, off in enumerate(offsets(spread, stride, FL)):
                    addr = (base + off) % DR
                    if addr in ring:
                        assert ctx.get(dut.data[i]) == ring[addr], (base, spread, stride, i)
                        seen[addr] = True

    run(dut, tb)
    assert len(seen) == len({n % DR for n in range(total)})


def test_keep_limits_the_loader():
    """The loader writes a beat only while its ring slots are at most ``DR`` elements past
    ``keep.first``."""
    g = geometry(2, 1, 64)
    L, DR = g.lanes, g.ring_depth
    dut = LineBuffer(g)

    async def tb(ctx):
        ctx.set(dut.load_shape.planes, 1)
        ctx.set(dut.load_shape.rows, 40)
        ctx.set(dut.load_shape.length, 8)
        ctx.set(dut.load_start, 1)
        await ctx.tick()
        ctx.set(dut.load_start, 0)
        ctx.set(dut.keep.valid, 1)
        ctx.set(dut.keep.first, 10)
        ctx.set(dut.load.valid, 1)
        while ctx.get(dut.load.ready):
            await ctx.tick()
        # The next beat would end past keep.first + DR.
        assert ctx.get(dut.loaded) + L > 10 + DR >= ctx.get(dut.loaded)
        ctx.set(dut.keep.first, 10 + L)
        assert ctx.get(dut.load.ready)
        ctx.set(dut.keep.valid, 0)
        await ctx.tick()
        assert ctx.get(dut.load.ready)

    run(dut, tb)
