"""The core cluster: one neural engine task on several cores, one done."""

import random

import pytest
from amaranth.sim import Simulator

from npu.neural.cluster import CoreCluster


@pytest.mark.parametrize("seed", range(4))
def test_cluster_starts_selected_cores_and_reports_once(seed):
    rng = random.Random(seed)
    cores = 3
    dut = CoreCluster(cores)
    log = []

    async def bench(ctx):
        busy_until = [0] * cores
        codes = [0] * cores
        cycle = 0
        for task in range(12):
            mask = rng.randrange(0, 1 << cores)
            selected = mask or 1
            durations = [rng.randint(1, 9) for _ in range(cores)]
            errors = [rng.choice([0, 0, 3, 5]) for _ in range(cores)]
            ctx.set(dut.mask, mask)
            ctx.set(dut.task.start.valid, 1)
            ctx.set(dut.task.start.payload.task_id, task)
            started = False
            done_seen = 0
            started_cores = set()
            for _ in range(200):
                # Behavioural cores: ready when idle, done after their duration.
                for i in range(cores):
                    ctx.set(dut.core[i].start.ready, int(cycle >= busy_until[i]))
                    finishing = cycle == busy_until[i] - 1 and codes[i] is not None
                    ctx.set(dut.core[i].done, int(finishing))
                    ctx.set(dut.core[i].error, codes[i] if finishing else 0)
                    if finishing:
                        codes[i] = None
                for i in range(cores):
                    if ctx.get(dut.core[i].start.valid) and ctx.get(dut.core[i].start.ready):
                        started_cores.add(i)
                        assert ctx.get(dut.core[i].start.payload.task_id) == task
                        busy_until[i] = cycle + 1 + durations[i]
                        codes[i] = errors[i]
                taken = ctx.get(dut.task.start.valid) and ctx.get(dut.task.start.ready)
                started = started or taken
                if ctx.get(dut.task.done):
                    done_seen += 1
                    log.append((task, ctx.get(dut.task.error)))
                await ctx.tick()
                if taken:
                    ctx.set(dut.task.start.valid, 0)
                cycle += 1
                if done_seen and cycle > max(busy_until) + 2:
                    break
            assert started
            assert started_cores == {i for i in range(cores) if selected >> i & 1}
            assert done_seen == 1, f"task {task}: {done_seen} dones"
            # The first nonzero code by finishing cycle, lowest core first among equals.
            order = sorted((durations[i], i) for i in started_cores)
            expected = next((errors[i] for _, i in order if errors[i]), 0)
            assert log[-1] == (task, expected)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
