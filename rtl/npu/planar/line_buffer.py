"""The line buffer: a ring of input elements in ``NB`` prime banks, its loader and its reads.

The ring holds ``DR = NB BD`` binary32 elements: element ``n`` of a task's loads (counted
from the loader's start) is at ring address ``n mod DR``, that is bank ``n mod NB``, word
``(n div NB) mod BD``. ``NB`` is a prime above the filter lanes and above the largest stride
(:func:`npu_spec.planar.line_buffer_banks`), so the ``L`` consecutive elements of a beat are
written to different banks in one cycle, and the ``FL`` elements of a window step (``sx``
apart) or of a row vector are read from different banks in one cycle.

A read is registered once: the base's bank and word (a multiplication by a constant, see
:func:`div_params`, built of adders by :func:`const_mul`) are computed from ``read.base`` and
registered; in the next cycle each lane's bank and word follow from the register and its
offset, and the data is there one cycle later (two cycles after ``read``).
"""

from amaranth.hdl import Array, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .geometry import const_mul, div_params, unchecked_memory, unchecked_read_port
from .layouts import (
    SHAPE_BITS,
    WINDOW_BITS,
    Spread,
    keep_layout,
    load_shape_layout,
    read_layout,
)
from .walk import at_least

__all__ = ["LineBuffer"]


