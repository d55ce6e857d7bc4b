"""A neural engine core's ports on the buffer: its input rows and its output row writes."""

from amaranth.hdl import Const, Module, Mux, Signal, signed
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.dataproc import ADDR_BITS, FLOW_BITS, SHAPE_BITS

from ..neural.layouts import row_data_layout, row_request_layout, row_write_layout
from .ports import BufferReadSignature, DatasetLayout, buffer_write_layout, wrap_address

__all__ = ["NEInPort", "NEOutPort"]

#: Width of the signed sums of dataset addresses before they wrap.
SUM_BITS = ADDR_BITS + 16


class NEInPort(wiring.Component):
    """Answers a core's row requests from its input dataset ``NE{i}_IN``.

    A request ``(c, y, x, tag)`` is registered, and in the next cycle registered with its
    buffer address ``BASE + c * CSTRIDE + y * RSTRIDE + x`` and which of its ``row_values``
    columns lie inside the image (``y`` in ``[0, H)``, column in ``[0, W)``) (two stages, so the
    address products start at flip-flops), then read as ``row_values / lanes`` runs of the
    buffer read port's ``lanes`` (one a cycle), which the port gathers into the answer; the
    answer's elements outside the image are 0. Answers keep request order and carry the tag.
    With ``lanes == row_values`` the port can take a request every cycle and answers ``2 +
    READ_LATENCY`` (4) cycles after one is taken when the buffer grants its read at once; with
    ``parts = row_values / lanes`` runs it takes a request every ``parts`` cycles and answers
    ``parts - 1`` cycles later.

    Parameters
    ----------
    row_values : int
        Elements of a row answer.
    tag : Layout
        The core's row tag layout.
    elements : int
        Elements of the buffer.
    lanes : int or None
        Lanes of the buffer read port (divides ``row_values``; default ``row_values``).
    depth : int
        Runs in flight (the buffer port's response queue depth).

    Members
    -------
    dataset : In(DatasetLayout)
        The input dataset; it must not change while the core runs.
    row_req : In(stream.Signature(row_request_layout(tag)))
    row_data : Out(stream.Signature(row_data_layout(row_values, tag)))
        The core's input ports.
    buf : Out(BufferReadSignature(lanes))
        The buffer read port.
    """

    def __init__(self, row_values, tag, elements, *, lanes=None, depth=4):
        lanes = row_values if lanes is None else lanes
        if not isinstance(lanes, int) or lanes < 1 or row_values % lanes:
            raise ValueError(f"lanes must divide the row width {row_values}, not {lanes!r}")
        self._row_values = row_values
        self._lanes = lanes
        self._tag = tag
        self._elements = elements
        self._depth = depth
        super().__init__({
            "dataset":  In(DatasetLayout),
            "row_req":  In(stream.Signature(row_request_layout(tag))),
            "row_data": Out(stream.Signature(row_data_layout(row_values, tag))),
            "buf":      Out(BufferReadSignature(lanes)),
        })

    def _inside(self, m, req):
        """Which of request ``req``'s columns lie inside the image (combinational): the
        columns ``k`` with ``-x <= k < W - x``, as two thermometer masks of the clamped bounds
        (no comparator per column)."""
        rv = self._row_values
        ds = self.dataset
        ones = Const((1 << rv) - 1, rv)

        def clamp(value, name):
            bound = Signal(range(rv + 1), name=name)
            m.d.comb += bound.eq(Mux(value < 0, 0, Mux(value > rv, rv, value)))
            return bound

        lo = clamp(-req.x, "inside_lo")
        hi = clamp(ds.width - req.x, "inside_hi")
        row_inside = (req.y >= 0) & (req.y < ds.height)
        return Mux(row_inside, (ones << lo)[:rv] & ~(ones << hi)[:rv], 0)

    def elaborate(self, platform):
        m = Module()
        rv, lanes = self._row_values, self._lanes
        parts = rv // lanes
        ds = self.dataset
        req = self.row_req.payload
        meta_layout = data.StructLayout({"tag": self._tag, "inside": rv})

        # Stage 0: the request taken. Stage 1: its address and inside mask, computed from
        # stage 0's registers (the multipliers start at flip-flops); its runs are issued from
        # there, the last one with the request's tag and mask into `meta`.
        # (The stages' contents are looked at only while they are valid: no reset.)
        r0_valid = Signal()
        r0 = Signal.like(req, reset_less=True)
        s1_valid = Signal()
        s1_addr = Signal(ADDR_BITS, reset_less=True)
        s1_meta = Signal(meta_layout, reset_less=True)
        part = Signal(range(parts))
        last = Signal()
        m.submodules.meta = meta = fifo.SyncFIFO(width=meta_layout.size, depth=self._depth)
        issue = Signal()
        m.d.comb += [
            last.eq(part == parts - 1),
            self.buf.req.valid.eq(s1_valid & (meta.w_rdy | ~last)),
            self.buf.req.payload.addr.eq(wrap_address(s1_addr + part * lanes, self._elements)),
            issue.eq(self.buf.req.valid & self.buf.req.ready),
            meta.w_en.eq(issue & last),
            meta.w_data.eq(s1_meta),
        ]
        move = Signal()
        m.d.comb += [move.eq(r0_valid & (~s1_valid | (issue & last))),
                     self.row_req.ready.eq(~r0_valid | move)]
        with m.If(self.row_req.valid & self.row_req.ready):
            m.d.sync += [r0_valid.eq(1), r0.eq(req)]
        with m.Elif(move):
            m.d.sync += r0_valid.eq(0)
        addr = Signal(signed(SUM_BITS))
        m.d.comb += addr.eq(ds.addr + r0.c * ds.cstride + r0.y * ds.rstride + r0.x)
        with m.If(move):
            m.d.sync += [s1_valid.eq(1), s1_addr.eq(wrap_address(addr, self._elements)),
                         s1_meta.tag.eq(r0.tag), s1_meta.inside.eq(self._inside(m, r0))]
        with m.Elif(issue & last):
            m.d.sync += s1_valid.eq(0)
        with m.If(issue):
            m.d.sync += part.eq(Mux(last, 0, part + 1))

        # The answer: the runs gathered, the elements outside the image zeroed, and the tag.
        got = data.View(meta_layout, meta.r_data)
        resp = self.buf.resp
        r_part = Signal(range(parts))
        r_last = Signal()
        gathered = [Signal(16, name=f"gathered{k}", reset_less=True) for k in range(rv - lanes)]
        values = gathered + [resp.payload.data[j] for j in range(lanes)]
        m.d.comb += [
            r_last.eq(r_part == parts - 1),
            self.row_data.valid.eq(resp.valid & r_last),
            resp.ready.eq(~r_last | self.row_data.ready),
            meta.r_en.eq(self.row_data.valid & self.row_data.ready),
            self.row_data.payload.tag.eq(got.tag),
        ]
        m.d.comb += [self.row_data.payload.values[k].eq(values[k] & got.inside[k].replicate(16))
                     for k in range(rv)]
        with m.If(resp.valid & resp.ready):
            m.d.sync += r_part.eq(Mux(r_last, 0, r_part + 1))
            for p in range(parts - 1):
                with m.If(r_part == p):
                    m.d.sync += [gathered[p * lanes + j].eq(resp.payload.data[j])
                                 for j in range(lanes)]
        return m


