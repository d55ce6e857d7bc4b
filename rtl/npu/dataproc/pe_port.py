"""The planar engine's ports on the buffer: operand readers and the result writer.

Both walk a dataset the same way (:class:`DatasetWalk`): the ``C * H`` rows of ``W`` elements
in raster order, ``ceil(W / L)`` beats of ``L`` lanes a row; beat ``k`` of a row covers columns
``k * L .. k * L + L - 1``, of which those below ``W`` are the dataset's.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from npu_spec.dataproc import ADDR_BITS, FLOW_BITS, SHAPE_BITS

from ..planar.layouts import beat_layout
from .ports import BufferReadSignature, DatasetLayout, buffer_write_layout, wrap_address

__all__ = ["DatasetWalk", "PEReader", "PEWriter"]


class DatasetWalk(wiring.Component):
    """The beats of a dataset, one step at a time, without multipliers.

    Parameters
    ----------
    lanes : int
        ``L``, a power of two.
    elements : int
        Elements of the buffer.

    Members
    -------
    dataset : In(DatasetLayout)
        Sampled by ``start``.
    start : In(1)
        Begin at the first beat.
    advance : In(1)
        Step to the next beat.
    addr : Out(ADDR_BITS)
        Element address of the beat's first column.
    lanes_in : Out(range(L + 1))
        Lanes of the beat inside ``W``.
    last : Out(1)
        The beat is the dataset's last.
    empty : Out(1)
        The dataset sampled has no beats (``C``, ``H`` or ``W`` is 0); combinational from
        ``dataset``.
    unit_last : Out(1)
        With flow control (``slots`` M nonzero): the beat is the last of a unit of
        ``planes`` planes (or the dataset's last). Plane ``c`` is then ring plane ``c mod
        (M * planes)``: the walk returns to the base after the ring's last plane.
    """

    def __init__(self, lanes, elements):
        self._lanes = lanes
        self._elements = elements
        super().__init__({
            "dataset":  In(DatasetLayout),
            "start":    In(1),
            "advance":  In(1),
            "addr":     Out(ADDR_BITS),
            "lanes_in": Out(range(lanes + 1)),
            "last":      Out(1),
            "empty":     Out(1),
            "unit_last": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        L = self._lanes
        # The walk's state, all written by ``start`` before it is used: no reset.
        ds = Signal(DatasetLayout, reset_less=True)
        in_unit = Signal(FLOW_BITS, reset_less=True)      # plane within its flow-control unit
        slot = Signal(FLOW_BITS, reset_less=True)         # slot of the plane's unit
        c = Signal(SHAPE_BITS, reset_less=True)
        y = Signal(SHAPE_BITS, reset_less=True)
        col = Signal(SHAPE_BITS + exact_log2(L) + 1, reset_less=True)     # k * L
        row = Signal(ADDR_BITS, reset_less=True)                          # address of (c, y, 0)
        plane = Signal(ADDR_BITS, reset_less=True)                        # address of (c, 0, 0)
        left = Signal(SHAPE_BITS + 1)
        m.d.comb += [
            self.empty.eq((self.dataset.channels == 0) | (self.dataset.height == 0)
                          | (self.dataset.width == 0)),
            self.addr.eq(wrap_address(row + col, self._elements)),
            left.eq(ds.width - col),
            self.lanes_in.eq(Mux(left >= L, L, left)),
        ]
        row_end = col + L >= ds.width
        plane_end = row_end & (y == ds.height - 1)
        m.d.comb += self.last.eq(plane_end & (c == ds.channels - 1))
        unit_end = in_unit + 1 == ds.planes
        m.d.comb += self.unit_last.eq(plane_end & (unit_end | (c == ds.channels - 1)))

        wrap = self._elements
        with m.If(self.start):
            base = wrap_address(self.dataset.addr, wrap)
            m.d.sync += [ds.eq(self.dataset), c.eq(0), y.eq(0), col.eq(0), row.eq(base),
                         plane.eq(base), in_unit.eq(0), slot.eq(0)]
        with m.Elif(self.advance):
            with m.If(~row_end):
                m.d.sync += col.eq(col + L)
            with m.Elif(~plane_end):
                m.d.sync += [col.eq(0), y.eq(y + 1),
                             row.eq(wrap_address(row + ds.rstride, wrap))]
            with m.Else():
                nxt = Signal(ADDR_BITS)
                m.d.comb += nxt.eq(wrap_address(plane + ds.cstride, wrap))
                ring_end = (ds.slots != 0) & unit_end & (slot + 1 == ds.slots)
                with m.If(ring_end):
                    m.d.comb += nxt.eq(wrap_address(ds.addr, wrap))
                m.d.sync += [col.eq(0), y.eq(0), c.eq(c + 1), row.eq(nxt), plane.eq(nxt),
                             in_unit.eq(Mux(unit_end, 0, in_unit + 1))]
                with m.If(unit_end):
                    m.d.sync += slot.eq(Mux(slot + 1 == ds.slots, 0, slot + 1))
        return m


class PEReader(wiring.Component):
    """Streams an operand dataset to the planar engine.

    On ``start`` (the engine's task start) the reader samples its dataset and requests its
    beats from the buffer, one a cycle while the buffer grants them; a dataset with ``C``,
    ``H`` or ``W`` of 0 streams nothing. Lanes beyond ``W`` are 0. ``stop`` (the engine's
    done) ends the stream: requests stop and the runs already asked for are taken from the
    buffer and dropped; a new ``start`` waits until they are gone.

    Parameters
    ----------
    lanes : int
        ``L``, the planar engine's lanes.
    elements : int
        Elements of the buffer.
    depth : int
        Runs in flight (the buffer port's response queue depth).

    With flow control (the dataset's ``slots`` nonzero; ``docs/system.md``, "Flow control")
    the beats come in units of ``planes`` planes: the first request of a unit waits until
    the previous unit's last run has come back (``consume``) and ``may_consume`` says the
    unit is written.

    Members
    -------
    dataset : In(DatasetLayout)
    start, stop : In(1)
        One-cycle pulses.
    buf : Out(BufferReadSignature(lanes))
        The buffer read port.
    out : Out(stream.Signature(beat_layout(lanes)))
        The operand stream.
    may_consume : In(1)
        The next unit may be read (``FlowControl.may_consume``).
    consume : Out(1)
        A unit has been read (``FlowControl.consume``).
    """

    def __init__(self, lanes, elements, *, depth=4):
        self._lanes = lanes
        self._elements = elements
        self._depth = depth
        super().__init__({
            "dataset": In(DatasetLayout),
            "start":   In(1),
            "stop":    In(1),
            "buf":     Out(BufferReadSignature(lanes)),
            "out":     Out(stream.Signature(beat_layout(lanes))),
            "may_consume": In(1),
            "consume":     Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        L = self._lanes
        m.submodules.walk = walk = DatasetWalk(L, self._elements)
        m.submodules.meta = meta = fifo.SyncFIFO(width=len(walk.lanes_in) + 1,
                                                 depth=self._depth)
        running = Signal()
        drop = Signal()           # runs of a stopped stream are still coming back

        # Flow control: a unit's requests start once it is written and the previous one
        # read.
        flow = Signal()
        opened = Signal()
        pending = Signal()        # the last run of a unit is on its way back
        unit_end = Signal()

        # Requests: one per beat while running.
        req = self.buf.req
        issue = Signal()
        m.d.comb += [
            walk.dataset.eq(self.dataset), walk.start.eq(self.start),
            req.valid.eq(running & ~drop & meta.w_rdy & (~flow | opened)),
            req.payload.addr.eq(walk.addr),
            issue.eq(req.valid & req.ready),
            walk.advance.eq(issue),
            meta.w_en.eq(issue),
            meta.w_data.eq(Cat(walk.lanes_in, flow & walk.unit_last)),
        ]
        with m.If(self.start):
            m.d.sync += [flow.eq(self.dataset.slots != 0), opened.eq(0), pending.eq(0)]
        with m.Elif(issue & flow & walk.unit_last):
            m.d.sync += [opened.eq(0), pending.eq(1)]
        with m.Elif(running & ~drop & flow & ~opened & ~pending & self.may_consume):
            m.d.sync += opened.eq(1)
        with m.If(self.consume):
            m.d.sync += pending.eq(0)
        with m.If(self.start):
            m.d.sync += running.eq(~walk.empty)
        with m.Elif(self.stop | (issue & walk.last)):
            m.d.sync += running.eq(0)

        # Responses: to the engine, or dropped after a stop.
        resp = self.buf.resp
        taken = Signal()
        m.d.comb += [
            self.out.valid.eq(resp.valid & ~drop),
            resp.ready.eq(drop | self.out.ready),
            taken.eq(resp.valid & resp.ready),
            meta.r_en.eq(taken),
        ]
        inside = Signal(range(L + 1))
        m.d.comb += [inside.eq(meta.r_data), unit_end.eq(meta.r_data[-1]),
                     self.consume.eq(taken & unit_end)]
        m.d.comb += [self.out.payload.data[j].eq(Mux(j < inside, resp.payload.data[j], 0))
                     for j in range(L)]
        outstanding = Signal(range(2 * self._depth + 1))
        after = Signal.like(outstanding)
        m.d.comb += after.eq(outstanding + issue - taken)
        m.d.sync += outstanding.eq(after)
        with m.If(self.start | self.stop):
            m.d.sync += drop.eq(after != 0)
        with m.Elif(after == 0):
            m.d.sync += drop.eq(0)
        return m


class PEWriter(wiring.Component):
    """Writes the planar engine's result beats into the result dataset ``PE_OUT``.

    On ``start`` the writer samples its dataset; result beat ``k`` of row ``r = c * H + y``
    is written at columns ``k * L ..`` of that row, the lanes below ``W`` only. A beat is taken
    in the cycle the buffer takes its run.

    Members
    -------
    dataset : In(DatasetLayout)
    start : In(1)
    beats : In(stream.Signature(beat_layout(lanes)))
        The engine's result stream.
    buf : Out(stream.Signature(buffer_write_layout(lanes)))
        The buffer write port.
    """

    def __init__(self, lanes, elements):
        self._lanes = lanes
        self._elements = elements
        super().__init__({
            "dataset": In(DatasetLayout),
            "start":   In(1),
            "beats":   In(stream.Signature(beat_layout(lanes))),
            "buf":     Out(stream.Signature(buffer_write_layout(lanes))),
        })

    def elaborate(self, platform):
        m = Module()
        L = self._lanes
        m.submodules.walk = walk = DatasetWalk(L, self._elements)
        w = self.buf.payload
        m.d.comb += [
            walk.dataset.eq(self.dataset), walk.start.eq(self.start),
            self.buf.valid.eq(self.beats.valid),
            self.beats.ready.eq(self.buf.ready),
            walk.advance.eq(self.beats.valid & self.beats.ready),
            w.addr.eq(walk.addr),
            w.data.eq(self.beats.payload.data),
            w.mask.eq(Cat(j < walk.lanes_in for j in range(L))),
        ]
        return m
