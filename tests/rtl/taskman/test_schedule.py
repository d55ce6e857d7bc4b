# amaranth: UnusedElaboratable=no
"""The scheduler (arbiter choice, current queue, fetch target, GTSP, the committed TSR task,
secure mode) against a cycle model of the rules in ``docs/task_manager.md``."""

import random

import pytest

from npu.taskman.schedule import Scheduler
from tests.support.csr import run


class SchedulerModel:
    """The rules, cycle by cycle: ``outputs`` from the state and this cycle's inputs, ``step``
    the state of the next cycle."""

    def __init__(self, queues):
        self.queues = queues
        self.choice = None            # (queue, priority) chosen in the previous cycle
        self.secure_request = False
        self.secure_mode = False
        self.current = 0
        self.current_valid = False
        self.gtsp = False
        self.tsr_pending = False

    @staticmethod
    def has_work(q):
        return q["count"] != 0 and not q["retired"]

    def outputs(self, x):
        queue, control = x["queue"], x["control"]
        choice_ok = self.choice is not None and self.has_work(queue[self.choice[0]])

        def above(i):
            # A switch request above queue i: a higher-priority choice, or secure work while
            # queue i is not secure.
            return ((choice_ok and self.choice[1] > control[i]["priority"]) or
                    (self.secure_request and not control[i]["secure"]))

        stay = (self.current_valid and self.has_work(queue[self.current]) and x["enable"] and
                not (self.gtsp and self.tsr_pending))
        if stay:
            target, target_valid = self.current, True
        else:
            target = self.choice[0] if self.choice is not None else 0
            target_valid = choice_ok
        return {
            "target": target, "target_valid": target_valid, "stay": stay,
            "may_commit": (not self.tsr_pending and x["enable"] and
                           control[x["fetched_queue"]]["secure"] == self.secure_mode),
            "request": self.current_valid and above(self.current),
            "request_above": [above(q) for q in x["completing"]],
            "work": choice_ok, "current": self.current, "current_valid": self.current_valid,
            "gtsp": self.gtsp, "secure_mode": self.secure_mode,
            "secure_request": self.secure_request,
        }

    def step(self, x, out):
        queue, control = x["queue"], x["control"]
        work = [self.has_work(q) for q in queue]
        exclusive = self.secure_mode or self.secure_request
        # The arbiter: highest priority among eligible queues, ties to the lower index.
        best = None
        for i in range(self.queues):
            if work[i] and x["enable"] and (control[i]["secure"] or not exclusive):
                if best is None or control[i]["priority"] > control[best]["priority"]:
                    best = i
        self.choice = None if best is None else (best, control[best]["priority"])
        if x["commit"]:
            self.current, self.current_valid = x["fetched_queue"], True
            if x["commit_tsr"]:
                self.tsr_pending = True
        if x["tsr_done"] or x["tsr_dropped"]:
            self.tsr_pending = False
        if x["started_new_queue"]:
            self.gtsp = False
        if x["gtsp_set"]:
            self.gtsp = True
        if x["switch"]:
            self.gtsp = False
            self.current_valid = False
        if x["retire"] and out["current_valid"] and out["current"] == x["retire_queue"]:
            self.current_valid = False
        if not x["busy"] and not out["stay"] and self.secure_mode != self.secure_request:
            self.secure_mode = self.secure_request
        self.secure_request = any(work[i] and control[i]["secure"]
                                  for i in range(self.queues))


@pytest.mark.parametrize("queues,seed", [(1, 0), (3, 1), (4, 2), (8, 3)])
def test_scheduler(queues, seed):
    dut = Scheduler(queues)
    rng = random.Random(seed)
    model = SchedulerModel(queues)
    queue = [{"count": 0, "retired": False} for _ in range(queues)]
    control = [{"priority": 0, "secure": False} for _ in range(queues)]
    seen = {"switch_target": 0, "secure_mode": 0, "stay": 0}

    async def tb(ctx):
        for cycle in range(1500):
            for i in range(queues):
                if rng.random() < 0.1:
                    queue[i] = {"count": rng.choice((0, 0, 1, 3)),
                                "retired": rng.random() < 0.1}
                if rng.random() < 0.03:
                    control[i] = {"priority": rng.randrange(16),
                                  "secure": rng.random() < 0.2}
                ctx.set(dut.queue[i].count, queue[i]["count"])
                ctx.set(dut.queue[i].retired, queue[i]["retired"])
                ctx.set(dut.queue[i].head, rng.getrandbits(32))      # not used
                ctx.set(dut.control[i].priority, control[i]["priority"])
                ctx.set(dut.control[i].secure, control[i]["secure"])
            x = {
                "queue": queue, "control": control,
                "enable": rng.random() < 0.95, "busy": rng.random() < 0.5,
                "fetched_queue": rng.randrange(queues),
                "completing": [rng.randrange(queues) for _ in range(2)],
                "gtsp_set": rng.random() < 0.1, "switch": rng.random() < 0.05,
                "started_new_queue": rng.random() < 0.1,
                "tsr_done": rng.random() < 0.1, "tsr_dropped": rng.random() < 0.02,
                "retire": rng.random() < 0.05, "retire_queue": rng.randrange(queues),
            }
            for name in ("enable", "busy", "fetched_queue", "gtsp_set", "switch",
                         "started_new_queue", "tsr_done", "tsr_dropped", "retire",
                         "retire_queue"):
                ctx.set(getattr(dut, name), x[name])
            for e in range(2):
                ctx.set(dut.completing[e], x["completing"][e])
            out = model.outputs(x)
            # A commit is offered only when allowed, as the composition does.
            x["commit"] = out["may_commit"] and rng.random() < 0.5
            x["commit_tsr"] = rng.random() < 0.3
            ctx.set(dut.commit, x["commit"])
            ctx.set(dut.commit_tsr, x["commit_tsr"])
            for name in ("target_valid", "may_commit", "request", "work", "current_valid",
                         "gtsp", "secure_mode", "secure_request"):
                assert ctx.get(getattr(dut, name)) == out[name], f"{name} at {cycle}"
            if out["target_valid"]:
                assert ctx.get(dut.target) == out["target"], f"target at {cycle}"
            if out["current_valid"]:
                assert ctx.get(dut.current) == out["current"]
            for e in range(2):
                assert ctx.get(dut.request_above[e]) == out["request_above"][e]
            seen["stay"] += out["stay"]
            seen["secure_mode"] += out["secure_mode"]
            seen["switch_target"] += (out["target_valid"] and out["current_valid"] and
                                      out["target"] != out["current"])
            await ctx.tick()
            model.step(x, out)

    run(dut, tb)
    # The run reached the interesting states (a target other than the current queue needs two
    # queues).
    if queues == 1:
        del seen["switch_target"]
    assert all(seen.values()), seen
