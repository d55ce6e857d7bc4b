# amaranth: UnusedElaboratable=no
"""The fixed-priority arbiter, against a Python reference, for several queue counts."""

import random

import pytest
from amaranth.sim import Simulator

from npu.taskman import Arbiter


def reference(request, priority):
    best = None
    for i, (r, p) in enumerate(zip(request, priority)):
        if r and (best is None or p > priority[best]):
            best = i
    return best


@pytest.mark.parametrize("queues", [1, 3, 8])
def test_arbiter(queues):
    dut = Arbiter(queues, 4)
    rng = random.Random(queues)

    async def tb(ctx):
        for _ in range(300):
            request = [rng.random() < 0.4 for _ in range(queues)]
            priority = [rng.randrange(3) for _ in range(queues)]
            for i in range(queues):
                ctx.set(dut.request[i], request[i])
                ctx.set(dut.priority[i], priority[i])
            expect = reference(request, priority)
            assert ctx.get(dut.valid) == (expect is not None)
            if expect is not None:
                assert ctx.get(dut.index) == expect
                assert ctx.get(dut.chosen_priority) == priority[expect]

    sim = Simulator(dut)
    sim.add_testbench(tb)
    sim.run()
