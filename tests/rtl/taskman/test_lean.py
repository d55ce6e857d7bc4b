# amaranth: UnusedElaboratable=no
"""The lean task manager (``taskman_impl="lean"``): the seed scenarios, the error classes and
random lists on it, checked against the reference model with a skew limit of 1 and against
serial runs; one task in flight at a time; its registers and counters."""

import pytest

from npu_spec.config import preset
from npu_spec.program import BaseEntry, Program, ProgramError, QueueSetup
from npu_spec.taskman import (
    COUNTERS,
    LEAN_COUNTERS,
    Cause,
    address_bits,
    base_table_size,
    lean_error,
    task_manager_map,
)
from tests.rtl.taskman import test_errors as errors
from tests.rtl.taskman import test_random as random_lists
from tests.rtl.taskman import test_scenarios as scenarios
from tests.support import taskman as support
from tests.support.taskman import LEAN, Scenario, values


@pytest.fixture
def lean(monkeypatch):
    """Every bench of the support module builds the lean task manager."""
    monkeypatch.setattr(support, "CONFIG", LEAN)


SHARED = [scenarios.test_fig15, scenarios.test_fig15_variant, scenarios.test_fig16,
          scenarios.test_missed_tse_window, scenarios.test_fetch_queue_replacement,
          scenarios.test_nested_switches, scenarios.test_end_of_list_switch,
          errors.test_decode_error_bad_magic, errors.test_decode_error_after_good_tasks,
          errors.test_address_error, errors.test_window_error_descriptor,
          errors.test_watchdog_timeout, errors.test_retired_queue_restarts_after_head_write,
          errors.test_garbage_never_hangs]


def test_engine_and_bus_errors_on_lean_build(lean):
    """The full build's engine-error test (with memory latency and stalls) and a bus error on a
    descriptor word, on the lean build."""
    errors.test_engine_error({"mem_latency": (1, 6), "mem_stall": 0.3, "seed": 4})
    errors.test_bus_error(2)


@pytest.mark.parametrize("test", SHARED, ids=lambda f: f.__name__)
def test_shared_test_on_lean_build(lean, test):
    """The full build's test, with every bench on the lean build (model with skew 1)."""
    test()


def one_in_flight():
    """Every cycle: at most one task has started and not ended."""
    def check(bench, cycle):
        running = set()
        for e in bench.trace:
            if e.kind == "start":
                running.add((e.queue, e.task_id))
            else:
                running.discard((e.queue, e.task_id))
        assert len(running) <= 1, running
    return check


@pytest.mark.parametrize("seed", range(4))
def test_lean_random(lean, seed):
    """Random lists in three queues: every task once, per-engine order, inputs and results of
    the serial run, and never two tasks in flight."""
    sc, rng = random_lists.random_scenario(seed)
    bench = sc.rtl(write_stall=rng.choice((0.0, 0.3)), seed=seed,
                   mem_latency=rng.choice((1, (1, 6))), mem_stall=rng.choice((0.0, 0.3)),
                   reads=[("cycles", 50)], checks=[one_in_flight()])
    random_lists.check_run(sc, bench)


def test_lean_fig8_is_serial(lean):
    """Seed 001 Fig. 8 runs strictly one task after the other, with the serial results and the
    reference model's order (skew 1); the counters the lean build keeps count, the others read
    0."""
    sc = Scenario({0: (1, scenarios.fig8_list(), 9)})
    names = [name for name, _ in COUNTERS]
    reads = [("wait", "end", 0, 8), ("cycles", 5)] + [("read", n, n) for n in names]
    bench = sc.rtl(reads=reads, write_stall=0.5, seed=3)    # the full build stalls here
    assert [ev.kind for ev in bench.events()] == ["start", "end"] * 9
    assert values(bench, 0) == sc.serial(0)
    scenarios.check_against_model(bench, sc)
    counts = {n: bench.reads[n]["value"] for n in names}
    assert counts["TASKS_RUN"] == 9
    first = min(e.time for e in bench.trace)
    last = max(e.time for e in bench.trace)
    assert last - first < counts["BUSY_CYCLES"] <= last + 1 and counts["IDLE_CYCLES"] > 0
    assert all(counts[n] == 0 for n in names if n not in LEAN_COUNTERS), counts


def test_lean_register_map():
    """One base-table entry a queue; address fields of the memory's width; offsets of the full
    map."""
    cfg = preset("icebreaker")
    assert cfg.taskman_impl == "lean"
    assert base_table_size(cfg) == 2 and address_bits(cfg) == 15    # 16,384 words: 0..16384
    full = task_manager_map(cfg.task_queues)
    regmap = task_manager_map(cfg.task_queues, base_entries=2, address_width=15)
    assert "BASE1" in regmap and "BASE2" not in regmap and "LIMIT2" not in regmap
    for name in ("Q0_HEAD", "Q1_TAIL", "Q1_PTR", "BASE0", "LIMIT1", "EXC_ADDR"):
        assert regmap[name].fields[0].width == 15
        assert regmap[name].offset == full[name].offset
    assert regmap["WATCHDOG"].fields[0].width == 32


def test_lean_rule_refuses_programs():
    """``lean_error`` (the rule of the program file): base-table entries beyond one a queue,
    and addresses or sizes beyond the memory's bits, are refused; the full build takes them."""
    cfg = preset("icebreaker")
    words = cfg.mem_kib * 256
    good = ([BaseEntry(0, words)], [QueueSetup(0, head=16, tail=words)])
    assert lean_error(cfg, *good) is None
    Program(cfg, *good)
    bad = [([BaseEntry(0, words)] * 3, [QueueSetup(0)]),
           ([BaseEntry(0, 1 << 15)], [QueueSetup(0)]),
           ([BaseEntry(1 << 15, 4)], [QueueSetup(0)]),
           ([BaseEntry(0, words)], [QueueSetup(1, head=0x10000)])]
    for table, queues in bad:
        assert lean_error(cfg, table, queues) is not None
        assert lean_error(cfg.replace(taskman_impl="full"), table, queues) is None
        with pytest.raises(ProgramError, match="lean task manager"):
            Program(cfg, table, queues)


def test_lean_base_index_beyond_the_table(lean):
    """A queue whose base index names an entry the lean build does not have (4 queues, 4
    entries; index 5, which a wrap to 2 bits would make entry 1, the window of its
    descriptors) has the empty window: its first descriptor fails with WINDOW, the queue
    is retired, and the other queue runs on with its serial results."""
    from tests.support.taskman import chain, make_bench
    a, b = chain(1, [{}, {}], cycles=20), chain(2, [{}], cycles=20)
    bench, placed = make_bench({0: a, 1: b})
    bench.setup_queue(0, priority=1, network=1, base_index=0, head=placed[0].head, push=2)
    bench.setup_queue(1, priority=3, network=2, base_index=5, head=placed[1].head, push=1)
    for register in ("EXC_STATUS", "EXC_ADDR", "Q1_STATUS"):
        bench.read(register)
    bench.host.insert(-3, ("cycles", 200))
    bench.run()
    assert bench.reads["EXC_STATUS"]["cause"] == Cause.WINDOW
    assert bench.reads["EXC_STATUS"]["queue"] == 1
    assert bench.reads["EXC_ADDR"]["address"] == placed[1].head
    assert bench.reads["Q1_STATUS"]["retired"] == 1
    assert bench.events("start", 1) == []
    assert values(bench, 0) == support.serial_values(a, 0, support.inputs_for({}))
