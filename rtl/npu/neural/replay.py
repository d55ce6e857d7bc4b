"""The parameter replayer: sends each group's per-slot parameters once per work unit.

The post-processor takes one set of parameters (scale and shift per slot) for every work unit,
but a group's header is decoded once. The sequencer stores each header's parameters in one of
two tables (by the group index's parity); the replayer sends the group's table to the
post-processor once per work unit, running ahead of the results as far as the
post-processor's two parameter banks allow (``docs/neural_engine.md``).
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..lib.loop import LoopNest
from .block_ram import block_memory, registered_read
from .layouts import geometry_layout, param_beat_layout, param_store_layout

__all__ = ["ParamReplay", "param_entry_layout"]


def param_entry_layout():
    """A slot's parameters as the tables hold them."""
    return data.StructLayout({"scale": 32, "shift": 6})


class ParamReplay(wiring.Component):
    """Parameter replayer of one neural engine core.

    Parameters
    ----------
    macs, slots : int
        MAC lanes and accumulator slots of the build.
    channel_bits : int
        Width of the output-channel counter: ``out_channel_limit(config).bit_length()``
        (``npu_spec.neural``; 24 by default). Layers with more channels are refused at the
        start.
    tile_bits : int
        Width of the work-unit counters (tile row and column):
        ``out_size_limit(config).bit_length()`` (``npu_spec.neural``; 12 by default). Layers
        with more output rows or columns are refused at the start.
    group_bits : int
        Width of the group counters (``npu.neural.layouts.group_bits(config)``; 16 by
        default).

    Members
    -------
    start : In(1)
        A layer starts (its registers passed the start check).
    geometry : In(geometry_layout(macs))
        Output channels and tiles of the layer.
    store : In(param_store_layout(slots))
        Writes into the tables (from the sequencer, as it decodes headers).
    headers : In(group_bits)
        Headers decoded so far: the replayer starts group ``g`` once ``headers > g``.
    group : Out(group_bits)
        The group the replayer is on.
    params : Out(stream.Signature(param_beat_layout(slots)))
        Parameter beats for the post-processor: for every work unit the group's slots in
        order, ``group_last`` on the last one; ``bias`` is 0 (the MAC array adds the bias).
    """

    def __init__(self, macs, slots, *, channel_bits=24, tile_bits=12, group_bits=16):
        self._channel_bits = channel_bits
        self._tile_bits = tile_bits
        self._slots = slots
        super().__init__({
            "start":    In(1),
            "geometry": In(geometry_layout(macs)),
            "store":    In(param_store_layout(slots)),
            "headers":  In(group_bits),
            "group":    Out(group_bits),
            "params":   Out(stream.Signature(param_beat_layout(slots))),
        })

    def elaborate(self, platform):
        m = Module()
        slots = self._slots
        geo = self.geometry

        ocg = Signal(range(slots + 1))      # channels of the current group
        m.submodules.loop = loop = LoopNest([("base", self._channel_bits, slots),
                                             ("ty", self._tile_bits), ("tx", self._tile_bits),
                                             ("slot", range(slots + 1))])
        m.d.comb += [loop.limit.base.eq(geo.out_channels), loop.limit.ty.eq(geo.tiles_y),
                     loop.limit.tx.eq(geo.tiles_x), loop.limit.slot.eq(ocg)]
        remaining = Signal(24)
        m.d.comb += remaining.eq(geo.out_channels - loop.index.base)

        # The two tables in one memory (bank = group parity, then slot), read a cycle ahead:
        # the address is the slot the loop is on in the next cycle, so the entry of the
        # current slot is there as the beat is offered. The sequencer writes a bank only when
        # the replayer is not on it (it waits for the replayer to leave the group whose table
        # a header overwrites) and the replayer offers a group only from the cycle after its
        # header count has risen, so no read meets a write of the same entry.
        slot_bits = max(1, (slots - 1).bit_length())
        m.submodules.tables = tables = block_memory(param_entry_layout(), 2 << slot_bits)
        wp = tables.write_port()
        advance = Signal()
        m.d.comb += [
            wp.en.eq(self.store.en),
            wp.addr.eq(Cat(self.store.slot[:slot_bits], self.store.bank)),
            wp.data.scale.eq(self.store.scale),
            wp.data.shift.eq(self.store.shift),
        ]
        entry = registered_read(
            m, tables, Cat(Mux(advance, loop.next.slot, loop.index.slot)[:slot_bits],
                           self.group[0]), 1, name="entry")
        slot = loop.index.slot
        p = self.params.payload
        m.d.comb += [
            p.slot.eq(slot), p.bias.eq(0), p.scale.eq(entry.scale), p.shift.eq(entry.shift),
            p.group_last.eq(loop.last.slot),
        ]
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.comb += loop.restart.eq(1)
                    m.d.sync += self.group.eq(0)
                    m.next = "WAIT"
            with m.State("WAIT"):
                with m.If(self.headers > self.group):
                    m.d.sync += ocg.eq(Mux(remaining >= slots, slots, remaining))
                    m.next = "PUSH"
            with m.State("PUSH"):
                m.d.comb += self.params.valid.eq(1)
                with m.If(self.params.ready):
                    m.d.comb += [loop.advance.eq(1), advance.eq(1)]
                    with m.If(loop.last.slot & loop.last.tx & loop.last.ty):
                        m.d.sync += self.group.eq(self.group + 1)
                        with m.If(~loop.last.base):
                            m.next = "WAIT"
                        with m.Else():
                            m.next = "IDLE"
        return m
