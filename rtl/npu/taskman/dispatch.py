"""Between the task buffer and the engines: rule 4 on the start streams, the watchdog and the
completion rules 1, 2, 3 and 5."""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.descriptors import SWITCH_POINTS
from npu_spec.engine import ERROR_BITS
from npu_spec.taskman import MAX_QUEUES

from ..lib.engine import QUEUE_WIDTH, EngineSignature, TaskEntry
from .layouts import CauseCode, ExceptionEvent
from .taskbuffer import ENGINES

__all__ = ["Dispatch"]


class Dispatch(wiring.Component):
    """Passes the task buffer's starts to the engines and turns their completions into the
    switch rules.

    * **Rule 4**: an SPC task starting while its queue's TQSP is set reads its input from
      system memory (``src_mem`` of the start beat).
    * A task of another queue than the last started one starting is reported
      (``started_new_queue``: it clears GTSP).
    * **Watchdog**: a task running ``watchdog`` cycles (0: off; the value of the cycle before)
      without ``done`` is aborted
      (``abort`` to the engine, ``kill`` to the task buffer) and raises ``TIMEOUT`` for its
      queue.
    * **Engine errors**: a ``done`` with a nonzero ``error`` code raises ``ENGINE`` for the
      task's queue, with the engine and the code; the task has left the task buffer but
      completes nothing (like an aborted one: no switch rule, no interrupt).
    * On completion (``done`` with error code 0; an aborted or failed task completes nothing):
      **rule 1**, a TSE task completing while a switch request exists above its queue sets
      GTSP; **rule 2**, the output
      also goes to system memory when the task has DST_MEM, or DPC while GTSP is set (including
      by rule 1 in this cycle): ``done_mem``; **rule 3**, a TSR task completing while GTSP is set
      sets its queue's TQSP, clears GTSP and releases the current queue (``switch``); **rule
      5**, an SPL task completing clears its queue's TQSP.

    Switch-point tasks run alone (task-buffer barrier), so at most one completing task carries
    TSE, TSR or SPL, and ``flag_queue`` is its queue.

    Parameters
    ----------
    queues : int
        Number of task queues (width of ``tqsp``).
    shared_watchdog : bool
        One watchdog timer for all engines, restarted by every start: exact when one task runs
        at a time (the lean task buffer); otherwise one timer per engine.
    done_register : bool
        Take each engine's ``done`` and ``error`` through a register (``NPUConfig.dispatch_regs``,
        ``docs/task_manager.md``, "The done register"): the task manager sees an engine's
        ``done`` one cycle after the engine gives it, so that no combinational path runs from
        an engine's end of task into the task buffer's grants and the other engines' starts.
        Every rule then acts one cycle later; ``done_mem`` is valid in that later cycle, and
        a watchdog abort may meet the engine's ``done`` (the task then counts as timed out).

    Members
    -------
    start : In(stream.Signature(TaskEntry)).array(ENGINES)
        The task buffer's starts.
    finished : In(TaskEntry).array(ENGINES); finished_valid : In(1).array(ENGINES)
        The task leaving the task buffer on each engine (combinational in the task buffer).
    done, kill : Out(1).array(ENGINES)
        To the task buffer: the running task completed / is aborted.
    engines : Out(EngineSignature()).array(ENGINES)
        The neural engine, the planar engine and the DMA engine (by ``Engine`` code).
    tqsp : In(queues)
        Bit ``i``: queue ``i``'s TQSP.
    watchdog : In(32)
        ``WATCHDOG.cycles``; compared through a register, so a new value counts from the cycle
        after it is written.
    gtsp : In(1)
        GTSP.
    request_above : In(1).array(ENGINES)
        A switch request exists above the queue of the task finishing on each engine.
    started_new_queue, gtsp_set, switch, tqsp_set, tqsp_clear : Out(1)
        The events above (combinational).
    flag_queue : Out(QUEUE_WIDTH)
        Queue of the completing switch-point task.
    tsr_done : Out(1)
        A TSR task left the task buffer (completed or aborted).
    task_done_irq : Out(1)
        A task with the IRQ flag completed.
    completed : Out(ENGINES)
        Per engine: a task left the task buffer (completed or aborted).
    exception : Out(ExceptionEvent)
        ``TIMEOUT`` of the aborted task's queue, descriptor and engine, else ``ENGINE`` of the
        failed task's queue, descriptor, engine and error code (the highest engine's if two
        engines raise the same cause in one cycle; their tasks are of one queue, as the task
        buffer drains before a queue change); ``NONE`` otherwise (combinational).
    """

    def __init__(self, queues, *, shared_watchdog=False, done_register=False):
        if not isinstance(queues, int) or not 1 <= queues <= MAX_QUEUES:
            raise ValueError(f"Number of queues must be in [1, {MAX_QUEUES}], not {queues!r}")
        self._queues = queues
        self._shared_watchdog = bool(shared_watchdog)
        self._done_register = bool(done_register)
        super().__init__({
            "start": In(stream.Signature(TaskEntry)).array(ENGINES),
            "finished": In(TaskEntry).array(ENGINES),
            "finished_valid": In(1).array(ENGINES),
            "done": Out(1).array(ENGINES),
            "kill": Out(1).array(ENGINES),
            "engines": Out(EngineSignature()).array(ENGINES),
            "tqsp": In(queues),
            "watchdog": In(32),
            "gtsp": In(1),
            "request_above": In(1).array(ENGINES),
            "started_new_queue": Out(1),
            "gtsp_set": Out(1),
            "switch": Out(1),
            "tqsp_set": Out(1),
            "tqsp_clear": Out(1),
            "flag_queue": Out(QUEUE_WIDTH),
            "tsr_done": Out(1),
            "task_done_irq": Out(1),
            "completed": Out(ENGINES),
            "exception": Out(ExceptionEvent),
        })

    @property
    def queues(self):
        return self._queues

    def elaborate(self, platform):
        m = Module()

        # The engines' done and error, as the task manager sees them (through a register or
        # not); the error code needs no reset: it is looked at only with ``done``.
        done = [Signal(name=f"done{e}") for e in range(ENGINES)]
        error = [Signal(ERROR_BITS, name=f"error{e}", reset_less=True) for e in range(ENGINES)]
        for e, engine in enumerate(self.engines):
            domain = m.d.sync if self._done_register else m.d.comb
            domain += [done[e].eq(engine.done), error[e].eq(engine.error)]

        # Starts, with rule 4; the queue of the most recently started task.
        last_queue = Signal(QUEUE_WIDTH)
        last_queue_valid = Signal()
        for e, engine in enumerate(self.engines):
            start = self.start[e]
            task = start.payload
            m.d.comb += [engine.start.valid.eq(start.valid), start.ready.eq(engine.start.ready),
                         engine.start.payload.eq(task),
                         engine.start.payload.src_mem.eq(
                             task.src_mem | (task.spc & self.tqsp.bit_select(task.queue, 1)))]
            with m.If(start.valid & start.ready):
                m.d.sync += [last_queue.eq(task.queue), last_queue_valid.eq(1)]
                with m.If(~last_queue_valid | (task.queue != last_queue)):
                    m.d.comb += self.started_new_queue.eq(1)

        # Engine errors (a timeout, below, wins over an error in the same cycle).
        failed = Signal(ENGINES)
        for e, engine in enumerate(self.engines):
            m.d.comb += failed[e].eq(self.finished_valid[e] & done[e] & (error[e] != 0))
            with m.If(failed[e]):
                m.d.comb += [self.exception.cause.eq(CauseCode.ENGINE),
                             self.exception.queue.eq(self.finished[e].queue),
                             self.exception.addr.eq(self.finished[e].addr),
                             self.exception.engine.eq(e),
                             self.exception.code.eq(error[e])]

        # Watchdog: one timer per engine (or one for all), holding the running task's age of
        # the next cycle (2 in the cycle after its start), so that the comparison with
        # ``watchdog`` is registered (``expired``): the task times out in the cycle its age
        # (1 in the cycle after its start) reaches ``watchdog`` as it was a cycle before.
        timeout = Signal(ENGINES)
        high_zero = Signal()            # WATCHDOG is 0 or 1 (one NOR for both tests below)
        m.d.comb += high_zero.eq(self.watchdog[1:] == 0)
        timers = [(Signal(32, name=f"age_next{e}"), Signal(name=f"expired{e}"))
                  for e in range(1 if self._shared_watchdog else ENGINES)]
        for e, engine in enumerate(self.engines):
            age_next, expired = timers[0 if self._shared_watchdog else e]
            running = Signal(name=f"running{e}")
            with m.If(engine.start.valid & engine.start.ready):
                m.d.sync += [running.eq(1), age_next.eq(2),
                             expired.eq(high_zero & self.watchdog[0])]       # WATCHDOG == 1
            with m.Elif(running):
                m.d.sync += [age_next.eq(age_next + 1),
                             expired.eq(~(high_zero & ~self.watchdog[0]) &   # WATCHDOG != 0
                                        (age_next >= self.watchdog))]
            with m.If(self.finished_valid[e]):
                m.d.sync += running.eq(0)
            m.d.comb += timeout[e].eq(running & ~done[e] & expired)
            m.d.comb += [self.done[e].eq(done[e]), self.kill[e].eq(timeout[e]),
                         engine.abort.eq(timeout[e])]
            with m.If(timeout[e]):
                m.d.comb += [self.exception.cause.eq(CauseCode.TIMEOUT),
                             self.exception.queue.eq(self.finished[e].queue),
                             self.exception.addr.eq(self.finished[e].addr),
                             self.exception.engine.eq(e), self.exception.code.eq(0)]

        # Completions: rules 1, 2, 3 and 5.
        completes = [Signal(name=f"completes{e}") for e in range(ENGINES)]
        for e in range(ENGINES):
            task = self.finished[e]
            m.d.comb += [completes[e].eq(self.finished_valid[e] & ~timeout[e] & ~failed[e]),
                         self.completed[e].eq(self.finished_valid[e])]
            with m.If(completes[e] & task.tse & self.request_above[e]):
                m.d.comb += self.gtsp_set.eq(1)                                 # rule 1
            with m.If(self.finished_valid[e] & task.tsr):
                m.d.comb += self.tsr_done.eq(1)
            with m.If(completes[e] & Cat(task[name] for name in SWITCH_POINTS).any()):
                m.d.comb += self.flag_queue.eq(task.queue)
            with m.If(completes[e] & task.irq):
                m.d.comb += self.task_done_irq.eq(1)
        gtsp = Signal()
        m.d.comb += gtsp.eq(self.gtsp | self.gtsp_set)
        for e, engine in enumerate(self.engines):
            task = self.finished[e]
            m.d.comb += engine.done_mem.eq(task.dst_mem | (task.dpc & gtsp))      # rule 2
            with m.If(completes[e] & task.tsr & gtsp):
                m.d.comb += [self.switch.eq(1), self.tqsp_set.eq(1)]            # rule 3
            with m.If(completes[e] & task.spl):
                m.d.comb += self.tqsp_clear.eq(1)                               # rule 5
        return m
