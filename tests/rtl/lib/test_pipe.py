# amaranth: UnusedElaboratable=no
"""Delay lines, the typed queue and the skid buffer."""

import random

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import data

from npu.lib.pipe import DelayLine, Queue, SkidBuffer, delay
from npu_sim.streams import run_simulation, seeded_rng, stream_get, stream_put
from tests.support.csr import run

BEAT = data.StructLayout({"value": 12, "last": 1})


@pytest.mark.parametrize("enable", [False, True])
def test_delay_line(enable):
    dut = DelayLine(8, 3, enable=enable)
    rng = random.Random(3)

    async def tb(ctx):
        history = [0, 0, 0]     # the values the chain took, newest last
        for _ in range(60):
            value = rng.randrange(256)
            en = rng.random() < 0.6 if enable else True
            ctx.set(dut.i, value)
            if enable:
                ctx.set(dut.en, en)
            await ctx.tick()
            if en:
                history.append(value)
            assert [ctx.get(t) for t in dut.taps] == history[-1:-4:-1]
            assert ctx.get(dut.o) == history[-3]

    run(dut, tb)


def test_delay_function_matches_component():
    m = Module()
    i = Signal(4)
    stages = delay(m, i, 2, name="d")
    assert [s.name for s in stages] == ["d_d1", "d_d2"]

    async def tb(ctx):
        for v in (3, 9, 5, 1):
            ctx.set(i, v)
            await ctx.tick()
        assert [ctx.get(s) for s in stages] == [1, 5]

    run(m, tb)


@pytest.mark.parametrize("cls, args", [(Queue, (BEAT, 4)), (SkidBuffer, (BEAT,))])
@pytest.mark.parametrize("stall", [0.0, 0.5])
def test_stream_order_under_stalls(cls, args, stall):
    dut = cls(*args)
    inp, out = (dut.w, dut.r) if cls is Queue else (dut.i, dut.o)
    values = [BEAT.const({"value": v, "last": v % 7 == 0}).as_bits()
              for v in random.Random(1).sample(range(4096), 80)]
    got = []

    async def producer(ctx):
        rng = seeded_rng(1, "in")
        for v in values:
            await stream_put(ctx, inp, v, rng, stall)

    async def consumer(ctx):
        rng = seeded_rng(1, "out")
        for _ in values:
            got.append(await stream_get(ctx, out, rng, stall))

    run_simulation(dut, [producer, consumer])
    assert got == values


def test_skid_buffer_full_rate():
    """With the output always ready, one value passes every cycle."""
    dut = SkidBuffer(8)

    async def tb(ctx):
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.i.valid, 1)
        seen = []
        for v in range(10):
            ctx.set(dut.i.payload, v)
            assert ctx.get(dut.i.ready)
            await ctx.tick()
            if ctx.get(dut.o.valid):
                seen.append(ctx.get(dut.o.payload))
        assert seen == list(range(10))

    run(dut, tb)


def test_queue_level_and_depth():
    dut = Queue(8, 3)

    async def tb(ctx):
        ctx.set(dut.w.valid, 1)
        for v in range(5):
            ctx.set(dut.w.payload, v)
            await ctx.tick()
        assert ctx.get(dut.level) == 3 and not ctx.get(dut.w.ready)
        ctx.set(dut.w.valid, 0)
        ctx.set(dut.r.ready, 1)
        out = []
        for _ in range(4):
            if ctx.get(dut.r.valid):
                out.append(ctx.get(dut.r.payload))
            await ctx.tick()
        assert out == [0, 1, 2]

    run(dut, tb)


@pytest.mark.parametrize("cls, args, message", [
    (DelayLine, (8, 0), "depth"),
    (Queue, (8, 0), "depth"),
    (Queue, ("x", 4), "shape-castable"),
])
def test_bad_arguments(cls, args, message):
    with pytest.raises((TypeError, ValueError), match=message):
        cls(*args)
