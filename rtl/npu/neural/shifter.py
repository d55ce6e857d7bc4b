"""The shifter: every lane's input for one coefficient beat, from the input-buffer rows.

Lane ``i`` of a ``W x H`` work unit is position ``(y, x) = (i // W, i % W)``; for a beat at
kernel column ``kx`` it takes element ``x * stride + kx * dilation`` of lane row ``y``'s halo
row (``docs/neural_engine.md``, "Input buffer and shifter").

The input buffer keeps each halo row in *stride order* (``npu_spec.neural.stride_order``):
:class:`StrideOrder` sorts a row by phase ``e % stride`` as it is written, once per row. The
elements a lane row needs at offset ``kx * dilation`` then sit side by side, from entry
``r = stride_rotation(row_values, stride, kx * dilation)`` on, so the read side only shifts:

* lane row ``y``: ``T_y[x] = row_y[r + x]`` for the ``x`` below the widest work unit that has
  a row ``y`` (``log2 row_values`` levels of 2:1 multiplexers, widest first, each only as
  wide as the columns after it need);
* lane ``i`` takes ``T_y[x]`` of its row ``y = i // W`` and column ``x = i % W``, a
  multiplexer over the work-unit shapes that put it somewhere.

The halo check at the start of a layer keeps every element a lane reads inside the row
(``r + x < row_values``), so an entry beyond the row never reaches a lane of a beat that passed
it: the shifter leaves those multiplexer inputs out. The rotation ``r`` is worked out from
the beat's kernel column a cycle early, as its rows are read (``en``), and registered, so the
wide multiplexers' selects come from a register. The shifter is then combinational, or with
``stages=1`` (``NPUConfig.ne_shift_stages``) has a register after its two widest levels,
loaded when ``en`` is high: the lanes then answer the rows of the last cycle ``en`` was high
in.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from npu_spec.neural import stride_order, stride_rotation, work_unit_shapes

from ..lib.arith import narrow_mul

__all__ = ["Shifter", "StrideOrder", "value_bits"]

#: Strides the layer register can hold (3 bits; 0 is refused at the start).
_STRIDES = range(1, 8)


def value_bits(config):
    """Bits the input buffer and shifter keep of an input value: 8 in int8-only builds (the
    MAC array reads the low 8 bits of an int8 operand), else 16."""
    return 16 if config.has_float else 8


class StrideOrder(wiring.Component):
    """A halo row into stride order, as the loader writes it into the input buffer.

    Parameters
    ----------
    row_values, bits : int
        Inputs per halo row and bits kept of each.

    Members
    -------
    stride : In(3)
        The layer's stride. Stride 0, which the start check refuses, keeps the row as it is
        but for entry 0, which is 0.
    values : In(data.ArrayLayout(bits, row_values))
        The halo row.
    ordered : Out(data.ArrayLayout(bits, row_values))
        Combinational: entry ``p`` is element ``stride_order(row_values, stride)[p]``.
    """

    def __init__(self, row_values, bits=16):
        self._row_values = row_values
        super().__init__({
            "stride":  In(3),
            "values":  In(data.ArrayLayout(bits, row_values)),
            "ordered": Out(data.ArrayLayout(bits, row_values)),
        })

    def elaborate(self, platform):
        m = Module()
        rv = self._row_values
        orders = {s: stride_order(rv, s) for s in _STRIDES}
        for p in range(rv):
            if p == 0:
                # Element 0 for every stride; 0 for stride 0, as an output that is a plain
                # copy of an input makes Yosys 0.70's ABC9 stop without a message.
                m.d.comb += self.ordered[0].eq(Mux(self.stride.any(), self.values[0], 0))
                continue
            # A multiplexer tree over the stride's bits (leaf s: the element stride s puts
            # here; stride 0 keeps the row): about 40% fewer LUTs than a case per source.
            level = [self.values[p]] + [self.values[orders[s][p]] for s in _STRIDES]
            for b in range(len(self.stride)):
                level = [Mux(self.stride[b], level[2 * k + 1], level[2 * k])
                         for k in range(len(level) // 2)]
            m.d.comb += self.ordered[p].eq(level[0])
        return m


class Shifter(wiring.Component):
    """Shifter of one neural engine core.

    Parameters
    ----------
    config : NPUConfig
    max_rows, row_values : int
        Lane rows and inputs per halo row of the input buffer.
    bits : int
        Bits of an input value: 16, or 8 in int8-only builds (``value_bits(config)``), whose
        MAC array reads only the low 8 bits of an operand.
    stages : int
        Pipeline registers: 0 (combinational) or 1 (``config.ne_shift_stages``).

    Members
    -------
    en : In(1)
        The input buffer reads the next beat's rows: take its ``kx``, and with ``stages=1``
        load the register (the rows move on).
    rows : In(data.ArrayLayout(data.ArrayLayout(bits, row_values), max_rows))
        The halo row of each lane row, in stride order (:class:`StrideOrder`).
    kx : In(4)
        Kernel column of the beat whose rows are read in this cycle, taken with ``en``: it
        applies to the ``rows`` of the next cycle.
    dilation, stride : In(3)
        The layer's dilation and stride.
    log2w : In(4)
        The work-unit shape: ``W = 2**log2w``.
    lanes : Out(data.ArrayLayout(bits, macs))
        Each lane's input: combinational from ``rows`` (with the ``kx`` taken at the last
        ``en``), or ``stages`` cycles of ``en`` late.
    """

    def __init__(self, config, max_rows, row_values, bits=16, stages=0):
        if stages not in (0, 1):
            raise ValueError(f"stages must be 0 or 1, not {stages!r}")
        self._config = config
        self._max_rows = max_rows
        self._row_values = row_values
        self._bits = bits
        self._stages = stages
        super().__init__({
            "en":       In(1),
            "rows":     In(data.ArrayLayout(data.ArrayLayout(bits, row_values), max_rows)),
            "kx":       In(4),
            "dilation": In(3),
            "stride":   In(3),
            "log2w":    In(4),
            "lanes":    Out(data.ArrayLayout(bits, config.macs)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self._config.macs
        rv = self._row_values
        log2rv = exact_log2(rv)
        shapes = work_unit_shapes(self._config, rv)

        # The first entry the lanes read: a table of (stride, offset mod row_values); the
        # halo check keeps the offset of every beat that passed it below row_values.
        offset = Signal(max(log2rv, 1))
        m.d.comb += offset.eq(narrow_mul(self.kx, self.dilation, len(offset)))
        r = Signal(max(log2rv, 1))
        with m.Switch(self.stride):
            for s in _STRIDES:
                with m.Case(s):
                    with m.Switch(offset):
                        for o in range(rv):
                            rot = stride_rotation(rv, s, o)
                            if rot:
                                with m.Case(o):
                                    m.d.comb += r.eq(rot)

        # The rotation of the beat whose rows come next (no reset: data, like the rows).
        r_now = Signal.like(r, name="r_now", reset_less=True)
        with m.If(self.en):
            m.d.sync += r_now.eq(r)
        r = r_now
        # With a register: after the two widest levels, with the rotation it still applies.
        cut = log2rv - 2 if self._stages else -1
        r_late = r
        if self._stages:
            r_late = Signal.like(r, name="r_late", reset_less=True)
            with m.If(self.en):
                m.d.sync += r_late.eq(r)
        shifted = []
        for y in range(self._max_rows):
            # Columns of row y: the widest shape that has a row y.
            cols = max(1 << lw for lw in shapes if (n >> lw) > y)
            t = [self.rows[y][j] for j in range(rv)]
            for b in reversed(range(log2rv)):
                step = 1 << b
                need = min(cols + step - 1, rv)      # entries the later levels read
                nxt = []
                for j in range(need):
                    if j + step < len(t):
                        v = Signal(self._bits, name=f"rot_r{y}_l{b}_{j}")
                        m.d.comb += v.eq(Mux((r if b >= cut else r_late)[b], t[j + step],
                                             t[j]))
                        nxt.append(v)
                    else:
                        # Shifted in from beyond the row: no beat that passed the halo
                        # check reads it.
                        nxt.append(t[j])
                t = nxt
                if b == cut:
                    # Data: no reset (the sequencer's valid bits qualify it).
                    held = [Signal(self._bits, name=f"pipe_r{y}_{j}", reset_less=True)
                            for j in range(len(t))]
                    with m.If(self.en):
                        m.d.sync += [held[j].eq(t[j]) for j in range(len(t))]
                    t = held
            shifted.append(t[:cols])

        # Lane i: row i >> log2w, column i & (W - 1), for the shapes the build offers.
        for i in range(n):
            with m.Switch(self.log2w):
                for lw in shapes:
                    with m.Case(lw):
                        m.d.comb += self.lanes[i].eq(shifted[i >> lw][i & ((1 << lw) - 1)])
        return m
