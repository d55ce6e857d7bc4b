# amaranth: UnusedElaboratable=no
"""Every error class (descriptor checks, bus errors on descriptor reads, engine errors, the
watchdog): exception status, interrupt, the queue retired, the others running."""

import random

import pytest

from npu_model.taskman import Raised, task
from npu_spec.descriptors import AddressError, DecodeError, WindowError, decode, encode
from npu_spec.engine import Engine
from npu_spec.taskman import Cause
from tests.support.taskman import WINDOWS, Scenario, chain, values


def good():
    return chain(1, [{}, {}, {}, {}], cycles=25)


def run_with_bad(bad_words, q_bad_list_prefix=(), watchdog=None, network=2):
    """Queue 0 runs a good list; queue 1 (higher priority) holds ``prefix`` then bad words."""
    B = list(q_bad_list_prefix) + [bad_words]
    sc = Scenario({0: (1, good(), 4), 1: (3, B, len(B))})
    reads = [("read", "EXC_STATUS", "exc"), ("read", "EXC_ADDR", "addr"),
             ("read", "IRQ_STATUS", "irq"), ("read", "Q1_STATUS", "q1"),
             ("read", "Q0_STATUS", "q0")]
    bench = sc.rtl(reads=[("cycles", 400)] + reads, watchdog=watchdog)
    return sc, bench


def bad_descriptor_address(bench, index):
    b = bench.placed[1]
    return b.addresses[index]


def check_error(sc, bench, cause, index=0):
    assert bench.reads["exc"]["cause"] == cause
    assert bench.reads["exc"]["queue"] == 1
    assert bench.reads["exc"]["count"] == 1
    assert bench.reads["addr"]["address"] == bad_descriptor_address(bench, index)
    assert bench.reads["irq"]["error"] == 1
    assert bench.irq, "the interrupt line never rose"
    assert bench.reads["q1"]["retired"] == 1
    # The other queue ran all its tasks with the right results.
    assert [e.task_id for e in bench.events("end", 0)] == [0, 1, 2, 3]
    assert values(bench, 0) == sc.serial(0)
    assert bench.reads["q0"]["count"] == 0


def words(desc):
    return encode(desc)


def test_decode_error_bad_magic():
    w = words(task(0, network=2))
    w[0] ^= 0x01
    with pytest.raises(DecodeError):
        decode(w)
    sc, bench = run_with_bad(w)
    check_error(sc, bench, Cause.DECODE)
    assert bench.events(queue=1) == []


def test_decode_error_after_good_tasks():
    # Two good tasks run, then the malformed third descriptor (entry count 0) retires queue 1.
    w = words(task(2, network=2))
    w[4] &= 0xFFFF
    with pytest.raises(DecodeError):
        decode(w)
    prefix = chain(2, [{}, {}], cycles=25)
    sc, bench = run_with_bad(w, prefix)
    check_error(sc, bench, Cause.DECODE, index=2)
    assert [e.task_id for e in bench.events("end", 1)] == [0, 1]


@pytest.mark.parametrize("bad", ["length", "reserved", "network", "overrun"])
def test_decode_error_kinds(bad):
    w = words(task(0, network=2))
    if bad == "length":
        w[0] = (w[0] & ~0xFF00) | (3 << 8)
    elif bad == "reserved":
        w[0] |= 1 << 30
    elif bad == "network":
        w[1] = (w[1] & ~0xFF0000) | (7 << 16)
    else:
        w[4] = (w[4] & 0xFFFF) | (5 << 16)       # entry count runs past the length
    with pytest.raises(DecodeError):
        decode(w, network=2)
    sc, bench = run_with_bad(w)
    check_error(sc, bench, Cause.DECODE)


def test_address_error():
    w = words(task(0, network=2))
    w[4] = 0x5100 | (1 << 16)                    # no register map at 0x5100
    with pytest.raises(AddressError):
        decode(w)
    sc, bench = run_with_bad(w)
    check_error(sc, bench, Cause.ADDRESS)
    assert bench.programs.get(0, [])[:0] == []
    # No write of the bad descriptor reached the blocks.
    assert all(a != 0x5100 for prog in bench.programs.values() for a, _ in prog)


