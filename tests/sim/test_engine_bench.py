# amaranth: UnusedElaboratable=no
"""The engine bench protocol on a small engine with the shared interface."""

import enum

import pytest
from amaranth.hdl import Module, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from npu.lib.csr import CSRSignature
from npu.lib.engine import EngineControl, EngineSignature, WriteLayout
from npu_sim import streams
from npu_sim.engine_bench import BenchProgram, EngineBench, StreamDataSide, run_bench
from npu_spec.codes import coded
from npu_spec.engine import TASK_OFFSET, control_registers
from npu_spec.regmap import Field, Register, RegisterMap


@coded(4)
class AddError(enum.IntEnum):
    NONE = 0
    EMPTY = 3


MAP = RegisterMap("ADDER", base=0x6000, registers=control_registers(AddError) + [
    Register("COUNT", offset=TASK_OFFSET, fields=[Field("n", 8)]),
    Register("OFFSET", fields=[Field("k", 16)]),
])


class AddEngine(wiring.Component):
    """Adds OFFSET to each of COUNT beats of stream ``a``; COUNT 0 is an error."""

    def __init__(self):
        self._control = EngineControl(MAP)
        super().__init__({
            "writes": In(stream.Signature(WriteLayout)),
            "csr": In(CSRSignature(self._control.csr.addr.shape().width)),
            "task": In(EngineSignature()),
            "a": In(stream.Signature(16)),
            "out": Out(stream.Signature(16)),
        })

    @property
    def base(self):
        return MAP.base

    def elaborate(self, platform):
        m = Module()
        m.submodules.control = ctl = self._control
        for name in ("writes", "csr", "task"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(ctl, name))
        regs = ctl.regs
        left = Signal(8)
        running = Signal()
        with m.If(ctl.go):
            m.d.sync += [left.eq(regs.count.n), running.eq(regs.count.n != 0)]
        m.d.comb += [self.out.valid.eq(self.a.valid & running),
                     self.out.payload.eq(self.a.payload + regs.offset.k),
                     self.a.ready.eq(self.out.ready & running)]
        with m.If(self.out.valid & self.out.ready):
            m.d.sync += left.eq(left - 1)
            with m.If(left == 1):
                m.d.sync += running.eq(0)
        # The task ends the cycle after its last beat (or at once for COUNT 0).
        m.d.comb += ctl.finish.eq(ctl.busy & ~running)
        empty = Signal()
        with m.If(ctl.go):
            m.d.sync += empty.eq(regs.count.n == 0)
        with m.If(empty):
            m.d.comb += ctl.code.eq(AddError.EMPTY)
        return m


def make_bench():
    engine = AddEngine()
    side = StreamDataSide(["a"], "out", 16, 32)
    return EngineBench(engine, side, data_width=32)


def program(tasks, stall=None):
    p = BenchProgram(32)
    if stall is not None:
        p.stall(stall)
    for n, k, values in tasks:
        p.writes([MAP.encode("COUNT", n=n), MAP.encode("OFFSET", k=k)])
        p.start()
        for v in values:
            p.load(0, v)
        p.wait(outputs=len(values) if n else 0)
        p.read(MAP.address("STATUS")).read(MAP.address("CYCLES"))
    return p


@pytest.mark.parametrize("stall", [0.0, 0.4])
def test_protocol(stall):
    bench = make_bench()
    tasks = [(3, 100, [1, 2, 3]), (0, 5, []), (2, 7, [40, 50])]
    p = program(tasks)
    records = run_bench(bench, p, stall=stall, seed=3)
    assert len(records) == 3 * len(tasks)
    for t, (n, k, values) in enumerate(tasks):
        (kind, code, data), (_, status), (_, cycles) = records[3 * t:3 * t + 3]
        assert kind == "wait"
        assert data == [v + k for v in values]
        fields = MAP.decode(MAP.address("STATUS"), status)
        if n:
            assert code == 0 and fields["error"] == 0 and cycles >= n
        else:
            assert code == AddError.EMPTY and fields["error_code"] == AddError.EMPTY
        assert fields["busy"] == 0


def without_cycles(records):
    """The records but the CYCLES reads (the third of each task's three)."""
    return [r for i, r in enumerate(records) if i % 3 != 2]


def test_data_side_stalls(monkeypatch):
    """STALL holds back the operand stream and the result stream at random (an LFSR each):
    the answers are the same, the tasks take longer, and a beat once offered stays offered
    with the same payload until it is taken (on the engine's input and on the data side's
    output)."""
    tasks = [(12, 3, list(range(12))), (0, 1, []), (6, 9, [7, 1, 2, 3, 4, 5])]
    plain = run_bench(make_bench(), program(tasks), seed=3)
    bench = make_bench()
    offers = []

    def watcher(stream):
        async def watch(ctx):
            held = None
            async for _, _, valid, ready, payload in ctx.tick().sample(
                    stream.valid, stream.ready, Value.cast(stream.payload)):
                if held is not None:
                    offers.append(valid and payload == held)
                held = payload if valid and not ready else None
        return watch

    run_simulation = streams.run_simulation

    def with_watchers(dut, testbenches, **kwargs):
        kwargs["background"] = [*kwargs.get("background", ()), watcher(bench.engine.a),
                                watcher(bench.data_side.bench.out)]
        return run_simulation(dut, testbenches, **kwargs)

    monkeypatch.setattr(streams, "run_simulation", with_watchers)
    stalled = run_bench(bench, program(tasks, stall=0.5), seed=3)
    assert without_cycles(stalled) == without_cycles(plain)
    assert stalled[2][1] > plain[2][1] and stalled[8][1] > plain[8][1]
    assert offers and all(offers)


def test_parse_reports_a_missing_answer():
    p = BenchProgram(32).wait()
    with pytest.raises(RuntimeError, match="no answer"):
        p.parse([])


def test_protocol_under_verilator():
    from npu_fpga.toolenv import apply_tool_env
    from npu_sim.verilator import StreamBench

    apply_tool_env()
    bench = make_bench()
    tasks = [(4, 1, [10, 20, 30, 40]), (0, 0, [])]
    verilator = StreamBench(bench, in_name="cmd", out_name="res")
    # Without stalls every answer, cycle counts included, is the same in both simulators;
    # with stalls (drawn differently) everything but the cycle counts.
    amaranth = run_bench(make_bench(), program(tasks), seed=5)
    assert run_bench(bench, program(tasks), backend="verilator", verilator=verilator) == amaranth
    stalled = run_bench(bench, program(tasks), backend="verilator", stall=0.3, seed=5,
                        verilator=verilator)
    assert without_cycles(stalled) == without_cycles(amaranth)
    # Stalls of the data side's streams too.
    data_stalled = run_bench(bench, program(tasks, stall=0.5), backend="verilator", stall=0.3,
                             seed=5, verilator=verilator)
    assert without_cycles(data_stalled) == without_cycles(amaranth)
    assert data_stalled[2][1] > amaranth[2][1]
