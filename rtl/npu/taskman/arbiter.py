"""Fixed-priority arbiter over the task queues."""

from amaranth.hdl import Module, Signal
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
        # A chain from queue 0 upwards; a later queue wins only with a strictly higher priority.
        valid, index, prio = 0, 0, 0
        for i in range(self._queues):
            take = Signal(name=f"take{i}")
            if i == 0:
                m.d.comb += take.eq(self.request[0])
            else:
                m.d.comb += take.eq(self.request[i] & (~valid | (self.priority[i] > prio)))
            n_valid, n_index = Signal(name=f"valid{i}"), Signal(5, name=f"index{i}")
            n_prio = Signal.like(self.chosen_priority, name=f"prio{i}")
            m.d.comb += [
                n_valid.eq(valid | self.request[i]),
                n_index.eq(index),
                n_prio.eq(prio),
            ]
            with m.If(take):
                m.d.comb += [n_index.eq(i), n_prio.eq(self.priority[i])]
            valid, index, prio = n_valid, n_index, n_prio
        m.d.comb += [self.valid.eq(valid), self.index.eq(index), self.chosen_priority.eq(prio)]
        return m
