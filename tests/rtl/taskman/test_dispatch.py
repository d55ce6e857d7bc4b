# amaranth: UnusedElaboratable=no
"""Dispatch: rule 4 on the start beats, the watchdog, engine errors, and the completion rules 1,
2, 3 and 5, against the rules as ``docs/task_manager.md`` states them, with random tasks, run
lengths, error codes, TQSP, GTSP and switch requests on the three engines."""

import random

import pytest

from npu.taskman.dispatch import Dispatch
from npu_spec.descriptors import FLAGS
from npu_spec.engine import Engine
from npu_spec.taskman import Cause
from tests.support.csr import run

QUEUES = 4
ENGINES = len(Engine)


def random_task(rng, engine, seq):
    task = {name: int(rng.random() < 0.3) for name in FLAGS}
    task.update(seq=seq & 0xFF, engine=engine, queue=rng.randrange(QUEUES),
                task_id=rng.getrandbits(16), addr=rng.getrandbits(32))
    return task


def expected_completion(finishing, timeout, failed, request_above, gtsp):
    """The completion rules for the tasks leaving the buffer on each engine (``None``: none); a
    task aborted by the watchdog or ended with an error code completes nothing."""
    completes = [t is not None and not timeout[e] and not failed[e]
                 for e, t in enumerate(finishing)]
    out = {"gtsp_set": any(c and t["tse"] and request_above[e]
                           for e, (c, t) in enumerate(zip(completes, finishing)))}   # rule 1
    gtsp = gtsp or out["gtsp_set"]
    out["done_mem"] = [bool(t and (t["dst_mem"] or (t["dpc"] and gtsp)))              # rule 2
                       for t in finishing]
    out["switch"] = any(c and t["tsr"] and gtsp for c, t in zip(completes, finishing))  # 3
    out["tqsp_clear"] = any(c and t["spl"] for c, t in zip(completes, finishing))      # 5
    out["tsr_done"] = any(t is not None and t["tsr"] for t in finishing)
    out["task_done_irq"] = any(c and t["irq"] for c, t in zip(completes, finishing))
    flagged = [t["queue"] for c, t in zip(completes, finishing)
               if c and (t["tse"] or t["tsr"] or t["spl"])]
    out["flag_queue"] = flagged[-1] if flagged else None
    return out


