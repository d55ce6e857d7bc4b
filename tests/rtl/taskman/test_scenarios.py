# amaranth: UnusedElaboratable=no
"""The seed scenarios of task switching (seed 000, paras 121-132) and asynchronous dispatch
(seed 001, Fig. 8), on the RTL with behavioural engines, checked against the seed's text and
against the reference model."""

from npu_spec.descriptors import NE, PE
from tests.support.taskman import Scenario, chain, summary, values

FIG15 = [{}, {"tse": True, "dpc": True, "tsr": True}, {"spc": True, "spl": True}, {}]
FIG15_VARIANT = [{"tse": True}, {"dpc": True, "tsr": True}, {"spc": True, "spl": True}, {}]


def fig16_list(network=1, cycles=30):
    """T0-T13 of FIG. 16: T0, T2, T4, T6 read memory; T1, T3, T5 read T0, T2, T4; T1, T3, T5,
    T6 write buffer words 0x420-0x423; T7, T9, T11, T13 read all four; T8, T10, T12 read T7,
    T9, T11."""
    from npu_model.taskman import task
    from tests.support.taskman import IN_OFF
    flags = {1: {"tse": True, "dpc": True}, 3: {"dpc": True}, 5: {"dpc": True},
             6: {"dpc": True, "tsr": True}, 7: {"spc": True}, 9: {"spc": True},
             11: {"spc": True}, 13: {"spc": True, "spl": True}}
    out = {1: 0x420, 3: 0x421, 5: 0x422, 6: 0x423}
    descs = []
    for i in range(14):
        f = flags.get(i, {})
        if i in (0, 2, 4, 6):
            src, src_len, src_mem = IN_OFF + i, 1, True
        elif i in (1, 3, 5):
            src, src_len, src_mem = 0x400 + i - 1, 1, False
        elif i in (7, 9, 11, 13):
            src, src_len, src_mem = 0x420, 4, False
        else:
            src, src_len, src_mem = 0x400 + i - 1, 1, False
        dst = out.get(i, 0x400 + i)
        descs.append(task(i, cycles=cycles, network=network, src=src, src_len=src_len,
                          dst=dst, src_mem=src_mem, **f))
    return descs


def positions(bench):
    return [(e.queue, e.task_id) for e in bench.events("start")]


def check_against_model(bench, scenario, **kwargs):
    """Same tasks, same start order, same locations and values as the reference model."""
    model = scenario.model(**kwargs)
    assert summary(bench.trace, "start") == summary(model.trace, "start")
    assert summary(bench.trace, "end") == summary(model.trace, "end")


def mem_writers(bench, q):
    """Task IDs of queue ``q`` that wrote system memory, in order."""
    return [key[1] for kind, where, addr, value, key in bench.space.log
            if kind == "write" and where == "mem" and key[0] == q]


def test_fig15():
    A = chain(1, FIG15)
    B = chain(2, [{}, {}, {}])
    reads = [("wait", "end", 1, 2), ("read", "Q0_STATUS", "tqsp_during_b")]
    sc = Scenario({0: (1, A, 4), 1: (5, B, 0)}, [("start", 0, 1, 1, 3)])
    bench = sc.rtl(reads=reads + [("cycles", 60), ("read", "Q0_STATUS", "end"),
                                  ("read", "SWITCHES", "switches")])
    # The switch happens after T1: all of B runs between A1 and A2.
    assert positions(bench) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (0, 2), (0, 3)]
    ends = {(e.queue, e.task_id): e for e in bench.events("end")}
    starts = {(e.queue, e.task_id): e for e in bench.events("start")}
    assert ends[(0, 1)].time < starts[(1, 0)].time
    # Rule 2: T1 writes its output to memory; no other task of A does.
    assert ends[(0, 1)].dst_mem and mem_writers(bench, 0) == [1]
    # Rule 4: T2 reads memory (SPC with TQSP); T3 reads the buffer.
    assert starts[(0, 2)].src_mem and not starts[(0, 3)].src_mem
    # Rule 3 set TQSP while B ran; rule 5 (T2's SPL) cleared it.
    assert bench.reads["tqsp_during_b"]["tqsp"] == 1
    assert bench.reads["end"]["tqsp"] == 0 and bench.reads["end"]["count"] == 0
    assert bench.reads["switches"]["value"] == 1
    # A's results equal a run with no switch; so do B's.
    assert values(bench, 0) == sc.serial(0)
    assert values(bench, 1) == sc.serial(1)
    check_against_model(bench, sc)


