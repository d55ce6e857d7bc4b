# amaranth: UnusedElaboratable=no
"""The gated clock domain (``npu.lib.gate``) against a cycle model: the domain ticks exactly
on the cycles of activity, the tail after them and the reset, and its registers sample the
same pre-edge values as the ``sync`` domain's."""

import random

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from npu.lib.gate import gated_domain


class GatedCounter(wiring.Component):
    """``count`` ticks on the gated domain's edges, ``sampled`` is ``x`` as the gated domain
    last saw it, ``seen`` is ``count`` as the ``sync`` domain saw it a cycle ago."""

    activity: In(1)
    x: In(8)
    count: Out(16)
    sampled: Out(8)
    seen: Out(16)

    def __init__(self, tail, power_on=False):
        self._tail = tail
        self._power_on = power_on
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        gated_domain(m, "g", self.activity, tail=self._tail, power_on=self._power_on)
        m.d.g += [self.count.eq(self.count + 1), self.sampled.eq(self.x)]
        m.d.sync += self.seen.eq(self.count)
        return m


@pytest.mark.parametrize("power_on", [False, True])
@pytest.mark.parametrize("tail", [1, 3, 8])
def test_ticks_on_activity_and_tail(tail, power_on):
    dut = GatedCounter(tail, power_on)
    rng = random.Random(tail)
    pattern = [k == 0 or rng.random() < 0.15 for k in range(300)]   # activity on the first edge

    async def tb(ctx):
        count = sampled = 0
        left = 0
        seen = 0
        # The enable starts high: the first edge (the reset's, in a design) ticks the domain;
        # with ``power_on`` it starts low: the first edge never ticks it.
        for k, act in enumerate(pattern):
            x = rng.randrange(256)
            ctx.set(dut.activity, act)
            ctx.set(dut.x, x)
            await ctx.delay(1e-9)
            enabled = (act or left > 0) and k > 0 if power_on else act or left > 0 or k == 0
            await ctx.tick()
            assert ctx.get(dut.seen) == seen, k
            if enabled:
                count += 1
                sampled = x
            seen = count
            left = tail if act else max(0, left - 1)
            assert ctx.get(dut.count) == count, k
            assert ctx.get(dut.sampled) == sampled, k

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
