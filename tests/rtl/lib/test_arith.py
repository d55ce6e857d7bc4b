# amaranth: UnusedElaboratable=no
"""``npu.lib.arith.narrow_mul`` against Python's product, modulo the width."""

import random

import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from npu.lib.arith import narrow_mul


@pytest.mark.parametrize("a_bits, b_bits, width", [(24, 5, 8), (12, 3, 14), (4, 3, 16),
                                                   (9, 5, 3)])
def test_against_python(a_bits, b_bits, width):
    a, b = Signal(a_bits), Signal(b_bits)
    out = Signal(width)
    m = Module()
    m.d.comb += out.eq(narrow_mul(a, b, width))
    rng = random.Random(a_bits * 100 + width)
    pairs = [(0, 0), ((1 << a_bits) - 1, (1 << b_bits) - 1)]
    pairs += [(rng.randrange(1 << a_bits), rng.randrange(1 << b_bits)) for _ in range(200)]

    async def tb(ctx):
        for x, y in pairs:
            ctx.set(a, x)
            ctx.set(b, y)
            assert ctx.get(out) == (x * y) % (1 << width), (x, y)

    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()


def test_bad_arguments():
    with pytest.raises(ValueError, match="width must be a positive integer, not 0"):
        narrow_mul(Signal(4), Signal(4), 0)
    with pytest.raises(TypeError, match="multiplier must be unsigned"):
        narrow_mul(Signal(4), Signal(range(-2, 2)), 4)
