"""The frame engine of the host bridge: bytes in, bytes out, system memory and host registers.

:class:`BridgeCore` parses the frames of ``npu_spec.bridge`` from a byte stream, accesses one
32-bit word at a time, and answers reads on a byte stream; :class:`npu.bridge.UARTBridge` puts
it behind a UART.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from npu_spec.bridge import (
    BRIDGE,
    BRIDGE_REGS_BASE,
    BRIDGE_REGS_WORDS,
    NPU_REGS_BASE,
    NPU_REGS_WORDS,
    Command,
    Region,
)

from ..lib.csr import CSRSignature, RegisterFile
from ..lib.wishbone import ADDR_BITS, WishboneSignature

__all__ = ["BridgeCore"]

#: ``region`` of a frame whose words are not all inside one region.
_NONE = 3


def _below(value, bound):
    """``value < bound`` for a constant ``bound``; a bound that is a power of two is a test of
    the high bits for zero (no carry chain)."""
    if bound & (bound - 1) == 0:
        return value[exact_log2(bound):] == 0
    return value < bound


class BridgeCore(wiring.Component):
    """Frames of ``npu_spec.bridge`` on byte streams; a Wishbone master into system memory and
    an initiator on the NPU's host register bus.

    Behaviour (``docs/bridge.md``):

    * A byte that is no :class:`~npu_spec.bridge.Command` where a frame starts sets
      ``STATUS.command`` and makes the bridge drop every byte until ``rx`` has been idle for
      ``timeout`` cycles (the rest of a corrupted frame is never taken for a frame).
    * A frame that waits ``timeout`` cycles for its next byte is dropped (``STATUS.timeout``);
      so is a frame during which ``rx_error`` or ``rx_overrun`` pulses (``STATUS.framing``,
      ``STATUS.overrun``), which then also drops bytes until the line is idle.
    * Before the first access the whole frame's address range is checked: words outside one
      region access nothing (``STATUS.range``; write data are dropped, reads answer 0).
    * One word is accessed at a time: a write when its four bytes have arrived, a read before
      its four bytes are sent. A memory word is one bus request of ``sel`` covering its four
      bytes; ``err`` sets ``STATUS.bus`` (a read answers 0).

    Parameters
    ----------
    mem_bytes : int
        Size of the system memory mapped from word 0, in bytes (a multiple of 4).
    mem_width : int
        System-memory bus width: 32, 64, 128 or 256.
    timeout : int
        Idle timeout in clock cycles.
    host_addr_bits : int
        Width of the NPU's host bus address (at most 16).

    Members
    -------
    rx : In(stream.Signature(8))
        Bytes from the host.
    tx : Out(stream.Signature(8))
        Bytes to the host.
    rx_error : In(1)
        Pulse: a byte was received with a framing error.
    rx_overrun : In(1)
        Pulse: a received byte was lost.
    rx_active : In(1)
        A byte is being received: the line is not idle.
    mem : Out(WishboneSignature(ADDR_BITS, mem_width))
        System memory.
    csr : Out(CSRSignature(host_addr_bits))
        The NPU's host register bus.
    busy : Out(1)
        A frame is in progress.
    error : Out(1)
        A ``STATUS`` flag is set.
    """

    def __init__(self, *, mem_bytes, mem_width=32, timeout=100_000, host_addr_bits=16):
        self.check(mem_bytes=mem_bytes, mem_width=mem_width, timeout=timeout,
                   host_addr_bits=host_addr_bits)
        self._mem_bytes = mem_bytes
        self._mem_width = mem_width
        self._timeout = timeout
        super().__init__({
            "rx":         In(stream.Signature(8)),
            "tx":         Out(stream.Signature(8)),
            "rx_error":   In(1),
            "rx_overrun": In(1),
            "rx_active":  In(1),
            "mem":        Out(WishboneSignature(ADDR_BITS, mem_width)),
            "csr":        Out(CSRSignature(host_addr_bits)),
            "busy":       Out(1),
            "error":      Out(1),
        })

    @staticmethod
    def check(*, mem_bytes, mem_width, timeout, host_addr_bits):
        """:class:`ValueError` naming the first bad parameter."""
        if not isinstance(mem_bytes, int) or mem_bytes < 4 or mem_bytes % 4:
            raise ValueError(f"mem_bytes must be a positive multiple of 4, not {mem_bytes!r}")
        if mem_bytes // 4 > NPU_REGS_BASE:
            raise ValueError(f"mem_bytes of {mem_bytes} overlaps the register windows")
        if not isinstance(timeout, int) or timeout < 1:
            raise ValueError(f"timeout must be a positive number of cycles, not {timeout!r}")
        if not 1 <= host_addr_bits <= exact_log2(NPU_REGS_WORDS):
            raise ValueError(f"host_addr_bits must be 1 to {exact_log2(NPU_REGS_WORDS)}, "
                             f"not {host_addr_bits!r}")
        WishboneSignature(ADDR_BITS, mem_width)         # checks the width

    @property
    def mem_bytes(self):
        return self._mem_bytes

    @property
    def timeout(self):
        return self._timeout

    def elaborate(self, platform):
        m = Module()
        m.submodules.regs = regs = RegisterFile(BRIDGE)
        status = regs.port("STATUS")
        frames = Signal(16)
        m.d.comb += [
            regs.port("FRAMES").count.eq(frames),
            self.error.eq(Cat(status.framing, status.overrun, status.timeout, status.command,
                              status.range, status.bus).any()),
            status.overrun_set.eq(self.rx_overrun),
        ]

        # The frame.
        cmd = Signal(3)
        addr = Signal(32)
        left = Signal(8)            # words still to access (the frame's length until NEXT)
        count = Signal(2)           # byte of the header address or of a data word
        word = Signal(32)           # write data being assembled, or read data being sent
        region = Signal(2)          # 0 memory, 1 NPU registers, 2 bridge registers, 3 none
        is_read = (cmd == Command.READ) | (cmd == Command.READ_FIXED)
        fixed = (cmd == Command.WRITE_FIXED) | (cmd == Command.READ_FIXED)
        byte = self.rx.payload
        got = self.rx.valid & self.rx.ready

        # Idle timer: cycles spent waiting for the next byte of a frame (or of a corrupted
        # stream being dropped) while the line is idle; any byte restarts it.
        idle = Signal(range(self._timeout + 1))
        waiting = Signal()
        expired = idle == self._timeout
        with m.If(got | ~waiting | self.rx_active):
            m.d.sync += idle.eq(0)
        with m.Elif(~expired):
            m.d.sync += idle.eq(idle + 1)

        # A framing error or a lost byte spoils the frame in progress (and the bytes queued
        # behind it): noted now, acted on where the frame takes its next byte.
        spoilt = Signal()
        with m.If(self.rx_error | self.rx_overrun):
            m.d.sync += spoilt.eq(1)
        m.d.comb += status.framing_set.eq(self.rx_error)

        frame_region = self._region_check(m, left, addr, fixed)
        access = self._access(m, status, is_read, addr, word, region, regs)

        def receive(then):
            """Take the next byte of the frame (``then`` runs with it), or drop the frame."""
            m.d.comb += [self.rx.ready.eq(~spoilt), waiting.eq(1)]
            with m.If(spoilt):
                m.d.sync += spoilt.eq(0)
                m.next = "DROP"
            with m.Elif(got):
                then()
            with m.Elif(expired):
                m.d.comb += status.timeout_set.eq(1)
                m.next = "COMMAND"

        with m.FSM() as fsm:
            with m.State("COMMAND"):
                m.d.comb += self.rx.ready.eq(~spoilt)
                with m.If(spoilt):
                    m.d.sync += spoilt.eq(0)
                    m.next = "DROP"
                with m.Elif(got):
                    m.d.sync += [cmd.eq(byte[:3]), count.eq(0)]
                    with m.If(byte.matches(*Command)):
                        m.next = "LENGTH"
                    with m.Else():
                        m.d.comb += status.command_set.eq(1)
                        m.next = "DROP"
            with m.State("LENGTH"):
                def got_length():
                    m.d.sync += left.eq(byte)
                    m.next = "ADDRESS"
                receive(got_length)
            with m.State("ADDRESS"):
                def got_address():
                    m.d.sync += [addr.eq(Cat(byte, addr[:24])), count.eq(count + 1)]
                    with m.If(count == 3):
                        m.next = "RANGE"
                receive(got_address)
            with m.State("RANGE"):
                # The last address is registered here (a long carry chain), the region
                # decoded from it in CHECK.
                m.next = "CHECK"
            with m.State("CHECK"):
                # The whole frame's region, held while ``addr`` advances.
                m.d.sync += [count.eq(0), region.eq(frame_region)]
                with m.If(left == 0):
                    m.d.sync += frames.eq(frames + 1)
                    m.next = "COMMAND"
                with m.Else():
                    with m.If(frame_region == _NONE):
                        m.d.comb += status.range_set.eq(1)
                    with m.If(~is_read):
                        m.next = "DATA"
                    with m.Elif(frame_region == _NONE):
                        m.next = "SEND"
                    with m.Else():
                        m.next = "ACCESS"
            with m.State("DATA"):
                def got_data():
                    m.d.sync += [word.eq(Cat(byte, word[:24])), count.eq(count + 1)]
                    with m.If(count == 3):
                        m.next = "NEXT"
                        with m.If(region != _NONE):
                            m.next = "ACCESS"
                receive(got_data)
            with m.State("ACCESS"):
                m.d.comb += access.start.eq(1)
                with m.If(access.done):
                    with m.If(is_read):
                        m.d.sync += [word.eq(access.data), count.eq(0)]
                        m.next = "SEND"
                    with m.Else():
                        m.next = "NEXT"
            with m.State("SEND"):
                # A read outside every region answers zeros.
                m.d.comb += [self.tx.valid.eq(1),
                             self.tx.payload.eq(Mux(region == _NONE, 0, word[24:]))]
                with m.If(self.tx.ready):
                    # The same shift as in DATA (what comes in is not sent).
                    m.d.sync += [word.eq(Cat(byte, word[:24])), count.eq(count + 1)]
                    with m.If(count == 3):
                        m.next = "NEXT"
            with m.State("NEXT"):
                # Only the low address bits count: a frame that accesses anything lies in
                # one region, which no carry out of them leaves (``_region_check``).
                low = self._addr_low_bits
                m.d.sync += [left.eq(left - 1), addr[:low].eq(addr[:low] + ~fixed),
                             count.eq(0)]
                with m.If(left == 1):
                    m.d.sync += frames.eq(frames + 1)
                    m.next = "COMMAND"
                with m.Elif(~is_read):
                    m.next = "DATA"
                with m.Elif(region == _NONE):
                    m.next = "SEND"
                with m.Else():
                    m.next = "ACCESS"
            with m.State("DROP"):
                # Drop everything until the line has been idle for the timeout.
                m.d.comb += [self.rx.ready.eq(1), waiting.eq(1)]
                m.d.sync += spoilt.eq(0)
                with m.If(expired):
                    m.next = "COMMAND"
        m.d.comb += self.busy.eq(~fsm.ongoing("COMMAND") & ~fsm.ongoing("DROP"))
        return m

    @property
    def _addr_low_bits(self):
        # Address bits that advance within a frame: enough for the memory and for the NPU's
        # register window (the widest window).
        return max(exact_log2(NPU_REGS_WORDS), (self._mem_bytes // 4 - 1).bit_length())

    def _region_check(self, m, left, addr, fixed):
        """The region of the frame's whole range (``_NONE``: not inside one region), from the
        frame's first address and the low bits of its last one (registered: valid a cycle
        after the header's last byte). The range lies in one region when the first address
        does, and the last one differs from it only in the region's offset bits: no carry out
        of them."""
        low = self._addr_low_bits
        region = Signal(2)
        last = Signal(low + 1)          # the last address's low bits and their carry
        m.d.sync += last.eq(addr[:low] + Mux(fixed, 0, (left - 1)[:8]))
        mem_words = self._mem_bytes // 4

        def window_hit(base, words):
            shift = exact_log2(words)
            stay = (base >> shift) & ((1 << (low - shift)) - 1)
            return (addr[shift:] == base >> shift) & (last[shift:] == stay)

        with m.If((addr[low:] == 0) & _below(last, mem_words)):
            m.d.comb += region.eq(Region.MEMORY)
        with m.Elif(window_hit(NPU_REGS_BASE, NPU_REGS_WORDS)):
            m.d.comb += region.eq(Region.NPU)
        with m.Elif(window_hit(BRIDGE_REGS_BASE, BRIDGE_REGS_WORDS)):
            m.d.comb += region.eq(Region.BRIDGE)
        with m.Else():
            m.d.comb += region.eq(_NONE)
        return region

    def _access(self, m, status, is_read, addr, word, region, regs):
        """One 32-bit access at word ``addr`` of ``region``: ``start`` is held until ``done``
        (one cycle, with the word read on ``data``)."""
        start = Signal()
        done = Signal()
        data = Signal(32)
        lanes = self._mem_width // 32
        lane_bits = exact_log2(lanes)
        lane = addr[:lane_bits]
        bus, csr = self.mem, self.csr
        m.d.comb += [
            bus.adr.eq(addr[lane_bits:]),
            bus.sel.eq(Const(0xF, 4) << (lane * 4) if lanes > 1 else 0xF),
            bus.dat_w.eq(word.replicate(lanes)),
            bus.we.eq(~is_read),
            csr.addr.eq(addr), csr.w_data.eq(word),
            regs.bus.addr.eq(addr), regs.bus.w_data.eq(word),
        ]
        with m.FSM(name="access"):
            with m.State("IDLE"):
                with m.If(start & (region == Region.MEMORY)):
                    m.d.comb += [bus.cyc.eq(1), bus.stb.eq(1)]
                    with m.If(~bus.stall):
                        m.next = "ANSWER"
                with m.Elif(start):
                    for target, which in ((csr, Region.NPU), (regs.bus, Region.BRIDGE)):
                        mine = region == which
                        m.d.comb += [target.r_en.eq(mine & is_read),
                                     target.w_en.eq(mine & ~is_read)]
                    with m.If(is_read):
                        m.next = "REGISTER"
                    with m.Else():
                        m.d.comb += done.eq(1)
            with m.State("ANSWER"):
                m.d.comb += bus.cyc.eq(1)
                with m.If(bus.ack | bus.err):
                    m.d.comb += [done.eq(1), status.bus_set.eq(bus.err)]
                    with m.If(bus.ack):
                        m.d.comb += data.eq(bus.dat_r.word_select(lane, 32) if lanes > 1
                                            else bus.dat_r)
                    m.next = "IDLE"
            with m.State("REGISTER"):
                # Read data come the cycle after ``r_en``; each target answers 0 unless read.
                m.d.comb += [done.eq(1), data.eq(csr.r_data | regs.bus.r_data)]
                m.next = "IDLE"
        return _Access(start, done, data)


class _Access:
    def __init__(self, start, done, data):
        self.start, self.done, self.data = start, done, data
