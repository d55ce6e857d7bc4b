# amaranth: UnusedElaboratable=no
"""Sizes of a build and division by constants."""

import numpy as np
import pytest

from npu.planar.geometry import Geometry, div_params
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
