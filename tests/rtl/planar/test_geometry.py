# amaranth: UnusedElaboratable=no
"""Sizes of a build and division by constants."""

import numpy as np
import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from npu.planar.geometry import Geometry, const_mul, div_params
from npu_spec.config import NPUConfig, preset
from npu_spec.planar import h_ring_depth, line_buffer_banks


def test_div_params():
    """Division by a constant (or a table of constants) as a multiplication and a shift."""
    rng = np.random.default_rng(0)
    for nbits, divisors in [(11, [17]), (13, range(1, 16)), (12, [67])]:
        s, ms = div_params(nbits, divisors)
        xs = [0, (1 << nbits) - 1, *rng.integers(0, 1 << nbits, 200).tolist()]
        for d in divisors:
            assert all((x * ms[d]) >> s == x // d for x in xs)
    assert div_params(13, range(1, 16))[0] <= 13 + 4


def test_const_mul():
    """A multiplication by a constant as adders, against Python's product, including the
    constants the line buffer uses (its bank count and the reciprocal multiplier)."""
    rng = np.random.default_rng(1)
    x = Signal(12)
    s, ms = div_params(11, [17])
    m = Module()
    outs = {}
    for c in [0, 1, 2, 3, 7, 17, 255, 3855, 65535, ms[17]]:
        outs[c] = Signal(len(const_mul(x, c)), name=f"y{c}")
        m.d.comb += outs[c].eq(const_mul(x, c))
    values = [0, 1, 4095, *rng.integers(0, 4096, 60).tolist()]

    async def testbench(ctx):
        for v in values:
            ctx.set(x, v)
            for c, y in outs.items():
                assert ctx.get(y) == v * c, (v, c)

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()
    with pytest.raises(ValueError, match="non-negative"):
        const_mul(x, -3)


@pytest.mark.parametrize("p,k,depth", [(1, 1, 1024), (2, 3, 64), (4, 3, 1024), (8, 1, 100)])
def test_geometry(p, k, depth):
    g = Geometry.of(NPUConfig(planar_lanes=p, planar_pool_beats=k), depth)
    assert (g.lanes, g.pool_beats, g.filter_lanes) == (p * p, k, k * p * p)
    assert (g.banks, g.bank_depth) == line_buffer_banks(k * p * p, depth)
    assert g.ring_depth == g.banks * g.bank_depth >= depth + 15
    assert g.h_depth == h_ring_depth(p * p, depth) == 1 << g.h_bits
    assert 1 << g.lane_bits == g.lanes


def test_geometry_checks():
    with pytest.raises(ValueError, match="power of two"):
        Geometry.of(NPUConfig(planar_lanes=3), 1024)
    with pytest.raises(ValueError, match="plane_depth"):
        Geometry.of(NPUConfig(planar_lanes=2), 8)
    with pytest.raises(TypeError, match="NPUConfig"):
        Geometry.of({"planar_lanes": 2}, 1024)


def test_integer_build_option():
    """``planar_impl``: ``"float"`` by default, ``"int8"`` only for int8-only builds (16-bit
    words), anything else refused naming the value; ``icebreaker`` uses the integer build."""
    assert NPUConfig().planar_impl == "float"
    assert Geometry.of(NPUConfig(), 1024).word == 32
    lean = NPUConfig(formats=("int8",), planar_impl="int8")
    assert Geometry.of(lean, 1024).integer and Geometry.of(lean, 1024).word == 16
    assert preset("icebreaker").planar_impl == "int8"
    with pytest.raises(ValueError, match=r"planar_impl 'int8' is int8 only: formats must be "
                                         r"\('int8',\), not \('int8', 'fp16', 'mixed'\)"):
        NPUConfig(planar_impl="int8")
    with pytest.raises(ValueError, match=r"NPUConfig.planar_impl must be one of float, int8, "
                                         r"not 'fixed'"):
        NPUConfig(planar_impl="fixed")
