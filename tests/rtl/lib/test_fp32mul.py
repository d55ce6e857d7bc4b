# amaranth: UnusedElaboratable=no
"""FP32Mul against the golden model npu_model.fp.f32_mul, over every class of operand."""

import numpy as np
import pytest

from npu.lib.fp32mul import FP32Mul
from npu_model import fp
from npu_sim.streams import run_simulation


def operand_classes(rng, n):
    """Random binary32 operand pairs stressing every class and boundary of the product."""
    def rand_bits(k):
        return rng.integers(0, 1 << 32, k, dtype=np.uint64).astype(np.uint32)

    def with_exp(k, lo, hi):
        e = rng.integers(lo, hi + 1, k).astype(np.uint32)
        f = rng.integers(0, 1 << 23, k).astype(np.uint32)
        s = rng.integers(0, 2, k).astype(np.uint32)
        return (s << 31) | (e << 23) | f

    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
                         0xFFFFFFFF, 0x3F800000, 0xBF800000, 0x00000001, 0x807FFFFF,
                         0x7F7FFFFF, 0x00800000, 0x3F000000, 0x34000000], dtype=np.uint32)
    k = n // 6
    a = np.concatenate([
        rand_bits(k),
        with_exp(k, 0, 0),          # subnormal x anything around 1
        with_exp(k, 1, 60),         # products near the subnormal range / underflow
        with_exp(k, 190, 254),      # products near overflow
        with_exp(k, 100, 154),      # ordinary products, many ties when fractions are short
        rng.choice(specials, k),
    ])
    b = np.concatenate([
        rand_bits(k),
        with_exp(k, 100, 160),
        with_exp(k, 40, 100),
        with_exp(k, 100, 140),
        with_exp(k, 100, 154) & np.uint32(0xFFFFF000),
        rand_bits(k // 2).tolist() + rng.choice(specials, k - k // 2).tolist(),
    ]).astype(np.uint32)
    # Short significands make exact ties (guard set, sticky clear) common.
    a[4 * k:5 * k] &= np.uint32(0xFFFFF800)
    return a, b


def run_mul(a, b, stall_every=0):
    dut = FP32Mul()
    got = []

    async def tb(ctx):
        # After the k-th en-cycle, ``result`` holds the product of the operands presented in
        # en-cycle k - LATENCY + 1 (counting from 1).
        n = len(a)
        pending = []
        cycle = 0
        while len(got) < n:
            en = not (stall_every and cycle % stall_every == stall_every - 1)
            ctx.set(dut.en, en)
            if en:
                i = len(pending)
                ctx.set(dut.a, int(a[i]) if i < n else 0)
                ctx.set(dut.b, int(b[i]) if i < n else 0)
                pending.append(i)
            await ctx.tick()
            cycle += 1
            if en and len(pending) >= FP32Mul.LATENCY:
                got.append(ctx.get(dut.result))

    run_simulation(dut, [tb])
    return np.array(got, dtype=np.uint32)


@pytest.mark.parametrize("seed,stall", [(1, 0), (2, 3)])
def test_fp32mul_classes(seed, stall):
    rng = np.random.default_rng(seed)
    a, b = operand_classes(rng, 1200)
    got = run_mul(a, b, stall)
    exp = fp.f32_mul(a, b)
    bad = np.nonzero(got != exp)[0]
    assert bad.size == 0, [f"{a[i]:08x}*{b[i]:08x}: {got[i]:08x} != {exp[i]:08x}"
                           for i in bad[:8]]


@pytest.mark.slow
def test_fp32mul_big():
    rng = np.random.default_rng(99)
    a, b = operand_classes(rng, 60000)
    got = run_mul(a, b)
    assert np.array_equal(got, fp.f32_mul(a, b))
