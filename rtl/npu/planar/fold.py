"""The operation and identity of a pooling or reduction fold (combinational): binary32, or
``word``-bit two's-complement integers in the integer build."""

from amaranth.hdl import Signal

from npu_spec.formats import F32_NEG_INF, F32_NEG_ZERO, F32_POS_INF

from .layouts import MacOp, PoolOp, RedOp

__all__ = ["pooling_fold", "reduction_fold"]


def _identities(word):
    """``(max, min, sum)`` identities: ``-inf``, ``+inf``, ``-0`` in binary32 (``word`` None),
    else the smallest and largest ``word``-bit integers and 0."""
    if word is None:
        return F32_NEG_INF, F32_POS_INF, F32_NEG_ZERO
    return 1 << (word - 1), (1 << (word - 1)) - 1, 0


def _fold(m, op, max_code, min_code, name, word):
    mac_op = Signal(MacOp, name=f"{name}_op")
    identity = Signal(word or 32, name=f"{name}_identity")
    max_id, min_id, sum_id = _identities(word)
    with m.Switch(op):
        with m.Case(max_code):
            m.d.comb += [mac_op.eq(MacOp.MAX), identity.eq(max_id)]
        with m.Case(min_code):
            m.d.comb += [mac_op.eq(MacOp.MIN), identity.eq(min_id)]
        with m.Default():
            m.d.comb += [mac_op.eq(MacOp.MAC), identity.eq(sum_id)]
    return mac_op, identity


def pooling_fold(m, op, name="pool", word=None):
    """``(MacOp, identity)`` of pooling operation ``op`` (a :class:`PoolOp` code): max from
    ``-inf``, min from ``+inf``, the sum of an average from ``-0`` (``word``: integers of that
    width, from the smallest, the largest, 0)."""
    return _fold(m, op, PoolOp.MAX, PoolOp.MIN, name, word)


def reduction_fold(m, op, name="red", word=None):
    """``(MacOp, identity)`` of reduction operation ``op`` (a :class:`RedOp` code)."""
    return _fold(m, op, RedOp.MAX, RedOp.MIN, name, word)
