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
    """Lane pipeline beats leave converted, masked lanes 0, from the second of two output
    registers two cycles after they are taken, in order, a beat a cycle while the output is
    ready; the pipeline advances when the registers advance (the second empty or its beat
    leaving) or it has no beat; ``idle`` when every beat entered has left and both registers
    are empty."""
    lanes = 4
    rng = np.random.default_rng(int(out_fmt))
    dut = OutputStage(lanes)
    values = f32_classes(rng, 200)[:200].reshape(50, lanes)
    masks = rng.integers(1, 1 << lanes, 50)
    expected = [np.where(np.array([mask >> i & 1 for i in range(lanes)], bool),
                         pl.from_f32(beat, out_fmt).astype(np.int64) & 0xFFFF, 0).tolist()
                for mask, beat in zip(masks, values)]
    got = []

    async def tb(ctx):
        set_task(ctx, dut.task, make_task(mode=Mode.ELTWISE, out_fmt=out_fmt))
        entered = taken = 0
        first = full = False        # the model of the two output registers
        streak = 0                  # cycles in a row with a beat out
        for _ in range(400):
            if taken == len(values) and not first and not full:
                break
            entering = entered < len(values)
            valid = taken < entered and rng.random() < 0.8
            ready = rng.random() < 0.7 or streak > 0 and streak < 6
            ctx.set(dut.entering, entering)
            ctx.set(dut.lane.valid, valid)
            if valid:
                ctx.set(dut.lane.mask, int(masks[taken]))
                for i, v in enumerate(values[taken]):
                    ctx.set(dut.lane.value[i], int(v))
            ctx.set(dut.out.ready, ready)
            lane_en = ctx.get(dut.lane_en)
            assert lane_en == (not valid or not full or ready)
            assert ctx.get(dut.out.valid) == full
            assert ctx.get(dut.idle) == (entered == len(got) and not first and not full)
            if full and ready:
                got.append([ctx.get(dut.out.payload.data[i]) for i in range(lanes)])
            streak = streak + 1 if full and ready else 0
            if not full or ready:
                first, full = valid, first
            taken += valid and lane_en
            entered += entering and lane_en
            await ctx.tick()
        assert ctx.get(dut.idle) and not ctx.get(dut.out.valid)

    run(dut, tb)
    assert got == expected


def test_reduction_results_and_accumulation():
    """A reduction's result leaves in lane 0 from the second output register two cycles after
    it is taken (the lane pipeline never waits; the tree waits while that register is full
    and not taken; not ``idle`` while either register is full); while the channel accumulator
    takes the lane results, nothing leaves and the pipeline waits on its hazard."""
    lanes = 2
    dut = OutputStage(lanes)
    value = int(np.float32(-2.5).view(np.uint32))

    async def tb(ctx):
        set_task(ctx, dut.task, make_task(mode=Mode.REDUCE, axis=Axis.PLANE, out_fmt=Fmt.FP16))
        ctx.set(dut.tree.valid, 1)
        ctx.set(dut.tree.payload, value)
        ctx.set(dut.lane.valid, 1)
        ctx.set(dut.entering, 1)
        ctx.set(dut.out.ready, 0)
        assert not ctx.get(dut.out.valid) and ctx.get(dut.lane_en) and ctx.get(dut.tree.ready)
        assert ctx.get(dut.idle)
        await ctx.tick()
        ctx.set(dut.tree.valid, 0)
        assert not ctx.get(dut.out.valid) and ctx.get(dut.tree.ready)
        assert not ctx.get(dut.idle)    # the result is in the first register
        await ctx.tick()
        assert ctx.get(dut.out.valid) and ctx.get(dut.lane_en) and not ctx.get(dut.tree.ready)
        assert not ctx.get(dut.idle)    # the result has not left
        assert ctx.get(dut.out.payload.data[0]) == int(pl.from_f32(np.uint32(value), Fmt.FP16))
        assert ctx.get(dut.out.payload.data[1]) == 0
        await ctx.tick()
        assert ctx.get(dut.out.valid)   # held until taken
        ctx.set(dut.out.ready, 1)
        assert ctx.get(dut.tree.ready)
        await ctx.tick()
        assert ctx.get(dut.idle) and not ctx.get(dut.out.valid)  # beats into the tree do not count
        set_task(ctx, dut.task, make_task(mode=Mode.REDUCE, axis=Axis.CHANNEL))
        ctx.set(dut.accumulating, 1)
        ctx.set(dut.out.ready, 0)
        for hazard in (0, 1):
            ctx.set(dut.hazard, hazard)
            assert ctx.get(dut.lane_en) == (not hazard)
        await ctx.tick()
        assert ctx.get(dut.idle) and not ctx.get(dut.out.valid)  # nor beats into the accumulator
        ctx.set(dut.accumulating, 0)
        ctx.set(dut.entering, 0)
        for _ in range(2):              # the registers are empty: they take two beats
            assert ctx.get(dut.lane_en)
            await ctx.tick()
        assert ctx.get(dut.out.valid) and not ctx.get(dut.lane_en)

    run(dut, tb)
