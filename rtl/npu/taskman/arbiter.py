"""Fixed-priority arbiter over the task queues."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Arbiter"]


class Arbiter(wiring.Component):
    """Chooses the highest-priority requesting queue; ties go to the lower index (combinational).

    Parameters
    ----------
    queues : int
        Number of queues.
    priority_width : int
        Width of a priority.

    Members
    -------
    request : In(queues)
        Bit ``i``: queue ``i`` is eligible (non-empty, not retired). A queue without a request is
        never chosen.
    priority : In(priority_width).array(queues)
        Priority of each queue; larger wins.
    valid : Out(1)
        Some queue requests.
    index : Out(5)
        The chosen queue (0 when ``valid`` is low).
    chosen_priority : Out(priority_width)
        Its priority.
    """

    def __init__(self, queues, priority_width=4):
        if not isinstance(queues, int) or not 1 <= queues <= 32:
            raise ValueError(f"Number of queues must be in [1, 32], not {queues!r}")
        if not isinstance(priority_width, int) or priority_width < 1:
            raise ValueError(f"Priority width must be a positive integer, "
                             f"not {priority_width!r}")
        self._queues = queues
        super().__init__({
            "request": In(queues),
            "priority": In(priority_width).array(queues),
            "valid": Out(1),
            "index": Out(5),
            "chosen_priority": Out(priority_width),
        })

    @property
    def queues(self):
        return self._queues

    def elaborate(self, platform):
        m = Module()
        # A tree of pairwise choices (depth log2(queues)): of two groups, the upper one (higher
        # indices) wins only with a strictly higher priority, so ties go to the lower index.
        def choose(lo, hi):
            if hi - lo == 1:
                return self.request[lo], lo, self.priority[lo]
            mid = (lo + hi + 1) // 2
            a_valid, a_index, a_prio = choose(lo, mid)
            b_valid, b_index, b_prio = choose(mid, hi)
            take_b = Signal(name=f"take{mid}_{lo}_{hi}")
            valid = Signal(name=f"valid{lo}_{hi}")
            index = Signal(5, name=f"index{lo}_{hi}")
            prio = Signal.like(self.chosen_priority, name=f"prio{lo}_{hi}")
            m.d.comb += [take_b.eq(b_valid & (~a_valid | (b_prio > a_prio))),
                         valid.eq(a_valid | b_valid),
                         index.eq(Mux(take_b, b_index, a_index)),
                         prio.eq(Mux(take_b, b_prio, a_prio))]
            return valid, index, prio

        valid, index, prio = choose(0, self._queues)
        m.d.comb += [self.valid.eq(valid), self.index.eq(index), self.chosen_priority.eq(prio)]
        return m
