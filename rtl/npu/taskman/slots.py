"""Pointers of the fetch slot and the configuration queue."""

from amaranth.hdl import Module, Mux
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SlotRing"]


class SlotRing(wiring.Component):
    """A ring of ``depth + 1`` descriptor slots: the configuration queue (a FIFO of ``depth``
    committed slots, ``rd`` is the oldest) and the fetch slot ``wr`` after it.

    The fetch slot is never a committed slot, so a fetch (or a replacement) never overwrites a
    committed descriptor; a commit is taken only when the queue is not full and a pop only when
    it is not empty, so nothing overflows or is dropped.

    Members
    -------
    commit, pop : In(1)
        Requests: move the fetch slot into the queue; release the oldest committed slot.
    committed, popped : Out(1)
        The requests taken this cycle (combinational).
    rd, wr : Out(range(depth + 1))
        Oldest committed slot; fetch slot.
    level : Out(range(depth + 1))
        Committed slots.
    full, empty : Out(1)
    """

    def __init__(self, depth):
        if not isinstance(depth, int) or not 1 <= depth <= 15:
            raise ValueError(f"Configuration queue depth must be in [1, 15], not {depth!r}")
        self._depth = depth
        super().__init__({
            "commit": In(1), "pop": In(1),
            "committed": Out(1), "popped": Out(1),
            "rd": Out(range(depth + 1)), "wr": Out(range(depth + 1)),
            "level": Out(range(depth + 1)),
            "full": Out(1), "empty": Out(1),
        })

    @property
    def depth(self):
        return self._depth

    def elaborate(self, platform):
        m = Module()
        last = self._depth
        m.d.comb += [
            self.full.eq(self.level == self._depth),
            self.empty.eq(self.level == 0),
            self.committed.eq(self.commit & ~self.full),
            self.popped.eq(self.pop & ~self.empty),
        ]
        with m.If(self.committed):
            m.d.sync += self.wr.eq(Mux(self.wr == last, 0, self.wr + 1))
        with m.If(self.popped):
            m.d.sync += self.rd.eq(Mux(self.rd == last, 0, self.rd + 1))
        m.d.sync += self.level.eq(self.level + self.committed - self.popped)
        return m
