"""The shifter: every lane's input for one coefficient beat, from the input-buffer rows.

Lane ``i`` of a ``W x H`` work unit is position ``(y, x) = (i // W, i % W)``; for a beat at
kernel column ``kx`` it takes element ``x * stride + kx * dilation`` of lane row ``y``'s halo
row. The selection is shared per lane row, so its cost grows with ``max_rows x row_values``
rather than ``macs x row_values`` (``docs/neural_engine.md``, "Input buffer and shifter"):

* rotator: ``T_r[j] = row_r[(j + kx * dilation) mod row_values]`` (``log2 row_values`` levels
  of 2:1 multiplexers);
* stride: ``U_r[x] = T_r[(x * stride) mod row_values]`` (one multiplexer over the strides);
* lane ``i`` takes ``U_r[x]`` of its row ``r = i // W`` and column ``x = i % W``, a multiplexer
  over the work-unit shapes that put it somewhere.

The halo check at the start of a layer keeps every index below ``row_values``, so nothing
wraps around, and a column's stride multiplexer has only the strides that keep it inside the
row (other values give 0; no layer that passes the check uses them). The shifter is
combinational.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from npu_spec.neural import work_unit_shapes

from ..lib.arith import narrow_mul

__all__ = ["Shifter", "value_bits"]


def value_bits(config):
    """Bits the input buffer and shifter keep of an input value: 8 in int8-only builds (the
    MAC array reads the low 8 bits of an int8 operand), else 16."""
    return 16 if config.has_float else 8


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

    Members
    -------
    rows : In(data.ArrayLayout(data.ArrayLayout(bits, row_values), max_rows))
        The halo row of each lane row.
    kx : In(4)
        Kernel column of the beat.
    dilation, stride : In(3)
        The layer's dilation and stride.
    log2w : In(4)
        The work-unit shape: ``W = 2**log2w``.
    lanes : Out(data.ArrayLayout(bits, macs))
        Combinational: each lane's input.
    """

    def __init__(self, config, max_rows, row_values, bits=16):
        self._config = config
        self._max_rows = max_rows
        self._row_values = row_values
        self._bits = bits
        super().__init__({
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
        strides = 1 << len(self.stride)
        cols = min(n, rv)
        offset = Signal(16)
        m.d.comb += offset.eq(narrow_mul(self.kx, self.dilation, len(offset)))

        shifted = []
        for r in range(self._max_rows):
            # Rotator; each level in named signals (an expression used twice would be copied).
            t = [self.rows[r][j] for j in range(rv)]
            for b in range(log2rv):
                nxt = [Signal(self._bits, name=f"rot_r{r}_l{b}_{j}") for j in range(rv)]
                m.d.comb += [nxt[j].eq(Mux(offset[b], t[(j + (1 << b)) % rv], t[j]))
                             for j in range(rv)]
                t = nxt
            # Stride: column x takes element x * stride. The halo check keeps x * stride below
            # row_values for every column a layer uses, so column x needs only those strides
            # (column 0 none, the columns from row_values / 2 on only stride 1).
            u = []
            for x in range(cols):
                ux = Signal(self._bits, name=f"shift_r{r}_x{x}")
                if x == 0:
                    m.d.comb += ux.eq(t[0])
                else:
                    with m.Switch(self.stride):
                        for s in range(1, min(strides - 1, (rv - 1) // x) + 1):
                            with m.Case(s):
                                m.d.comb += ux.eq(t[x * s])
                u.append(ux)
            shifted.append(u)

        # Lane i: row i >> log2w, column i & (W - 1), for the shapes the build offers.
        for i in range(n):
            with m.Switch(self.log2w):
                for lw in work_unit_shapes(self._config, rv):
                    with m.Case(lw):
                        m.d.comb += self.lanes[i].eq(shifted[i >> lw][i & ((1 << lw) - 1)])
        return m