def test_fig15_variant():
    A = chain(1, FIG15_VARIANT)
    B = chain(2, [{}, {}])
    sc = Scenario({0: (1, A, 4), 1: (5, B, 0)}, [("start", 0, 0, 1, 2)])
    bench = sc.rtl()
    # Request during T0 (TSE): GTSP set after T0, switch after T1 (TSR).
    assert positions(bench) == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3)]
    ends = {(e.queue, e.task_id): e for e in bench.events("end")}
    starts = {(e.queue, e.task_id): e for e in bench.events("start")}
    assert not ends[(0, 0)].dst_mem and ends[(0, 1)].dst_mem
    assert mem_writers(bench, 0) == [1]
    assert starts[(0, 2)].src_mem and not starts[(0, 3)].src_mem
    assert values(bench, 0) == sc.serial(0)
    check_against_model(bench, sc)


def test_fig16():
    A = fig16_list()
    B = chain(2, [{}, {}])
    sc = Scenario({0: (1, A, 14), 1: (5, B, 0)}, [("start", 0, 1, 1, 2)])
    bench = sc.rtl()
    order = positions(bench)
    # No switch before T6 completes; then all of B; then T7..T13.
    assert order == [(0, i) for i in range(7)] + [(1, 0), (1, 1)] + \
        [(0, i) for i in range(7, 14)]
    ends = {(e.queue, e.task_id): e for e in bench.events("end")}
    starts = {(e.queue, e.task_id): e for e in bench.events("start")}
    assert ends[(0, 6)].time < starts[(1, 0)].time
    # Memory writes only from T1, T3, T5, T6.
    assert mem_writers(bench, 0) == [1, 3, 5, 6]
    # T0, T2, T4, T6 read memory (statically); after resuming T7, T9, T11, T13 read memory
    # and T8, T10, T12 the buffer; T1, T3, T5 read the buffer.
    from_mem = sorted(t for (q, t), e in starts.items() if q == 0 and e.src_mem)
    assert from_mem == [0, 2, 4, 6, 7, 9, 11, 13]
    assert values(bench, 0) == sc.serial(0)
    check_against_model(bench, sc)


def test_missed_tse_window():
    A = fig16_list()
    B = chain(2, [{}, {}])
    # The request comes during T2, after T1 (the only TSE task) completed: no switch.
    sc = Scenario({0: (1, A, 14), 1: (5, B, 0)}, [("start", 0, 2, 1, 2)])
    bench = sc.rtl(reads=[("wait", "start", 0, 9), ("read", "Q0_STATUS", "mid"),
                          ("read", "STATUS", "status")])
    assert positions(bench) == [(0, i) for i in range(14)] + [(1, 0), (1, 1)]
    assert mem_writers(bench, 0) == []
    starts = {(e.queue, e.task_id): e for e in bench.events("start")}
    assert sorted(t for (q, t), e in starts.items() if q == 0 and e.src_mem) == [0, 2, 4, 6]
    assert bench.reads["mid"]["tqsp"] == 0 and bench.reads["status"]["gtsp"] == 0
    assert values(bench, 0) == sc.serial(0)
    check_against_model(bench, sc)


def test_fetch_queue_replacement():
    # A's last task has TSR (no TSE): commits wait for it. Meanwhile the fetch queue takes C's
    # first descriptor (the arbiter's choice); B arrives and replaces it.
    A = chain(1, [{}, {"tsr": True, "cycles": 120}])
    B = chain(2, [{}, {}])
    C = chain(3, [{}, {}])
    sc = Scenario({0: (2, A, 2), 1: (5, B, 0), 2: (0, C, 2)}, [("start", 0, 1, 1, 2)])
    reads = [("wait", "start", 0, 1), ("cycles", 30), ("read", "Q2_STATUS", "c_before"),
             ("read", "Q2_PTR", "c_ptr")]
    # Push B only after C's head descriptor sits in the fetch queue.
    sc.pushes = []
    bench = sc.rtl(reads=reads + [("write", "Q1_PUSH", {"count": 2})])
    c_head = bench.placed[2].head
    fetch_c = [c for c, a in bench.mem_reads if a == c_head]
    starts = {(e.queue, e.task_id): e for e in bench.events("start")}
    # C's head was fetched before B was pushed, and again later: twice in all.
    assert len(fetch_c) == 2 and fetch_c[0] < starts[(0, 1)].time + 30
    # The fetch queue has no side effects: C's count and head pointer did not change.
    assert bench.reads["c_before"]["count"] == 2
    assert bench.reads["c_ptr"]["address"] == c_head
    # B runs first; the replaced task C0 runs exactly once, later.
    assert positions(bench) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert values(bench, 2) == sc.serial(2)


