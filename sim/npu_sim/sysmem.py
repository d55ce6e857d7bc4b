"""System memory for simulation: a Wishbone B4 pipelined slave with latency and random stalls.

:class:`SystemMemory` stands outside the NPU, in the system-simulation harness, on the other
end of the NPU's system memory bus (``docs/system.md``, "System memory bus"). It is plain
gateware (a :class:`~amaranth.lib.memory.Memory`, registers and an LFSR), so the same component
runs in ``amaranth.sim`` and in a Verilator build with no Python per cycle.

For Verilator the words can live in the C++ bench instead (``storage="dpi"``): the component
then instantiates :data:`DPI_VERILOG`, whose clocked block calls the C++ functions of
:data:`DPI_CPP` (a vector that grows as words are written, so its size is set at run time and
costs nothing to elaborate). An elaborated memory of ``words`` words is exported by Amaranth
as one initial value per bit, which is what makes a memory of megabytes slow and large to
build (``docs/system.md``, "System memory of large programs").
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, ClockSignal, Instance, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu.lib.pipe import delay
from npu.lib.wishbone import ADDR_BITS, WishboneSignature

__all__ = ["DPI_CPP", "DPI_VERILOG", "HostSignature", "SystemMemory"]

#: The storage of ``SystemMemory(storage="dpi")``: 32-bit lanes read and written through DPI
#: calls at the clock edge, reads before writes (a read returns the word before a write of
#: the same edge, like the non-transparent ports of the gateware storage).
DPI_VERILOG = """
module npu_sysmem_dpi #(parameter LANES = 1) (
    input clk,
    input [31:0] bus_addr, input [LANES*4-1:0] bus_mask, input [LANES*32-1:0] bus_wdata,
    output reg [LANES*32-1:0] bus_rdata,
    input [31:0] host_addr, input host_we, input [LANES*32-1:0] host_wdata, input host_re,
    output reg [LANES*32-1:0] host_rdata);
  import "DPI-C" function int npu_sysmem_read(input int index);
  import "DPI-C" function void npu_sysmem_write(input int index, input int data, input int mask);
  integer k;
  always @(posedge clk) begin
    for (k = 0; k < LANES; k = k + 1) begin
      bus_rdata[k*32 +: 32] <= npu_sysmem_read(bus_addr * LANES + k);
      if (host_re) host_rdata[k*32 +: 32] <= npu_sysmem_read(host_addr * LANES + k);
    end
    for (k = 0; k < LANES; k = k + 1) begin
      if (bus_mask[k*4 +: 4] != 4'd0)
        npu_sysmem_write(bus_addr * LANES + k, bus_wdata[k*32 +: 32], {28'd0, bus_mask[k*4 +: 4]});
      if (host_we) npu_sysmem_write(host_addr * LANES + k, host_wdata[k*32 +: 32], 15);
    end
  end
endmodule
"""

#: The C++ side of :data:`DPI_VERILOG`: lanes never written read as zero.
DPI_CPP = r"""
#include "Vtop__Dpi.h"
static std::vector<uint32_t> npu_sysmem;
int npu_sysmem_read(int index) {
    uint32_t i = (uint32_t)index;
    return i < npu_sysmem.size() ? (int)npu_sysmem[i] : 0;
}
void npu_sysmem_write(int index, int data, int mask) {
    uint32_t i = (uint32_t)index;
    if (i >= npu_sysmem.size()) npu_sysmem.resize((size_t)i + 1 + npu_sysmem.size() / 2);
    uint32_t bits = 0;
    for (int b = 0; b < 4; b++) if (mask >> b & 1) bits |= 0xFFu << (8 * b);
    npu_sysmem[i] = (npu_sysmem[i] & ~bits) | ((uint32_t)data & bits);
}
"""

#: Taps of the stall generator's LFSR, x^16 + x^14 + x^13 + x^11 + 1 (maximal length).
_TAPS = (15, 13, 12, 10)


class HostSignature(wiring.Signature):
    """The harness's port into :class:`SystemMemory`, from the harness's side: whole words,
    read and written by index.

    Members
    -------
    addr : Out(range(words))
        Word index.
    w_en : Out(1)
        Write ``w_data`` to ``addr`` at the clock edge.
    w_data : Out(data_width)
    r_en : Out(1)
        Read ``addr``; the word is on ``r_data`` in the next cycle.
    r_data : In(data_width)
    """

    def __init__(self, words, data_width):
        super().__init__({
            "addr":   Out(range(words)),
            "w_en":   Out(1),
            "w_data": Out(data_width),
            "r_en":   Out(1),
            "r_data": In(data_width),
        })


def _lfsr_step(bits):
    """One step of the Fibonacci LFSR on a list of 16 one-bit values (bit 0 first)."""
    feedback = bits[_TAPS[0]] ^ bits[_TAPS[1]] ^ bits[_TAPS[2]] ^ bits[_TAPS[3]]
    return [feedback] + bits[:-1]


class SystemMemory(wiring.Component):
    """``words`` words of ``data_width`` bits behind a Wishbone B4 pipelined slave port.

    * **Latency.** A request taken in cycle ``t`` (``cyc & stb & ~stall``) is answered in cycle
      ``t + latency`` exactly, by ``ack`` (with ``dat_r`` on a read) or by ``err``. One request
      is taken a cycle, so up to ``latency`` requests are in flight. The access happens in
      cycle ``t + latency - 1``: requests act on the memory in the order they were taken, and a
      read sees every write taken before it.
    * **Writes** change the bytes whose ``sel`` bit is set; a read ignores ``sel``.
    * **Errors.** A request with ``adr >= words`` is answered by ``err`` and touches nothing.
    * **Stalls.** ``stall`` is high in a cycle when the low byte of a 16-bit LFSR (stepped 8
      times a cycle, started at ``seed``) is below ``stall_prob``: a cycle stalls with
      probability ``stall_prob / 256``; 0 never stalls. ``stall`` does not depend on ``stb``.
    * **Aborts** are not modelled: a master keeps ``cyc`` high until its last answer (the bus
      contract), and answers in flight are given even if it does not.
    * **Host port.** ``host`` reads and writes whole words by index, for the harness to load
      memory before a run and read it back after; a host write and a bus access to the same
      word in the same cycle is not allowed. ``init`` gives the words at reset.

    Parameters
    ----------
    words : int
        Memory size in words (any positive number).
    data_width : int
        32, 64, 128 or 256.
    latency : int
        Cycles from taking a request to its answer (at least 1).
    addr_width : int
        Width of the bus ``adr``.
    seed : int
        Start value of the stall LFSR (1 to 65535).
    init : iterable of int
        Initial contents (missing words are 0); only with ``storage="gateware"``.
    storage : str
        ``"gateware"``: a :class:`~amaranth.lib.memory.Memory` (every simulator);
        ``"dpi"``: words kept by the Verilator bench (:data:`DPI_VERILOG`, :data:`DPI_CPP`).

    Members
    -------
    bus : In(WishboneSignature(addr_width, data_width))
        The slave port.
    stall_prob : In(8)
        Stall probability, in 256ths.
    host : In(HostSignature(words, data_width))
        The harness's word port.
    """

    def __init__(self, words, data_width=32, latency=1, *, addr_width=ADDR_BITS, seed=1,
                 init=(), storage="gateware"):
        if not isinstance(words, int) or isinstance(words, bool) or words < 1:
            raise ValueError(f"Words must be a positive integer, not {words!r}")
        if not isinstance(latency, int) or isinstance(latency, bool) or latency < 1:
            raise ValueError(f"Latency must be a positive integer, not {latency!r}")
        if not isinstance(seed, int) or not 1 <= seed <= 0xFFFF:
            raise ValueError(f"Seed must be an integer from 1 to 65535, not {seed!r}")
        bus = WishboneSignature(addr_width, data_width)    # checks the widths
        if words > 2 ** addr_width:
            raise ValueError(f"Words must be at most 2**addr_width ({2 ** addr_width}), "
                             f"not {words!r}")
        self._words = words
        self._data_width = data_width
        self._latency = latency
        self._seed = seed
        if storage not in ("gateware", "dpi"):
            raise ValueError(f"Storage must be 'gateware' or 'dpi', not {storage!r}")
        self._init = list(init)
        if self._init and storage != "gateware":
            raise ValueError("Init needs storage='gateware'")
        self._storage = storage
        if len(self._init) > words:
            raise ValueError(f"Init must have at most {words} words, not {len(self._init)}")
        super().__init__({
            "bus":        In(bus),
            "stall_prob": In(8),
            "host":       In(HostSignature(words, data_width)),
        })

    @property
    def words(self):
        return self._words

    @property
    def data_width(self):
        return self._data_width

    @property
    def latency(self):
        return self._latency

    def _storage_ports(self, m):
        """The storage's ports: a bus write port (byte lanes), a bus read port, a host write
        port and a host read port, each with ``addr``, ``data`` and (but the bus read port)
        ``en``."""
        width = self._data_width
        if self._storage == "gateware":
            m.submodules.mem = mem = Memory(shape=width, depth=self._words, init=self._init)
            return (mem.write_port(granularity=8), mem.read_port(), mem.write_port(),
                    mem.read_port())

        def port(name, en_width):
            p = SimpleNamespace(addr=Signal(32, name=f"{name}_addr"),
                                data=Signal(width, name=f"{name}_data"))
            if en_width:
                p.en = Signal(en_width, name=f"{name}_en")
            return p
        bus_w, bus_r = port("bus_w", width // 8), port("bus_r", 0)
        host_w, host_r = port("host_w", 1), port("host_r", 1)
        m.submodules.storage = Instance(
            "npu_sysmem_dpi", p_LANES=width // 32, i_clk=ClockSignal(),
            i_bus_addr=bus_w.addr, i_bus_mask=bus_w.en, i_bus_wdata=bus_w.data,
            o_bus_rdata=bus_r.data, i_host_addr=host_w.addr, i_host_we=host_w.en,
            i_host_wdata=host_w.data, i_host_re=host_r.en, o_host_rdata=host_r.data)
        return bus_w, bus_r, host_w, host_r

    def elaborate(self, platform):
        m = Module()
        width = self._data_width
        lanes = width // 8
        bus_w, bus_r, host_w, host_r = self._storage_ports(m)

        # Stalls: the low byte of the LFSR against the probability.
        lfsr = Signal(16, init=self._seed)
        bits = list(lfsr)
        for _ in range(8):
            bits = _lfsr_step(bits)
        m.d.sync += lfsr.eq(Cat(*bits))
        m.d.comb += self.bus.stall.eq(lfsr[:8] < self.stall_prob)

        # A request taken now acts on the memory ``latency - 1`` cycles later.
        request = Signal(data.StructLayout({
            "valid": 1, "we": 1, "err": 1, "addr": range(self._words), "sel": lanes,
            "data": width,
        }))
        m.d.comb += [
            request.valid.eq(self.bus.cyc & self.bus.stb & ~self.bus.stall),
            request.we.eq(self.bus.we),
            request.err.eq(self.bus.adr >= self._words),
            request.addr.eq(self.bus.adr),
            request.sel.eq(self.bus.sel),
            request.data.eq(self.bus.dat_w),
        ]
        access = request
        if self._latency > 1:
            access = delay(m, request, self._latency - 1, name="request")[-1]

        # The access, and its answer in the next cycle.
        ok = access.valid & ~access.err
        m.d.comb += [
            bus_w.addr.eq(access.addr),
            bus_w.data.eq(access.data),
            bus_w.en.eq(access.sel & (ok & access.we).replicate(lanes)),
            bus_r.addr.eq(access.addr),
            self.bus.dat_r.eq(bus_r.data),
        ]
        m.d.sync += [
            self.bus.ack.eq(ok),
            self.bus.err.eq(access.valid & access.err),
        ]

        # The harness's port.
        m.d.comb += [
            host_w.addr.eq(self.host.addr),
            host_w.data.eq(self.host.w_data),
            host_w.en.eq(self.host.w_en),
            host_r.addr.eq(self.host.addr),
            host_r.en.eq(self.host.r_en),
            self.host.r_data.eq(host_r.data),
        ]
        return m
