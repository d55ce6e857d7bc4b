# amaranth: UnusedElaboratable=no
"""Queue state: head writes, pushes, commits, TQSP (rules 3 and 5) and exceptions, against the
reference model's queue records (``npu_model.taskman.TaskManagerModel``)."""

import random

import pytest

from npu.taskman.queues import Queues
from npu_model.taskman import TaskManagerModel
from tests.support.csr import run

MASK32 = (1 << 32) - 1


def reference_step(model, events):
    """Apply one cycle's ``events`` to the model's queues, as the model states each update.

    In one cycle a head write of a queue wins over its other updates (the host restarts the
    queue), and a rule-5 clear of TQSP wins over a rule-3 set (rule 5 is applied last).
    """
    for i, q in enumerate(model.q):
        if events["push"][i]:
            model.push(i, events["push"][i])
        commit = events["commit"] is not None and events["commit"][0] == i
        if commit:
            q.count -= 1                         # a commit takes one descriptor
        q.count &= 0xFFFF
        if events["set_head"][i] is not None:
            model.set_head(i, events["set_head"][i])
            continue
        if commit:
            q.head = (q.head + events["commit"][1]) & MASK32
        flag = events["flag"]
        if flag is not None and flag[0] == i:
            if flag[1]:
                q.tqsp = True                    # rule 3
            if flag[2]:
                q.tqsp = False                   # rule 5
        retire = events["retire"]
        if retire is not None and retire[0] == i:
            q.retired = True
            if retire[1]:                        # a watchdog timeout also drops the queue
                q.drop = True


@pytest.mark.parametrize("queues", [1, 3, 8])
def test_queue_updates(queues):
    dut = Queues(queues)
    rng = random.Random(queues)
    model = TaskManagerModel({}, queues)

    async def tb(ctx):
        for _ in range(600):
            events = {
                "set_head": [rng.getrandbits(32) if rng.random() < 0.05 else None
                             for _ in range(queues)],
                "push": [rng.choice((0, 0, 0, 1, 2, 0xFFFF)) for _ in range(queues)],
                "commit": ((rng.randrange(queues), rng.randrange(4, 256))
                           if rng.random() < 0.4 else None),
                "flag": ((rng.randrange(queues), rng.random() < 0.5, rng.random() < 0.5)
                         if rng.random() < 0.3 else None),
                "retire": ((rng.randrange(queues), rng.random() < 0.5)
                           if rng.random() < 0.05 else None),
            }
            for i in range(queues):
                ctx.set(dut.set_head[i], events["set_head"][i] is not None)
                ctx.set(dut.head[i], events["set_head"][i] or 0)
                ctx.set(dut.push[i], events["push"][i])
            commit, flag, retire = events["commit"], events["flag"], events["retire"]
            ctx.set(dut.commit, commit is not None)
            ctx.set(dut.commit_queue, commit[0] if commit else rng.randrange(queues))
            ctx.set(dut.commit_length, commit[1] if commit else rng.randrange(256))
            ctx.set(dut.tqsp_set, flag is not None and flag[1])
            ctx.set(dut.tqsp_clear, flag is not None and flag[2])
            ctx.set(dut.flag_queue, flag[0] if flag else rng.randrange(queues))
            ctx.set(dut.retire, retire is not None)
            ctx.set(dut.retire_queue, retire[0] if retire else rng.randrange(queues))
            ctx.set(dut.retire_drop, retire is not None and retire[1])
            await ctx.tick()
            reference_step(model, events)
            for i, q in enumerate(model.q):
                state = ctx.get(dut.state[i])
                assert (state.head, state.count, state.tqsp, state.retired, state.drop) == \
                    (q.head, q.count, q.tqsp, q.retired, q.drop), f"queue {i}"
                assert ctx.get(dut.tqsp[i]) == q.tqsp
                assert ctx.get(dut.dropped[i]) == q.drop

    run(dut, tb)


def test_queue_count_checked():
    with pytest.raises(ValueError, match="Number of queues"):
        Queues(0)
