# amaranth: UnusedElaboratable=no
"""The binary32 adder / max / min / compare pipeline against the golden model
(npu_model.fp.f32_add, f32_max, f32_min, f32_cmp), over every class of operand, with stalls."""

import numpy as np
import pytest

from npu.lib.fp32 import FP32AddPipe, MacOp
from npu_model import fp
from npu_sim.streams import run_simulation
from npu_spec.formats import F32_MINUS_ONE, F32_ONE

SPECIALS = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
                     0xFFFFFFFF, 0x3F800000, 0xBF800000, 0x00000001, 0x807FFFFF, 0x7F7FFFFF,
                     0x00800000, 0x80800000], dtype=np.uint32)


def operands(rng, n):
    """Random pairs: any bits, close exponents (cancellation), subnormals, specials."""
    def bits(k):
        return rng.integers(0, 1 << 32, k, dtype=np.uint64).astype(np.uint32)

    k = n // 4
    a = np.concatenate([bits(k), bits(k), bits(k) & np.uint32(0x807FFFFF),
                        rng.choice(SPECIALS, k)])
    # b near a (same exponent, random sign and low bits) for a quarter of the pairs.
    near = (a[:k] & np.uint32(0x7FFFFF00)) | (bits(k) & np.uint32(0x800000FF))
    b = np.concatenate([near, bits(k), rng.choice(SPECIALS, k), bits(k)])
    return a, b


def expected(op, a, b):
    if op is MacOp.MAC:
        return fp.f32_add(a, b)
    if op is MacOp.MAX:
        return fp.f32_max(a, b)
    if op is MacOp.MIN:
        return fp.f32_min(a, b)
    c = fp.f32_cmp(b, a)          # +1 when b > a
    return np.where(c > 0, F32_ONE, np.where(c < 0, F32_MINUS_ONE, 0)).astype(np.uint32)


def run_adder(op, a, b, rng):
    """The adder's results for the operand pairs ``a``, ``b``, with random stall cycles."""
    dut = FP32AddPipe()
    got = []

    async def tb(ctx):
        # Present the operands with random stall cycles (en low); a result leaves LATENCY
        # advancing cycles after its operands.
        ctx.set(dut.op, op)
        pending = []
        k = 0
        while len(got) < len(a):
            en = rng.random() > 0.3
            if k < len(a):
                ctx.set(dut.a, int(a[k]))
                ctx.set(dut.b, int(b[k]))
            ctx.set(dut.en, en)
            if en:
                pending.append(k < len(a))
                k += k < len(a)
            await ctx.tick()
            if en and len(pending) > FP32AddPipe.LATENCY:
                pending.pop(0)
            if en and len(pending) == FP32AddPipe.LATENCY and pending[0]:
                got.append(ctx.get(dut.result))

    run_simulation(dut, [tb])
    return got


@pytest.mark.parametrize("op", list(MacOp), ids=lambda op: op.name)
def test_against_golden_model(op):
    rng = np.random.default_rng(int(op.value) + 7)
    a, b = operands(rng, 400)
    want = expected(op, a, b)
    got = run_adder(op, a, b, rng)
    bad = [(hex(a[i]), hex(b[i]), hex(got[i]), hex(want[i]))
           for i in range(len(a)) if got[i] != want[i]]
    assert not bad, bad[:5]


def test_rounding_edges():
    """Sums whose rounding carries into the exponent: overflow to infinity at the top
    exponents, subnormal sums that become normal, cancellations down to subnormals, ties."""
    rng = np.random.default_rng(11)
    k = 60

    def with_exp(lo, hi, frac_mask=0x7FFFFF):
        e = rng.integers(lo, hi + 1, k).astype(np.uint32)
        f = rng.integers(0, 1 << 23, k).astype(np.uint32) & np.uint32(frac_mask)
        s = rng.integers(0, 2, k).astype(np.uint32)
        return (s << 31) | (e << 23) | f

    top = with_exp(253, 254) | np.uint32(0x7FFF00)
    tiny = with_exp(0, 1)
    near = with_exp(1, 3)
    ties = with_exp(120, 130, 0x7FFFF8)
    a = np.concatenate([top, tiny, near, ties])
    b = np.concatenate([(top & np.uint32(0x7FFFFFFF)) | (a[:k] & np.uint32(0x80000000)),
                        with_exp(0, 1), near ^ np.uint32(0x80000001), ties + np.uint32(3 << 23)])
    want = fp.f32_add(a, b)
    got = run_adder(MacOp.MAC, a, b, rng)
    bad = [(hex(a[i]), hex(b[i]), hex(got[i]), hex(want[i]))
           for i in range(len(a)) if got[i] != want[i]]
    assert not bad, bad[:5]
