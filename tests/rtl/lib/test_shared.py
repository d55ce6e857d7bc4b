# amaranth: UnusedElaboratable=no
"""Blocks converted once and instantiated by name (``npu.lib.shared``)."""

import subprocess

import pytest
from amaranth.back import verilog
from amaranth.hdl import Module, ResetInserter
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from npu.lib.shared import SharedModule, SharedModules, place


class Counter(wiring.Component):
    en: In(1)
    count: Out(8)

    def elaborate(self, platform):
        m = Module()
        with m.If(self.en):
            m.d.sync += self.count.eq(self.count + 1)
        return m


class Pair(wiring.Component):
    """Two counters, cleared by ``flush`` as a ResetInserter clears them."""

    flush: In(1)
    en: In(2)
    a: Out(8)
    b: Out(8)

    def __init__(self, shared=None):
        self._shared = shared
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        for i, out in enumerate((self.a, self.b)):
            counter = place(m, f"counter{i}", self._shared, "counter", Counter,
                            reset=self.flush)
            m.d.comb += [counter.en.eq(self.en[i]), out.eq(counter.count)]
        return ResetInserter(self.flush)(m)


class Outer(wiring.Component):
    """A shared Pair: converting it asks the library for the counter."""

    en: In(2)
    a: Out(8)

    def __init__(self, shared):
        self._shared = shared
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        pair = place(m, "pair", self._shared, "pair", lambda: Pair(self._shared))
        m.d.comb += [pair.en.eq(self.en), self.a.eq(pair.a)]
        return m


def test_get_builds_once():
    shared = SharedModules()
    built = []

    def build():
        built.append(Counter())
        return built[-1]
    first = shared.get("counter", build)
    assert shared.get("counter", build) is first
    assert len(built) == 1 and first.component is built[0]
    assert shared.names() == ["counter"]


def test_shared_module_needs_a_component():
    with pytest.raises(TypeError, match="wiring.Component"):
        SharedModule(object(), "x")


def test_verilog_holds_the_blocks_found_while_converting():
    shared = SharedModules()
    text = verilog.convert(Outer(shared), name="outer", emit_src=False)
    assert shared.names() == ["pair"]
    text += shared.verilog()
    assert shared.names() == ["pair", "counter"]
    for name in ("outer", "pair", "counter"):
        assert text.count(f"module {name}(") == 1
    assert text.count("  counter counter") == 2


def test_place_without_a_library_inlines():
    dut = Pair()
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    seen = []

    async def bench(ctx):
        ctx.set(dut.en, 0b11)
        await ctx.tick().repeat(5)
        seen.append((ctx.get(dut.a), ctx.get(dut.b)))
        ctx.set(dut.flush, 1)
        await ctx.tick()
        ctx.set(dut.flush, 0)
        ctx.set(dut.en, 0b01)
        await ctx.tick().repeat(2)
        seen.append((ctx.get(dut.a), ctx.get(dut.b)))
    sim.add_testbench(bench)
    sim.run()
    assert seen == [(5, 5), (2, 0)]


_BENCH = """
module bench;
  reg clk = 0, rst = 1, flush = 0;
  reg [1:0] en = 2'b11;
  wire [7:0] a, b;
  pair dut(.clk(clk), .rst(rst), .flush(flush), .en(en), .a(a), .b(b));
  always #1 clk = ~clk;
  initial begin
    @(negedge clk) rst = 0;
    repeat (5) @(negedge clk);
    $display("%0d %0d", a, b);
    flush = 1; @(negedge clk); flush = 0; en = 2'b01;
    repeat (2) @(negedge clk);
    $display("%0d %0d", a, b);
    $finish;
  end
endmodule
"""


def test_instances_take_the_flush(tmp_path):
    """The counters as instances of one converted module: the flush reaches them through the
    instances' reset (a ResetInserter alone would not); run on Icarus Verilog."""
    shared = SharedModules()
    text = verilog.convert(Pair(shared), name="pair", emit_src=False) + shared.verilog()
    assert text.count("module counter(") == 1
    (tmp_path / "pair.v").write_text(text + _BENCH)
    subprocess.run(["iverilog", "-o", str(tmp_path / "sim"), "-s", "bench",
                    str(tmp_path / "pair.v")], check=True)
    out = subprocess.run(["vvp", "-N", str(tmp_path / "sim")], check=True, capture_output=True,
                         text=True).stdout.split("\n")
    assert out[:2] == ["5 5", "2 0"]
