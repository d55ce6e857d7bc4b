"""Groups of three beat descriptors, as the pooling filters walk them (the next group computed
over the cycles of the current one), and the comparison of their modular counts."""

from amaranth.hdl import Mux, Signal

__all__ = ["at_least", "next_group"]


def at_least(a, b, width):
    """``a >= b`` for counts kept modulo ``2**width`` whose true values are less than
    ``2**(width - 1)`` apart (combinational): the sign of the modular difference."""
    return ~(a - b)[width - 1]


def next_group(m, group, layout, successor, name, restart, reload):
    """The last valid descriptor of ``group`` (three descriptors of ``layout``), whether the
    walk goes on after it, and the next group, computed one descriptor a cycle.

    ``successor(desc, name)`` gives the descriptor after ``desc``. The walk goes on only if
    ``group`` was full (its third descriptor valid) and the descriptor after it is valid (not
    past the end of the walk). ``restart(goes_on)`` gives ``(cond, desc)``: if ``cond``, the
    next group starts at ``desc`` instead (a new walk or a new plane).

    The chain of three successors is not one combinational path: in the first cycle after
    ``reload`` (the caller loads ``group``, or starts a walk, in that cycle) the next group's
    first descriptor is registered, in the second its second one; from the third cycle on
    (``ready``) the next group is the two registers and the successor of the second, so that
    a load passes through one successor only. A group lasts at least three cycles (one step
    of each of its beats), so ``ready`` never holds a walk up between groups. ``goes_on`` is
    combinational (one successor) and holds for the whole group.

    Returns ``last, goes_on, (first, second, third), ready``.
    """
    last = Signal(layout, name=f"{name}_last")
    m.d.comb += last.eq(Mux(group[2].valid, group[2], Mux(group[1].valid, group[1], group[0])))
    after = successor(last, f"{name}_next")
    goes_on = Signal(name=f"{name}_goes_on")
    m.d.comb += goes_on.eq(after.valid & group[2].valid)
    first = Signal(layout, name=f"{name}_first")
    m.d.comb += [first.eq(after), first.valid.eq(goes_on)]
    cond, desc = restart(goes_on)
    with m.If(cond):
        m.d.comb += first.eq(desc)

    # Descriptors of the next group computed so far (0, 1 or 2).
    ahead = Signal(range(3), name=f"{name}_ahead")
    ahead_regs = [Signal(layout, name=f"{name}{k}", reset_less=True) for k in range(2)]
    with m.If(ahead == 0):
        m.d.sync += [ahead_regs[0].eq(first), ahead.eq(1)]
    with m.If(ahead == 1):
        m.d.sync += [ahead_regs[1].eq(successor(ahead_regs[0], f"{name}1_next")), ahead.eq(2)]
    with m.If(reload):
        m.d.sync += ahead.eq(0)
    third = successor(ahead_regs[1], f"{name}2")
    return last, goes_on, (ahead_regs[0], ahead_regs[1], third), ahead == 2
