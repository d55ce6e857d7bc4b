# amaranth: UnusedElaboratable=no
"""k-induction proofs (yowasp-sby) of the task manager's arbiter, configuration queue, task
buffer, queue state and fetch queue."""

import pytest
from amaranth.hdl import Array, Assert, Assume, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In

from npu.lib.engine import ADDR_WIDTH, QUEUE_WIDTH, SEQ_WIDTH, TaskEntry
from npu.taskman import Arbiter, TaskBuffer
from npu.taskman.fetch import Fetch
from npu.taskman.layouts import CauseCode, MemoryWindow, QueueControl, QueueStatus
from npu.taskman.queues import Queues
from npu.taskman.serial import SerialTaskBuffer
from npu.taskman.slots import SlotRing
from npu.taskman.taskbuffer import ENGINES
from npu_sim.formal import prove
from npu_spec.descriptors import HEADER_WORDS
from npu_spec.taskman import BASE_TABLE_SIZE

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
    the properties hold for every task. ``buffer`` builds the buffer under proof from the depth
    and the number of queues (the lean build's :class:`SerialTaskBuffer` has depth 1).
    """

    def __init__(self, depth, buffer=TaskBuffer):
        self.depth = depth
        self.buffer = buffer
        super().__init__({
            "load_valid": In(1), "load": In(TaskEntry),
            "start_ready": In(1).array(ENGINES), "done": In(1).array(ENGINES),
            "kill": In(1).array(ENGINES), "skew": In(8), "tracked": In(SEQ_WIDTH),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.depth
        m.submodules.dut = dut = self.buffer(n, 2)
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
        m.d.comb += [Assume(self.load.dep < 8), Assume(self.skew <= n), Assume(t == t_prev),
                     Assume(self.load.engine < ENGINES)]

        out = Signal()       # the tracked task is loaded and not finished
        begun = Signal()     # ... and started
        eng = Signal.like(self.load.engine)
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
                             Assert(dut.entry[i].dep < 8), Assert(dut.entry[i].engine < ENGINES)]
                offered_here = 0
                for e in range(ENGINES):
                    if hasattr(dut, "offered"):     # the registered start of the full buffer
                        offered_here = offered_here | (dut.offered[e] & (dut.running[e] == i))
                with m.If(dut.entry[i].seq == t):
                    m.d.comb += [Assert(begun == (dut.started[i] & ~offered_here)),
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
        if hasattr(dut, "offered"):
            # The full buffer's start registers, age matrix and producers.
            for e in range(ENGINES):
                with m.If(dut.offered[e]):
                    m.d.comb += Assert(dut.running_valid[e])
                with m.If(dut.running_valid[e]):
                    for i in range(n):
                        with m.If(dut.running[e] == i):
                            m.d.comb += [Assert(dut.valid[i] & dut.started[i]),
                                         Assert(dut.offer[e] == dut.entry[i])]
            for i in range(n):
                with m.If(dut.valid[i]):
                    m.d.comb += Assert(dut.producer[i] ==
                                       (dut.entry[i].seq - dut.entry[i].dep)[:SEQ_WIDTH])
                    for j in range(n):
                        if j != i:
                            age_i = (dut.next_seq - dut.entry[i].seq)[:SEQ_WIDTH]
                            age_j = (dut.next_seq - dut.entry[j].seq)[:SEQ_WIDTH]
                            with m.If(dut.valid[j]):
                                m.d.comb += Assert(dut.older[j][i] == (age_j > age_i))
        for e in range(ENGINES):
            m.d.comb += Assert(dut.running[e] < n)
            with m.If(dut.running_valid[e]):
                m.d.comb += [Assert(Array(dut.valid)[dut.running[e]]),
                             Assert(Array(dut.started)[dut.running[e]]),
                             Assert(Array(dut.entry)[dut.running[e]].engine == e)]
        return m


class QueuesProof(wiring.Component):
    """A queue's head pointer and descriptor count change only by a host write (``HEAD``,
    ``PUSH``) or a commit of that queue (by its length, by one); TQSP only by rules 3 and 5 of
    that queue or a head write; retired and drop only by an exception of that queue or a head
    write, and drop implies retired. Nothing else (a fetch, its replacement) can move them.
    With ``addr_width`` below 32 (the lean build) the head is kept, and moves, modulo
    ``2 ** addr_width``."""

    def __init__(self, queues, addr_width=ADDR_WIDTH):
        self.queues = queues
        self.addr_width = addr_width
        super().__init__({
            "set_head": In(1).array(queues), "head": In(ADDR_WIDTH).array(queues),
            "push": In(16).array(queues), "commit": In(1), "commit_queue": In(QUEUE_WIDTH),
            "commit_length": In(8), "tqsp_set": In(1), "tqsp_clear": In(1),
            "flag_queue": In(QUEUE_WIDTH), "retire": In(1), "retire_queue": In(QUEUE_WIDTH),
            "retire_drop": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        nq = self.queues
        aw = self.addr_width
        m.submodules.dut = dut = Queues(nq, addr_width=aw)
        for name in ("commit", "commit_queue", "commit_length", "tqsp_set", "tqsp_clear",
                     "flag_queue", "retire", "retire_queue", "retire_drop"):
            m.d.comb += getattr(dut, name).eq(getattr(self, name))
        for i in range(nq):
            m.d.comb += [dut.set_head[i].eq(self.set_head[i]), dut.head[i].eq(self.head[i]),
                         dut.push[i].eq(self.push[i])]
        # Last cycle's state and inputs.
        past = Signal(data.ArrayLayout(QueueStatus, nq))
        past_valid = Signal()
        m.d.sync += [past.eq(dut.state), past_valid.eq(1)]
        events = {}
        for i in range(nq):
            for name, value in (
                    ("set_head", self.set_head[i]), ("head", self.head[i]),
                    ("push", self.push[i]),
                    ("commit", self.commit & (self.commit_queue == i)),
                    ("length", self.commit_length),
                    ("tqsp_set", self.tqsp_set & (self.flag_queue == i)),
                    ("tqsp_clear", self.tqsp_clear & (self.flag_queue == i)),
                    ("retire", self.retire & (self.retire_queue == i)),
                    ("drop", self.retire & (self.retire_queue == i) & self.retire_drop)):
                events[name, i] = Signal.like(value, name=f"past_{name}{i}")
                m.d.sync += events[name, i].eq(value)
        for i in range(nq):
            now, before = dut.state[i], past[i]

            def event(name):
                return events[name, i]
            m.d.comb += Assert(~now.drop | now.retired)
            with m.If(past_valid):
                m.d.comb += Assert(now.count == (before.count + event("push") -
                                                 event("commit"))[:16])
                with m.If(event("set_head")):
                    m.d.comb += [Assert(now.head == event("head")[:aw]), Assert(~now.tqsp),
                                 Assert(~now.retired), Assert(~now.drop)]
                with m.Else():
                    m.d.comb += Assert(now.head == Mux(event("commit"),
                                                       (before.head + event("length"))[:aw],
                                                       before.head))
                    with m.If(now.tqsp != before.tqsp):
                        m.d.comb += Assert(Mux(now.tqsp, event("tqsp_set") &
                                               ~event("tqsp_clear"), event("tqsp_clear")))
                    m.d.comb += [Assert(now.retired == (before.retired | event("retire"))),
                                 Assert(now.drop == (before.drop | event("drop")))]
        return m


class FetchProof(wiring.Component):
    """The fetch queue: its descriptor leaves only by a commit or a replacement (it no longer
    matches the target), unchanged while it waits; a complete descriptor has had every one of
    its words checked, at least the header and at most a slot; new requests and slot writes stay
    inside the slot, each word at its index; nothing new is requested, filled, offered or raised
    for a stale fetch; a request not taken stays offered, unchanged; the reads in flight are
    those of dropped fetches (``drain``, answered first) then this fetch's unanswered words, and
    no word is taken while a dropped fetch's answer is still due. Memory data, bus errors,
    request stalls, response timing (in order, one per request taken), queue state, registers
    and commits are arbitrary."""

    def __init__(self, queues, slot_words, fetch=Fetch, max_in_flight=3, **options):
        self.queues = queues
        self.slot_words = slot_words
        self.fetch = fetch
        self.max_in_flight = max_in_flight
        self.options = options          # the lean build's addr_width and base_entries
        super().__init__({
            "queue": In(data.ArrayLayout(QueueStatus, queues)),
            "control": In(data.ArrayLayout(QueueControl, queues)),
            "window": In(data.ArrayLayout(MemoryWindow, BASE_TABLE_SIZE)),
            "target": In(QUEUE_WIDTH), "target_valid": In(1), "data": In(32), "err": In(1),
            "resp_valid": In(1), "req_ready": In(1), "ready": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        w = self.slot_words
        m.submodules.dut = dut = self.fetch(self.queues, w, max_in_flight=self.max_in_flight,
                                            **self.options)
        req, resp = dut.mem.req, dut.mem.resp
        m.d.comb += [dut.queue.eq(self.queue), dut.control.eq(self.control),
                     dut.window.eq(self.window), dut.target.eq(self.target),
                     dut.target_valid.eq(self.target_valid), resp.payload.data.eq(self.data),
                     resp.payload.err.eq(self.err), resp.valid.eq(self.resp_valid),
                     req.ready.eq(self.req_ready), dut.descriptor.ready.eq(self.ready)]
        m.d.comb += Assume(self.target < self.queues)
        # The memory: one answer per request taken, in order (``pending`` taken, not answered).
        pending = Signal(range(self.max_in_flight + 2))
        m.d.sync += pending.eq(pending + (req.valid & req.ready) - (resp.valid & resp.ready))
        m.d.comb += Assume(~self.resp_valid | (pending != 0))
        m.d.comb += [Assert(resp.ready), Assert(dut.in_flight == pending + dut.hold),
                     Assert(dut.in_flight <= self.max_in_flight),
                     Assert(dut.drain <= dut.in_flight)]
        with m.If(dut.busy):
            m.d.comb += Assert(dut.in_flight == dut.drain + dut.issued - dut.received)
        with m.Else():
            m.d.comb += Assert(dut.in_flight == dut.drain)
        with m.If(dut.fill.valid | (dut.exception.cause != CauseCode.NONE)):
            m.d.comb += Assert(dut.drain == 0)               # no word of a dropped fetch
        # A request not taken is offered again, unchanged.
        past_offered = Signal()
        past_req = Signal(ADDR_WIDTH)
        m.d.sync += [past_offered.eq(req.valid & ~req.ready), past_req.eq(req.payload)]
        with m.If(past_offered):
            m.d.comb += [Assert(req.valid), Assert(req.payload == past_req), Assert(dut.hold)]
        with m.Else():
            m.d.comb += Assert(~dut.hold)
        fetched = dut.fetched
        commit = dut.descriptor.valid & dut.descriptor.ready
        past_valid = Signal()
        past_waiting = Signal()          # a complete descriptor was held, not stale, not taken
        past_held = Signal()             # the fetch queue held a complete descriptor
        past_left = Signal()             # ... and it was committed or stale
        past_fetched = Signal.like(fetched)
        m.d.sync += [past_valid.eq(1), past_waiting.eq(dut.descriptor.valid & ~self.ready),
                     past_held.eq(dut.valid), past_left.eq(commit | dut.stale),
                     past_fetched.eq(fetched)]
        with m.If(past_valid):
            with m.If(past_waiting):
                m.d.comb += [Assert(dut.valid), Assert(fetched.as_value() ==
                                                       past_fetched.as_value())]
            with m.If(past_held & ~dut.valid):
                m.d.comb += Assert(past_left)
        # Nothing new is requested, offered or raised for a stale fetch.
        new_request = req.valid & ~dut.hold
        with m.If(dut.stale):
            m.d.comb += [Assert(~dut.descriptor.valid),
                         Assert(dut.exception.cause == CauseCode.NONE), Assert(~new_request),
                         Assert(~dut.fill.valid)]
        # Inside the slot, word by word.
        m.d.comb += Assert(~(dut.busy & dut.valid))
        with m.If(new_request):
            m.d.comb += [Assert(dut.busy), Assert(dut.issued < w),
                         Assert(req.payload == (fetched.slot.addr + dut.issued)[:32])]
        with m.If(dut.fill.valid):
            index = dut.fill.payload.index
            m.d.comb += [Assert(dut.received < w),
                         Assert(index == dut.received[:len(index)])]
        with m.If(dut.busy):
            m.d.comb += Assert(dut.received <= dut.issued)
            with m.If(dut.length_known):
                m.d.comb += [Assert(fetched.length >= HEADER_WORDS),
                             Assert(fetched.length <= w), Assert(dut.issued <= fetched.length),
                             Assert(dut.received >= 1)]
            with m.Else():
                # Word 0 arrived with a length the slot does not take: its check fails next.
                m.d.comb += [Assert((dut.received == 0) |
                                    (dut.checked & (dut.check_cause != CauseCode.NONE))),
                             Assert(dut.received <= 1), Assert(dut.issued <= 1)]
        with m.If(dut.valid):
            m.d.comb += [Assert(dut.length_known), Assert(dut.received == fetched.length),
                         Assert(dut.issued == fetched.length), Assert(dut.drain == 0),
                         Assert(fetched.length >= HEADER_WORDS), Assert(fetched.length <= w)]
        return m


class OverflowingRing(SlotRing):
    """A broken ring that takes a commit even when full (the proof must catch it)."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        m.d.comb += self.committed.eq(self.commit)
        return m


