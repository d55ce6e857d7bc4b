"""On-chip system memory of a board: a Wishbone B4 pipelined slave on a block RAM, or on the
single-port SPRAMs of an iCE40 UltraPlus."""

from amaranth.hdl import Cat, ClockSignal, Instance, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from ..lib.wishbone import ADDR_BITS, WishboneSignature

__all__ = ["SPRAM_COUNT", "SPRAM_WORDS", "WishboneSRAM", "has_spram", "spram_fits"]

#: ``SB_SPRAM256KA`` of the iCE40 UltraPlus: 16K words of 16 bits, four of them on the UP5K.
SPRAM_WORDS = 16384
SPRAM_WIDTH = 16
SPRAM_COUNT = 4


def has_spram(platform):
    """True if ``platform`` is an Amaranth platform for an iCE40 UltraPlus (``device``
    iCE40UP...), the iCE40s with ``SB_SPRAM256KA``."""
    return str(getattr(platform, "device", "")).startswith("iCE40UP")


def spram_fits(words, data_width):
    """True if ``words`` words of ``data_width`` bits fit in the UP5K's four SPRAMs
    (``data_width // 16`` side by side per bank of 16K words)."""
    banks = -(-words // SPRAM_WORDS)
    return banks * (data_width // SPRAM_WIDTH) <= SPRAM_COUNT


class WishboneSRAM(wiring.Component):
    """``words`` words of ``data_width`` bits on the system-memory bus (``docs/system.md``).

    Never stalls; a request taken in cycle ``t`` is answered in cycle ``t + 1`` (``ack``, with
    ``dat_r`` on a read), or ``t + 2`` with ``request_register``, one request a cycle. A write
    changes the bytes whose ``sel`` bit is set. A request with ``adr >= words`` is answered by
    ``err`` and touches nothing.

    Two builds with that same behaviour:

    * block RAM: one synchronous read port and one byte-enabled write port of an Amaranth
      memory (Yosys maps it to block RAM); contents ``init``, zero where not given;
    * SPRAM (iCE40 UltraPlus): ``SB_SPRAM256KA`` instances, ``data_width // 16`` side by side
      per bank of 16K words, as many banks as ``words`` needs, at most the UP5K's four SPRAMs
      (32-bit words: up to 32K words, 128 KiB; 64-bit: 16K words; wider words do not fit).
      A byte's ``sel`` bit enables the two nibbles of ``MASKWREN`` over it. SPRAM has no
      initial contents: the memory holds undefined values until written.

    Parameters
    ----------
    words : int
        Size in words.
    data_width : int
        32, 64, 128 or 256.
    init : iterable of int
        Initial contents (block RAM only).
    spram : bool or None
        ``True``: the SPRAM build (``ValueError`` if ``init`` is given or the size does not
        fit); ``False``: block RAM; ``None`` (the default): SPRAM when elaborated for an
        iCE40 UltraPlus platform and the memory fits without ``init``, else block RAM.
    request_register : bool
        A register between the bus and the memory's address, data and enables: the request
        path from the masters (through the arbiters) ends at a flip-flop instead of at the
        block RAM's address pins, for one more cycle of latency
        (``docs/bridge.md``, "Board tops").

    Members
    -------
    bus : In(WishboneSignature(ADDR_BITS, data_width))
    """

    def __init__(self, words, data_width=32, *, init=(), spram=None, request_register=False):
        if not isinstance(words, int) or isinstance(words, bool) or words < 1:
            raise ValueError(f"Words must be a positive integer, not {words!r}")
        self._words = words
        self._data_width = data_width
        self._init = list(init)
        if spram and self._init:
            raise ValueError("WishboneSRAM(spram=True) cannot have initial contents: "
                             "SB_SPRAM256KA has none")
        if spram and not spram_fits(words, data_width):
            raise ValueError(f"WishboneSRAM(spram=True): {words} words of {data_width} bits "
                             f"need more than the {SPRAM_COUNT} SPRAMs of 16K x 16 bits")
        self._spram = spram
        self._request_register = bool(request_register)
        super().__init__({"bus": In(WishboneSignature(ADDR_BITS, data_width))})

    @property
    def words(self):
        return self._words

    def uses_spram(self, platform):
        """True if elaborating for ``platform`` builds the memory from SPRAM."""
        if self._spram is not None:
            return self._spram
        return (has_spram(platform) and not self._init
                and spram_fits(self._words, self._data_width))

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        m.d.comb += bus.stall.eq(0)
        req = self._request(m)
        taken = req.cyc & req.stb
        inside = req.adr < self._words
        m.d.sync += [bus.ack.eq(taken & inside), bus.err.eq(taken & ~inside)]
        if self.uses_spram(platform):
            self._spram_build(m, req, taken & inside)
        else:
            self._block_ram_build(m, req, taken & inside)
        return m

    def _request(self, m):
        """The request the memory serves: the bus's own, or (``request_register``) the bus's
        of the cycle before."""
        if not self._request_register:
            return self.bus
        bus = self.bus
        req = WishboneSignature(ADDR_BITS, self._data_width).flip().create(path=("req",))
        # Only ``stb`` (a request is there) needs a reset; the rest is read only with it.
        for name in ("cyc", "we", "adr", "sel", "dat_w"):
            field = getattr(req, name)
            held = Signal.like(field, name=f"req_{name}", reset_less=True)
            m.d.sync += held.eq(getattr(bus, name))
            m.d.comb += field.eq(held)
        stb = Signal(name="req_stb")
        m.d.sync += stb.eq(bus.cyc & bus.stb)
        m.d.comb += req.stb.eq(stb)
        return req

    def _block_ram_build(self, m, bus, go):
        lanes = self._data_width // 8
        m.submodules.mem = mem = Memory(shape=self._data_width, depth=self._words,
                                        init=self._init)
        w = mem.write_port(granularity=8)
        r = mem.read_port()
        m.d.comb += [
            w.addr.eq(bus.adr), w.data.eq(bus.dat_w),
            w.en.eq(bus.sel & (go & bus.we).replicate(lanes)),
            r.addr.eq(bus.adr), r.en.eq(bus.cyc & bus.stb & ~bus.we),
            self.bus.dat_r.eq(r.data),
        ]

    def _spram_build(self, m, bus, go):
        per_bank = self._data_width // SPRAM_WIDTH
        banks = -(-self._words // SPRAM_WORDS)
        offset = bus.adr[:14]
        bank = bus.adr[14:]
        # The bank of the last read, for the output multiplexer in the answer cycle.
        read_bank = Signal(range(banks))
        with m.If(go & ~bus.we):
            m.d.sync += read_bank.eq(bank)
        for b in range(banks):
            outs = []
            for k in range(per_bank):
                out = Signal(SPRAM_WIDTH, name=f"dout_{b}_{k}")
                sel = bus.sel[2 * k:2 * k + 2]
                m.submodules[f"spram_{b}_{k}"] = Instance(
                    "SB_SPRAM256KA",
                    i_CLOCK=ClockSignal("sync"),
                    i_CHIPSELECT=go & (bank == b), i_WREN=bus.we,
                    i_ADDRESS=offset,
                    i_DATAIN=bus.dat_w[SPRAM_WIDTH * k:SPRAM_WIDTH * (k + 1)],
                    i_MASKWREN=Cat(sel[0], sel[0], sel[1], sel[1]),
                    i_STANDBY=0, i_SLEEP=0, i_POWEROFF=1,
                    o_DATAOUT=out,
                )
                outs.append(out)
            with m.If(read_bank == b):
                m.d.comb += self.bus.dat_r.eq(Cat(*outs))