class LineBuffer(wiring.Component):
    """Banks, loader (write side) and read addressing of the line buffer.

    Parameters
    ----------
    geometry : Geometry
        ``L``, ``FL``, ``NB``, ``BD``.

    Members
    -------
    load_start : In(1)
        Start a load of ``load_shape``: counts and ring position return to 0.
    load_shape : In(load_shape_layout())
        ``planes`` of ``rows`` rows of ``length`` elements, sampled with ``load_start``.
    load : In(stream.Signature(ArrayLayout(32, L)))
        Beats of the rows (binary32; in the integer build INT8 sign-extended, of which the
        banks keep the low byte, :attr:`Geometry.buffer_shape`): each row in
        ``ceil(length / L)`` beats, the last one's extra lanes ignored. ``ready`` while the
        beat's ring slots are free (see ``keep``) and the load is not complete.
    keep : In(keep_layout(count_bits))
        The first element a reader still needs: the ring position ``DR`` elements after it is
        not written.
    loaded : Out(count_bits)
        Elements written since the load started (modulo ``2**count_bits``, see
        :attr:`Geometry.count_bits`).
    all_loaded : Out(1)
        Every beat of the load has been taken.
    load_done : Out(1)
        Combinational: the load's last beat is taken in this cycle.
    read : In(read_layout(geometry.ring_depth))
        A read (see :class:`Spread`): ``base`` (``-15 <= base < 2 DR``) is taken in every
        cycle; in the next cycle the lanes' offsets follow from ``spread`` and ``stride`` (which
        hold for a task) and the banks are read if ``en``.
    data : Out(ArrayLayout(32, FL))
        The elements of the read whose base was given two cycles before (held while the banks
        are not read).
    """

    def __init__(self, geometry):
        self._geometry = geometry
        super().__init__({
            "load_start": In(1),
            "load_shape": In(load_shape_layout()),
            "load":       In(stream.Signature(data.ArrayLayout(geometry.word, geometry.lanes))),
            "keep":       In(keep_layout(geometry.count_bits)),
            "loaded":     Out(geometry.count_bits),
            "all_loaded": Out(1),
            "load_done":  Out(1),
            "read":       In(read_layout(geometry.ring_depth)),
            "data":       Out(data.ArrayLayout(geometry.word, geometry.filter_lanes)),
        })

    def elaborate(self, platform):
        m = Module()
        g = self._geometry
        banks = []
        # A read never needs an element written in the same cycle: readers wait for ``loaded``
        # and the loader does not write what ``keep`` protects (``unchecked_memory``).
        for b in range(g.banks):
            bank = unchecked_memory(shape=g.buffer_shape, depth=g.bank_depth, init=[])
            m.submodules[f"bank{b}"] = bank
            banks.append(bank)
        self._loader(m, [bank.write_port() for bank in banks])
        self._reader(m, [unchecked_read_port(m, bank, f"bank{b}_read")
                         for b, bank in enumerate(banks)])
        return m

    def _loader(self, m, wports):
        """Rows of the load into the ring; the ring position is bank ``r``, word ``q``."""
        g = self._geometry
        L, NB, BD = g.lanes, g.banks, g.bank_depth
        shape = Signal(load_shape_layout())
        # Down counters, so that a beat's element count and the ends of the row, the plane and
        # the load are registers (no subtraction or comparison with the shape on the path
        # from the loader's state to its ready and write enables).
        left = Signal(SHAPE_BITS + 1)    # elements of the row from this beat on
        n = Signal(range(L + 1))         # elements of the row in this beat, min(left, L)
        rows_left = Signal(SHAPE_BITS)   # rows of the plane from this one on
        planes_left = Signal(SHAPE_BITS)  # planes from this one on
        q = Signal(range(BD))
        r = Signal(range(NB))

        def count(elements):
            return Mux(elements >= L, L, elements)

        space = Signal()
        m.d.comb += space.eq(~self.keep.valid
                             | at_least(self.keep.first + g.ring_depth, self.loaded + n,
                                        g.count_bits))
        m.d.comb += self.load.ready.eq(space & ~self.all_loaded)
        accept = self.load.valid & self.load.ready

        # Element j of the beat goes to bank (r + j) mod NB, word q (+ 1 past the wrap).
        beat = Array(self.load.payload[i] for i in range(L))
        for b in range(NB):
            j = Signal(range(NB), name=f"j{b}")
            m.d.comb += j.eq(Mux(r <= b, b - r, b + NB - r))
            word = Signal(range(BD + 1), name=f"word{b}")
            m.d.comb += word.eq(q + (r > b))
            m.d.comb += [wports[b].addr.eq(Mux(word == BD, 0, word)),
                         wports[b].data.eq(beat[j[:max(1, g.lane_bits)] if L > 1 else 0]),
                         wports[b].en.eq(accept & (j < n))]

        r_next = Signal(range(NB + L + 1))
        m.d.comb += r_next.eq(r + n)
        with m.If(accept):
            m.d.sync += self.loaded.eq(self.loaded + n)
            with m.If(r_next >= NB):
                m.d.sync += [r.eq(r_next - NB), q.eq(Mux(q == BD - 1, 0, q + 1))]
            with m.Else():
                m.d.sync += r.eq(r_next)
            with m.If(left <= L):
                m.d.sync += [left.eq(shape.length), n.eq(count(shape.length))]
                with m.If(rows_left == 1):
                    m.d.sync += [rows_left.eq(shape.rows), planes_left.eq(planes_left - 1)]
                    with m.If(planes_left == 1):
                        m.d.comb += self.load_done.eq(1)
                        m.d.sync += self.all_loaded.eq(1)
                with m.Else():
                    m.d.sync += rows_left.eq(rows_left - 1)
            with m.Else():
                m.d.sync += [left.eq(left - L), n.eq(count(left - L))]
        with m.If(self.load_start):
            ls = self.load_shape
            m.d.sync += [shape.eq(ls), left.eq(ls.length), n.eq(count(ls.length)),
                         rows_left.eq(ls.rows), planes_left.eq(ls.planes), q.eq(0),
                         r.eq(0), self.loaded.eq(0), self.all_loaded.eq(0)]

    def _reader(self, m, rports):
        """The base's bank and word, registered; each lane's bank and word from them."""
        g = self._geometry
        NB, BD, DR, FL = g.banks, g.bank_depth, g.ring_depth, g.filter_lanes
        read = self.read
        ring = Signal(range(DR))
        m.d.comb += ring.eq(Mux(read.base < 0, read.base + DR,
                                Mux(read.base >= DR, read.base - DR, read.base)))
        nb_s, nb_m = div_params(len(ring), [NB])
        word_next = Signal(range(BD))
        m.d.comb += word_next.eq(const_mul(ring, nb_m[NB])[nb_s:])
        base_word = Signal(range(BD))
        base_bank = Signal(range(NB))
        m.d.sync += [base_word.eq(word_next), base_bank.eq(ring - const_mul(word_next, NB))]

        lane_bank = []
        lane_word = []
        strides = range(1 << WINDOW_BITS)
        for i in range(FL):
            word_off = Signal(range(BD), name=f"word_off{i}")
            bank_off = Signal(range(NB), name=f"bank_off{i}")
            with m.Switch(read.spread):
                with m.Case(Spread.STEP):
                    m.d.comb += [
                        word_off.eq(Array(Const((s * i) // NB, range(BD)) for s in strides)
                                    [read.stride]),
                        bank_off.eq(Array(Const((s * i) % NB, range(NB)) for s in strides)
                                    [read.stride])]
                with m.Case(Spread.ROW):
                    m.d.comb += [word_off.eq(i // NB), bank_off.eq(i % NB)]
            bank_sum = Signal(range(2 * NB), name=f"bank_sum{i}")
            m.d.comb += bank_sum.eq(base_bank + bank_off)
            word_sum = Signal(range(2 * BD + 1), name=f"word_sum{i}")
            m.d.comb += word_sum.eq(base_word + word_off + (bank_sum >= NB))
            bank = Signal(range(NB), name=f"bank{i}")
            word = Signal(range(BD), name=f"word{i}")
            m.d.comb += [bank.eq(Mux(bank_sum >= NB, bank_sum - NB, bank_sum)),
                         word.eq(Mux(word_sum >= BD, word_sum - BD, word_sum))]
            lane_bank.append(bank)
            lane_word.append(word)

        # Each bank's address is the word of the lane that reads it; each lane's data comes
        # from the bank it read.
        for b in range(NB):
            addr = 0
            for i in range(FL):
                addr = addr | Mux(lane_bank[i] == b, lane_word[i], 0)
            m.d.comb += [rports[b].addr.eq(addr), rports[b].en.eq(read.en)]
        bank_data = Array(rports[b].data for b in range(NB))
        for i in range(FL):
            bank_read = Signal(range(NB), name=f"bank_read{i}")
            with m.If(read.en):
                m.d.sync += bank_read.eq(lane_bank[i])
            m.d.comb += self.data[i].eq(bank_data[bank_read])
