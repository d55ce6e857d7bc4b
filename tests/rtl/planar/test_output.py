# amaranth: UnusedElaboratable=no
"""The output stage: the second format converter against the golden model's
(:func:`npu_model.planar.from_f32`), the output stream and the lane pipeline's advance."""

import numpy as np
import pytest

from npu.planar.output import OutputStage
from npu_model import planar as pl
from npu_spec.planar import Axis, Fmt, Mode, make_task
from tests.support.planar import f32_classes, run, set_task


@pytest.mark.parametrize("out_fmt", [Fmt.INT8, Fmt.FP16])
def test_lane_results(out_fmt):
    """Lane pipeline beats leave converted, masked lanes 0; the pipeline advances when the
    output is taken or empty; ``idle`` counts the beats entered and not yet left."""
    lanes = 4
    rng = np.random.default_rng(int(out_fmt))
    dut = OutputStage(lanes)
    values = f32_classes(rng, 200)[:200].reshape(50, lanes)
    masks = rng.integers(1, 1 << lanes, 50)

    async def tb(ctx):
        set_task(ctx, dut.task, make_task(mode=Mode.ELTWISE, out_fmt=out_fmt))
        for n in range(3):          # three beats enter
            ctx.set(dut.entering, 1)
            assert ctx.get(dut.lane_en)
            await ctx.tick()
        ctx.set(dut.entering, 0)
        assert not ctx.get(dut.idle)
        # Each beat taken lets another one enter: three stay in the pipeline.
        ctx.set(dut.entering, 1)
        for mask, beat in zip(masks, values):
            ctx.set(dut.lane.valid, 1)
            ctx.set(dut.lane.mask, int(mask))
            for i, v in enumerate(beat):
                ctx.set(dut.lane.value[i], int(v))
            ready = rng.random() < 0.6
            ctx.set(dut.out.ready, ready)
            assert ctx.get(dut.out.valid) and ctx.get(dut.lane_en) == ready
            expected = np.where(np.array([mask >> i & 1 for i in range(lanes)], bool),
                                pl.from_f32(beat, out_fmt).astype(np.int64) & 0xFFFF, 0)
            assert [ctx.get(dut.out.payload.data[i]) for i in range(lanes)] == expected.tolist()
            await ctx.tick()
            assert not ctx.get(dut.idle)
        # The last three leave.
        ctx.set(dut.entering, 0)
        ctx.set(dut.out.ready, 1)
        for n in range(3):
            assert not ctx.get(dut.idle)
            await ctx.tick()
        assert ctx.get(dut.idle)
        ctx.set(dut.lane.valid, 0)
        ctx.set(dut.out.ready, 0)
        assert ctx.get(dut.lane_en) and not ctx.get(dut.out.valid)

    run(dut, tb)


def test_reduction_results_and_accumulation():
    """A reduction's result leaves in lane 0 (the lane pipeline never waits); while the channel
    accumulator takes the lane results, nothing leaves and the pipeline waits on its hazard."""
    lanes = 2
    dut = OutputStage(lanes)
    value = int(np.float32(-2.5).view(np.uint32))

    async def tb(ctx):
        set_task(ctx, dut.task, make_task(mode=Mode.REDUCE, axis=Axis.PLANE, out_fmt=Fmt.FP16))
        ctx.set(dut.tree.valid, 1)
        ctx.set(dut.tree.payload, value)
        ctx.set(dut.lane.valid, 1)
        ctx.set(dut.out.ready, 0)
        assert ctx.get(dut.out.valid) and ctx.get(dut.lane_en) and not ctx.get(dut.tree.ready)
        assert ctx.get(dut.out.payload.data[0]) == int(pl.from_f32(np.uint32(value), Fmt.FP16))
        assert ctx.get(dut.out.payload.data[1]) == 0
        ctx.set(dut.out.ready, 1)
        assert ctx.get(dut.tree.ready)
        ctx.set(dut.entering, 1)
        await ctx.tick()
        assert ctx.get(dut.idle)        # beats into the tree do not count
        ctx.set(dut.tree.valid, 0)
        set_task(ctx, dut.task, make_task(mode=Mode.REDUCE, axis=Axis.CHANNEL))
        ctx.set(dut.accumulating, 1)
        ctx.set(dut.out.ready, 0)
        for hazard in (0, 1):
            ctx.set(dut.hazard, hazard)
            assert not ctx.get(dut.out.valid) and ctx.get(dut.lane_en) == (not hazard)
        await ctx.tick()
        assert ctx.get(dut.idle)        # nor beats into the accumulator
        ctx.set(dut.accumulating, 0)
        assert ctx.get(dut.out.valid) and not ctx.get(dut.lane_en)

    run(dut, tb)