def test_nested_switches():
    A = chain(1, FIG15)
    B = chain(2, FIG15)
    C = chain(3, [{}, {}])
    sc = Scenario({0: (1, A, 4), 1: (2, B, 0), 2: (3, C, 0)},
                  [("start", 0, 1, 1, 4), ("start", 1, 1, 2, 2)])
    bench = sc.rtl(reads=[("wait", "end", 2, 1), ("read", "Q0_STATUS", "a"),
                          ("read", "Q1_STATUS", "b")])
    assert positions(bench) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1),
                                (1, 2), (1, 3), (0, 2), (0, 3)]
    # While C ran, both interrupted queues had TQSP set.
    assert bench.reads["a"]["tqsp"] == 1 and bench.reads["b"]["tqsp"] == 1
    for q in range(3):
        assert values(bench, q) == sc.serial(q)
    assert mem_writers(bench, 0) == [1] and mem_writers(bench, 1) == [1]
    check_against_model(bench, sc)


def test_end_of_list_switch():
    # Queue A holds two lists: L1 = T0, T1 {TSE, TSR, DPC}; L2 = T2 {SPL} (reads memory),
    # T3 {SPC}, T4. The request during T1 switches at the end of L1 and sets a TQSP that L2
    # does not need; T2's SPL clears it, so T3 reads the buffer.
    flags = [{}, {"tse": True, "tsr": True, "dpc": True},
             {"spl": True, "src_mem": True, "src": 0x808}, {"spc": True}, {}]
    A = chain(1, flags)
    B = chain(2, [{}, {}])
    sc = Scenario({0: (1, A, 5), 1: (5, B, 0)}, [("start", 0, 1, 1, 2)])
    bench = sc.rtl(reads=[("wait", "end", 1, 1), ("read", "Q0_STATUS", "stale")])
    assert positions(bench) == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (0, 4)]
    assert bench.reads["stale"]["tqsp"] == 1
    starts = {(e.queue, e.task_id): e for e in bench.events("start")}
    assert starts[(0, 2)].src_mem and not starts[(0, 3)].src_mem
    assert values(bench, 0) == sc.serial(0)
    check_against_model(bench, sc)


def fig8_list(network=1):
    """Seed 001 Fig. 8: TC1 TP1 TC2 TC3(long) TP2 TP3 TP4 TP5 TC4; TP2-TP4 need only TC2,
    TP5 needs TC3, TC4 needs TP5."""
    from npu_model.taskman import task
    from tests.support.taskman import IN_OFF
    spec = [  # (name, engine, cycles, src index or None for memory, dep distance)
        ("TC1", NE, 20, None, 0), ("TP1", PE, 20, 0, 1), ("TC2", NE, 20, 1, 1),
        ("TC3", NE, 200, 2, 0), ("TP2", PE, 20, 2, 2), ("TP3", PE, 20, 4, 0),
        ("TP4", PE, 20, 5, 0), ("TP5", PE, 20, 3, 4), ("TC4", NE, 20, 7, 1),
    ]
    descs = []
    for i, (name, engine, cycles, src, dep) in enumerate(spec):
        descs.append(task(i, engine=engine, cycles=cycles, network=network, dep=dep,
                          src=IN_OFF if src is None else 0x400 + src,
                          src_mem=src is None, dst=0x400 + i))
    return descs


def test_fig8_async_dispatch():
    A = fig8_list()
    sc = Scenario({0: (1, A, 9)})
    fast = sc.rtl()
    serial = sc.rtl(skew=1)
    s = {e.task_id: e for e in fast.events("start")}
    e = {ev.task_id: ev for ev in fast.events("end")}
    # TP2, TP3 and TP4 (ids 4-6) run during TC3 (id 3).
    for tp in (4, 5, 6):
        assert s[3].time <= s[tp].time and e[tp].time < e[3].time
    # TP5 waits for TC3 and finishes earlier than in serial order.
    assert s[7].time > e[3].time
    serial_end = {ev.task_id: ev for ev in serial.events("end")}
    assert e[7].time < serial_end[7].time
    # Serial order really is serial: each task starts after the previous one ended.
    se = serial.events()
    assert [ev.kind for ev in se] == ["start", "end"] * 9
    assert values(fast, 0) == values(serial, 0) == sc.serial(0)
    check_against_model(fast, sc)


