"""The memory reader: bus reads of a transfer's elements, in order, to the on-chip side.

Every element is one read request. A request is presented as soon as the address generator
offers the element and fewer than ``depth`` elements are outstanding (requested and not yet
delivered): the answers cannot be stalled, so each outstanding element has a place in the
answer queue. With no stall and a round trip shorter than ``depth`` cycles, one element a cycle.

The bus answer is registered, then the element is taken from its byte lanes (``INT8``
sign-extended, ``HALF`` and ``WORD`` little-endian) and queued for the on-chip side. After an
``err`` no request is presented; the answers still due are dropped and the elements before the
error are delivered.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.dma import DmaFormat

from ..lib.pipe import Queue
from ..lib.wishbone import WishboneSignature
from .layouts import BUS_ADDR_BITS, CHIP_BITS, ElementLayout, byte_mask, lane_bits

__all__ = ["MemoryReader", "ReadLayout"]

#: An element read: its on-chip address and its value (``INT8`` sign-extended to 32 bits).
ReadLayout = data.StructLayout({"chip": CHIP_BITS, "data": 32})


class MemoryReader(wiring.Component):
    """Bus reads of elements.

    Parameters
    ----------
    mem_width : int
        Width of a bus word.
    depth : int
        Elements outstanding at most.

    Members
    -------
    elements : In(stream.Signature(ElementLayout))
        The elements to read.
    fmt : In(2)
        Their :class:`~npu_spec.dma.DmaFormat`; holds while not ``idle``.
    bus : Out(WishboneSignature(30, mem_width))
        Read requests.
    out : Out(stream.Signature(ReadLayout))
        The elements read, in order.
    error : Out(1)
        The bus answered ``err``; no further request (until reset).
    idle : Out(1)
        Nothing requested and not delivered (or dropped).
    """

    def __init__(self, mem_width, depth):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self._mem_width = mem_width
        self._depth = depth
        super().__init__({
            "elements": In(stream.Signature(ElementLayout)),
            "fmt":      In(2),
            "bus":      Out(WishboneSignature(BUS_ADDR_BITS, mem_width)),
            "out":      Out(stream.Signature(ReadLayout)),
            "error":    Out(1),
            "idle":     Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        bus, lanes = self.bus, lane_bits(self._mem_width)
        meta_layout = data.StructLayout({"lane": lanes, "chip": CHIP_BITS})
        m.submodules.meta = meta = Queue(meta_layout, self._depth)
        m.submodules.answers = answers = Queue(ReadLayout, self._depth)

        # Requests: one per element while fewer than depth are outstanding.
        outstanding = Signal(range(self._depth + 1))
        inflight = Signal(range(self._depth + 1))
        element = self.elements.payload
        lane = element.byte[:lanes]
        issue = (outstanding < self._depth) & ~self.error
        take = Signal()
        m.d.comb += [
            bus.stb.eq(self.elements.valid & issue),
            bus.cyc.eq(bus.stb | (inflight != 0)),
            bus.adr.eq(element.byte[lanes:]),
            bus.sel.eq(byte_mask(m, self.fmt, lane, self._mem_width)),
            self.elements.ready.eq(issue & ~bus.stall),
            take.eq(bus.stb & ~bus.stall),
            meta.w.valid.eq(take),
            meta.w.payload.lane.eq(lane),
            meta.w.payload.chip.eq(element.chip),
        ]
        answer = bus.cyc & (bus.ack | bus.err)
        m.d.sync += inflight.eq(inflight + take - answer)

        # Answers, registered; the element from its lanes.
        ack, err = Signal(), Signal()
        dat = Signal(self._mem_width)
        m.d.sync += [ack.eq(bus.cyc & bus.ack), err.eq(bus.cyc & bus.err), dat.eq(bus.dat_r)]
        word = Signal(32)
        m.d.comb += word.eq(dat >> (meta.r.payload.lane << 3))
        value = Signal(32)
        with m.Switch(self.fmt):
            with m.Case(DmaFormat.INT8):
                m.d.comb += value.eq(word[:8].as_signed())
            with m.Case(DmaFormat.HALF):
                m.d.comb += value.eq(word[:16])
            with m.Default():
                m.d.comb += value.eq(word)
        keep = ack & ~self.error
        discard = Signal()
        m.d.comb += [
            meta.r.ready.eq(ack | err),
            answers.w.valid.eq(keep),
            answers.w.payload.chip.eq(meta.r.payload.chip),
            answers.w.payload.data.eq(value),
            discard.eq((ack | err) & ~keep),
        ]
        with m.If(err):
            m.d.sync += self.error.eq(1)

        # Delivery, and the count of outstanding elements.
        wiring.connect(m, answers.r, wiring.flipped(self.out))
        delivered = self.out.valid & self.out.ready
        m.d.sync += outstanding.eq(outstanding + take - delivered - discard)
        m.d.comb += self.idle.eq(outstanding == 0)
        return m