class OverlongFetch(Fetch):
    """A broken fetch that accepts descriptors up to twice its slot (the proof must catch it)."""

    def elaborate(self, platform):
        self._slot_words *= 2
        try:
            return super().elaborate(platform)
        finally:
            self._slot_words //= 2


def check(result):
    assert result.passed, f"{result.status}\n{result.log[-3000:]}"


def test_arbiter_highest_priority_served():
    check(prove(ArbiterProof(5), "taskman_arbiter", mode="prove", depth=1))


def test_config_queue_never_overflows_or_drops():
    check(prove(RingProof(3), "taskman_ring", mode="prove", depth=4))


def test_task_buffer_waits_for_dependencies():
    check(prove(TaskBufferProof(3), "taskman_taskbuffer", mode="prove", depth=3, timeout=900))


def test_queue_state_changes_only_by_its_events():
    check(prove(QueuesProof(3), "taskman_queues", mode="prove", depth=1))


def test_lean_task_buffer_waits_for_dependencies():
    def serial(depth, queues):
        return SerialTaskBuffer(queues, addr_width=15)
    check(prove(TaskBufferProof(1, serial), "taskman_serial_taskbuffer", mode="prove",
                depth=3, timeout=900))


def test_lean_queue_state_changes_only_by_its_events():
    check(prove(QueuesProof(3, addr_width=15), "taskman_queues_lean", mode="prove", depth=1))


def test_fetch_queue_leaves_only_by_commit_or_replacement():
    check(prove(FetchProof(2, 8), "taskman_fetch", mode="prove", depth=2, timeout=900))


def test_lean_fetch_queue_leaves_only_by_commit_or_replacement():
    check(prove(FetchProof(2, 8, addr_width=15, base_entries=2), "taskman_fetch_lean",
                mode="prove", depth=2, timeout=900))


def test_config_queue_proof_catches_overflow():
    result = prove(RingProof(3, OverflowingRing), "taskman_ring_broken", mode="prove", depth=4)
    assert not result.passed and result.status == "FAIL"


def test_fetch_proof_catches_overlong_descriptor():
    # A bounded check long enough for a 9-word descriptor in an 8-word slot.
    result = prove(FetchProof(1, 8, OverlongFetch), "taskman_fetch_broken", mode="bmc",
                   depth=14, timeout=900)
    assert not result.passed and result.status == "FAIL"
