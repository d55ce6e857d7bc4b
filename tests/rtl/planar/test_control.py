# amaranth: UnusedElaboratable=no
"""The control unit: its task check against the specification's rules
(:func:`npu_spec.planar.task_error`), the sizes it computes, and the order in which it feeds
operand beats (:func:`npu_spec.planar.operand_beats`)."""

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module, ResetInserter, Signal

from npu.planar.control import Control
from npu.planar.geometry import Geometry
from npu_sim import planar as ps
from npu_spec.config import NPUConfig
from npu_spec.planar import (
    INT8_CHANNEL_SUM,
    INT8_SUM_ELEMENTS,
    TASK_FIELDS,
    Bcast,
    Mode,
    PlanarError,
    make_task,
    operand_beats,
    pool_output_size,
    task_error,
)
from tests.support.planar import pool_sizes, run, set_task


class Resettable(Elaboratable):
    def __init__(self, dut):
        self.dut = dut
        self.rst = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = ResetInserter(self.rst)(self.dut)
        return m


#: Binary32 constants for ``SCALE``, ``BIAS`` and ``SCALAR``: zeros, one, integers in and out
#: of the integer build's range, fractions, infinities, NaN, a subnormal.
CONSTANTS = [0, 0x8000_0000, 0x3F80_0000, 0xBF80_0000, 0x4040_0000, 0xC300_0000, 0x467F_FC00,
             0x4680_0000, 0xC67F_FC00, 0x3F00_0000, 0x4020_0000, 0x7F80_0000, 0x7FC0_0000, 1]


def wild_task(rng):
    """Any field values: codes outside their enums, zero and huge sizes, empty windows, any
    constants."""
    def small(top):
        return int(rng.choice([0, 1, 2, 3, int(rng.integers(0, top + 1))]))
    task = {name: 0 for name in TASK_FIELDS}
    task.update(mode=int(rng.integers(0, 4)), op=int(rng.integers(0, 16)),
                in_fmt=int(rng.random() < 0.1), out_fmt=int(rng.random() < 0.1),
                bcast=int(rng.integers(0, 8)), pre=small(15), post=small(3), axis=small(3))
    for name in ("channels", "height", "width"):
        task[name] = int(rng.choice([small(20), int(rng.integers(0, 4096))], p=[0.85, 0.15]))
    for name in ("kh", "kw", "sy", "sx", "py", "px"):
        task[name] = small(15)
    for name in ("scale", "bias", "scalar"):
        task[name] = int(rng.choice(CONSTANTS))
    return task


def bound_tasks(lanes):
    """Sums at the integer build's limits (``INT8_SUM_ELEMENTS`` elements over a plane or the
    tensor, ``INT8_CHANNEL_SUM`` channels) and one beat or channel beyond: a plane of 128 rows
    of ``w`` elements (every plane of three), the tensor of two planes of 64 such rows (the
    limit counts whole beats: ``w + 1`` is one beat more per row), sums across channels."""
    one = 0x3F80_0000
    w = INT8_SUM_ELEMENTS // 128
    return [make_task(mode=Mode.REDUCE, scale=one, channels=c, height=128, width=w + d)
            for c, d in ((1, 0), (1, 1), (3, 0))] + [
        make_task(mode=Mode.REDUCE, scale=one, axis=1, channels=2, height=64, width=w + d)
        for d in (1 - lanes, 1)] + [
        make_task(mode=Mode.REDUCE, scale=one, axis=2, channels=c, height=2, width=3)
        for c in (INT8_CHANNEL_SUM, INT8_CHANNEL_SUM + 1)]


@pytest.mark.parametrize("fp16,depth,impl", [(True, 1024, "float"), (False, 64, "float"),
                                             (False, 1024, "int8"), (False, 64, "int8")])
