# amaranth: UnusedElaboratable=no
"""Gateware enums derived from the specification's codes."""

import enum

import pytest
from amaranth.hdl import Shape, Signal

from npu.lib.enums import hw_enum
from npu_spec.codes import coded
from npu_spec.planar import EltOp


def test_same_members_and_width():
    hw = hw_enum(EltOp)
    assert [(m.name, m.value) for m in hw] == [(m.name, m.value) for m in EltOp]
    assert Shape.cast(hw).width == EltOp.bits
    assert hw_enum(EltOp) is hw      # one enum per code class


def test_signals_are_typed():
    hw = hw_enum(EltOp)
    sig = Signal(hw)
    with pytest.raises(TypeError):
        sig == 3        # an EnumView compares only with its own members
    assert (sig == hw.ADD) is not None


def test_needs_a_width():
    class Plain(enum.IntEnum):
        A = 0

    with pytest.raises(TypeError, match="bit width"):
        hw_enum(Plain)


def test_coded_checks_members():
    with pytest.raises(ValueError, match="does not fit"):
        @coded(2)
        class TooWide(enum.IntEnum):
            BIG = 4
