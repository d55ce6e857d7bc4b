"""M-slot flow control: the seed's dispatch trace, RTL against the golden model, and a formal
proof that no slot is overwritten while a consumer still reads it and no unit is read early."""

import random

import pytest
from amaranth.hdl import Assert, Assume, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from npu.dataproc.flow import FlowControl, FlowParams
from npu_model.flow import dispatch, first_needed, last_needed
from npu_sim.formal import prove


def _seed_params():
    # 3x3 stride-1 consumer (one row of padding), M = 3 slots, N = 6 rows.
    return dict(rows=6, units=6, slots=3, kernel=3, stride=1, pad=1)


def test_model_reproduces_the_seed_trace():
    order = dispatch(_seed_params())
    names = [f"{e[0]}{e[1]}" for e in order]
    assert names == "P0 P1 C0 P2 C1 P3 C2 P4 C3 P5 C4 C5".split()
    assert [e[2] for e in order if e[0] == "P"] == [0, 1, 2, 0, 1, 2]


def _run_rtl(p):
    """Dispatch on the RTL unit with the model's policy; the order and the slots it gives."""
    dut = FlowControl()
    order = []

    async def bench(ctx):
        for name, value in p.items():
            ctx.set(getattr(dut.params, name), value)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        for _ in range(4 * (p["rows"] + p["units"]) + 4):
            if ctx.get(dut.may_consume):
                order.append(("C", ctx.get(dut.consumed)))
                first_slot = ctx.get(dut.first_slot)
                assert first_slot == first_needed(p, order[-1][1]) % p["slots"]
                ctx.set(dut.consume, 1)
            elif ctx.get(dut.may_produce):
                order.append(("P", ctx.get(dut.produced), ctx.get(dut.slot)))
                ctx.set(dut.produce, 1)
            await ctx.tick()
            ctx.set(dut.consume, 0)
            ctx.set(dut.produce, 0)
        done = ctx.get(dut.done)
        order.append(("done", done))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return order


def test_rtl_reproduces_the_seed_trace():
    order = _run_rtl(_seed_params())
    assert order[-1] == ("done", 1)
    assert order[:-1] == dispatch(_seed_params())


@pytest.mark.parametrize("seed", range(12))
def test_rtl_matches_model(seed):
    rng = random.Random(seed)
    kernel = rng.randint(1, 5)
    stride = rng.randint(1, 3)
    pad = rng.randint(0, kernel - 1)
    rows = rng.randint(1, 14)
    units = max(1, (rows + 2 * pad - kernel) // stride + 1)
    p = dict(rows=rows, units=units, slots=rng.randint(max(kernel, stride), kernel + 3),
             kernel=kernel, stride=stride, pad=pad)
    order = _run_rtl(p)
    expected = dispatch(p)
    assert order[:-1] == expected
    # With at least K slots every unit is written and consumed: no deadlock.
    assert order[-1] == ("done", 1)
    assert sum(e[0] == "P" for e in expected) == rows


class _Harness(wiring.Component):
    """The unit with free inputs: parameters with M >= K, 1 <= S <= M, P < K (small, for the
    solver), starts at any time, produce and consume at random."""

    params: In(FlowParams)
    start: In(1)
    produce: In(1)
    consume: In(1)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = FlowControl()
        m.d.comb += [dut.params.eq(self.params), dut.start.eq(self.start),
                     dut.produce.eq(self.produce), dut.consume.eq(self.consume)]

        def valid(q):
            return ((q.rows <= 9) & (q.units <= 9) & (q.slots <= 6) & (q.kernel >= 1)
                    & (q.kernel <= 4) & (q.stride >= 1) & (q.stride <= 3)
                    & (q.pad < q.kernel) & (q.slots >= q.kernel) & (q.stride <= q.slots))

        with m.If(self.start):
            m.d.comb += Assume(valid(self.params))
        started = Signal()
        with m.If(self.start):
            m.d.sync += started.eq(1)

        p = dut.p
        c, produced = dut.consumed, dut.produced
        window = Signal(range(-16, 64))
        first = Signal(range(64))
        last = Signal(range(-16, 64))
        m.d.comb += [window.eq(c * p.stride - p.pad),
                     first.eq(Mux(window < 0, 0, window)),
                     last.eq(window + p.kernel - 1)]
        with m.If(started):
            # The state: valid parameters, counters in range, the incremental values right.
            m.d.comb += [Assert(valid(p)), Assert(produced <= p.rows), Assert(c <= p.units),
                         Assert(dut.window == window),
                         Assert(dut.slot == produced % p.slots),
                         Assert(dut.first_slot == first % p.slots),
                         # No unit an unfinished consumer unit reads has been overwritten.
                         Assert((c >= p.units) | (produced <= first + p.slots))]
            with m.If(~self.start):
                # A unit is produced only into a slot no unfinished consumer unit reads.
                with m.If(dut.produce & dut.may_produce & (c < p.units)):
                    m.d.comb += Assert(produced < first + p.slots)
                # A consumer unit runs only when every unit it reads is written.
                with m.If(dut.consume & dut.may_consume):
                    m.d.comb += Assert((produced > last) | (produced >= p.rows))
        return m


@pytest.mark.formal
def test_flow_control_is_safe():
    result = prove(_Harness(), "flow_control", mode="prove", depth=12)
    assert result.passed, result.log[-3000:]


def test_model_rules_are_the_definition():
    p = _seed_params()
    assert [first_needed(p, c) for c in range(6)] == [0, 0, 1, 2, 3, 4]
    assert [last_needed(p, c) for c in range(6)] == [1, 2, 3, 4, 5, 5]
