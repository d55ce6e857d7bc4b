"""The binary32 operation and identity of a pooling or reduction fold (combinational)."""

from amaranth.hdl import Signal

from npu_spec.formats import F32_NEG_INF, F32_NEG_ZERO, F32_POS_INF

from .layouts import MacOp, PoolOp, RedOp

__all__ = ["pooling_fold", "reduction_fold"]


def _fold(m, op, max_code, min_code, name):
    mac_op = Signal(MacOp, name=f"{name}_op")
    identity = Signal(32, name=f"{name}_identity")
    with m.Switch(op):
        with m.Case(max_code):
            m.d.comb += [mac_op.eq(MacOp.MAX), identity.eq(F32_NEG_INF)]
        with m.Case(min_code):
            m.d.comb += [mac_op.eq(MacOp.MIN), identity.eq(F32_POS_INF)]
        with m.Default():
            m.d.comb += [mac_op.eq(MacOp.MAC), identity.eq(F32_NEG_ZERO)]
    return mac_op, identity


def pooling_fold(m, op, name="pool"):
    """``(MacOp, identity)`` of pooling operation ``op`` (a :class:`PoolOp` code): max from
    ``-inf``, min from ``+inf``, the sum of an average from ``-0``."""
    return _fold(m, op, PoolOp.MAX, PoolOp.MIN, name)


def reduction_fold(m, op, name="red"):
    """``(MacOp, identity)`` of reduction operation ``op`` (a :class:`RedOp` code)."""
    return _fold(m, op, RedOp.MAX, RedOp.MIN, name)
