# amaranth: UnusedElaboratable=no
"""Randomized task lists in several queues: random priorities, engines (all three), run lengths,
dependencies, switch points, push times, write-port stalls and descriptor-memory latencies and
stalls. Checked every cycle and at the
end: no task lost or run twice, per-engine order kept, every input equal to the serial run's
(no read before the producer's data), every result equal to serial execution."""

import random

import pytest

from npu_model.taskman import task
from npu_spec.engine import Engine
from tests.support.taskman import IN_OFF, WINDOWS, Scenario


def random_list(rng, network, n):
    """A list split into segments by switch points. A switch point is a task with TSE, DPC and
    TSR whose output the next task (SPC, SPL) reads; otherwise tasks read memory or the buffer
    output of an earlier task of their segment."""
    descs = []
    seg_start = 0
    engines = [rng.choice(list(Engine)) for _ in range(n)]
    switch_after = None
    for i in range(n):
        f = {}
        if switch_after == i - 1 and i > 0:
            src, src_mem = 0x400 + i - 1, False
            f.update(spc=True, spl=True)
            producer = i - 1
            seg_start = i
        elif i == seg_start or rng.random() < 0.25:
            src, src_mem, producer = IN_OFF + i, True, None
        else:
            producer = rng.randrange(seg_start, i)
            src, src_mem = 0x400 + producer, False
        if 0 < i < n - 1 and switch_after != i - 1 and rng.random() < 0.3:
            f.update(tse=True, dpc=True, tsr=True)
            switch_after = i
        dep = 0
        if producer is not None and engines[producer] != engines[i]:
            dep = i - producer
        if i == n - 1:
            f["dst_mem"] = True
        descs.append(task(i, engine=engines[i], cycles=rng.randrange(4, 30), network=network,
                          src=src, src_mem=src_mem, dst=0x400 + i, dep=dep, **f))
    return descs


def random_scenario(seed):
    rng = random.Random(seed)
    nq = 3
    queues = {}
    for q in range(nq):
        queues[q] = (rng.randrange(4), random_list(rng, q + 1, rng.randrange(3, 7)), 0)
    # Queue 0 starts; the others are pushed when a random task of an earlier queue starts.
    queues[0] = (queues[0][0], queues[0][1], len(queues[0][1]))
    pushes = []
    for q in range(1, nq):
        src_q = rng.randrange(q)
        tid = rng.randrange(len(queues[src_q][1]))
        pushes.append(("start", src_q, tid, q, len(queues[q][1])))
    return Scenario(queues, pushes), rng


def check_run(sc, bench):
    # Exactly once, nothing lost.
    for q, (_, descs, _) in sc.queues.items():
        starts = [e.task_id for e in bench.events("start", q)]
        ends = [e.task_id for e in bench.events("end", q)]
        assert sorted(starts) == list(range(len(descs))), (q, starts)
        assert sorted(ends) == list(range(len(descs))), (q, ends)
        # Per-engine order kept.
        for engine in Engine:
            ids = [e.task_id for e in bench.events("start", q) if e.engine == engine]
            assert ids == sorted(ids)
        # Inputs and results equal the serial run.
        serial = sc.serial(q)
        from npu_model.taskman import serial_run
        from tests.support.taskman import inputs_for
        results, _ = serial_run(descs, WINDOWS[q][0], inputs_for({}))
        for e in bench.events("start", q):
            assert e.inputs == results[e.task_id][1], (q, e.task_id)
        assert {e.task_id: e.value for e in bench.events("end", q)} == serial


def no_overlap_check():
    """Every cycle: each engine runs at most one task, and a queue's tasks never interleave
    with another queue's in flight."""
    state = {"seen": 0}

    def check(bench, cycle):
        trace = bench.trace
        if len(trace) == state["seen"]:
            return
        state["seen"] = len(trace)
        in_flight = {}
        for e in trace:
            key = (e.queue, e.task_id)
            if e.kind == "start":
                assert key not in in_flight, f"{key} started twice"
                in_flight[key] = e
            else:
                in_flight.pop(key, None)
        assert len({e.queue for e in in_flight.values()}) <= 1
        for engine in Engine:
            assert sum(e.engine == engine for e in in_flight.values()) <= 1
    return check


@pytest.mark.parametrize("seed", range(6))
def test_random(seed):
    sc, rng = random_scenario(seed)
    bench_kwargs = {"write_stall": rng.choice((0.0, 0.3)), "seed": seed,
                    "mem_latency": rng.choice((1, (1, 6))), "mem_stall": rng.choice((0.0, 0.3))}
    bench = sc.rtl(skew=rng.choice((0, 2, 3)), **bench_kwargs, reads=[("cycles", 50)],
                   checks=[no_overlap_check()])
    check_run(sc, bench)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 60))
def test_random_long(seed):
    sc, rng = random_scenario(seed)
    bench = sc.rtl(skew=rng.choice((0, 2, 3)), write_stall=rng.choice((0.0, 0.3)), seed=seed,
                   mem_latency=rng.choice((1, (1, 6))), mem_stall=rng.choice((0.0, 0.3)),
                   reads=[("cycles", 50)], checks=[no_overlap_check()])
    check_run(sc, bench)
