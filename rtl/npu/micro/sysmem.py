"""The micro build's system memory on a board: the micro top's fixed-latency port first, a
Wishbone slave (the host bridge) in the cycles the micro top leaves free (``docs/micro.md``,
"The micro top")."""

from amaranth.hdl import Cat, ClockSignal, Instance, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory, MemoryData
from amaranth.lib.wiring import In, Out

from ..bridge.sram import SPRAM_WIDTH, SPRAM_WORDS, has_spram
from ..lib.wishbone import ADDR_BITS, WishboneSignature

__all__ = ["MicroSystemMemory"]


class MicroSystemMemory(wiring.Component):
    """``words`` 32-bit words with byte lanes behind two ports.

    The micro top's port (``addr``, ``re``, ``wdata``, ``we``; ``rdata`` the cycle after
    ``re``) is served in every cycle it asks. A Wishbone request on ``bus`` is taken in a cycle
    in which the micro top neither reads nor writes (``stall`` otherwise) and answered in the
    next (``ack``, with ``dat_r`` on a read); a request at or beyond ``words`` is answered by
    ``err`` and touches nothing.

    On an iCE40 UltraPlus (:func:`npu.bridge.sram.has_spram`) the words are ``SB_SPRAM256KA``
    pairs (16K words a pair; no initial contents); elsewhere an Amaranth memory of
    :attr:`data`, which a testbench may read and set.

    Members
    -------
    addr : In(addr_bits), re : In(1), wdata : In(32), we : In(4), rdata : Out(32)
        The micro top's port.
    bus : In(WishboneSignature(ADDR_BITS, 32))
        The host bridge's port.
    """

    def __init__(self, words, *, init=()):
        if not isinstance(words, int) or not 1 <= words <= 2 * SPRAM_WORDS:
            raise ValueError(f"Words must be an integer in [1, {2 * SPRAM_WORDS}], "
                             f"not {words!r}")
        self._words = words
        self.addr_bits = max(1, (words - 1).bit_length())
        self.data = MemoryData(shape=32, depth=words, init=list(init))
        super().__init__({
            "addr": In(self.addr_bits), "re": In(1), "wdata": In(32), "we": In(4),
            "rdata": Out(32), "bus": In(WishboneSignature(ADDR_BITS, 32)),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        micro = self.re | self.we.any()
        request = bus.cyc & bus.stb
        # Inside the memory; a power-of-two size is a test of the high bits (no carry chain).
        if self._words == 1 << self.addr_bits:
            inside = bus.adr[self.addr_bits:] == 0
        else:
            inside = bus.adr < self._words
        taken = request & ~micro
        m.d.comb += bus.stall.eq(request & micro)
        m.d.sync += [bus.ack.eq(taken & inside), bus.err.eq(taken & ~inside)]

        # The one port of the RAM: the micro top's access, else the bridge's.
        # The write enables are the micro top's ORed with the bridge's, which count only when
        # the micro top does not ask: the bridge's part comes from its own (early) signals, so
        # the micro top's late enables pass two levels of logic to the RAM, not the arbiter's.
        addr = Signal(self.addr_bits)
        we = Signal(4)
        wdata = Signal(32)
        bridge_we = Signal(4)
        m.d.comb += [bridge_we.eq(bus.sel & (request & inside & bus.we).replicate(4)),
                     addr.eq(Mux(micro, self.addr, bus.adr)),
                     we.eq(self.we | (bridge_we & (~micro).replicate(4))),
                     wdata.eq(Mux(micro, self.wdata, bus.dat_w))]
        rdata = Signal(32)
        m.d.comb += [self.rdata.eq(rdata), bus.dat_r.eq(rdata)]
        if has_spram(platform):
            self._spram(m, addr, we, wdata, rdata)
        else:
            m.submodules.memory = memory = Memory(self.data)
            read = memory.read_port()
            write = memory.write_port(granularity=8)
            m.d.comb += [read.addr.eq(addr), rdata.eq(read.data), write.addr.eq(addr),
                         write.data.eq(wdata), write.en.eq(we)]
        return m

    def _spram(self, m, addr, we, wdata, rdata):
        banks = -(-self._words // SPRAM_WORDS)
        bank = addr[14:] if banks > 1 else 0
        read_bank = Signal(range(banks))
        m.d.sync += read_bank.eq(bank)
        for b in range(banks):
            halves = []
            for k in range(2):
                out = Signal(SPRAM_WIDTH, name=f"dout_{b}_{k}")
                lanes = we[2 * k:2 * k + 2]
                m.submodules[f"spram_{b}_{k}"] = Instance(
                    "SB_SPRAM256KA",
                    i_CLOCK=ClockSignal("sync"), i_CHIPSELECT=bank == b,
                    i_WREN=lanes.any(), i_ADDRESS=addr[:14],
                    i_DATAIN=wdata[SPRAM_WIDTH * k:SPRAM_WIDTH * (k + 1)],
                    i_MASKWREN=Cat(lanes[0], lanes[0], lanes[1], lanes[1]),
                    i_STANDBY=0, i_SLEEP=0, i_POWEROFF=1, o_DATAOUT=out)
                halves.append(out)
            with m.If(read_bank == b):
                m.d.comb += rdata.eq(Cat(*halves))
