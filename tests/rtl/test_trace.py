"""The task trace recorder: every start and end, in order, with its cycle."""

import random

import pytest
from amaranth.sim import Simulator

from npu.trace import TraceRecorder


@pytest.mark.parametrize("seed", range(3))
def test_every_event_is_recorded_in_order(seed):
    rng = random.Random(seed)
    dut = TraceRecorder(3, depth=64)
    events = []
    got = []

    async def bench(ctx):
        busy = [None] * 3
        since = [0] * 3         # a task lasts at least 4 cycles (real ones take far longer)
        for cycle in range(300):
            ctx.set(dut.cycle, cycle)
            for e in range(3):
                st, dn = dut.starts[e], dut.dones[e]
                start = busy[e] is None and rng.random() < 0.5
                done = busy[e] is not None and cycle - since[e] >= 4 and rng.random() < 0.3
                task = rng.randrange(1 << 16)
                ctx.set(st.valid, start)
                ctx.set(st.ready, start)
                ctx.set(st.task_id, task)
                ctx.set(st.queue, e)
                ctx.set(dn.done, done)
                ctx.set(dn.error, 3 if done else 0)
                if start:
                    busy[e] = task
                    since[e] = cycle
                    events.append((task, e, 0, 0, e, cycle))
                elif done:
                    events.append((busy[e], e, 1, 3, e, cycle))
                    busy[e] = None
            # The host pops one entry a cycle.
            if ctx.get(dut.head_valid):
                h = ctx.get(dut.head)
                got.append((h.task_id, h.engine, h.end, h.error, h.queue, h.cycle))
                ctx.set(dut.pop, 1)
            else:
                ctx.set(dut.pop, 0)
            await ctx.tick()
        ctx.set(dut.pop, 0)
        for e in range(3):
            ctx.set(dut.starts[e].valid, 0)
            ctx.set(dut.dones[e].done, 0)
        for _ in range(200):
            if ctx.get(dut.head_valid):
                h = ctx.get(dut.head)
                got.append((h.task_id, h.engine, h.end, h.error, h.queue, h.cycle))
                ctx.set(dut.pop, 1)
            else:
                ctx.set(dut.pop, 0)
            await ctx.tick()
        assert not ctx.get(dut.overflow)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    # Per engine in order; all of them.
    for e in range(3):
        assert [g for g in got if g[1] == e] == [ev for ev in events if ev[1] == e]
    assert len(got) == len(events)
