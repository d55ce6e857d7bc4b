"""The task buffer: asynchronous dispatch to the neural engine, the planar engine and the DMA
engine, with dependencies."""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.engine import Engine

from ..lib.engine import QUEUE_WIDTH, SEQ_WIDTH, TaskEntry

__all__ = ["ENGINES", "TaskBuffer", "task_buffer_members"]

#: Engines served, indexed by :class:`npu_spec.engine.Engine` code: 0 the neural engine, 1 the
#: planar engine, 2 the DMA engine.
ENGINES = len(Engine)


def task_buffer_members(queues):
    """The ports of a task buffer (:class:`TaskBuffer` and the lean build's
    :class:`~npu.taskman.serial.SerialTaskBuffer`) with ``queues`` task queues."""
    return {
        "load": In(stream.Signature(TaskEntry)),
        "next_seq": Out(SEQ_WIDTH),
        "skew": In(8),
        "start": Out(stream.Signature(TaskEntry)).array(ENGINES),
        "done": In(1).array(ENGINES),
        "kill": In(1).array(ENGINES),
        "finished": Out(TaskEntry).array(ENGINES),
        "finished_valid": Out(1).array(ENGINES),
        "drop": In(queues),
        "withdraw": In(queues),
        "empty": Out(1),
        "waiting": Out(1).array(ENGINES),
        "loaded": Out(ENGINES),
    }


