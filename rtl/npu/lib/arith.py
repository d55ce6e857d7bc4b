"""Small arithmetic helpers for address generation."""

from amaranth.hdl import Const, Mux, Value

__all__ = ["narrow_mul"]


def narrow_mul(a, b, width):
    """``(a * b) mod 2**width`` as shifts and adds, one per bit of ``b`` (combinational).

    For address arithmetic where ``b`` is a narrow register (a kernel side, a stride) and
    only the low ``width`` bits of the product are used (an address into a memory of
    ``2**width`` words): the adders are ``width`` bits wide whatever the width of ``a``, and
    Yosys sees no multiplication, so it spends no DSP on it.
    """
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError(f"width must be a positive integer, not {width!r}")
    a, b = Value.cast(a), Value.cast(b)
    if b.shape().signed:
        raise TypeError(f"the multiplier must be unsigned, not {b.shape()!r}")
    a = a[:width]
    total = Const(0, width)
    for i in range(min(len(b), width)):
        total = (total + Mux(b[i], a << i, 0))[:width]
    return total

