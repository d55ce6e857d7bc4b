"""The task trace: a stamp for every start and end of a task, for the host to read
(``docs/system.md``, "Trace buffer")."""

from amaranth.hdl import Module, Mux, ResetInserter, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.engine import ERROR_BITS, Engine

from .lib.engine import QUEUE_WIDTH

__all__ = ["ABORTED", "TraceEntry", "TraceRecorder"]

#: The error code of the end entry of a task the task manager's watchdog aborted.
ABORTED = (1 << ERROR_BITS) - 1

#: One trace entry: what happened (the fields of ``TRACE_DATA0``) and when.
TraceEntry = data.StructLayout({
    "task_id": 16,
    "engine":  Engine.bits,
    "end":     1,
    "error":   ERROR_BITS,
    "queue":   QUEUE_WIDTH,
    "cycle":   32,
})


class TraceRecorder(wiring.Component):
    """Watches the task manager's dispatch ports and keeps start and end stamps in a FIFO.

    Each engine has at most one event a cycle (a start is taken only while the engine is
    idle); events of the engines wait in a small queue each and enter the trace FIFO one a
    cycle. An event that finds its engine's queue full is dropped and sets ``overflow``.

    Parameters
    ----------
    engines : int
        Dispatch ports watched (in ``Engine`` order).
    depth : int
        Entries of the trace FIFO.

    Members
    -------
    starts : In(valid, ready, task_id, queue).array(engines)
    dones : In(done, error, abort).array(engines)
        What the recorder watches of each dispatch port (:meth:`watch` connects them).
    cycle : In(32)
        The time base.
    head : Out(TraceEntry); head_valid : Out(1)
        The oldest entry.
    count : Out(16)
        Entries in the FIFO.
    overflow : Out(1)
        An entry was dropped since the last ``clear``.
    pop, clear : In(1)
        Drop the oldest entry / every entry and the overflow flag.
    """

    def __init__(self, engines=len(Engine), depth=64):
        self._engines = engines
        self._depth = depth
        super().__init__({
            "starts":     In(wiring.Signature({"valid": In(1), "ready": In(1),
                                               "task_id": In(16), "queue": In(QUEUE_WIDTH)}))
                          .array(engines),
            "dones":      In(wiring.Signature({"done": In(1), "error": In(ERROR_BITS),
                                               "abort": In(1)})).array(engines),
            "cycle":      In(32),
            "head":       Out(TraceEntry),
            "head_valid": Out(1),
            "count":      Out(16),
            "overflow":   Out(1),
            "pop":        In(1),
            "clear":      In(1),
        })

    def watch(self, m, e, port):
        """Connect dispatch port ``port`` (an ``EngineSignature`` seen from the task manager's
        side) of engine ``e``."""
        start = port.start
        m.d.comb += [
            self.starts[e].valid.eq(start.valid), self.starts[e].ready.eq(start.ready),
            self.starts[e].task_id.eq(start.payload.task_id),
            self.starts[e].queue.eq(start.payload.queue),
            self.dones[e].done.eq(port.done), self.dones[e].error.eq(port.error),
            self.dones[e].abort.eq(port.abort),
        ]

    def elaborate(self, platform):
        m = Module()
        width = TraceEntry.size
        clear = self.clear
        trace = fifo.SyncFIFOBuffered(width=width, depth=self._depth)
        m.submodules.trace = ResetInserter(clear)(trace)
        overflow = Signal()
        queues = []
        for e in range(self._engines):
            q = fifo.SyncFIFO(width=width, depth=4)
            m.submodules[f"events{e}"] = q
            queues.append(q)
            running = Signal(TraceEntry, name=f"running{e}")
            start, done = self.starts[e], self.dones[e]
            event = Signal(TraceEntry, name=f"event{e}")
            fire = Signal(name=f"fire{e}")
            with m.If(start.valid & start.ready):
                m.d.comb += [fire.eq(1), event.task_id.eq(start.task_id),
                             event.queue.eq(start.queue), event.engine.eq(e),
                             event.cycle.eq(self.cycle)]
                m.d.sync += [running.task_id.eq(start.task_id), running.queue.eq(start.queue)]
            with m.Elif(done.done | done.abort):
                m.d.comb += [fire.eq(1), event.task_id.eq(running.task_id),
                             event.queue.eq(running.queue), event.engine.eq(e),
                             event.end.eq(1),
                             event.error.eq(Mux(done.abort, ABORTED, done.error)),
                             event.cycle.eq(self.cycle)]
            m.d.comb += [q.w_data.eq(event), q.w_en.eq(fire & ~clear)]
            with m.If(fire & ~q.w_rdy):
                m.d.sync += overflow.eq(1)

        # Merge: the lowest engine with an event goes first; the FIFO full drops the event.
        taken = Signal()
        for q in reversed(queues):
            with m.If(q.r_rdy):
                m.d.comb += [trace.w_data.eq(q.r_data)]
        for e, q in enumerate(queues):
            earlier = 0
            for p in queues[:e]:
                earlier = earlier | p.r_rdy
            m.d.comb += q.r_en.eq(q.r_rdy & ~earlier)
        any_event = 0
        for q in queues:
            any_event = any_event | q.r_rdy
        m.d.comb += [taken.eq(any_event), trace.w_en.eq(taken & ~clear)]
        with m.If(taken & ~trace.w_rdy):
            m.d.sync += overflow.eq(1)
        with m.If(clear):
            m.d.sync += overflow.eq(0)

        m.d.comb += [
            self.head.eq(trace.r_data),
            self.head_valid.eq(trace.r_rdy),
            self.count.eq(trace.level),
            self.overflow.eq(overflow),
            trace.r_en.eq(trace.r_rdy & self.pop),
        ]
        return m
