"""The Verilator stream bench: zero memory initialisation is left to Verilator, the reset is
made inside the design, the build options are part of the cache key."""

import re

import pytest
from amaranth.hdl import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu_fpga.toolenv import apply_tool_env
from npu_sim import verilator as vl
from npu_sim.verilator import PowerOnReset, StreamBench, strip_zero_memory_init

ROM = [0, 0x1234, 0, 0xBEEF, 0, 0, 7, 0]


class _Lookup(wiring.Component):
    """Answers an address with ROM[addr] + RAM[addr] a cycle later; the RAM is never written."""

    cmd: In(stream.Signature(data.StructLayout({"addr": 3})))
    res: Out(stream.Signature(data.StructLayout({"data": 16})))

    def elaborate(self, platform):
        m = Module()
        m.submodules.rom = rom = Memory(shape=16, depth=len(ROM), init=ROM)
        m.submodules.ram = ram = Memory(shape=16, depth=len(ROM), init=[])
        rp, qp = rom.read_port(), ram.read_port()
        take = ~self.res.valid | self.res.ready
        for port in (rp, qp):
            m.d.comb += [port.addr.eq(self.cmd.payload.addr), port.en.eq(take)]
        m.d.comb += [self.cmd.ready.eq(take), self.res.payload.data.eq(rp.data + qp.data)]
        with m.If(take):
            m.d.sync += self.res.valid.eq(self.cmd.valid)
        return m


def test_strip_keeps_nonzero_words_and_logic():
    text = ("  always @* begin\n    \\y [3] = 1'h0;\n  end\n"
            "  initial begin\n    mem[0] = 16'h0000;\n    \\top.m [1] = 8'h00;\n"
            "    mem[2] = 16'h0100;\n    x = 16'h0000;\n    k[7] = 32'd0;\n  end\n"
            "  always @(posedge clk) begin\n    \\z [0] = 4'h0;\n  end\n")
    out = strip_zero_memory_init(text)
    assert "mem[0]" not in out and "\\top.m [1]" not in out and "k[7]" not in out
    assert "mem[2] = 16'h0100;" in out and "x = 16'h0000;" in out
    assert "\\y [3] = 1'h0;" in out and "\\z [0] = 4'h0;" in out


def test_memories_start_as_initialised():
    apply_tool_env()
    bench = StreamBench(_Lookup(), in_name="cmd", out_name="res")
    assert "= 16'h0000;" not in bench.verilog      # the zero words are gone
    addrs = [3, 0, 6, 1, 2, 7, 3]
    got, _ = bench.run(addrs, len(addrs), stall=0.3, seed=5)
    assert got == [ROM[a] for a in addrs]


def test_reset_is_made_inside_the_design():
    apply_tool_env()
    bench = StreamBench(_Lookup(), in_name="cmd", out_name="res")
    top = re.search(r"^module top\((.*?)\);", bench.verilog, re.M)
    ports = {p.strip() for p in top.group(1).split(",")}
    assert "clk" in ports and "rst" not in ports
    inner = PowerOnReset(_Lookup())
    inner._MustUse__silence = inner._component._MustUse__silence = True
    with pytest.raises(ValueError, match="clk"):
        PowerOnReset(inner)


def test_build_options_are_part_of_the_cache_key(monkeypatch, tmp_path):
    def build_dir():
        return StreamBench(_Lookup(), in_name="cmd", out_name="res", key=("lookup",),
                           cache_dir=tmp_path).build_dir
    before = build_dir()
    assert build_dir() == before
    monkeypatch.setattr(vl, "BUILD_FLAGS", vl.BUILD_FLAGS + ("--no-such-option",))
    assert build_dir() != before


def test_profile_guided_build():
    """A build with a profile (``training``) runs the training commands on an instrumented
    binary, compiles again with the profile and answers like the build without; it is cached
    under a key of its own."""
    apply_tool_env()
    runs = []

    def training():
        runs.append("trained")
        return [([1, 3, 6, 6], 4)]

    plain = StreamBench(_Lookup(), in_name="cmd", out_name="res")
    bench = StreamBench(_Lookup(), in_name="cmd", out_name="res", training=training)
    assert bench.build_dir != plain.build_dir
    fresh = not bench.binary.exists()
    addrs = [3, 0, 6, 1, 2, 7, 3]
    got, stats = bench.run(addrs, len(addrs), stall=0.3, seed=5)
    assert got == [ROM[a] for a in addrs]
    assert (got, stats) == plain.run(addrs, len(addrs), stall=0.3, seed=5)
    assert runs == (["trained"] if fresh else [])
    assert list((bench.build_dir / "obj_dir").glob("*.gcda"))     # the profile it used
