"""The memory writer: buffer reads of a transfer's elements, then bus writes, in order.

Every element is one buffer read and one bus write with ``sel`` covering the element's bytes
(``INT8``: its low byte). A buffer read is requested while fewer than ``depth`` elements are
outstanding (read from the buffer and not yet acknowledged by the bus). The write request is a
register, loaded while it is empty or being taken, so ``stb`` does not depend on the buffer's
answer combinationally and a burst runs at one element a cycle.

After an ``err`` no buffer read is requested and the buffer's answers still due are dropped; the
write request already presented and the writes already taken complete (the bus may carry up to
``depth`` writes after the one that failed).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.dma import DmaFormat

from ..dataproc.ports import BufferReadSignature
from ..lib.pipe import Queue
from ..lib.wishbone import WishboneSignature
from .layouts import BUS_ADDR_BITS, ElementLayout, byte_mask, lane_bits

__all__ = ["MemoryWriter"]


class MemoryWriter(wiring.Component):
    """Bus writes of buffer elements.

    Parameters
    ----------
    mem_width : int
        Width of a bus word.
    depth : int
        Elements outstanding at most.

    Members
    -------
    elements : In(stream.Signature(ElementLayout))
        The elements to write.
    fmt : In(2)
        Their :class:`~npu_spec.dma.DmaFormat` (``INT8`` or ``HALF``); holds while not
        ``idle``.
    buf_read : Out(BufferReadSignature(1))
        Reads of the buffer.
    bus : Out(WishboneSignature(30, mem_width))
        Write requests.
    error : Out(1)
        The bus answered ``err``; no further buffer read (until reset).
    idle : Out(1)
        Nothing read from the buffer and not acknowledged (or dropped).
    """

    def __init__(self, mem_width, depth):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self._mem_width = mem_width
        self._depth = depth
        super().__init__({
            "elements": In(stream.Signature(ElementLayout)),
            "fmt":      In(2),
            "buf_read": Out(BufferReadSignature(1)),
            "bus":      Out(WishboneSignature(BUS_ADDR_BITS, mem_width)),
            "error":    Out(1),
            "idle":     Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        bus, lanes = self.bus, lane_bits(self._mem_width)
        meta_layout = data.StructLayout({"lane": lanes, "adr": BUS_ADDR_BITS})
        m.submodules.meta = meta = Queue(meta_layout, self._depth)

        # Buffer reads: one per element while fewer than depth are outstanding.
        outstanding = Signal(range(self._depth + 1))
        req = self.buf_read.req
        element = self.elements.payload
        issue = (outstanding < self._depth) & ~self.error
        requested = Signal()
        m.d.comb += [
            req.valid.eq(self.elements.valid & issue),
            req.payload.addr.eq(element.chip),
            self.elements.ready.eq(issue & req.ready),
            requested.eq(req.valid & req.ready),
            meta.w.valid.eq(requested),
            meta.w.payload.lane.eq(element.byte[:lanes]),
            meta.w.payload.adr.eq(element.byte[lanes:]),
        ]

        # The write request register, loaded from a buffer answer and its address (after an
        # error the answers are dropped).
        resp = self.buf_read.resp
        load = ~bus.stb | ~bus.stall
        pop = Signal()
        discard = Signal()
        m.d.comb += [
            resp.ready.eq(meta.r.valid & (load | self.error)),
            meta.r.ready.eq(resp.valid & (load | self.error)),
            pop.eq(resp.valid & meta.r.valid & (load | self.error)),
            discard.eq(pop & self.error),
        ]
        value = Signal(16)
        with m.If(self.fmt == DmaFormat.INT8):
            m.d.comb += value.eq(resp.payload.data[0][:8])
        with m.Else():
            m.d.comb += value.eq(resp.payload.data[0])
        lane = meta.r.payload.lane
        # The request's address and data are looked at only with ``stb``: no reset.
        adr = Signal.like(bus.adr, reset_less=True)
        sel = Signal.like(bus.sel, reset_less=True)
        dat_w = Signal.like(bus.dat_w, reset_less=True)
        m.d.comb += [bus.adr.eq(adr), bus.sel.eq(sel), bus.dat_w.eq(dat_w)]
        with m.If(load):
            m.d.sync += [
                bus.stb.eq(pop & ~self.error),
                adr.eq(meta.r.payload.adr),
                sel.eq(byte_mask(m, self.fmt, lane, self._mem_width)),
                dat_w.eq(value << (lane << 3)),
            ]

        # The bus: a cycle while a request is presented or answers are due.
        inflight = Signal(range(self._depth + 1))
        take = bus.stb & ~bus.stall
        answer = bus.cyc & (bus.ack | bus.err)
        m.d.comb += [bus.we.eq(bus.stb), bus.cyc.eq(bus.stb | (inflight != 0))]
        m.d.sync += inflight.eq(inflight + take - answer)
        with m.If(bus.cyc & bus.err):
            m.d.sync += self.error.eq(1)
        m.d.sync += outstanding.eq(outstanding + requested - answer - discard)
        m.d.comb += self.idle.eq(outstanding == 0)
        return m
