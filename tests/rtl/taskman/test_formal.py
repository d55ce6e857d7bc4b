# amaranth: UnusedElaboratable=no
"""k-induction proofs (yowasp-sby) of the task manager's arbiter, configuration queue and task
buffer."""

import pytest
from amaranth.hdl import Array, Assert, Assume, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In
from npu.taskman import Arbiter, TaskBuffer
from npu.lib.engine import SEQ_WIDTH, TaskEntry
from npu.taskman.slots import SlotRing
from npu.taskman.taskbuffer import ENGINES
from npu_sim.formal import prove

pytestmark = pytest.mark.formal


class ArbiterProof(wiring.Component):
    """Whenever a queue requests, the chosen one requests, has the highest priority of all
    requesting queues, and is the lowest-indexed of those with that priority; no request, no
    choice."""

    def __init__(self, queues, width=3):
        self.queues = queues
        super().__init__({"request": In(queues), "priority": In(width).array(queues)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = Arbiter(self.queues, len(self.priority[0]))
        m.d.comb += dut.request.eq(self.request)
        for i in range(self.queues):
            m.d.comb += dut.priority[i].eq(self.priority[i])
        for i in range(self.queues):
            with m.If(dut.valid):
                with m.If(self.request[i]):
                    m.d.comb += Assert(self.priority[i] <= dut.chosen_priority)
                    with m.If(self.priority[i] == dut.chosen_priority):
                        m.d.comb += Assert(dut.index <= i)
                with m.If(dut.index == i):
                    m.d.comb += [Assert(self.request[i]),
                                 Assert(dut.chosen_priority == self.priority[i])]
            with m.Else():
                m.d.comb += Assert(~self.request[i])
        return m


class RingProof(wiring.Component):
    """The configuration queue never overflows, never drops or duplicates an entry, pops in
    commit order, and the fetch slot is never a committed slot."""

    def __init__(self, depth, ring=SlotRing):
        self.depth = depth
        self.ring = ring
        super().__init__({"commit": In(1), "pop": In(1)})

    def elaborate(self, platform):
        m = Module()
        depth = self.depth
        slots = depth + 1
        m.submodules.dut = dut = self.ring(depth)
        m.d.comb += [dut.commit.eq(self.commit), dut.pop.eq(self.pop)]
        # Shadow: a tag per commit, written into the slot it went to.
        tags = Array(Signal(4, name=f"tag{s}") for s in range(slots))
        next_tag = Signal(4)
        pop_tag = Signal(4)
        with m.If(dut.committed):
            m.d.sync += [tags[dut.wr].eq(next_tag), next_tag.eq(next_tag + 1)]
        with m.If(dut.popped):
            m.d.sync += pop_tag.eq(pop_tag + 1)
            m.d.comb += Assert(tags[dut.rd] == pop_tag)          # FIFO order, nothing lost
        # Requests are taken exactly when they can be.
        m.d.comb += [Assert(dut.committed == (self.commit & (dut.level < depth))),
                     Assert(dut.popped == (self.pop & (dut.level != 0))),
                     Assert(dut.level <= depth)]
        # The committed slots are rd .. rd + level - 1 and hold the tags in order; the fetch
        # slot wr follows them.
        m.d.comb += Assert(Mux(dut.wr >= dut.rd, dut.wr - dut.rd, dut.wr + slots - dut.rd)
                           == dut.level)
        m.d.comb += Assert((next_tag - pop_tag)[:4] == dut.level)
        for i in range(depth):
            idx = Signal(range(2 * slots), name=f"idx{i}")
            m.d.comb += idx.eq(dut.rd + i)
            slot = Mux(idx >= slots, idx - slots, idx)
            with m.If(i < dut.level):
                m.d.comb += Assert(tags[slot] == (pop_tag + i)[:4])
        return m


class TaskBufferProof(wiring.Component):
    """A task starts only when the task it depends on has completed, after every older task of
    its engine has started, with its engine idle, and a switch-point task only alone.

    The proof follows one arbitrary sequence number ``tracked`` (a free input held constant):
    a shadow records whether the task with that number is loaded and unfinished, started, its
    engine and its barrier bit; every grant is checked against it. As ``tracked`` is arbitrary,
    the properties hold for every task.
    """

    def __init__(self, depth):
        self.depth = depth
        super().__init__({
            "load_valid": In(1), "load": In(TaskEntry),
            "start_ready": In(1).array(ENGINES), "done": In(1).array(ENGINES),
            "kill": In(1).array(ENGINES), "skew": In(8), "tracked": In(SEQ_WIDTH),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.depth
        m.submodules.dut = dut = TaskBuffer(n, 2)
        m.d.comb += [dut.load.valid.eq(self.load_valid), dut.load.payload.eq(self.load),
                     dut.skew.eq(self.skew), dut.drop.eq(0)]
        for e in range(ENGINES):
            m.d.comb += [dut.start[e].ready.eq(self.start_ready[e]), dut.done[e].eq(self.done[e]),
                         dut.kill[e].eq(self.kill[e])]
        # Dependency distances below 8 and a skew limit of at most the buffer depth (the ages
        # of the entries then stay within the depth); ``tracked`` never changes.
        t = self.tracked
        t_prev = Signal(SEQ_WIDTH)
        m.d.sync += t_prev.eq(t)
        m.d.comb += [Assume(self.load.dep < 8), Assume(self.skew <= n), Assume(t == t_prev)]

        out = Signal()       # the tracked task is loaded and not finished
        begun = Signal()     # ... and started
        eng = Signal()
        bar = Signal()
        with m.If(dut.load.valid & dut.load.ready & (dut.next_seq == t)):
            m.d.sync += [out.eq(1), begun.eq(0), eng.eq(self.load.engine),
                         bar.eq(self.load.barrier)]
        for e in range(ENGINES):
            st = dut.start[e]
            with m.If(st.valid & st.ready & (st.payload.seq == t)):
                m.d.sync += begun.eq(1)
            with m.If(dut.finished_valid[e] & (dut.finished[e].seq == t)):
                m.d.sync += out.eq(0)

        # Properties at every grant.
        for e in range(ENGINES):
            st = dut.start[e]
            p = st.payload
            with m.If(st.valid):
                m.d.comb += Assert(p.engine == e)
                with m.If(p.seq == t):
                    m.d.comb += Assert(out & ~begun)
                with m.If((p.dep != 0) & ((p.seq - p.dep)[:SEQ_WIDTH] == t)):
                    m.d.comb += Assert(~out)                  # the producer has completed
                for k in range(1, n):
                    with m.If((p.seq - k)[:SEQ_WIDTH] == t):
                        m.d.comb += [Assert(~(out & ~begun & (eng == e))),   # engine order
                                     Assert(~(out & bar))]                   # older barrier
                        with m.If(p.barrier):
                            m.d.comb += Assert(~out)          # a barrier starts alone
                m.d.comb += Assert(~(out & begun & (eng == e)))              # engine idle

        # Invariants linking the shadow to the buffer (they make the induction go through).
        in_buffer = 0
        for i in range(n):
            age = (dut.next_seq - dut.entry[i].seq)[:SEQ_WIDTH]
            in_buffer = in_buffer | (dut.valid[i] & (dut.entry[i].seq == t))
            with m.If(dut.valid[i]):
                m.d.comb += [Assert((age >= 1) & (age <= n)),
                             Assert(dut.entry[i].dep < 8)]
                with m.If(dut.entry[i].seq == t):
                    m.d.comb += [Assert(begun == dut.started[i]),
                                 Assert(eng == dut.entry[i].engine),
                                 Assert(bar == dut.entry[i].barrier)]
                for j in range(i + 1, n):
                    with m.If(dut.valid[j]):
                        m.d.comb += Assert(dut.entry[i].seq != dut.entry[j].seq)
                with m.If(dut.started[i]):
                    running_here = 0
                    for e in range(ENGINES):
                        running_here = running_here | (dut.running_valid[e] &
                                                       (dut.running[e] == i))
                    m.d.comb += Assert(running_here)
        m.d.comb += Assert(out == in_buffer)
        for e in range(ENGINES):
            m.d.comb += Assert(dut.running[e] < n)
            with m.If(dut.running_valid[e]):
                m.d.comb += [Assert(Array(dut.valid)[dut.running[e]]),
                             Assert(Array(dut.started)[dut.running[e]]),
                             Assert(Array(dut.entry)[dut.running[e]].engine == e)]
        return m


class OverflowingRing(SlotRing):
    """A broken ring that takes a commit even when full (the proof must catch it)."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        m.d.comb += self.committed.eq(self.commit)
        return m


def check(result):
    assert result.passed, f"{result.status}\n{result.log[-3000:]}"


def test_arbiter_highest_priority_served():
    check(prove(ArbiterProof(5), "taskman_arbiter", mode="prove", depth=1))


def test_config_queue_never_overflows_or_drops():
    check(prove(RingProof(3), "taskman_ring", mode="prove", depth=4))


def test_task_buffer_waits_for_dependencies():
    check(prove(TaskBufferProof(3), "taskman_taskbuffer", mode="prove", depth=3, timeout=900))


def test_config_queue_proof_catches_overflow():
    result = prove(RingProof(3, OverflowingRing), "taskman_ring_broken", mode="prove", depth=4)
    assert not result.passed and result.status == "FAIL"
