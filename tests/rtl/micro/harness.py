"""Memories around a micro unit for the Amaranth simulator: system memory (32-bit words with
byte lanes), the buffer (16-bit elements) and the kernel memory (32-bit words), each a
``lib.memory.Memory`` with a synchronous read port, as the SPRAMs and EBRs of the board."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu_spec import dataproc, dma


class DMAHarness(wiring.Component):
    """A :class:`npu.micro.dma.MicroDMA` (``dut``) with its memories; the register file is a
    RAM of the DMA window's words (``regs``, word ``a`` of the window at row ``a``; a word
    outside the window reads 0), which the unit also writes (its index counters)."""

    def __init__(self, dut, *, memory, buffer, kernel, registers):
        self.dut = dut
        config = dut.config
        self.sysmem = Memory(shape=32, depth=config.mem_kib * 256, init=memory)
        self.buffer = Memory(shape=16, depth=dataproc.buffer_elements(config), init=buffer)
        self.kmem = Memory(shape=32, depth=config.kernel_kib * 256, init=kernel)
        self.regs = Memory(shape=32, depth=len(registers), init=registers)
        super().__init__({"start": In(1), "done": Out(1), "error": Out(4),
                          "base": In(32), "limit": In(32)})

    def elaborate(self, platform):
        m = Module()
        dut = m.submodules.dut = self.dut
        for name in ("sysmem", "buffer", "kmem", "regs"):
            m.submodules[name] = getattr(self, name)
        m.d.comb += [dut.start.eq(self.start), self.done.eq(dut.done),
                     self.error.eq(dut.error), dut.base.eq(self.base), dut.limit.eq(self.limit)]

        # The DMA window's words; any other register word reads 0 (as in the register file).
        regs = self.regs.read_port()
        bits = (self.regs.depth - 1).bit_length()
        inside = Signal()
        m.d.sync += inside.eq((dut.reg_addr >> bits) == dma.BASE >> bits)
        m.d.comb += [regs.addr.eq(dut.reg_addr), dut.reg_data.eq(Mux(inside, regs.data, 0))]
        # The unit's own words (its index counters), inside the window.
        regs_w = self.regs.write_port()
        m.d.comb += [regs_w.addr.eq(dut.reg_w_addr), regs_w.data.eq(dut.reg_w_data),
                     regs_w.en.eq(dut.reg_w_en & ((dut.reg_w_addr >> bits) == dma.BASE >> bits))]

        mem_r = self.sysmem.read_port()
        mem_w = self.sysmem.write_port(granularity=8)
        m.d.comb += [mem_r.addr.eq(dut.mem_addr), mem_r.en.eq(dut.mem_re),
                     dut.mem_rdata.eq(mem_r.data), mem_w.addr.eq(dut.mem_addr),
                     mem_w.data.eq(dut.mem_wdata), mem_w.en.eq(dut.mem_we)]

        buf_r = self.buffer.read_port()
        buf_w = self.buffer.write_port()
        m.d.comb += [buf_r.addr.eq(dut.buf_addr), dut.buf_rdata.eq(buf_r.data),
                     buf_w.addr.eq(dut.buf_addr), buf_w.data.eq(dut.buf_wdata),
                     buf_w.en.eq(dut.buf_we)]

        k_w = self.kmem.write_port()
        m.d.comb += [k_w.addr.eq(dut.kmem_waddr), k_w.data.eq(dut.kmem_wdata),
                     k_w.en.eq(dut.kmem_we)]
        return m
