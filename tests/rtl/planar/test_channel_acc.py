# amaranth: UnusedElaboratable=no
"""The channel accumulator, with the H ring and the horizontal filter's pipes it borrows,
against the golden model's fold across channels (:func:`npu_model.planar.fold_channels`)."""

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module

from npu.planar.channel_acc import ChannelAcc
from npu.planar.geometry import Geometry
from npu.planar.h_ring import HRing
from npu.planar.hfilter import HFilter
from npu.planar.layouts import EltOp
from npu_model import fp
from npu_model import planar as pl
from npu_spec.config import NPUConfig
from npu_spec.planar import make_task
from tests.support.planar import run, set_task


class Accumulator(Elaboratable):
    def __init__(self, geometry):
        self.acc = ChannelAcc(geometry)
        self.ring = HRing(geometry)
        self.pipes = HFilter(geometry)

    def elaborate(self, platform):
        m = Module()
        m.submodules.acc = acc = self.acc
        m.submodules.ring = ring = self.ring
        m.submodules.pipes = hf = self.pipes
        m.d.comb += [hf.task.eq(acc.task), hf.borrowed.eq(acc.active), hf.borrow.eq(acc.fold),
                     ring.acc_mode.eq(acc.active), ring.acc_write.eq(acc.ring_write),
                     ring.acc_read.eq(acc.ring_read), ring.data.eq(hf.fold),
                     acc.ring_data.eq(ring.read_data)]
        return m


@pytest.mark.parametrize("p,shape,op,seed", [
    (1, (3, 1, 1), 0, 1), (1, (4, 2, 2), 1, 2), (2, (5, 1, 4), 2, 3), (2, (3, 3, 7), 0, 4),
    (2, (6, 2, 9), 1, 5), (1, (2, 6, 1), 2, 6),
])
def test_channel_acc(p, shape, op, seed):
    """Planes of one to several beats (under five: the hazard holds the lane pipeline), beats
    arriving with gaps, then the output pass with the pipeline stalled at random."""
    g = Geometry.of(NPUConfig(planar_lanes=p), 1024)
    L = g.lanes
    c, h, w = shape
    wb = -(-w // L)
    rng = np.random.default_rng(seed)
    x = fp.f32_bits((rng.standard_normal((c, h, w)) * 50).astype(np.float32))
    beats = np.zeros((c, h, wb * L), dtype=np.uint32)
    beats[..., :w] = x
    beats = beats.reshape(c, h * wb, L)
    scale = int(fp.f32_bits(np.float32(-1.5)))
    task = make_task(mode=2, axis=2, op=op, channels=c, height=h, width=w, scale=scale)
    dut = Accumulator(g)
    acc = dut.acc
    out = []
    hazards = []

    async def tb(ctx):
        set_task(ctx, acc.task, task)
        ctx.set(acc.sizes.beats_plane, h * wb)
        ctx.set(acc.clear, 1)
        await ctx.tick()
        ctx.set(acc.clear, 0)
        assert ctx.get(acc.accumulating) and ctx.get(acc.active)
        # The lane pipeline's output: a beat stays until the accumulator takes it.
        for plane in beats:
            for beat in plane:
                while rng.random() < 0.3:
                    ctx.set(acc.lane.valid, 0)
                    ctx.set(acc.en, 1)
                    await ctx.tick()
                ctx.set(acc.lane.valid, 1)
                for i, v in enumerate(beat):
                    ctx.set(acc.lane.value[i], int(v))
                while True:
                    hazard = ctx.get(acc.hazard)
                    hazards.append(hazard)
                    ctx.set(acc.en, not hazard)
                    await ctx.tick()
                    if not hazard:
                        break
        ctx.set(acc.lane.valid, 0)
        while not ctx.get(acc.done):
            await ctx.tick()
        # The output pass.
        ctx.set(acc.drain_start, 1)
        await ctx.tick()
        ctx.set(acc.drain_start, 0)
        assert not ctx.get(acc.accumulating)
        issued = 0
        while len(out) < h * wb:
            en = rng.random() < 0.7
            ctx.set(acc.en, en)
            ctx.set(acc.drain, issued < h * wb)
            ctx.set(acc.beat_mask, sum(1 << i for i in range(L) if (issued % wb) * L + i < w))
            if en and ctx.get(acc.beat.valid):
                out.append((ctx.get(acc.beat.mask), ctx.get(acc.beat.op),
                            [ctx.get(acc.beat.a[i]) for i in range(L)],
                            [ctx.get(acc.beat.b[i]) for i in range(L)]))
            await ctx.tick()
            if en:
                issued += 1

    run(dut, tb)
    folded = pl.fold_channels(x, op)                     # (H, W)
    for k, (mask, beat_op, a, b) in enumerate(out):
        y, xb = divmod(k, wb)
        cols = [i for i in range(L) if xb * L + i < w]
        assert beat_op == EltOp.MUL and mask == sum(1 << i for i in cols)
        assert [a[i] for i in cols] == folded[y, xb * L:xb * L + len(cols)].tolist(), (k, y)
        assert all(b[i] == scale for i in cols)
    # A plane of fewer than five beats makes the next channel's beat wait for its word.
    assert any(hazards) == (c > 1 and h * wb < 5)
