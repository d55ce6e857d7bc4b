# amaranth: UnusedElaboratable=no
"""The six-stage binary32 adder (npu.lib.fp32_deep.FP32AddDeep) against the golden model, with
the operands of the FP32AddPipe tests: every class, cancellations down to subnormals (where the
normalising shift is limited by the exponent), rounding carries, ties."""

import numpy as np
import pytest

from npu.lib.fp32 import MacOp
from npu.lib.fp32_deep import FP32AddDeep
from npu_model import fp
from npu_sim.streams import run_simulation

from .test_fp32 import expected, operands


def run_deep(op, a, b):
    """One operand pair a cycle; result ``LATENCY`` cycles later."""
    dut = FP32AddDeep(reset_less=True)
    got = []

    async def tb(ctx):
        ctx.set(dut.op, op)
        for k in range(len(a) + FP32AddDeep.LATENCY):
            if k < len(a):
                ctx.set(dut.a, int(a[k]))
                ctx.set(dut.b, int(b[k]))
            await ctx.tick()
            if k + 1 >= FP32AddDeep.LATENCY:
                got.append(ctx.get(dut.result))

    run_simulation(dut, [tb])
    return got[:len(a)]


def check(op, a, b, want):
    got = run_deep(op, a, b)
    bad = [(hex(a[i]), hex(b[i]), hex(got[i]), hex(want[i]))
           for i in range(len(a)) if got[i] != want[i]]
    assert not bad, bad[:5]


@pytest.mark.parametrize("op", list(MacOp), ids=lambda op: op.name)
def test_against_golden_model(op):
    rng = np.random.default_rng(int(op.value) + 17)
    a, b = operands(rng, 400)
    check(op, a, b, expected(op, a, b))


def test_limited_normalising_shift():
    """Differences of close values at every small exponent (the shift stops at exponent 1,
    giving subnormals) and at exponents around 27 (where the limit stops mattering)."""
    rng = np.random.default_rng(5)
    k = 200
    e = np.concatenate([rng.integers(1, 32, k), rng.integers(20, 40, k)]).astype(np.uint32)
    f = rng.integers(0, 1 << 23, 2 * k).astype(np.uint32)
    a = (e << 23) | f
    # Same exponent or one below, opposite sign, a few low bits apart.
    b = ((e - (rng.integers(0, 2, 2 * k).astype(np.uint32) & (e > 1))) << 23) \
        | (f ^ rng.integers(0, 1 << 6, 2 * k).astype(np.uint32)) | np.uint32(0x80000000)
    check(MacOp.MAC, a, b, fp.f32_add(a, b))