def test_check_matches_task_error(fp16, depth, impl):
    """Random tasks, valid and invalid, with codes outside their enums, zero and huge sizes,
    empty and too large windows, planes that do not fit the line buffers and any constants
    (and, in the integer build, the sums at its limits): the error the control unit reports
    is the specification's."""
    config = NPUConfig(planar_lanes=2, planar_pool_beats=3, planar_impl=impl,
                       formats=("int8", "fp16", "mixed") if fp16 else ("int8",))
    g = Geometry.of(config, depth)
    rng = np.random.default_rng(depth)
    tasks = bound_tasks(g.lanes) if impl == "int8" else []
    for k in range(400):
        if k % 3 == 0:
            tasks.append(ps.random_task(rng, config, max_dim=30 if depth > 64 else 12))
        else:
            tasks.append(wild_task(rng))
    top = Resettable(Control(g, has_fp16=fp16))
    dut = top.dut
    seen = set()

    async def tb(ctx):
        for task in tasks:
            set_task(ctx, dut.task_regs, task)
            ctx.set(dut.go, 1)
            await ctx.tick()
            ctx.set(dut.go, 0)
            while not ctx.get(dut.clear):
                await ctx.tick()
            await ctx.tick()
            code = PlanarError(ctx.get(dut.code).value)
            assert code == task_error(task, config, depth), task
            assert ctx.get(dut.finish) == (code != PlanarError.NONE)
            seen.add(code)
            ctx.set(top.rst, 1)
            await ctx.tick()
            ctx.set(top.rst, 0)

    run(top, tb)
    assert seen == set(PlanarError) - ({PlanarError.BAD_FORMAT} if fp16 else set()) - (
        {PlanarError.UNSUPPORTED} if impl == "float" else set())
    if impl == "int8":
        lanes = g.lanes
        assert [task_error(t, config, depth) for t in bound_tasks(lanes)] == [
            PlanarError.NONE, PlanarError.UNSUPPORTED, PlanarError.NONE,
            PlanarError.NONE if lanes > 1 else PlanarError.UNSUPPORTED,
            PlanarError.UNSUPPORTED, PlanarError.NONE, PlanarError.UNSUPPORTED]


@pytest.mark.parametrize("p,k", [(1, 1), (2, 3), (4, 1)])
def test_sizes(p, k):
    """The products registered for the other units (pooling and reduction tasks)."""
    config = NPUConfig(planar_lanes=p, planar_pool_beats=k)
    g = Geometry.of(config, 1024)
    rng = np.random.default_rng(p + k)
    tasks = [ps.random_task(rng, config, mode, max_dim=40) for mode in ("pool", "reduce") * 20]
    top = Resettable(Control(g))
    dut = top.dut

    async def tb(ctx):
        for task in tasks:
            set_task(ctx, dut.task_regs, task)
            ctx.set(dut.go, 1)
            await ctx.tick()
            ctx.set(dut.go, 0)
            while not ctx.get(dut.clear):
                await ctx.tick()
            await ctx.tick()
            expected = pool_sizes(task, g.lanes, g.filter_lanes)
            if task["mode"] == Mode.REDUCE:
                expected = {key: expected[key] for key in ("wb", "beats_plane", "rows")}
                group = expected["beats_plane"] * (task["channels"] if task["axis"] == 1 else 1)
                assert ctx.get(dut.sizes.beats_group) == group
            else:
                assert pool_output_size(task)[1] <= expected["owb"] * g.filter_lanes
            for name, value in expected.items():
                if name != "beats_group":
                    assert ctx.get(getattr(dut.sizes, name)) == value, (name, task)
            ctx.set(top.rst, 1)
            await ctx.tick()
            ctx.set(top.rst, 0)

    run(top, tb)


@pytest.mark.parametrize("bcast", [Bcast.NONE, Bcast.SCALAR, Bcast.CHANNEL, Bcast.ROW,
                                   Bcast.COLUMN])
