# amaranth: UnusedElaboratable=no
"""The format converters against the golden model's (:mod:`npu_model.fp`)."""

import numpy as np
from amaranth.hdl import ClockDomain, Module, Signal, signed
from amaranth.sim import Simulator

from npu.planar.convert import ToF32, f32_round_pack, from_f32, to_f32
from npu.planar.layouts import Fmt
from npu_model import fp
from npu_model import planar as pl
from npu_sim.streams import seeded_rng, stream_get, stream_put
from tests.support.planar import f32_classes, run


def test_from_f32():
    rng = np.random.default_rng(1)
    a = f32_classes(rng, 3000)
    m = Module()
    x = Signal(32)
    h = from_f32(m, x, 1, "h")
    i = from_f32(m, x, 0, "i")
    got = []

    async def tb(ctx):
        for v in a:
            ctx.set(x, int(v))
            await ctx.delay(1e-9)
            got.append((ctx.get(h), ctx.get(i)))
    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()
    gh = np.array([g[0] for g in got], dtype=np.uint16)
    gi = np.array([g[1] for g in got], dtype=np.uint16).view(np.int16)
    assert np.array_equal(gh, fp.f32_to_f16(a))
    assert np.array_equal(gi, fp.f32_to_int8(a).astype(np.int16))


def test_to_f32():
    h = np.arange(0, 1 << 16, 7, dtype=np.uint32)
    m = Module()
    x = Signal(16)
    f = to_f32(m, x, 1, "f")
    i = to_f32(m, x, 0, "i")
    got = []

    async def tb(ctx):
        for v in h:
            ctx.set(x, int(v))
            await ctx.delay(1e-9)
            got.append((ctx.get(f), ctx.get(i)))
    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()
    gf = np.array([g[0] for g in got], dtype=np.uint32)
    gi = np.array([g[1] for g in got], dtype=np.uint32)
    assert np.array_equal(gf, fp.f16_to_f32(h))
    assert np.array_equal(gi, fp.int8_to_f32((h & 0xFF).astype(np.uint8).view(np.int8)))


def test_round_pack():
    rng = np.random.default_rng(4)
    n = 2000
    sig = rng.integers(0, 1 << 30, n, dtype=np.int64) >> rng.integers(0, 30, n)
    exp = rng.integers(-200, 120, n)
    sign = rng.integers(0, 2, n)
    m = Module()
    s_sig, s_sign = Signal(30), Signal()
    s_exp = Signal(signed(12))
    out = f32_round_pack(m, s_sign, s_sig, s_exp, "p")
    got = []

    async def tb(ctx):
        for a, b, c in zip(sign, sig, exp):
            ctx.set(s_sign, int(a))
            ctx.set(s_sig, int(b))
            ctx.set(s_exp, int(c))
            await ctx.delay(1e-9)
            got.append(ctx.get(out))
    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()
    assert np.array_equal(np.array(got, dtype=np.uint32), fp.f32_pack(sign, sig, exp))


def test_to_f32_stream():
    """The first converter on a stream: beats of both formats, valid and ready passed through
    (random stalls on both sides)."""
    lanes = 4
    dut = ToF32(lanes)
    rng = np.random.default_rng(3)
    beats = {fmt: rng.integers(0, 1 << 16, (40, lanes)) for fmt in (pl.FMT_INT8, pl.FMT_FP16)}
    got = []

    async def producer(ctx):
        prng = seeded_rng(1, "i")
        for fmt, values in beats.items():
            ctx.set(dut.fmt, Fmt(fmt))
            for beat in values:
                word = sum(int(v) << (16 * i) for i, v in enumerate(beat))
                await stream_put(ctx, dut.i, word, prng, 0.3)
            await ctx.tick().repeat(3)

    async def consumer(ctx):
        crng = seeded_rng(1, "o")
        for _ in range(2 * 40):
            word = await stream_get(ctx, dut.o, crng, 0.3)
            got.append([(word >> (32 * i)) & 0xFFFF_FFFF for i in range(lanes)])

    top = Module()
    top.submodules.dut = dut
    top.domains.sync = ClockDomain()
    run(top, producer, consumer)
    expected = [pl.to_f32((values & 0xFF).astype(np.uint8).view(np.int8), pl.FMT_INT8)
                if fmt == pl.FMT_INT8 else pl.to_f32(values, pl.FMT_FP16)
                for fmt, values in beats.items()]
    assert np.array_equal(np.array(got, dtype=np.uint32), np.concatenate(expected))