def test_performance_counters():
    A = fig8_list()
    sc = Scenario({0: (1, A, 9)})
    names = ["TASKS_RUN", "BUSY_CYCLES", "IDLE_CYCLES", "STALL_FETCH", "STALL_DEP",
             "STALL_WRITE", "SWITCHES"]
    reads = [("wait", "end", 0, 8), ("cycles", 5)] + [("read", n, n) for n in names]
    bench = sc.rtl(reads=reads, write_stall=0.5, seed=3)
    c = {n: bench.reads[n]["value"] for n in names}
    assert c["TASKS_RUN"] == 9
    assert c["SWITCHES"] == 0
    # Busy from the first commit to the last completion; every cycle is busy or idle.
    first = min(e.time for e in bench.trace)
    last = max(e.time for e in bench.trace)
    assert last - first < c["BUSY_CYCLES"] <= last + 1
    assert c["IDLE_CYCLES"] > 0
    # TP5 waits for TC3 with the planar engine idle; the write port stalled half the time; the
    # first descriptor had to be fetched while nothing ran.
    assert c["STALL_DEP"] > 0 and c["STALL_WRITE"] > 0 and c["STALL_FETCH"] > 0


def three_engine_list(network=1):
    """Tasks on all three engines with dependencies across each pair: DMA loads, NE and PE
    compute, DMA stores, the engines overlapping where the dependencies allow."""
    from npu_model.taskman import task
    from npu_spec.engine import Engine
    from tests.support.taskman import IN_OFF
    DMA = Engine.DMA
    # Run lengths well above the ~10 cycles a descriptor takes to fetch and program, so that
    # the order of starts does not depend on the pipeline (the model has none).
    spec = [  # (engine, cycles, src, src_mem, dep)
        (DMA, 48, IN_OFF, True, 0),          # T0 load
        (DMA, 36, IN_OFF + 1, True, 0),      # T1 load (runs while T2 computes)
        (NE, 80, 0x400, False, 2),           # T2 reads T0 (DMA -> NE)
        (PE, 28, 0x401, False, 2),           # T3 reads T1 (DMA -> PE)
        (PE, 44, 0x402, False, 2),           # T4 reads T2 (NE -> PE)
        (DMA, 24, 0x404, False, 1),          # T5 stores T4 (PE -> DMA)
        (NE, 56, 0x403, False, 3),           # T6 reads T3 (PE -> NE)
        (DMA, 20, 0x406, False, 1),          # T7 stores T6 (NE -> DMA)
    ]
    return [task(i, engine=e, cycles=c, network=network, src=src, src_mem=mem, dst=0x400 + i,
                 dep=dep, dst_mem=e == DMA and not mem)
            for i, (e, c, src, mem, dep) in enumerate(spec)]


def test_three_engine_dispatch():
    """NE, PE and DMA tasks with dependencies across all three: the same starts, ends, inputs
    and values as the reference model, the engines overlap, and each start beat carries the
    queue's memory window (base and limit)."""
    from npu_spec.engine import Engine
    from tests.support.taskman import WINDOWS
    A = three_engine_list()
    sc = Scenario({0: (1, A, len(A))})
    for kwargs in ({}, {"mem_latency": (1, 7), "mem_stall": 0.4, "seed": 3}):
        bench = sc.rtl(skew=0, **kwargs)
        assert sorted(e.task_id for e in bench.events("end")) == list(range(len(A)))
        assert {e.engine for e in bench.events("start")} == set(Engine)
        assert values(bench, 0) == sc.serial(0)
        # The model (no pipeline latency) may order simultaneous starts on different engines
        # differently (T6 is loaded only once T2 has left the buffer): the same tasks, inputs,
        # locations and values, and the same order on each engine.
        model = sc.model()
        for kind in ("start", "end"):
            assert sorted(summary(bench.trace, kind)) == sorted(summary(model.trace, kind))
        for engine in Engine:
            assert [e.task_id for e in bench.events("start") if e.engine == engine] == \
                [e.task_id for e in model.trace if e.kind == "start" and e.engine == engine]
        # The engines overlap: T1 (DMA) and T3 (PE) run while T2 (NE) does, T5 (DMA) while
        # T6 (NE) does.
        start = {e.task_id: e.time for e in bench.events("start")}
        end = {e.task_id: e.time for e in bench.events("end")}
        assert start[2] < end[1] and start[3] < end[2] and start[6] < end[5]
        # Each consumer started after its producer ended.
        for i, d in enumerate(A):
            if d.dep:
                assert start[i] >= end[i - d.dep], i
        assert set(bench.windows.values()) == {WINDOWS[0]}
    # With the memory's latency the reads were pipelined.
    assert bench.max_in_flight >= 2
