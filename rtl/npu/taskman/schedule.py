"""Which queue the task manager works on: the arbiter's registered choice, the current queue,
the fetch target, the task-switch state (GTSP, a committed TSR task) and secure mode."""

from amaranth.hdl import Array, Cat, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.taskman import MAX_QUEUES, PRIORITY_WIDTH

from ..lib.engine import QUEUE_WIDTH
from .arbiter import Arbiter
from .layouts import QueueControl, QueueStatus
from .taskbuffer import ENGINES

__all__ = ["Scheduler"]


class Scheduler(wiring.Component):
    """The arbiter's choice, the current queue, the fetch target and the switch state.

    * A queue **has work** when it has uncommitted descriptors and is not retired. The arbiter
      chooses among queues with work while ``enable`` is set; in secure mode, or while a secure
      queue has work (a secure request), only secure queues take part. Its choice is
      registered (one cycle behind the queue state, off the critical path); a choice whose
      queue has meanwhile lost its work is ignored.
    * The **current queue** is the queue of the latest commit. It **stays** the fetch target
      while it has work, unless GTSP is set and its TSR task is committed (the switch is then
      certain, so the next queue's descriptor is prefetched); otherwise the target is the
      arbiter's choice. Rule 3 (``switch``) and an exception of the current queue release it.
    * A **switch request** above queue ``q``: the choice has a higher priority than ``q``, or
      a secure request exists and ``q`` is not secure.
    * **GTSP** is set by rule 1 and cleared by rule 3 and by the start of a task of another
      queue. A committed **TSR task** blocks further commits until it leaves the task buffer
      (completed, aborted or dropped).
    * **Secure mode** follows the secure request once the NPU has drained (nothing committed,
      loaded or running) and the current queue does not hold the pipeline.

    Parameters
    ----------
    queues : int
        Number of task queues.

    Members
    -------
    queue : In(data.ArrayLayout(QueueStatus, queues))
        State of every queue.
    control : In(data.ArrayLayout(QueueControl, queues))
        Priority and secure flag of every queue.
    enable : In(1)
        ``CTRL.enable``: queues may be chosen and descriptors committed.
    busy : In(1)
        Tasks are committed, loaded or running.
    target : Out(QUEUE_WIDTH); target_valid : Out(1)
        The queue to fetch from (combinational).
    fetched_queue : In(QUEUE_WIDTH); may_commit : Out(1)
        The queue of the descriptor in the fetch queue; whether it may commit now: no TSR task
        is committed, ``enable`` is set and the queue is secure exactly in secure mode
        (combinational).
    commit : In(1); commit_tsr : In(1)
        A descriptor of ``fetched_queue`` is committed; it is a TSR task.
    completing : In(QUEUE_WIDTH).array(ENGINES); request_above : Out(1).array(ENGINES)
        Per engine: the queue of the task completing on it; whether a switch request exists
        above that queue (rule 1; combinational).
    gtsp_set, switch, started_new_queue : In(1)
        Rule 1 sets GTSP; rule 3 clears it and releases the current queue; a task of a queue
        other than the last started one starts (clears GTSP).
    tsr_done, tsr_dropped : In(1)
        A TSR task left the task buffer / was dropped from the configuration queue.
    retire : In(1); retire_queue : In(QUEUE_WIDTH)
        An exception retires ``retire_queue`` (releasing it if it is current).
    current : Out(QUEUE_WIDTH); current_valid : Out(1)
        The current queue.
    gtsp : Out(1)
        Global task-switch parameter.
    request : Out(1)
        A switch request exists above the current queue (combinational).
    work : Out(1)
        Some queue has work that the arbiter may choose (its registered choice is valid;
        combinational).
    secure_mode, secure_request : Out(1)
        Secure mode; some secure queue has work (registered).
    """

    def __init__(self, queues):
        if not isinstance(queues, int) or not 1 <= queues <= MAX_QUEUES:
            raise ValueError(f"Number of queues must be in [1, {MAX_QUEUES}], not {queues!r}")
        self._queues = queues
        super().__init__({
            "queue": In(data.ArrayLayout(QueueStatus, queues)),
            "control": In(data.ArrayLayout(QueueControl, queues)),
            "enable": In(1),
            "busy": In(1),
            "target": Out(QUEUE_WIDTH),
            "target_valid": Out(1),
            "fetched_queue": In(QUEUE_WIDTH),
            "may_commit": Out(1),
            "commit": In(1),
            "commit_tsr": In(1),
            "completing": In(QUEUE_WIDTH).array(ENGINES),
            "request_above": Out(1).array(ENGINES),
            "gtsp_set": In(1),
            "switch": In(1),
            "started_new_queue": In(1),
            "tsr_done": In(1),
            "tsr_dropped": In(1),
            "retire": In(1),
            "retire_queue": In(QUEUE_WIDTH),
            "current": Out(QUEUE_WIDTH),
            "current_valid": Out(1),
            "gtsp": Out(1),
            "request": Out(1),
            "work": Out(1),
            "secure_mode": Out(1),
            "secure_request": Out(1),
        })

    @property
    def queues(self):
        return self._queues

    def elaborate(self, platform):
        m = Module()
        nq = self._queues
        queue = Array(self.queue[i] for i in range(nq))
        control = Array(self.control[i] for i in range(nq))

        # Queues with work; the secure request is registered (off the critical path).
        has_work = [Signal(name=f"has_work{i}") for i in range(nq)]
        for i in range(nq):
            m.d.comb += has_work[i].eq((self.queue[i].count != 0) & ~self.queue[i].retired)
        m.d.sync += self.secure_request.eq(
            Cat(has_work[i] & self.control[i].secure for i in range(nq)).any())

        # The arbiter and its registered choice.
        m.submodules.arbiter = arbiter = Arbiter(nq, PRIORITY_WIDTH)
        exclusive = self.secure_mode | self.secure_request
        for i in range(nq):
            m.d.comb += [arbiter.request[i].eq(has_work[i] & self.enable &
                                               (self.control[i].secure | ~exclusive)),
                         arbiter.priority[i].eq(self.control[i].priority)]
        choice_valid = Signal()
        choice = Signal(QUEUE_WIDTH)
        choice_priority = Signal(PRIORITY_WIDTH)
        m.d.sync += [choice_valid.eq(arbiter.valid), choice.eq(arbiter.index),
                     choice_priority.eq(arbiter.chosen_priority)]
        choice_ok = Signal()
        m.d.comb += [choice_ok.eq(choice_valid & (queue[choice].count != 0) &
                                  ~queue[choice].retired),
                     self.work.eq(choice_ok)]

        # Switch requests above a queue: above the current one, and above each completing
        # task's (rule 1).
        def request_above(q):
            return ((choice_ok & (choice_priority > control[q].priority)) |
                    (self.secure_request & ~control[q].secure))
        m.d.comb += self.request.eq(self.current_valid & request_above(self.current))
        for e in range(ENGINES):
            m.d.comb += self.request_above[e].eq(request_above(self.completing[e]))

        # The fetch target: the current queue while it stays, else the choice.
        stay = Signal()
        tsr_pending = Signal()
        m.d.comb += stay.eq(self.current_valid & (queue[self.current].count != 0) &
                            ~queue[self.current].retired & self.enable &
                            ~(self.gtsp & tsr_pending))
        with m.If(stay):
            m.d.comb += [self.target.eq(self.current), self.target_valid.eq(1)]
        with m.Else():
            m.d.comb += [self.target.eq(choice), self.target_valid.eq(choice_ok)]

        # Commit permission; the current queue and the committed TSR task.
        m.d.comb += self.may_commit.eq(~tsr_pending & self.enable &
                                       (control[self.fetched_queue].secure == self.secure_mode))
        with m.If(self.commit):
            m.d.sync += [self.current.eq(self.fetched_queue), self.current_valid.eq(1)]
            with m.If(self.commit_tsr):
                m.d.sync += tsr_pending.eq(1)
        with m.If(self.tsr_done | self.tsr_dropped):
            m.d.sync += tsr_pending.eq(0)

        # GTSP (rules 1 and 3, cleared when another queue's task starts); rule 3 and an
        # exception of the current queue release it.
        with m.If(self.started_new_queue):
            m.d.sync += self.gtsp.eq(0)
        with m.If(self.gtsp_set):
            m.d.sync += self.gtsp.eq(1)
        with m.If(self.switch):
            m.d.sync += [self.gtsp.eq(0), self.current_valid.eq(0)]
        with m.If(self.retire & self.current_valid & (self.current == self.retire_queue)):
            m.d.sync += self.current_valid.eq(0)

        # Secure mode switches when drained.
        with m.If(~self.busy & ~stay & (self.secure_mode != self.secure_request)):
            m.d.sync += self.secure_mode.eq(self.secure_request)
        return m