class NEOutPort(wiring.Component):
    """Writes a core's output rows into its output dataset ``NE{i}_OUT``.

    A row write ``(oc, y, x, values, mask)`` is registered with its plane, and in the next
    cycle with its buffer address ``BASE + oc * CSTRIDE + y * RSTRIDE + x`` (two stages, so the
    address products start at flip-flops); value ``j`` goes to that address plus ``j`` when mask
    bit ``j`` is set. A row of ``macs`` values is written as ``macs / lanes`` runs of the buffer
    write port's ``lanes`` (runs without a mask bit are skipped), the first one at the earliest
    two cycles after the row is taken; with ``lanes == macs`` the port takes a row every cycle
    the buffer takes its run.

    Parameters
    ----------
    macs : int
        Values of a row write.
    lanes : int
        Lanes of the buffer write port (divides ``macs``).
    elements : int
        Elements of the buffer.

    With flow control (the dataset's ``slots`` M nonzero, ``docs/system.md``, "Flow
    control") the output channels come in units of ``planes`` P (the core writes them in
    order, a multiple of its output-channel group at a time): unit ``u`` goes into ring planes
    ``(u mod M) * P ..``, that is channel ``oc`` to plane ``oc mod (M * P)``. The first write
    of a unit waits for ``may_produce``; a unit is complete (``produce``) when a write of a
    later unit arrives, or at ``finish``, once its last write is in the buffer.

    Members
    -------
    dataset : In(DatasetLayout)
        The output dataset; it must not change while the core runs.
    out : In(stream.Signature(row_write_layout(macs)))
        The core's row writes.
    buf : Out(stream.Signature(buffer_write_layout(lanes)))
        The buffer write port.
    flow_start : In(1)
        The core starts a task with flow control: the first unit is next, in slot 0.
    finish : In(1)
        The core's task has ended (level): the open unit is complete once written.
    may_produce : In(1)
        The next unit's slot is free (``FlowControl.may_produce``).
    produce : Out(1)
        A unit is complete (``FlowControl.produce``).
    """

    def __init__(self, macs, lanes, elements):
        if not isinstance(lanes, int) or lanes < 1 or macs % lanes:
            raise ValueError(f"lanes must divide the MAC count {macs}, not {lanes!r}")
        self._macs = macs
        self._lanes = lanes
        self._elements = elements
        super().__init__({
            "dataset":     In(DatasetLayout),
            "out":         In(stream.Signature(row_write_layout(macs))),
            "buf":         Out(stream.Signature(buffer_write_layout(lanes))),
            "flow_start":  In(1),
            "finish":      In(1),
            "may_produce": In(1),
            "produce":     Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        n, lanes = self._macs, self._lanes
        parts = n // lanes
        ds = self.dataset
        row = self.out.payload

        # Stage A: the row write taken, with its plane. Stage B (held): its address, computed
        # from stage A's registers (the multipliers start at flip-flops), and the run being
        # written. A row moves on while the last run of the one before is written.
        # (The stages' contents are looked at only while they are valid: no reset.)
        a_valid = Signal()
        a_y = Signal.like(row.y, reset_less=True)
        a_x = Signal.like(row.x, reset_less=True)
        a_values = Signal(data.ArrayLayout(16, n), reset_less=True)
        a_mask = Signal(n, reset_less=True)
        held = Signal()
        h_addr = Signal(ADDR_BITS, reset_less=True)
        h_values = Signal(data.ArrayLayout(16, n), reset_less=True)
        h_mask = Signal(n, reset_less=True)
        part = Signal(range(max(2, parts)))
        part_mask = Signal(lanes)
        m.d.comb += part_mask.eq(h_mask.word_select(part, lanes))
        w = self.buf.payload
        m.d.comb += [
            self.buf.valid.eq(held & part_mask.any()),
            w.addr.eq(wrap_address(h_addr + part * lanes, self._elements)),
            w.data.eq(h_values.as_value().word_select(part, 16 * lanes)),
            w.mask.eq(part_mask),
        ]
        done_part = (self.buf.valid & self.buf.ready) | (held & ~part_mask.any())
        last_part = done_part & (part == parts - 1)
        move = a_valid & (~held | last_part)
        take = self._flow(m, held | a_valid)
        a_plane = Signal.like(self._plane, reset_less=True)
        m.d.comb += self.out.ready.eq((~a_valid | move) & take)
        with m.If(done_part):
            m.d.sync += part.eq(part + 1)
        with m.If(last_part):
            m.d.sync += [held.eq(0), part.eq(0)]
        addr = Signal(SUM_BITS)
        m.d.comb += addr.eq(ds.addr + a_plane * ds.cstride + a_y * ds.rstride + a_x)
        with m.If(move):
            m.d.sync += [held.eq(1), h_addr.eq(wrap_address(addr, self._elements)),
                         h_values.eq(a_values), h_mask.eq(a_mask)]
        with m.If(self.out.valid & self.out.ready):
            m.d.sync += [a_valid.eq(1), a_plane.eq(self._plane), a_y.eq(row.y), a_x.eq(row.x),
                         a_values.eq(row.values), a_mask.eq(row.mask)]
        with m.Elif(move):
            m.d.sync += a_valid.eq(0)
        return m

    def _flow(self, m, held):
        """The flow-control units of the row writes; returns whether the write offered may be
        taken, and sets ``self._plane``, the plane the write goes to."""
        ds = self.dataset
        oc = self.out.payload.oc
        flow = Signal()
        active = Signal()            # a task with flow control runs: units to close
        opened = Signal()            # the current unit's slot was granted
        first = Signal(SHAPE_BITS)   # first channel of the current unit
        slot = Signal(FLOW_BITS)
        ring = Signal(2 * FLOW_BITS)  # ring plane of `first`
        beyond = Signal()
        m.d.comb += [flow.eq(ds.slots != 0), beyond.eq(oc >= first + ds.planes)]
        self._plane = Signal(SHAPE_BITS + 2 * FLOW_BITS)
        m.d.comb += self._plane.eq(Mux(flow, ring + (oc - first), oc))
        close = Signal()
        m.d.comb += close.eq(flow & active & opened & ~held
                             & ((self.out.valid & beyond) | self.finish))
        m.d.comb += self.produce.eq(close)
        with m.If(self.flow_start):
            m.d.sync += [active.eq(1), opened.eq(0), first.eq(0), slot.eq(0), ring.eq(0)]
        with m.Elif(close):
            wrap = slot + 1 == ds.slots
            m.d.sync += [opened.eq(0), first.eq(first + ds.planes),
                         slot.eq(Mux(wrap, 0, slot + 1)),
                         ring.eq(Mux(wrap, 0, ring + ds.planes))]
            with m.If(self.finish):
                m.d.sync += active.eq(0)
        with m.Elif(flow & active & ~opened & self.out.valid & ~beyond & self.may_produce):
            m.d.sync += opened.eq(1)
        return ~flow | (opened & ~beyond)