@pytest.mark.parametrize("bad", ["src", "dst"])
def test_window_error_data(bad):
    limit = WINDOWS[1][1]
    fields = {"src": limit - 1, "src_len": 2} if bad == "src" else {"dst": limit}
    w = words(task(0, network=2, **fields))
    with pytest.raises(WindowError):
        decode(w, window=WINDOWS[1], address=WINDOWS[1][0])
    sc, bench = run_with_bad(w)
    check_error(sc, bench, Cause.WINDOW)


def test_window_error_descriptor():
    # Queue 1's head points into queue 0's window.
    sc = Scenario({0: (1, good(), 4), 1: (3, chain(2, [{}]), 0)})
    reads = [("write", "Q1_HEAD", {"address": WINDOWS[0][0]}),
             ("write", "Q1_PUSH", {"count": 1}), ("cycles", 300),
             ("read", "EXC_STATUS", "exc"), ("read", "EXC_ADDR", "addr"),
             ("read", "Q1_STATUS", "q1")]
    bench = sc.rtl(reads=reads)
    assert bench.reads["exc"]["cause"] == Cause.WINDOW
    assert bench.reads["addr"]["address"] == WINDOWS[0][0]
    assert bench.reads["q1"]["retired"] == 1
    assert values(bench, 0) == sc.serial(0)


def test_watchdog_timeout():
    # Queue 1's second task runs far too long: it is aborted, the rest of queue 1 is dropped,
    # queue 0 keeps running.
    B = chain(2, [{}, {"cycles": 5000}, {}, {}], cycles=25)
    sc = Scenario({0: (1, good(), 4), 1: (3, B, 4)})
    reads = [("cycles", 500), ("read", "EXC_STATUS", "exc"), ("read", "EXC_ADDR", "addr"),
             ("read", "IRQ_STATUS", "irq"), ("read", "Q1_STATUS", "q1"),
             ("read", "Q0_STATUS", "q0")]
    bench = sc.rtl(reads=reads, watchdog=100)
    check_error(sc, bench, Cause.TIMEOUT, index=1)
    aborts = bench.events("abort")
    assert [(e.queue, e.task_id) for e in aborts] == [(1, 1)]
    start = next(e for e in bench.events("start", 1) if e.task_id == 1)
    assert aborts[0].time - start.time == 100
    assert [e.task_id for e in bench.events("start", 1)] == [0, 1]
    model = sc.model(watchdog=100)
    assert [(e.kind, e.queue, e.task_id) for e in model.trace] == \
        [(e.kind, e.queue, e.task_id) for e in bench.trace]


def test_retired_queue_restarts_after_head_write():
    w = words(task(0, network=2))
    w[0] ^= 0x01
    good_b = chain(2, [{}], cycles=10)
    sc = Scenario({0: (1, good(), 4), 1: (3, [w] + good_b, 1)})
    reads = [("cycles", 300), ("read", "Q1_STATUS", "retired"),
             ("write", "IRQ_STATUS", {"error": 1}), ("read", "IRQ_STATUS", "cleared")]
    bench = sc.rtl(reads=reads)
    assert bench.reads["retired"]["retired"] == 1
    assert bench.reads["cleared"]["error"] == 0
    # Point queue 1 at its good descriptor: it runs.
    bench2 = sc.rtl(reads=reads + [("write", "Q1_HEAD",
                                     {"address": WINDOWS[1][0] + len(w)}),
                                    ("write", "Q1_PUSH", {"count": 1}), ("cycles", 100)])
    assert [e.task_id for e in bench2.events("end", 1)] == [0]


def test_garbage_never_hangs():
    rng = random.Random(5)
    for trial in range(3):
        base = words(task(0, network=2))
        w = [rng.getrandbits(32) if rng.random() < 0.5 else x for x in base]
        w[0] = (w[0] & ~0xFF) | 0xD7 if trial else w[0]
        sc = Scenario({0: (1, good(), 4), 1: (3, [w] + [[rng.getrandbits(32)
                                                        for _ in range(6)]], 2)})
        bench = sc.rtl(reads=[("cycles", 300), ("read", "Q1_STATUS", "q1")])
        assert values(bench, 0) == sc.serial(0)
        try:
            decode(w, network=2, window=WINDOWS[1], address=WINDOWS[1][0])
            ok = True
        except (DecodeError, AddressError, WindowError):
            ok = False
        if not ok:
            assert bench.reads["q1"]["retired"] == 1