class TaskBuffer(wiring.Component):
    """Holds loaded tasks and starts them on their engines as order and dependencies allow.

    Rules, all checked every cycle:

    * Tasks of one engine start in load order (the compiled order), one at a time.
    * A task with ``dep = d > 0`` starts only after the task loaded ``d`` positions earlier has
      completed (it is no longer in the buffer).
    * A switch-point task (``barrier``: TSE, TSR or SPL) starts only when every older task has
      completed, and no younger task starts before it completes.
    * A completed entry is freed in the cycle its engine reports ``done`` (or is killed), before
      any new entry can use the slot.
    * A task is loaded only if the oldest task in the buffer is fewer than ``skew`` positions
      older than it (``skew = 0``: the buffer depth), and only into an empty buffer when its
      queue differs from the previous task's (a queue change drains the buffer).

    The start streams are registered: a granted task counts as started (its engine as busy) and
    waits in its engine's start register until the engine takes it; a task of a dropped queue
    waiting there is withdrawn and removed. Order comes from an age matrix (``older``) written
    at each load and dependencies from each entry's producer sequence number computed at its
    load, so the grant has no arithmetic.

    Parameters
    ----------
    depth : int
        Number of entries (2 to 16).
    queues : int
        Number of task queues (width of ``drop``).

    Members
    -------
    load : In(stream.Signature(TaskEntry))
        Tasks in list order; ``seq`` of the payload is ignored and replaced by :attr:`next_seq`.
    next_seq : Out(SEQ_WIDTH)
        Sequence number the next loaded task gets.
    skew : In(8)
        Skew limit.
    start : Out(stream.Signature(TaskEntry)).array(ENGINES)
        Per engine: the task to start (registered; ``valid`` falls without a transfer only when
        the task's queue is dropped).
    done, kill : In(1).array(ENGINES)
        Per engine: the running task completed / is aborted.
    finished : Out(TaskEntry).array(ENGINES); finished_valid : Out(1).array(ENGINES)
        Per engine: the task leaving the buffer this cycle (the entry from the start register;
        ``finished_valid`` combinational).
    drop : In(queues)
        Entries not started, or waiting in a start register, whose queue bit is set are
        removed, and none of them starts.
    withdraw : In(queues)
        As ``drop``, for the start registers only: a task waiting there whose queue bit is set
        is withdrawn and removed (the entries not started are left to ``drop``, which must
        follow from the next cycle on; a task granted meanwhile is withdrawn then). It keeps
        a combinational drop (an exception of this cycle) off the grants.
    empty : Out(1)
        No entry is valid.
    waiting : Out(1).array(ENGINES)
        Per engine: it is idle while a task of it is loaded but may not start yet.
    loaded : Out(ENGINES)
        Per engine: a task of it is loaded or running (not yet completed).
    """

    def __init__(self, depth=4, queues=8):
        if not isinstance(depth, int) or not 2 <= depth <= 16:
            raise ValueError(f"Task buffer depth must be in [2, 16], not {depth!r}")
        self._depth = depth
        super().__init__(task_buffer_members(queues))
        # Entry state; attributes (not locals of elaborate) so that formal harnesses can state
        # invariants over them.
        self.valid = [Signal(name=f"valid{i}") for i in range(depth)]
        self.started = [Signal(name=f"started{i}") for i in range(depth)]
        # (An entry is looked at only while it is valid: no reset.)
        self.entry = [Signal(TaskEntry, name=f"entry{i}", reset_less=True) for i in range(depth)]
        self.running = [Signal(range(depth), name=f"running{e}") for e in range(ENGINES)]
        self.running_valid = [Signal(name=f"running_valid{e}") for e in range(ENGINES)]
        # ``older[j][i]``: entry ``j`` was loaded before entry ``i`` (meaningful while both are
        # valid); ``producer[i]``: the sequence number entry ``i`` depends on.
        self.older = [[Signal(name=f"older{j}_{i}", reset_less=True) for i in range(depth)]
                      for j in range(depth)]
        self.producer = [Signal(SEQ_WIDTH, name=f"producer{i}", reset_less=True)
                         for i in range(depth)]
        # Per engine: the granted task waits in the start register (``start[e]``) for its
        # engine to take it.
        self.offered = [Signal(name=f"offered{e}") for e in range(ENGINES)]
        self.offer = [Signal(TaskEntry, name=f"offer{e}", reset_less=True)
                      for e in range(ENGINES)]

    @property
    def depth(self):
        return self._depth

    def elaborate(self, platform):
        m = Module()
        n = self._depth
        valid, started, entry = self.valid, self.started, self.entry
        running, running_valid = self.running, self.running_valid
        last_queue = Signal(QUEUE_WIDTH)

        # Age of each entry: how many loads ago it was loaded (for the skew limit only; the
        # start conditions use the age matrix ``older``, which needs no arithmetic).
        age = [Signal(SEQ_WIDTH, name=f"age{i}") for i in range(n)]
        for i in range(n):
            m.d.comb += age[i].eq(self.next_seq - entry[i].seq)

        def older(j, i):
            return valid[j] & self.older[j][i]

        # Start conditions per entry.
        grant = [[Signal(name=f"grant{e}_{i}") for i in range(n)] for e in range(ENGINES)]
        for i in range(n):
            pend = valid[i] & ~started[i] & ~self.drop.bit_select(entry[i].queue, 1)
            first = Signal(name=f"first{i}")       # oldest pending task of its engine
            dep_ok = Signal(name=f"dep_ok{i}")
            barrier_ok = Signal(name=f"barrier_ok{i}")
            producer = self.producer[i]
            blockers = []
            waits = []
            older_any = []
            older_barrier = []
            for j in range(n):
                if j == i:
                    continue
                blockers.append(older(j, i) & ~started[j] & (entry[j].engine == entry[i].engine))
                waits.append(older(j, i) & (entry[j].seq == producer))
                older_any.append(older(j, i))
                older_barrier.append(older(j, i) & entry[j].barrier)

            def none(terms):
                result = 1
                for t in terms:
                    result = result & ~t
                return result
            m.d.comb += [
                first.eq(pend & none(blockers)),
                dep_ok.eq((entry[i].dep == 0) | none(waits)),
                barrier_ok.eq(none(older_barrier) & (~entry[i].barrier | none(older_any))),
            ]
            for e in range(ENGINES):
                m.d.comb += grant[e][i].eq(first & dep_ok & barrier_ok & ~running_valid[e] &
                                           (entry[i].engine == e))

        # Start streams, registered: at most one grant per engine (only the oldest pending task
        # of an engine may be granted, and only while the engine has none); the granted task
        # counts as started and running, and waits in the start register until its engine
        # takes it. A task of a dropped queue waiting there is withdrawn and removed.
        for e in range(ENGINES):
            start = self.start[e]
            offered = self.offered[e]
            payload = self.offer[e]
            withdrawn = Signal(name=f"withdrawn{e}")
            m.d.comb += [withdrawn.eq((self.drop | self.withdraw).bit_select(payload.queue, 1)),
                         start.valid.eq(offered & ~withdrawn), start.payload.eq(payload)]
            with m.If(start.valid & start.ready):
                m.d.sync += offered.eq(0)
            with m.If(offered & withdrawn):
                m.d.sync += [offered.eq(0), running_valid[e].eq(0)]
                for i in range(n):
                    with m.If(running[e] == i):
                        m.d.sync += valid[i].eq(0)
            granted = Signal(name=f"granted{e}")
            m.d.comb += granted.eq(Cat(grant[e]).any())
            for i in range(n):
                with m.If(grant[e][i]):
                    m.d.sync += [started[i].eq(1), running[e].eq(i), running_valid[e].eq(1),
                                 offered.eq(1), payload.eq(entry[i])]
            pending = 0
            for i in range(n):
                pending = pending | (valid[i] & ~started[i] & (entry[i].engine == e))
            m.d.comb += self.waiting[e].eq(~running_valid[e] & pending & ~granted)

        # Completion: free the running entry (once its engine has taken it); the start
        # register still holds the running task.
        for e in range(ENGINES):
            finish = running_valid[e] & ~self.offered[e] & (self.done[e] | self.kill[e])
            m.d.comb += [self.finished_valid[e].eq(finish),
                         self.finished[e].eq(self.offer[e])]
            with m.If(finish):
                m.d.sync += running_valid[e].eq(0)
                for i in range(n):
                    with m.If(running[e] == i):
                        m.d.sync += valid[i].eq(0)

        # Dropped entries (their queue was retired by the watchdog).
        for i in range(n):
            with m.If(valid[i] & ~started[i] & self.drop.bit_select(entry[i].queue, 1)):
                m.d.sync += valid[i].eq(0)

        # Loading: a free slot, the skew limit, and a drain before a queue change.
        empty = 1
        for i in range(n):
            empty = empty & ~valid[i]
        m.d.comb += self.empty.eq(empty)
        for e in range(ENGINES):
            m.d.comb += self.loaded[e].eq(Cat(valid[i] & (entry[i].engine == e)
                                              for i in range(n)).any())
        limit = Signal(8)
        m.d.comb += limit.eq(self.skew)
        with m.If(self.skew == 0):
            m.d.comb += limit.eq(n)
        skew_ok = 1
        for i in range(n):
            skew_ok = skew_ok & ~(valid[i] & (age[i] >= limit))
        free = Signal(range(n))
        any_free = 0
        for i in reversed(range(n)):
            with m.If(~valid[i]):
                m.d.comb += free.eq(i)
            any_free = any_free | ~valid[i]
        m.d.comb += self.load.ready.eq(any_free & skew_ok &
                                       (empty | (self.load.payload.queue == last_queue)))
        with m.If(self.load.valid & self.load.ready):
            m.d.sync += [self.next_seq.eq(self.next_seq + 1),
                         last_queue.eq(self.load.payload.queue)]
            for i in range(n):
                with m.If(free == i):
                    m.d.sync += [valid[i].eq(1), started[i].eq(0),
                                 entry[i].eq(self.load.payload),
                                 entry[i].seq.eq(self.next_seq),
                                 self.producer[i].eq(self.next_seq - self.load.payload.dep)]
                    for j in range(n):
                        if j != i:
                            m.d.sync += [self.older[j][i].eq(valid[j]),
                                         self.older[i][j].eq(0)]
        return m
