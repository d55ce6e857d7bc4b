# amaranth: UnusedElaboratable=no
"""The performance counters against their descriptions in ``npu_spec.taskman.COUNTERS``."""

import random

from npu.taskman.counters import Counters
from npu.taskman.taskbuffer import ENGINES
from npu_spec.taskman import COUNTERS
from tests.support.csr import run


def test_counters():
    dut = Counters()
    rng = random.Random(1)
    names = [name for name, _ in COUNTERS]
    count = dict.fromkeys(names, 0)
    latency = None               # cycles since the first cycle of the current request

    async def tb(ctx):
        nonlocal latency
        for cycle in range(3000):
            x = {"busy": rng.random() < 0.6, "work": rng.random() < 0.5,
                 "completed": rng.getrandbits(ENGINES), "waiting": rng.getrandbits(ENGINES),
                 "write_stall": rng.random() < 0.2, "switch": rng.random() < 0.02,
                 "request": rng.random() < 0.03, "started_new_queue": rng.random() < 0.02}
            for name, value in x.items():
                ctx.set(getattr(dut, name), value)
            await ctx.tick()
            count["TASKS_RUN"] += bin(x["completed"]).count("1")
            count["BUSY_CYCLES"] += x["busy"]
            count["IDLE_CYCLES"] += not x["busy"]
            count["STALL_FETCH"] += x["work"] and not x["busy"]      # work, nothing in flight
            count["STALL_DEP"] += x["waiting"] != 0
            count["STALL_WRITE"] += x["write_stall"]
            count["SWITCHES"] += x["switch"]
            # From the first cycle of a request to the start of another queue's task.
            if latency is not None:
                latency += 1
                if x["started_new_queue"]:
                    count["SWITCH_LATENCY"] = latency
                    latency = None
            elif x["request"]:
                latency = 0
            for n, name in enumerate(names):
                assert ctx.get(dut.value[n]) == count[name], f"{name} at {cycle}"
                assert ctx.get(dut.counter(name)) == count[name]

    run(dut, tb)
    assert all(count.values()), count
