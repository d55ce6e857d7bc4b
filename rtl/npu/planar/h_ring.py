"""The H ring: the line buffer between the horizontal and the vertical pooling filter.

``HD`` words of ``FL`` binary32 values, one write and one read port; H beat ``n`` of a task
is word ``n mod HD``. In a reduction across channels the ring holds the channel
accumulator's plane instead: the accumulator's writes and reads take the ports.
"""

from amaranth.hdl import Module, Mux
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .geometry import unchecked_memory, unchecked_read_port
from .layouts import ring_read_layout, ring_write_layout

__all__ = ["HRing"]


class HRing(wiring.Component):
    """The H ring and the choice of its users.

    Parameters
    ----------
    geometry : Geometry
        ``FL``, ``HD``.

    Members
    -------
    filter_write : In(ring_write_layout(hword_bits))
        The horizontal filter's write (word index modulo ``HD``).
    acc_write : In(ring_write_layout(range(HD)))
        The channel accumulator's write (wins over the filter's).
    data : In(ArrayLayout(32, FL))
        The data of either write.
    acc_mode : In(1)
        The channel accumulator reads (a reduction across channels).
    filter_read, acc_read : In(ring_read_layout(HD))
        The vertical filter's and the channel accumulator's reads.
    read_data : Out(ArrayLayout(32, FL))
        The word read in the cycle before (held while the read is disabled).
    """

    def __init__(self, geometry):
        self._geometry = geometry
        hd = geometry.h_depth
        words = data.ArrayLayout(geometry.word, geometry.filter_lanes)
        super().__init__({
            "filter_write": In(ring_write_layout(geometry.hword_bits)),
            "acc_write":    In(ring_write_layout(range(hd))),
            "data":         In(words),
            "acc_mode":     In(1),
            "filter_read":  In(ring_read_layout(hd)),
            "acc_read":     In(ring_read_layout(hd)),
            "read_data":    Out(words),
        })

    def elaborate(self, platform):
        m = Module()
        g = self._geometry
        # A read never needs the word written in the same cycle: the vertical filter reads
        # words below ``count``, the accumulator waits while its word is in flight (hazard).
        m.submodules.words = words = unchecked_memory(
            shape=data.ArrayLayout(g.word, g.filter_lanes), depth=g.h_depth, init=[])
        write = words.write_port()
        read = unchecked_read_port(m, words, "read")
        acc_w, filter_w = self.acc_write, self.filter_write
        m.d.comb += [
            write.addr.eq(Mux(acc_w.valid, acc_w.word, filter_w.word[:g.h_bits])),
            write.en.eq(acc_w.valid | filter_w.valid),
            write.data.eq(self.data),
        ]
        with m.If(self.acc_mode):
            m.d.comb += [read.addr.eq(self.acc_read.addr), read.en.eq(self.acc_read.en)]
        with m.Else():
            m.d.comb += [read.addr.eq(self.filter_read.addr), read.en.eq(self.filter_read.en)]
        m.d.comb += self.read_data.eq(read.data)
        return m
