"""The state of the task queues and its updates."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.taskman import MAX_QUEUES

from ..lib.engine import ADDR_WIDTH, QUEUE_WIDTH
from .layouts import QueueStatus

__all__ = ["Queues"]


class Queues(wiring.Component):
    """Head pointer, descriptor count, TQSP, retired and drop flags of every task queue.

    Updates, each applied at the end of the cycle of its strobe:

    * a head write (``set_head``) sets the head and clears TQSP, retired and drop; it wins over
      every other update of the head and the flags of that queue;
    * ``push`` adds descriptors to the count;
    * a commit moves the committing queue's head on by the descriptor's length and takes one
      descriptor off its count;
    * rule 3 sets and rule 5 clears TQSP of the completing switch-point task's queue (a clear
      wins over a set in the same cycle);
    * an exception retires its queue, and a watchdog timeout also drops it.

    Parameters
    ----------
    queues : int
        Number of task queues.
    addr_width : int
        Bits of the head pointers (upper bits of ``state.head`` are 0; a commit past the top
        wraps, which the lean build's rule on its addresses, ``npu_spec.taskman.lean_error``,
        keeps from happening in a valid program).

    Members
    -------
    state : Out(data.ArrayLayout(QueueStatus, queues))
        The state of every queue (registers).
    set_head : In(1).array(queues); head : In(ADDR_WIDTH).array(queues)
        Host write of ``Qi_HEAD``: the new head pointer.
    push : In(16).array(queues)
        Descriptors appended to queue ``i`` in this cycle (0: none).
    commit : In(1); commit_queue : In(QUEUE_WIDTH); commit_length : In(8)
        A descriptor of ``commit_queue``, ``commit_length`` words long, is committed.
    tqsp_set, tqsp_clear : In(1); flag_queue : In(QUEUE_WIDTH)
        Rule 3 / rule 5 for the queue of the completing switch-point task.
    retire : In(1); retire_queue : In(QUEUE_WIDTH); retire_drop : In(1)
        An exception retires ``retire_queue``; with ``retire_drop`` (a watchdog timeout) its
        committed and loaded tasks are dropped too.
    tqsp, dropped : Out(queues)
        Bit ``i``: queue ``i``'s TQSP / drop flag (combinational).
    """

    def __init__(self, queues, *, addr_width=ADDR_WIDTH):
        if not isinstance(queues, int) or not 1 <= queues <= MAX_QUEUES:
            raise ValueError(f"Number of queues must be in [1, {MAX_QUEUES}], not {queues!r}")
        if not isinstance(addr_width, int) or not 1 <= addr_width <= ADDR_WIDTH:
            raise ValueError(f"Address width must be in [1, {ADDR_WIDTH}], not {addr_width!r}")
        self._queues = queues
        self._addr_width = addr_width
        super().__init__({
            "state": Out(data.ArrayLayout(QueueStatus, queues)),
            "set_head": In(1).array(queues),
            "head": In(ADDR_WIDTH).array(queues),
            "push": In(QueueStatus.members["count"]).array(queues),
            "commit": In(1),
            "commit_queue": In(QUEUE_WIDTH),
            "commit_length": In(8),
            "tqsp_set": In(1),
            "tqsp_clear": In(1),
            "flag_queue": In(QUEUE_WIDTH),
            "retire": In(1),
            "retire_queue": In(QUEUE_WIDTH),
            "retire_drop": In(1),
            "tqsp": Out(queues),
            "dropped": Out(queues),
        })

    @property
    def queues(self):
        return self._queues

    def elaborate(self, platform):
        m = Module()
        for i in range(self._queues):
            # The registers; the head in ``addr_width`` bits, shown zero-extended.
            q = Signal(QueueStatus, name=f"queue{i}")
            head = Signal(self._addr_width, name=f"head{i}")
            m.d.comb += [self.state[i].eq(q), self.state[i].head.eq(head),
                         self.tqsp[i].eq(q.tqsp), self.dropped[i].eq(q.drop)]
            committed = Signal(name=f"committed{i}")
            m.d.comb += committed.eq(self.commit & (self.commit_queue == i))
            m.d.sync += q.count.eq(q.count + self.push[i] - Mux(committed, 1, 0))
            with m.If(self.set_head[i]):
                m.d.sync += [head.eq(self.head[i]), q.retired.eq(0), q.drop.eq(0),
                             q.tqsp.eq(0)]
            with m.Else():
                with m.If(committed):
                    m.d.sync += head.eq(head + self.commit_length)
                with m.If(self.tqsp_set & (self.flag_queue == i)):
                    m.d.sync += q.tqsp.eq(1)
                with m.If(self.tqsp_clear & (self.flag_queue == i)):
                    m.d.sync += q.tqsp.eq(0)
                with m.If(self.retire & (self.retire_queue == i)):
                    m.d.sync += q.retired.eq(1)
                    with m.If(self.retire_drop):
                        m.d.sync += q.drop.eq(1)
        return m
