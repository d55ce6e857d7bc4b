"""The task manager's performance counters."""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu_spec.taskman import COUNTERS

from .taskbuffer import ENGINES

__all__ = ["Counters"]


class Counters(wiring.Component):
    """The counters of :data:`npu_spec.taskman.COUNTERS`, 32 bits each, wrapping.

    ``TASKS_RUN`` counts tasks leaving the task buffer; ``BUSY_CYCLES`` / ``IDLE_CYCLES`` the
    cycles with / without work committed, loaded or running; ``STALL_FETCH`` idle cycles while
    a queue has work; ``STALL_DEP`` cycles in which an engine waits for a dependency, a barrier
    or a drain; ``STALL_WRITE`` cycles in which a register write is held back; ``SWITCHES``
    rule-3 switches; ``SWITCH_LATENCY`` the cycles from the first cycle of the latest switch
    request to the start of a task of another queue.

    Parameters
    ----------
    kept : iterable of str or None
        The counters built (``None``: all); the others read 0 (the lean task manager keeps
        :data:`npu_spec.taskman.LEAN_COUNTERS`).

    Members
    -------
    busy : In(1)
        Tasks are committed, loaded or running.
    work : In(1)
        Some queue has work for the arbiter.
    completed : In(ENGINES)
        Per engine: a task left the task buffer.
    waiting : In(ENGINES)
        Per engine: idle while a loaded task of it may not start yet.
    write_stall : In(1)
        A register write is offered and not taken.
    switch : In(1)
        A rule-3 switch.
    request : In(1)
        A switch request exists above the current queue.
    started_new_queue : In(1)
        A task of another queue than the last started one starts.
    value : Out(32).array(len(COUNTERS))
        The counters, in the order of :data:`~npu_spec.taskman.COUNTERS`.
    """

    def __init__(self, kept=None):
        names = [name for name, _ in COUNTERS]
        self._kept = tuple(names if kept is None else kept)
        for name in self._kept:
            if name not in names:
                raise ValueError(f"No counter {name!r}; counters: {', '.join(names)}")
        super().__init__({
            "busy": In(1),
            "work": In(1),
            "completed": In(ENGINES),
            "waiting": In(ENGINES),
            "write_stall": In(1),
            "switch": In(1),
            "request": In(1),
            "started_new_queue": In(1),
            "value": Out(32).array(len(COUNTERS)),
        })

    def counter(self, name):
        """The output of the counter called ``name``."""
        for n, (counter_name, _) in enumerate(COUNTERS):
            if counter_name == name:
                return self.value[n]
        raise ValueError(f"No counter {name!r}; counters: "
                         f"{', '.join(c for c, _ in COUNTERS)}")

    def elaborate(self, platform):
        m = Module()
        c = self.counter

        def count(name, condition):
            if name in self._kept:
                with m.If(condition):
                    m.d.sync += c(name).eq(c(name) + 1)

        if "TASKS_RUN" in self._kept:
            m.d.sync += c("TASKS_RUN").eq(c("TASKS_RUN") +
                                          sum(self.completed[e] for e in range(ENGINES)))
        count("BUSY_CYCLES", self.busy)
        count("IDLE_CYCLES", ~self.busy)
        count("STALL_FETCH", self.work & ~self.busy)
        count("STALL_DEP", self.waiting.any())
        count("STALL_WRITE", self.write_stall)
        count("SWITCHES", self.switch)

        # Switch latency: from the first cycle of a request to the start of a task of another
        # queue.
        if "SWITCH_LATENCY" not in self._kept:
            return m
        latency = Signal(32)
        measuring = Signal()
        with m.If(measuring):
            m.d.sync += latency.eq(latency + 1)
            with m.If(self.started_new_queue):
                m.d.sync += [measuring.eq(0), c("SWITCH_LATENCY").eq(latency + 1)]
        with m.Elif(self.request):
            m.d.sync += [measuring.eq(1), latency.eq(0)]
        return m
