"""The Verilator stream bench: zero memory initialisation is left to Verilator."""

from amaranth.hdl import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu_fpga.toolenv import apply_tool_env
from npu_sim.verilator import StreamBench, strip_zero_memory_init

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
