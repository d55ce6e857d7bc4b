"""The output circuit: post-processed results to output row writes.

A post-processed result holds one output channel (a slot) of one work unit, every lane. The
writer turns it into ``H`` row writes, lane row ``y`` at output row ``ty*H + y`` from column
``tx*W`` on, with a mask that drops the columns beyond the work unit's ``W`` and beyond the
layer; rows beyond the layer are skipped (``docs/neural_engine.md``). Results come for every
group, work unit and the group's channels in the order their accumulations end
(``npu_spec.neural.result_order``); the writer counts them to know the work unit.
"""

from amaranth.hdl import Array, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..lib.loop import LoopNest
from .layouts import geometry_layout, layer_layout, postproc_out_layout, row_write_layout

__all__ = ["Writer"]


class Writer(wiring.Component):
    """Output circuit of one neural engine core.

    Parameters
    ----------
    macs, slots, max_rows : int
        MAC lanes, accumulator slots and the largest work-unit height of the build.
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
    geometry : In(geometry_layout(macs))
    res : In(stream.Signature(postproc_out_layout(macs, slots)))
        Post-processed results, taken with their last row.
    out : Out(stream.Signature(row_write_layout(macs)))
        Output row writes.
    done : Out(1)
        The layer's last result has been written (until ``ack``).
    ack : In(1)
        The layer ended.
    """

    def __init__(self, macs, slots, max_rows, *, channel_bits=24, tile_bits=12):
        self._channel_bits = channel_bits
        self._tile_bits = tile_bits
        self._macs = macs
        self._slots = slots
        self._max_rows = max_rows
        super().__init__({
            "start":    In(1),
            "layer":    In(layer_layout()),
            "geometry": In(geometry_layout(macs)),
            "res":      In(stream.Signature(postproc_out_layout(macs, slots))),
            "out":      Out(stream.Signature(row_write_layout(macs))),
            "done":     Out(1),
            "ack":      In(1),
        })

    def elaborate(self, platform):
        m = Module()
        n, slots = self._macs, self._slots
        layer = self.layer
        geo = self.geometry

        ocg = Signal(range(slots + 1))      # channels of the current group
        m.submodules.loop = loop = LoopNest([
            ("base", self._channel_bits, slots), ("ty", self._tile_bits), ("tx", self._tile_bits),
            ("count", range(slots + 1)), ("y", range(self._max_rows + 1))])
        pos = loop.index
        remaining = Signal(24)
        m.d.comb += [
            loop.limit.base.eq(geo.out_channels), loop.limit.ty.eq(geo.tiles_y),
            loop.limit.tx.eq(geo.tiles_x), loop.limit.count.eq(ocg), loop.limit.y.eq(geo.unit_h),
            remaining.eq(geo.out_channels - pos.base),
        ]

        # Row `y` of the result: values[x] is lane y * W + x.
        res = self.res.payload
        o = self.out.payload
        m.d.comb += [
            o.oc.eq(pos.base + res.slot),
            o.y.eq((pos.ty << geo.log2h) + pos.y),
            o.x.eq(pos.tx << layer.log2w),
        ]
        # Columns of the layer from the unit's first one on: one subtraction, then each mask
        # bit compares a constant (the unit lies inside the layer, so it is positive).
        cols_left = Signal(12)
        m.d.comb += cols_left.eq(layer.out_w - (pos.tx << layer.log2w))
        # Column x of row y is lane y * W + x: for each work-unit shape the build can offer
        # (H = n / W at most max_rows), a choice among the H lanes of column x, so the
        # selection grows with the shapes and not with the lanes (columns beyond W are
        # masked and take any value).
        log2n = (n - 1).bit_length()
        shapes = [lw for lw in range(log2n + 1) if n >> lw <= self._max_rows]
        for x in range(n):
            m.d.comb += o.mask[x].eq((x < geo.unit_w) & (cols_left > x))
            with m.Switch(layer.log2w):
                for lw in shapes:
                    if x >= 1 << lw:
                        continue
                    with m.Case(lw):
                        rows = [res.values[(y << lw) + x] for y in range(n >> lw)]
                        m.d.comb += o.values[x].eq(Array(rows)[pos.y])
        # The row lies inside the layer: a register, worked out for the loop's next position
        # as it advances (so the shift, add and compare are not on the way to `res.ready`,
        # which the post-processor's pipeline enable follows).
        row_inside = Signal(reset_less=True)
        with m.If(loop.restart):
            m.d.sync += row_inside.eq(layer.out_h != 0)
        with m.Elif(loop.advance):
            m.d.sync += row_inside.eq((loop.next.ty << geo.log2h) + loop.next.y < layer.out_h)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.comb += loop.restart.eq(1)
                    m.next = "GROUP"
            with m.State("GROUP"):
                m.d.sync += ocg.eq(Mux(remaining >= slots, slots, remaining))
                m.next = "ROWS"
            with m.State("ROWS"):
                m.d.comb += self.out.valid.eq(self.res.valid & row_inside)
                step = Signal()
                m.d.comb += step.eq(self.res.valid & (~row_inside | self.out.ready))
                with m.If(step):
                    m.d.comb += [loop.advance.eq(1), self.res.ready.eq(loop.last.y)]
                    with m.If(loop.last.y & loop.last.count & loop.last.tx & loop.last.ty):
                        with m.If(~loop.last.base):
                            m.next = "GROUP"
                        with m.Else():
                            m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += self.done.eq(1)
                with m.If(self.ack):
                    m.next = "IDLE"
        return m
