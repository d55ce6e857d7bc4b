# amaranth: UnusedElaboratable=no
"""The post-processor (square root, reciprocal) against the golden model, bit for bit."""

import numpy as np
import pytest

from npu.planar.layouts import PostFn
from npu.planar.postproc import PostProcessor
from npu_model import planar as pl
from npu_sim.streams import run_simulation
from tests.support.planar import f32_classes


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