def test_elementwise_sequence(bcast):
    """An elementwise task (fma): the vector on B is loaded first; then every beat of A, B and
    C enters the lane pipeline in raster order with its lanes' mask, and the line buffer reads
    each beat's vector element in the cycle before it enters."""
    config = NPUConfig(planar_lanes=2)
    g = Geometry.of(config, 1024)
    L = g.lanes
    rng = np.random.default_rng(int(bcast))
    task = make_task(mode=Mode.ELTWISE, op="fma", bcast=bcast, channels=3, height=2, width=6)
    counts = operand_beats(task, L)
    wb = -(-task["width"] // L)
    raster = [(ch, y, xb) for ch in range(3) for y in range(2) for xb in range(wb)]
    dut = Control(g)
    entered = []
    loaded = []
    bases = []

    async def stream(ctx, port, n, tag):
        for k in range(n):
            while rng.random() < 0.3:
                ctx.set(port.valid, 0)
                await ctx.tick()
            ctx.set(port.valid, 1)
            ctx.set(port.payload[0], tag + k)
            await ctx.tick().until(port.ready)
        ctx.set(port.valid, 0)

    async def control(ctx):
        set_task(ctx, dut.task_regs, task)
        ctx.set(dut.go, 1)
        await ctx.tick()
        ctx.set(dut.go, 0)
        await ctx.tick().until(dut.finish)

    async def vector(ctx):
        # The line buffer takes the vector; its last beat is the load's last.
        async for _, _, start, length, valid, ready in ctx.tick().sample(
                dut.load_start, dut.load_shape.length, dut.load.valid, dut.load.ready):
            ctx.set(dut.load.ready, 1)
            ctx.set(dut.load_done, 0)
            if start:
                loaded.append(("start", length))
            if valid and ready:
                loaded.append(int(ctx.get(dut.load.payload[0])))
            if len(loaded) == counts["b"] and loaded and bcast >= Bcast.CHANNEL:
                ctx.set(dut.load_done, int(ctx.get(dut.load.valid)))

    async def lanes(ctx):
        async for _, _, lane_in, en, base in ctx.tick().sample(dut.lane_in, dut.lane_en,
                                                               dut.read.base):
            if lane_in.valid and en:
                entered.append((int(lane_in.a[0]), int(lane_in.b[0]), int(lane_in.c[0]),
                                int(lane_in.mask), int(lane_in.vector), bases[-1]))
            bases.append(int(base))
            ctx.set(dut.lane_en, int(rng.random() < 0.7))
            ctx.set(dut.lane_idle, 1)

    def feeder(port, n, tag):
        async def feed(ctx):
            await stream(ctx, port, n, tag)
        return feed

    streams = [feeder(dut.a, counts["a"], 0), feeder(dut.b, counts["b"], 1000),
               feeder(dut.c, counts["c"], 2000)]
    run(dut, control, *streams, background=[vector, lanes])
    vector_beats = counts["b"] if bcast >= Bcast.CHANNEL else 0
    if vector_beats:
        length = {Bcast.CHANNEL: 3, Bcast.ROW: 6, Bcast.COLUMN: 2}[bcast]
        assert loaded == [("start", length), *range(1000, 1000 + vector_beats)]
    assert len(entered) == len(raster)
    for k, ((ch, y, xb), (a, b, c, mask, vec, base)) in enumerate(zip(raster, entered)):
        assert a == k and c == 2000 + k
        if bcast == Bcast.NONE:
            assert b == 1000 + k
        assert mask == sum(1 << i for i in range(L) if xb * L + i < task["width"])
        assert vec == (bcast >= Bcast.CHANNEL)
        if vec:
            assert base == {Bcast.CHANNEL: ch, Bcast.ROW: xb * L, Bcast.COLUMN: y}[bcast]


def test_reduction_sequence():
    """A reduction per plane: each plane's beats, then a wait for its result; the task ends
    after the last plane's result, once it has left the output register (``lane_idle``)."""
    config = NPUConfig(planar_lanes=1)
    g = Geometry.of(config, 1024)
    task = make_task(mode=Mode.REDUCE, op="sum", channels=3, height=2, width=2)
    dut = Control(g)
    events = []

    async def tb(ctx):
        set_task(ctx, dut.task_regs, task)
        ctx.set(dut.lane_en, 1)
        ctx.set(dut.go, 1)
        await ctx.tick()
        ctx.set(dut.go, 0)
        ctx.set(dut.a.valid, 1)
        for _ in range(60):
            if ctx.get(dut.a.ready):
                events.append("beat")
            if ctx.get(dut.finish):
                events.append("finish")
                break
            await ctx.tick()
            if len(events) >= 4 and events[-4:] == ["beat"] * 4:
                for _ in range(5):      # waits for the plane's result
                    assert not ctx.get(dut.a.ready) and not ctx.get(dut.finish)
                    await ctx.tick()
                ctx.set(dut.group_done, 1)
                await ctx.tick()
                ctx.set(dut.group_done, 0)
                events.append("result")
                if events.count("result") == 3:
                    for _ in range(4):  # the result still in the output register
                        assert not ctx.get(dut.finish)
                        await ctx.tick()
                    ctx.set(dut.lane_idle, 1)

    run(dut, tb)
    assert events == (["beat"] * 4 + ["result"]) * 3 + ["finish"]
