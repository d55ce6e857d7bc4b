"""Groups of three beat descriptors, as the pooling filters walk them."""

from amaranth.hdl import Mux, Signal

__all__ = ["next_group"]


def next_group(m, group, layout, successor, name):
    """The last valid descriptor of ``group`` (three descriptors of ``layout``) and the three
    that follow it (combinational).

    ``successor(desc, name)`` gives the descriptor after ``desc``. The next group is valid only
    if ``group`` was full (its third descriptor valid); a descriptor past the end of the walk
    has ``valid`` low.
    """
    last = Signal(layout, name=f"{name}_last")
    m.d.comb += last.eq(Mux(group[2].valid, group[2], Mux(group[1].valid, group[1], group[0])))
    after = successor(last, f"{name}_next")
    first = Signal(layout, name=f"{name}0")
    m.d.comb += [first.eq(after), first.valid.eq(after.valid & group[2].valid)]
    second = successor(first, f"{name}1")
    return last, (first, second, successor(second, f"{name}2"))
