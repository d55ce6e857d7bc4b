"""A neural engine core's ports on the buffer: its input rows and its output row writes."""

from amaranth.hdl import Cat, Module, Signal, signed
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.dataproc import ADDR_BITS

from ..neural.layouts import row_data_layout, row_request_layout, row_write_layout
from .ports import BufferReadSignature, DatasetLayout, buffer_write_layout, wrap_address

__all__ = ["NEInPort", "NEOutPort"]

#: Width of the signed sums of dataset addresses before they wrap.
SUM_BITS = ADDR_BITS + 16


class NEInPort(wiring.Component):
    """Answers a core's row requests from its input dataset ``NE{i}_IN``.

    A request ``(c, y, x, tag)`` is registered with its buffer address ``BASE + c * CSTRIDE +
    y * RSTRIDE + x`` and which of its ``row_values`` columns lie inside the image (``y`` in
    ``[0, H)``, column in ``[0, W)``), then read as one run; the run's elements outside the
    image are answered as 0. Answers keep request order and carry the tag; the port can take a
    request every cycle and answers ``1 + READ_LATENCY`` (3) cycles after one is taken when the
    buffer grants its read at once.

    Parameters
    ----------
    row_values : int
        Elements of a row answer (the buffer read port's lanes).
    tag : Layout
        The core's row tag layout.
    elements : int
        Elements of the buffer.
    depth : int
        Requests in flight (the buffer port's response queue depth).

    Members
    -------
    dataset : In(DatasetLayout)
        The input dataset; it must not change while the core runs.
    row_req : In(stream.Signature(row_request_layout(tag)))
    row_data : Out(stream.Signature(row_data_layout(row_values, tag)))
        The core's input ports.
    buf : Out(BufferReadSignature(row_values))
        The buffer read port.
    """

    def __init__(self, row_values, tag, elements, *, depth=4):
        self._row_values = row_values
        self._tag = tag
        self._elements = elements
        self._depth = depth
        super().__init__({
            "dataset":  In(DatasetLayout),
            "row_req":  In(stream.Signature(row_request_layout(tag))),
            "row_data": Out(stream.Signature(row_data_layout(row_values, tag))),
            "buf":      Out(BufferReadSignature(row_values)),
        })

    def elaborate(self, platform):
        m = Module()
        rv = self._row_values
        ds = self.dataset
        req = self.row_req.payload
        meta_layout = data.StructLayout({"tag": self._tag, "inside": rv})

        # Stage 1: the request's address and inside mask, registered.
        s1_valid = Signal()
        s1_addr = Signal(ADDR_BITS)
        s1_meta = Signal(meta_layout)
        m.submodules.meta = meta = fifo.SyncFIFO(width=meta_layout.size, depth=self._depth)
        issue = Signal()
        m.d.comb += [
            self.buf.req.valid.eq(s1_valid & meta.w_rdy),
            self.buf.req.payload.addr.eq(s1_addr),
            issue.eq(self.buf.req.valid & self.buf.req.ready),
            self.row_req.ready.eq(~s1_valid | issue),
            meta.w_en.eq(issue),
            meta.w_data.eq(s1_meta),
        ]
        addr = Signal(signed(SUM_BITS))
        m.d.comb += addr.eq(ds.addr + req.c * ds.cstride + req.y * ds.rstride + req.x)
        row_inside = (req.y >= 0) & (req.y < ds.height)
        inside = Cat(row_inside & (req.x + k >= 0) & (req.x + k < ds.width) for k in range(rv))
        with m.If(self.row_req.valid & self.row_req.ready):
            m.d.sync += [s1_valid.eq(1), s1_addr.eq(wrap_address(addr, self._elements)),
                         s1_meta.tag.eq(req.tag), s1_meta.inside.eq(inside)]
        with m.Elif(issue):
            m.d.sync += s1_valid.eq(0)

        # The answer: the run with the elements outside the image zeroed, and the tag.
        got = data.View(meta_layout, meta.r_data)
        resp = self.buf.resp
        m.d.comb += [
            self.row_data.valid.eq(resp.valid),
            resp.ready.eq(self.row_data.ready),
            meta.r_en.eq(resp.valid & resp.ready),
            self.row_data.payload.tag.eq(got.tag),
        ]
        m.d.comb += [self.row_data.payload.values[k].eq(
            resp.payload.data[k] & got.inside[k].replicate(16)) for k in range(rv)]
        return m


class NEOutPort(wiring.Component):
    """Writes a core's output rows into its output dataset ``NE{i}_OUT``.

    A row write ``(oc, y, x, values, mask)`` is registered with its buffer address ``BASE +
    oc * CSTRIDE + y * RSTRIDE + x``; value ``j`` goes to that address plus ``j`` when mask bit
    ``j`` is set. A row of ``macs`` values is written as ``macs / lanes`` runs of the buffer
    write port's ``lanes`` (runs without a mask bit are skipped); with ``lanes == macs`` the port
    takes a row every cycle the buffer takes its run.

    Parameters
    ----------
    macs : int
        Values of a row write.
    lanes : int
        Lanes of the buffer write port (divides ``macs``).
    elements : int
        Elements of the buffer.

    Members
    -------
    dataset : In(DatasetLayout)
        The output dataset; it must not change while the core runs.
    out : In(stream.Signature(row_write_layout(macs)))
        The core's row writes.
    buf : Out(stream.Signature(buffer_write_layout(lanes)))
        The buffer write port.
    """

    def __init__(self, macs, lanes, elements):
        if not isinstance(lanes, int) or lanes < 1 or macs % lanes:
            raise ValueError(f"lanes must divide the MAC count {macs}, not {lanes!r}")
        self._macs = macs
        self._lanes = lanes
        self._elements = elements
        super().__init__({
            "dataset": In(DatasetLayout),
            "out":     In(stream.Signature(row_write_layout(macs))),
            "buf":     Out(stream.Signature(buffer_write_layout(lanes))),
        })

    def elaborate(self, platform):
        m = Module()
        n, lanes = self._macs, self._lanes
        parts = n // lanes
        ds = self.dataset
        row = self.out.payload

        # The held row write and the run being written.
        held = Signal()
        h_addr = Signal(ADDR_BITS)
        h_values = Signal(data.ArrayLayout(16, n))
        h_mask = Signal(n)
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
        m.d.comb += self.out.ready.eq(~held | last_part)
        with m.If(done_part):
            m.d.sync += part.eq(part + 1)
        with m.If(last_part):
            m.d.sync += [held.eq(0), part.eq(0)]
        addr = Signal(SUM_BITS)
        m.d.comb += addr.eq(ds.addr + row.oc * ds.cstride + row.y * ds.rstride + row.x)
        with m.If(self.out.valid & self.out.ready):
            m.d.sync += [held.eq(1), h_addr.eq(wrap_address(addr, self._elements)),
                         h_values.eq(row.values), h_mask.eq(row.mask)]
        return m
