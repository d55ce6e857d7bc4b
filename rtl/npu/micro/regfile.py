"""The micro build's register file: the register words its units read, in one RAM
(``docs/micro.md``, "The register file")."""

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu_spec import dataproc
from npu_spec.micro import BLOCK_WORDS, REGISTER_BLOCKS, ROWS, reset_rows

__all__ = ["MicroRegisterFile"]


class MicroRegisterFile(wiring.Component):
    """A RAM of 32-bit words, :data:`npu_spec.micro.BLOCK_WORDS` rows for each block of
    :data:`npu_spec.micro.REGISTER_BLOCKS`, initialised with the registers' reset values, and
    ``NE_CORES`` bit 0 in a flip-flop. A write to any other register word is dropped; a read
    of one returns 0.

    Members
    -------
    w_addr : In(16)
        Register word address written when ``w_en`` is high.
    w_data : In(32)
    w_en : In(1)
    r_addr : In(16)
        Register word address read.
    r_data : Out(32)
        The word at ``r_addr`` of the previous cycle (synchronous read; a write in that same
        cycle is not seen).
    ne_core0 : Out(1)
        ``DATA_PROCESSOR.NE_CORES`` bit 0: the neural task runs core 0.
    """

    w_addr: In(16)
    w_data: In(32)
    w_en: In(1)
    r_addr: In(16)
    r_data: Out(32)
    ne_core0: Out(1, init=dataproc.DATA_PROCESSOR["NE_CORES"].reset & 1)

    def __init__(self):
        super().__init__()
        # (a word read in the cycle it is written is never used: the runner writes while no
        # unit reads, and the DMA unit writes a counter word while it reads another; so Yosys
        # may leave such a collision undefined, "no_rw_check", as for the kernel memory in
        # npu.micro.top)
        self.ram = Memory(shape=32, depth=ROWS, init=reset_rows(), attrs={"no_rw_check": 1})

    @staticmethod
    def _row(m, address, name):
        """(row, kept) of register word ``address`` (combinational)."""
        row = Signal(range(ROWS), name=f"{name}_row")
        hits = []
        block_bits = (BLOCK_WORDS - 1).bit_length()
        for k, start in enumerate(REGISTER_BLOCKS):
            hit = address[block_bits:] == start >> block_bits
            hits.append(hit)
            with m.If(hit):
                m.d.comb += row.eq(Cat(address[:block_bits], Const(k, len(row) - block_bits)))
        return row, Cat(*hits).any()

    def elaborate(self, platform):
        m = Module()
        m.submodules.ram = self.ram

        # Writes: kept words into the RAM, NE_CORES into its flip-flop.
        w_row, w_kept = self._row(m, self.w_addr, "w")
        write = self.ram.write_port()
        m.d.comb += [write.addr.eq(w_row), write.data.eq(self.w_data),
                     write.en.eq(self.w_en & w_kept)]
        with m.If(self.w_en & (self.w_addr == dataproc.NE_CORES)):
            m.d.sync += self.ne_core0.eq(self.w_data[0])

        # Reads: one cycle later, 0 for a word that is not kept.
        r_row, r_kept = self._row(m, self.r_addr, "r")
        # (an asynchronous port and a register: Yosys merges them into the block RAM's
        # synchronous port)
        read = self.ram.read_port(domain="comb")
        word = Signal(32, reset_less=True)
        kept = Signal()
        m.d.sync += [kept.eq(r_kept), word.eq(read.data)]
        m.d.comb += [read.addr.eq(r_row), self.r_data.eq(word & kept.replicate(32))]
        return m
