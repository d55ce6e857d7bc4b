"""Groups of three beat descriptors, as the pooling filters walk them, and the comparison of
their modular counts."""

from amaranth.hdl import Mux, Signal

__all__ = ["at_least", "next_group"]


def at_least(a, b, width):
    """``a >= b`` for counts kept modulo ``2**width`` whose true values are less than
    ``2**(width - 1)`` apart (combinational): the sign of the modular difference."""
    return ~(a - b)[width - 1]


def next_group(m, group, layout, successor, name, restart=None):
    """The last valid descriptor of ``group`` (three descriptors of ``layout``), whether the
    walk goes on after it, and the next group (combinational).

    ``successor(desc, name)`` gives the descriptor after ``desc``. The walk goes on only if
    ``group`` was full (its third descriptor valid) and the descriptor after it is valid (not
    past the end of the walk). ``restart(goes_on)`` gives ``(cond, desc)``: if ``cond``, the
    next group starts at ``desc`` instead (a new walk or a new plane), so that one chain of
    successors serves both. Returns ``last, goes_on, (first, second, third)``.
    """
    last = Signal(layout, name=f"{name}_last")
    m.d.comb += last.eq(Mux(group[2].valid, group[2], Mux(group[1].valid, group[1], group[0])))
    after = successor(last, f"{name}_next")
    goes_on = Signal(name=f"{name}_goes_on")
    m.d.comb += goes_on.eq(after.valid & group[2].valid)
    first = Signal(layout, name=f"{name}0")
    m.d.comb += [first.eq(after), first.valid.eq(goes_on)]
    if restart is not None:
        cond, desc = restart(goes_on)
        with m.If(cond):
            m.d.comb += first.eq(desc)
    second = successor(first, f"{name}1")
    return last, goes_on, (first, second, successor(second, f"{name}2"))
