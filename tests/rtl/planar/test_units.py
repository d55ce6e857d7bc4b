# amaranth: UnusedElaboratable=no
"""Planar engine sub-blocks against the golden model: converters and the post-processor."""

import numpy as np
import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator
from npu.planar.convert import f32_round_pack, from_f32, to_f32
from npu.planar.layouts import PostFn
from npu.planar.postproc import PostProcessor
from npu_model import fp
from npu_model import planar as pl
from npu_sim.streams import run_simulation


def f32_classes(rng, n):
    e = rng.choice([0, 1, 2, 100, 112, 113, 120, 126, 127, 128, 140, 142, 143, 150, 200, 254,
                    255], n).astype(np.uint32)
    e = np.where(rng.random(n) < 0.5, rng.integers(0, 256, n), e).astype(np.uint32)
    f = rng.integers(0, 1 << 23, n).astype(np.uint32)
    f = np.where(rng.random(n) < 0.3, f & 0x7FE000, f).astype(np.uint32)  # ties for binary16
    s = rng.integers(0, 2, n).astype(np.uint32)
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 1,
                        0x3F000000, 0x3FC00000, 0x40200000, 0xBF000000, 0x42FF0000, 0x42FE0000,
                        0xC3008000, 0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001],
                       dtype=np.uint32)
    return np.concatenate([(s << 31) | (e << 23) | f, special])




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
    from amaranth.hdl import signed
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


def run_post(fn, a):
    dut = PostProcessor()
    got = []

    async def tb(ctx):
        for v in a:
            ctx.set(dut.x, int(v))
            ctx.set(dut.fn, fn)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            await ctx.tick().until(dut.done)
            got.append(ctx.get(dut.result))
    run_simulation(dut, [tb])
    return np.array(got, dtype=np.uint32)


@pytest.mark.parametrize("fn,ref", [(PostFn.SQRT, pl.f32_sqrt), (PostFn.RECIP, pl.f32_recip),
                                    (PostFn.RSQRT, pl.f32_rsqrt),
                                    (PostFn.NONE, lambda a: a)])
def test_postproc(fn, ref):
    rng = np.random.default_rng(int(fn.value) + 5)
    a = f32_classes(rng, 150)
    got = run_post(fn, a)
    exp = ref(a)
    bad = np.nonzero(got != exp)[0]
    assert bad.size == 0, [f"{a[i]:08x}: {got[i]:08x} != {exp[i]:08x}" for i in bad[:6]]


@pytest.mark.slow
@pytest.mark.parametrize("fn,ref", [(PostFn.SQRT, pl.f32_sqrt), (PostFn.RECIP, pl.f32_recip)])
def test_postproc_big(fn, ref):
    a = f32_classes(np.random.default_rng(77), 4000)
    assert np.array_equal(run_post(fn, a), ref(a))
