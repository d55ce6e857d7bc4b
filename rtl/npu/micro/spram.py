"""The micro build's buffer: one single-port RAM of 16-bit elements, an ``SB_SPRAM256KA`` on
an iCE40 UltraPlus, an Amaranth memory elsewhere (the simulator's build)."""

from amaranth.hdl import ClockSignal, Instance, Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory, MemoryData
from amaranth.lib.wiring import In, Out

from ..bridge.sram import SPRAM_WIDTH, SPRAM_WORDS, has_spram

__all__ = ["ElementRAM"]


class ElementRAM(wiring.Component):
    """``depth`` elements of 16 bits behind one port: ``rdata`` is the element at the
    ``addr`` of the previous cycle (after a write there: unspecified); ``we`` writes
    ``wdata`` to ``addr``.

    On a platform with SPRAM (:func:`npu.bridge.sram.has_spram`) the RAM is one
    ``SB_SPRAM256KA`` (``depth`` at most 16K), which has no initial contents; elsewhere it is
    an Amaranth ``Memory`` of :attr:`data` (a ``MemoryData``, initially zero), which a
    testbench may read (``ctx.get(ram.data[k])``).

    Members
    -------
    addr : In(14)
    wdata : In(16)
    we : In(1)
    rdata : Out(16)
    """

    addr: In(14)
    wdata: In(SPRAM_WIDTH)
    we: In(1)
    rdata: Out(SPRAM_WIDTH)

    def __init__(self, depth):
        if not isinstance(depth, int) or not 1 <= depth <= SPRAM_WORDS:
            raise ValueError(f"Depth must be an integer in [1, {SPRAM_WORDS}], not {depth!r}")
        super().__init__()
        self.data = MemoryData(shape=SPRAM_WIDTH, depth=depth, init=[])

    def elaborate(self, platform):
        m = Module()
        if has_spram(platform):
            m.submodules.spram = Instance(
                "SB_SPRAM256KA",
                i_CLOCK=ClockSignal("sync"), i_CHIPSELECT=1, i_WREN=self.we,
                i_ADDRESS=self.addr, i_DATAIN=self.wdata, i_MASKWREN=0b1111,
                i_STANDBY=0, i_SLEEP=0, i_POWEROFF=1, o_DATAOUT=self.rdata)
            return m
        m.submodules.memory = memory = Memory(self.data)
        read = memory.read_port()
        write = memory.write_port()
        m.d.comb += [read.addr.eq(self.addr), self.rdata.eq(read.data),
                     write.addr.eq(self.addr), write.data.eq(self.wdata), write.en.eq(self.we)]
        return m
