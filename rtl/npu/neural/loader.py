"""The loader: fills the input buffer with the rows each work unit needs.

For every output-channel group, every work unit (tile row, tile column) and every input
channel the group reads, kernel row and lane row, the loader requests one halo row from the
data source and writes the answer into the free bank of the input buffer
(``docs/neural_engine.md``, "Input buffer and shifter"). Lane row ``y`` of the unit at tile
``(ty, tx)`` needs, for input channel ``c`` and kernel row ``ky``, input row
``(ty*H + y)*stride + ky*dilation - pad`` from column ``tx*W*stride - pad`` on.
"""

from amaranth.hdl import Module, Mux, Shape, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..lib.arith import narrow_mul
from ..lib.loop import LoopNest
from .group_walker import GroupWalker
from .input_buffer import BufferWriteSignature
from .layouts import (
    geometry_layout,
    layer_layout,
    row_data_layout,
    row_request_layout,
    row_tag_layout,
)

__all__ = ["Loader"]


class Loader(wiring.Component):
    """Loader of one neural engine core.

    Parameters
    ----------
    macs, slots : int
        MAC lanes and accumulator slots of the build.
    max_rows, row_values, buffer_rows : int
        Input-buffer geometry (``npu_spec.neural.engine_geometry``).
    bits : int
        Bits the input buffer keeps of each value (``npu.neural.shifter.value_bits``).
    channel_bits : int
        Width of the output-channel counter: ``out_channel_limit(config).bit_length()``
        (``npu_spec.neural``; 24 by default). Layers with more channels are refused at the
        start.
    tile_bits : int
        Width of the work-unit counters (tile row and column):
        ``out_size_limit(config).bit_length()`` (``npu_spec.neural``; 12 by default). Layers
        with more output rows or columns are refused at the start.

    Members
    -------
    start : In(1)
        A layer starts (its registers passed the start check).
    layer : In(layer_layout())
        The layer registers.
    geometry : In(geometry_layout(macs))
        The layer's work-unit shape, output channels and tiles.
    row_req : Out(stream.Signature(row_request_layout(tag)))
        Rows wanted, in order: channel, kernel row, lane row (fastest).
    row_data : In(stream.Signature(row_data_layout(row_values, tag)))
        The answers, in request order; always accepted. Answers that arrive while the loader
        is idle (after an abort) are dropped.
    buffer : Out(BufferWriteSignature(max_rows, row_values, buffer_rows, bits))
        Row writes into the input buffer.
    full : In(2)
        The input buffer's full banks: the loader waits for its bank to be free ...
    fill : Out(2)
        ... and marks it full once every answer for it has been written.
    """

    def __init__(self, macs, slots, max_rows, row_values, buffer_rows, bits=16, *,
                 channel_bits=24, tile_bits=12):
        self._channel_bits = channel_bits
        self._tile_bits = tile_bits
        self._macs = macs
        self._slots = slots
        self._max_rows = max_rows
        self._buffer_rows = buffer_rows
        tag = row_tag_layout(max_rows, buffer_rows)
        super().__init__({
            "start":    In(1),
            "layer":    In(layer_layout()),
            "geometry": In(geometry_layout(macs)),
            "row_req":  Out(stream.Signature(row_request_layout(tag))),
            "row_data": In(stream.Signature(row_data_layout(row_values, tag))),
            "buffer":   Out(BufferWriteSignature(max_rows, row_values, buffer_rows, bits)),
            "full":     In(2),
            "fill":     Out(2),
        })

    def elaborate(self, platform):
        m = Module()
        layer = self.layer
        geo = self.geometry
        depth = self._buffer_rows

        m.submodules.walker = walker = GroupWalker(self._slots)
        m.submodules.tiles = tiles = LoopNest([("base", self._channel_bits, self._slots),
                                               ("ty", self._tile_bits), ("tx", self._tile_bits)])
        # Counters only as wide as a layer that passes the sequencer's buffer check needs
        # (channels x kernel rows at most `buffer_rows`); a group beyond it ends the layer with
        # BUFFER before its rows are used. The first channel is kept as wide as the request's.
        m.submodules.rows = rows = LoopNest([("c", range(depth + 1)), ("ky", 5),
                                             ("y", range(self._max_rows + 1))])
        in_base = Signal(len(self.row_req.payload.c))     # first input channel of the group
        in_count = Signal(range(depth + 1))               # input channels of the group
        m.d.comb += [
            walker.ocpg.eq(layer.ocpg), walker.icpg.eq(layer.icpg),
            walker.remaining.eq(geo.out_channels - tiles.index.base),
            tiles.limit.base.eq(geo.out_channels), tiles.limit.ty.eq(geo.tiles_y),
            tiles.limit.tx.eq(geo.tiles_x),
            rows.limit.c.eq(in_count), rows.limit.ky.eq(layer.kh), rows.limit.y.eq(geo.unit_h),
        ]

        # Answers outstanding; an answer is written to the buffer row its tag names.
        bank = Signal()
        idle = Signal()
        outstanding = Signal(range(depth * self._max_rows + 1))   # at most a unit's rows
        answer = Signal()
        m.d.comb += [
            self.row_data.ready.eq(1),
            answer.eq(self.row_data.valid & ~idle),
            self.buffer.en.eq(answer),
            self.buffer.row.eq(self.row_data.payload.tag.row),
            self.buffer.addr.eq(self.row_data.payload.tag.addr),
        ]
        values = self.row_data.payload.values
        m.d.comb += [self.buffer.values[j].eq(values[j]) for j in range(len(values))]
        m.d.sync += outstanding.eq(outstanding + (self.row_req.valid & self.row_req.ready)
                                   - answer)

        # The request at the loop position. Products are kept only as wide as the fields they
        # end in (row and column: the request's; the buffer address: the tag's), in shifts
        # and adds rather than multipliers.
        pad = Signal(signed(6))
        req = self.row_req.payload
        pos = rows.index
        yx_bits = len(req.y)
        addr_bits = Shape.cast(range(2 * depth)).width
        m.d.comb += [
            pad.eq(layer.pad),
            req.c.eq(in_base + pos.c),
            req.y.eq(narrow_mul((tiles.index.ty << geo.log2h) + pos.y, layer.stride, yx_bits)
                     + narrow_mul(pos.ky, layer.dilation, yx_bits) - pad),
            req.x.eq(narrow_mul(tiles.index.tx << layer.log2w, layer.stride, yx_bits) - pad),
            req.tag.row.eq(pos.y),
            req.tag.addr.eq(Mux(bank, depth, 0) + narrow_mul(pos.c, layer.kh, addr_bits)
                            + pos.ky),
        ]

        with m.FSM() as fsm:
            m.d.comb += idle.eq(fsm.ongoing("IDLE"))
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.comb += [walker.restart.eq(1), tiles.restart.eq(1)]
                    m.d.sync += bank.eq(0)
                    m.next = "GROUP"
            with m.State("GROUP"):
                m.d.comb += walker.begin.eq(1)
                m.next = "WALK"
            with m.State("WALK"):
                # The input channels of the group's convolution groups.
                with m.If(walker.walking):
                    m.d.comb += walker.step.eq(1)
                with m.Else():
                    m.d.sync += [in_base.eq(walker.in_base), in_count.eq(walker.in_count)]
                    m.next = "WAIT_BANK"
            with m.State("WAIT_BANK"):
                with m.If(~self.full.bit_select(bank, 1)):
                    m.d.comb += rows.restart.eq(1)
                    m.next = "ROWS"
            with m.State("ROWS"):
                m.d.comb += self.row_req.valid.eq(1)
                with m.If(self.row_req.ready):
                    m.d.comb += rows.advance.eq(1)
                    with m.If(rows.done):
                        m.next = "DRAIN"
            with m.State("DRAIN"):
                # Every answer written: the bank is full; on to the next work unit.
                with m.If(outstanding == 0):
                    m.d.comb += [self.fill.eq(Mux(bank, 0b10, 0b01)), tiles.advance.eq(1)]
                    m.d.sync += bank.eq(~bank)
                    with m.If(~tiles.last.ty | ~tiles.last.tx):
                        m.next = "WAIT_BANK"
                    with m.Elif(~tiles.last.base):
                        m.next = "GROUP"
                    with m.Else():
                        m.next = "IDLE"
        return m