def exception_reads():
    return [("read", "EXC_STATUS", "exc"), ("read", "EXC_ADDR", "addr"),
            ("read", "IRQ_STATUS", "irq"), ("read", "Q1_STATUS", "q1"),
            ("read", "Q0_STATUS", "q0")]


def kinds(trace):
    return [(e.kind, e.queue, e.task_id) for e in trace]


@pytest.mark.parametrize("memory", [{}, {"mem_latency": (1, 6), "mem_stall": 0.3, "seed": 4}])
def test_engine_error(memory):
    """Queue 1 preempts queue 0 at its switch point; queue 1's DMA task ends with error code 5:
    EXC_STATUS records ENGINE, the queue, the engine and the code; queue 1 is retired and its
    remaining tasks never start; queue 0 resumes and runs to its end with serial results. The
    reference model gives the same trace and the same exception."""
    A = chain(1, [{}, {"tse": True, "dpc": True, "tsr": True}, {"spc": True, "spl": True}, {}],
              cycles=40)
    B = chain(2, [{}, {"engine": Engine.DMA, "error": 5, "dep": 1},
                  {"engine": Engine.PLANAR, "dep": 1}, {"dep": 1}], cycles=30)
    sc = Scenario({0: (1, A, 4), 1: (5, B, 0)}, [("start", 0, 1, 1, 4)])
    bench = sc.rtl(reads=[("cycles", 300)] + exception_reads(), **memory)
    exc = bench.reads["exc"]
    assert (exc["cause"], exc["queue"], exc["engine"], exc["error_code"], exc["count"]) == \
        (Cause.ENGINE, 1, Engine.DMA, 5, 1)
    assert bench.reads["addr"]["address"] == bench.placed[1].addresses[1]
    assert bench.reads["irq"]["error"] == 1 and bench.irq
    assert bench.reads["q1"]["retired"] == 1
    assert kinds(bench.trace) == [
        ("start", 0, 0), ("end", 0, 0), ("start", 0, 1), ("end", 0, 1),
        ("start", 1, 0), ("end", 1, 0), ("start", 1, 1), ("error", 1, 1),
        ("start", 0, 2), ("end", 0, 2), ("start", 0, 3), ("end", 0, 3)]
    assert values(bench, 0) == sc.serial(0)
    # The failed task wrote nothing.
    assert not [entry for entry in bench.space.log if entry[0] == "write" and
                entry[4] == (1, 1)]
    model = sc.model()
    assert kinds(model.trace) == kinds(bench.trace)
    assert model.errors == [Raised(Cause.ENGINE, 1, bench.placed[1].addresses[1], Engine.DMA,
                                   5)]


@pytest.mark.parametrize("word", [0, 2, 5])
def test_bus_error(word):
    """A descriptor read answered with a bus error raises BUS for its queue and retires it, like
    a window error: the queue's earlier task ran, nothing after it; the other queue runs. The
    reference model agrees."""
    B = chain(2, [{}, {}, {}], cycles=25)
    sc = Scenario({0: (1, good(), 4), 1: (3, B, 3)})
    from npu_model.taskman import layout
    _, placed = layout({1: B}, start=WINDOWS[1][0])
    bad = placed[1].addresses[1] + word
    bench = sc.rtl(reads=[("cycles", 300)] + exception_reads(), bus_errors={bad},
                   mem_latency=(1, 5), mem_stall=0.2, seed=word)
    check_error(sc, bench, Cause.BUS, index=1)
    assert bench.reads["exc"]["engine"] == 0 and bench.reads["exc"]["error_code"] == 0
    assert [e.task_id for e in bench.events("end", 1)] == [0]
    assert any(err for _, address, err in bench.mem_answers if address == bad)
    model = sc.model(bus_errors={bad})
    assert kinds(model.trace) == kinds(bench.trace)
    assert model.errors == [Raised(Cause.BUS, 1, placed[1].addresses[1])]
