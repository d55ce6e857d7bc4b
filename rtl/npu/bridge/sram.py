"""On-chip system memory of a board: a Wishbone B4 pipelined slave on a block RAM."""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from ..lib.wishbone import ADDR_BITS, WishboneSignature

__all__ = ["WishboneSRAM"]


class WishboneSRAM(wiring.Component):
    """``words`` words of ``data_width`` bits on the system-memory bus (``docs/system.md``).

    Never stalls; a request taken in cycle ``t`` is answered in cycle ``t + 1`` (``ack``, with
    ``dat_r`` on a read), one request a cycle. A write changes the bytes whose ``sel`` bit is
    set. A request with ``adr >= words`` is answered by ``err`` and touches nothing. The memory
    is one synchronous read port and one byte-enabled write port, which Yosys maps to block RAM.

    Parameters
    ----------
    words : int
        Size in words.
    data_width : int
        32, 64, 128 or 256.
    init : iterable of int
        Initial contents.

    Members
    -------
    bus : In(WishboneSignature(ADDR_BITS, data_width))
    """

    def __init__(self, words, data_width=32, *, init=()):
        if not isinstance(words, int) or isinstance(words, bool) or words < 1:
            raise ValueError(f"Words must be a positive integer, not {words!r}")
        self._words = words
        self._data_width = data_width
        self._init = list(init)
        super().__init__({"bus": In(WishboneSignature(ADDR_BITS, data_width))})

    @property
    def words(self):
        return self._words

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        lanes = self._data_width // 8
        m.submodules.mem = mem = Memory(shape=self._data_width, depth=self._words,
                                        init=self._init)
        w = mem.write_port(granularity=8)
        r = mem.read_port()
        taken = bus.cyc & bus.stb
        inside = bus.adr < self._words
        m.d.comb += [
            bus.stall.eq(0),
            w.addr.eq(bus.adr), w.data.eq(bus.dat_w),
            w.en.eq(bus.sel & (taken & inside & bus.we).replicate(lanes)),
            r.addr.eq(bus.adr), r.en.eq(taken & ~bus.we),
            bus.dat_r.eq(r.data),
        ]
        m.d.sync += [bus.ack.eq(taken & inside), bus.err.eq(taken & ~inside)]
        return m