@pytest.mark.parametrize("done_register", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_dispatch_rules(seed, done_register):
    """With ``done_register`` the dispatch sees each engine's ``done`` and ``error`` a cycle
    after the engine gives them; the watchdog compares with ``watchdog`` as it was a cycle
    before."""
    dut = Dispatch(QUEUES, done_register=done_register)
    rng = random.Random(seed)
    seen = {"rule4": 0, "timeout": 0, "engine_error": 0, "gtsp_set": 0, "switch": 0,
            "tqsp_clear": 0, "new_queue": 0}

    async def tb(ctx):
        offered = [None] * ENGINES   # task offered on each engine's start stream
        running = [None] * ENGINES   # (task, cycles left, start cycle, error code at done)
        last_queue = None
        seq = 0
        watchdog = 0
        engine_done = [False] * ENGINES     # the done the dispatch sees in this cycle
        for cycle in range(1500):
            watchdog_before = watchdog
            if rng.random() < 0.02:
                watchdog = rng.choice((0, 1, 5, 20))
            tqsp = rng.getrandbits(QUEUES)
            gtsp = rng.random() < 0.3
            request_above = [rng.random() < 0.5 for _ in range(ENGINES)]
            ctx.set(dut.watchdog, watchdog)
            ctx.set(dut.tqsp, tqsp)
            ctx.set(dut.gtsp, gtsp)
            for e in range(ENGINES):
                if offered[e] is None and rng.random() < 0.3:
                    offered[e] = random_task(rng, e, seq)
                    seq += 1
                engine = dut.engines[e]
                ctx.set(dut.start[e].valid, offered[e] is not None)
                if offered[e] is not None:
                    for name, value in offered[e].items():
                        ctx.set(getattr(dut.start[e].payload, name), value)
                ctx.set(engine.start.ready, running[e] is None and rng.random() < 0.8)
                done = running[e] is not None and running[e][1] == 0
                ctx.set(engine.done, done)
                # The code counts only with done.
                ctx.set(engine.error, running[e][3] if done else rng.getrandbits(4))
                ctx.set(dut.request_above[e], request_above[e])
                if not done_register:
                    engine_done[e] = done
            # The done the dispatch sees (and a late one of a task already aborted).
            seen_done = list(engine_done)
            # The watchdog, from the running tasks' ages.
            timeout = [running[e] is not None and not seen_done[e] and watchdog_before != 0 and
                       cycle - running[e][2] >= watchdog_before for e in range(ENGINES)]
            for e in range(ENGINES):
                assert ctx.get(dut.engines[e].abort) == timeout[e], f"cycle {cycle}"
                assert ctx.get(dut.kill[e]) == timeout[e]
                assert ctx.get(dut.done[e]) == seen_done[e]
            # The task buffer's view: the running task leaves on done or abort.
            finishing = [running[e][0] if running[e] is not None and
                         (seen_done[e] or timeout[e]) else None for e in range(ENGINES)]
            for e in range(ENGINES):
                ctx.set(dut.finished_valid[e], finishing[e] is not None)
                task = finishing[e] or random_task(rng, e, 0)
                for name, value in task.items():
                    ctx.set(getattr(dut.finished[e], name), value)
            failed = [finishing[e] is not None and not timeout[e] and running[e][3] != 0
                      for e in range(ENGINES)]
            expect = expected_completion(finishing, timeout, failed, request_above, gtsp)
            for name in ("gtsp_set", "switch", "tqsp_clear", "tsr_done", "task_done_irq"):
                assert ctx.get(getattr(dut, name)) == expect[name], f"{name} at {cycle}"
            assert ctx.get(dut.tqsp_set) == expect["switch"]
            if expect["flag_queue"] is not None:
                assert ctx.get(dut.flag_queue) == expect["flag_queue"]
            for e in range(ENGINES):
                if finishing[e] is not None:          # done_mem is valid with done
                    assert ctx.get(dut.engines[e].done_mem) == expect["done_mem"][e]
            assert ctx.get(dut.completed) == sum(1 << e for e in range(ENGINES)
                                                 if finishing[e] is not None)
            exception = ctx.get(dut.exception)
            got = (Cause(exception.cause.value), exception.queue, exception.addr,
                   exception.engine, exception.code)
            if any(timeout):
                e = max(e for e in range(ENGINES) if timeout[e])
                assert got == (Cause.TIMEOUT, running[e][0]["queue"], running[e][0]["addr"], e,
                               0)
            elif any(failed):
                e = max(e for e in range(ENGINES) if failed[e])
                assert got == (Cause.ENGINE, running[e][0]["queue"], running[e][0]["addr"], e,
                               running[e][3])
            else:
                assert Cause(exception.cause.value) == Cause.NONE
            # Starts: rule 4, and a task of another queue than the last started one.
            new_queue = False
            started = [False] * ENGINES
            for e in range(ENGINES):
                engine = dut.engines[e]
                fire = offered[e] is not None and ctx.get(engine.start.ready)
                started[e] = fire
                assert ctx.get(engine.start.valid) == (offered[e] is not None)
                assert ctx.get(dut.start[e].ready) == ctx.get(engine.start.ready)
                if offered[e] is not None:
                    task = offered[e]
                    beat = ctx.get(engine.start.payload)
                    src_mem = task["src_mem"] or (task["spc"] and (tqsp >> task["queue"]) & 1)
                    assert beat.src_mem == src_mem                                   # rule 4
                    assert (beat.seq, beat.queue, beat.task_id, beat.spc) == \
                        (task["seq"], task["queue"], task["task_id"], task["spc"])
                    seen["rule4"] += src_mem and not task["src_mem"]
                if fire:
                    new_queue |= last_queue is None or offered[e]["queue"] != last_queue
            assert ctx.get(dut.started_new_queue) == new_queue
            seen["new_queue"] += new_queue
            seen["timeout"] += any(timeout)
            seen["engine_error"] += any(failed)
            for name in ("gtsp_set", "switch", "tqsp_clear"):
                seen[name] += expect[name]
            await ctx.tick()
            if done_register:
                engine_done = [running[e] is not None and running[e][1] == 0
                               for e in range(ENGINES)]
            for e in range(ENGINES):
                if finishing[e] is not None:
                    running[e] = None
                elif running[e] is not None:
                    running[e] = (running[e][0], running[e][1] - 1, *running[e][2:])
            for e in range(ENGINES):
                if started[e]:
                    code = rng.randrange(1, 16) if rng.random() < 0.15 else 0
                    running[e] = (offered[e], rng.choice((0, 1, 2, 3, 8, 30)), cycle, code)
                    last_queue = offered[e]["queue"]
                    offered[e] = None

    run(dut, tb)
    assert all(seen.values()), seen
