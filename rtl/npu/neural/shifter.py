"""The shifter: every lane's input for one coefficient beat, from the input-buffer rows.

Lane ``i`` of a ``W x H`` work unit is position ``(y, x) = (i // W, i % W)``; for a beat at
kernel column ``kx`` it takes element ``x * stride + kx * dilation`` of lane row ``y``'s halo
row (``docs/neural_engine.md``, "Input buffer and shifter").

The input buffer keeps each halo row in *stride order* (``npu_spec.neural.stride_order``):
:class:`StrideOrder` sorts a row by phase ``e % stride`` as it is written, once per row. The
elements a lane row needs at offset ``kx * dilation`` then sit side by side, from entry
``r = stride_rotation(row_values, stride, kx * dilation)`` on, so the read side only shifts:

* lane row ``y``: ``T_y[x] = row_y[r + x]`` for the ``x`` below the widest work unit that has
  a row ``y`` (``log2 row_values`` levels of 2:1 multiplexers);
* lane ``i`` takes ``T_y[x]`` of its row ``y = i // W`` and column ``x = i % W``, a
  multiplexer over the work-unit shapes that put it somewhere.

Both are built for the beats of the layers the core runs, ``npu_spec.neural.shift_beats``
(those that pass the halo check): a beat outside that set belongs to a refused layer, so what
the lanes answer to it is never used. Column ``x`` of lane row ``y`` is read at the rotations
``r`` of the beats of the shapes that have that column and row (for example only ``r = 0``
for a column only the widest shape reads); each level's 2:1 multiplexer is built only where
those rotations differ in the level's bit (:func:`_shift_demand`; widest step first, which
on the presets' rows needs no more multiplexers than any other order). The halo check keeps
every entry a lane reads inside the row (``r + x < row_values``), so nothing wraps around.
:class:`StrideOrder` is built only for the strides some shape can take. The rotation ``r`` is
worked out from the beat's kernel column a cycle early, as its rows are read (``en``), and
registered, so the wide multiplexers' selects come from a register. The shifter is then
combinational, or with ``stages=1`` (``NPUConfig.ne_shift_stages``) has a register after its
first two levels, loaded when ``en`` is high: the lanes then answer the rows of the last
cycle ``en`` was high in.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from npu_spec.neural import shift_beats, stride_order, stride_rotation, work_unit_shapes

from ..lib.arith import narrow_mul

__all__ = ["Shifter", "StrideOrder", "value_bits"]

#: Strides the layer register can hold (3 bits; 0 is refused at the start).
_STRIDES = range(1, 8)


def value_bits(config):
    """Bits the input buffer and shifter keep of an input value: 8 in int8-only builds (the
    MAC array reads the low 8 bits of an int8 operand), else 16."""
    return 16 if config.has_float else 8


def _select_tree(leaves, free):
    """The smallest multiplexer tree that picks ``leaves[s]`` for each select value ``s`` in
    ``leaves`` (values outside it are don't-cares): ``(muxes, select bits used, tree)``, a tree
    being a leaf or ``(bit, tree for bit 0, tree for bit 1)``; fewer select bits win a tie."""
    if len(set(leaves.values())) == 1:
        return 0, frozenset(), next(iter(leaves.values()))
    best = None
    for b in sorted(free):
        sides = [{s: e for s, e in leaves.items() if (s >> b) & 1 == v} for v in (0, 1)]
        if not all(sides):
            continue
        low, high = (_select_tree(side, free - {b}) for side in sides)
        cand = (low[0] + high[0] + 1, low[1] | high[1] | {b}, (b, low[2], high[2]))
        if best is None or (cand[0], len(cand[1])) < (best[0], len(best[1])):
            best = cand
    return best


def _build_tree(tree, select, leaf):
    if not isinstance(tree, tuple):
        return leaf(tree)
    b, low, high = tree
    return Mux(select[b], _build_tree(high, select, leaf), _build_tree(low, select, leaf))


def _shift_demand(reach, order):
    """A barrel shifter's nodes, for output ``x`` reading entry ``x + r`` for every ``r`` in
    ``reach[x]``, with the rotation's bits applied in ``order`` (first to last). Node ``(k,
    j)`` is entry ``j + (r & bits of order[:k])``; ``demand[k][j]`` the rotations it must be
    right for (its consumers'). A node whose rotations all agree on the bit of its level is a
    wire to one input, not a multiplexer."""
    demand = [None] * len(order) + [{x: set(rs) for x, rs in reach.items()}]
    for k in reversed(range(len(order))):
        step = 1 << order[k]
        below = {}
        for j, rs in demand[k + 1].items():
            for r in rs:
                below.setdefault(j + (step if r & step else 0), set()).add(r)
        demand[k] = below
    muxes = sum(len({r & (1 << order[k]) for r in rs}) - 1
                for k in range(len(order)) for rs in demand[k + 1].values())
    return muxes, demand


class StrideOrder(wiring.Component):
    """A halo row into stride order, as the loader writes it into the input buffer.

    Parameters
    ----------
    row_values, bits : int
        Inputs per halo row and bits kept of each.
    strides : iterable of int, optional
        The strides to sort for: those a layer the core runs can have
        (``npu_spec.neural.shift_beats``); 1 to 7 if not given. Any other stride (0, which
        the start check refuses, or one no work-unit shape's halo row fits) fills the entries
        with elements of the row (some twice, some not at all) that no lane reads.

    Members
    -------
    stride : In(3)
        The layer's stride.
    values : In(data.ArrayLayout(bits, row_values))
        The halo row.
    ordered : Out(data.ArrayLayout(bits, row_values))
        Combinational: entry ``p`` is element ``stride_order(row_values, stride)[p]``.
    """

    def __init__(self, row_values, bits=16, strides=None):
        self._row_values = row_values
        self._strides = tuple(sorted(set(_STRIDES if strides is None else strides)))
        if not self._strides or not set(self._strides) <= set(_STRIDES):
            raise ValueError(f"Strides must be some of 1 to 7, not {strides!r}")
        super().__init__({
            "stride":  In(3),
            "values":  In(data.ArrayLayout(bits, row_values)),
            "ordered": Out(data.ArrayLayout(bits, row_values)),
        })

    def elaborate(self, platform):
        m = Module()
        rv = self._row_values
        orders = {s: stride_order(rv, s) for s in self._strides}
        for p in range(rv):
            # A multiplexer tree over the stride's bits with the fewest multiplexers: leaf s
            # is the element stride s puts here; strides not built are don't-cares, and
            # strides that put the same element here share a leaf.
            _, _, tree = _select_tree({s: orders[s][p] for s in self._strides},
                                      frozenset(range(len(self.stride))))
            if isinstance(tree, tuple):
                m.d.comb += self.ordered[p].eq(_build_tree(tree, self.stride,
                                                           lambda e: self.values[e]))
            else:
                # One element for every stride built (entry 0 always): 0 for stride 0, as
                # an output that is a plain copy of an input makes Yosys 0.70's ABC9 stop
                # without a message.
                m.d.comb += self.ordered[p].eq(Mux(self.stride.any(), self.values[tree], 0))
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

    def _reach(self, beats, shapes):
        """``[{x: rotations}]`` per lane row: the rotations ``r`` at which column ``x`` of row
        ``y`` is read (by a shape that has a row ``y`` and a column ``x``), from entry
        ``r + x``, which the halo check keeps inside the row."""
        n, rv = self._config.macs, self._row_values
        reach = [{} for _ in range(self._max_rows)]
        for (lw, s), offsets in beats.items():
            rots = {stride_rotation(rv, s, o) for o in offsets}
            for y in range(n >> lw):
                for x in range(1 << lw):
                    assert max(rots) + x < rv
                    reach[y].setdefault(x, set()).update(rots)
        return reach

    def elaborate(self, platform):
        m = Module()
        n = self._config.macs
        rv = self._row_values
        log2rv = exact_log2(rv)
        shapes = work_unit_shapes(self._config, rv)
        beats = shift_beats(self._config, rv)

        # The first entry the lanes read: a table of (stride, offset mod row_values) over the
        # beats that pass the halo check (any other beat's lanes are never read).
        offset = Signal(max(log2rv, 1))
        m.d.comb += offset.eq(narrow_mul(self.kx, self.dilation, len(offset)))
        r = Signal(max(log2rv, 1))
        with m.Switch(self.stride):
            for s in _STRIDES:
                offsets = set().union(*(o for (_, st), o in beats.items() if st == s))
                rots = {o: stride_rotation(rv, s, o) for o in sorted(offsets)}
                if any(rots.values()):
                    with m.Case(s):
                        with m.Switch(offset):
                            for o, rot in rots.items():
                                if rot:
                                    with m.Case(o):
                                        m.d.comb += r.eq(rot)

        # The rotation of the beat whose rows come next (no reset: data, like the rows).
        r_now = Signal.like(r, name="r_now", reset_less=True)
        with m.If(self.en):
            m.d.sync += r_now.eq(r)
        r = r_now
        # With a register: after the first two levels (the widest), with the rotation the
        # later levels still apply.
        cut = 2 if self._stages else None
        r_late = r
        if self._stages:
            r_late = Signal.like(r, name="r_late", reset_less=True)
            with m.If(self.en):
                m.d.sync += r_late.eq(r)
        # The row entries, made once: nodes are told apart by identity.
        entries = [[self.rows[y][j] for j in range(rv)] for y in range(self._max_rows)]
        shifted = [self._shift_row(m, y, entries[y], reach, r, r_late, log2rv, cut)
                   for y, reach in enumerate(self._reach(beats, shapes))]

        # Lane i: row i >> log2w, column i & (W - 1), for the shapes the build offers (a
        # case over the shapes maps smaller than a multiplexer tree over log2w's bits: the
        # shape gate shares a LUT4 with the last level).
        for i in range(n):
            with m.Switch(self.log2w):
                for lw in shapes:
                    with m.Case(lw):
                        m.d.comb += self.lanes[i].eq(shifted[i >> lw][i & ((1 << lw) - 1)])
        return m

    def _shift_row(self, m, y, entries, reach, r, r_late, levels, cut):
        """Lane row ``y`` shifted: ``{x: entry x + r of the row}`` for the columns in
        ``reach``, each right for the rotations ``reach[x]`` only (``_shift_demand``)."""
        order = tuple(reversed(range(levels)))      # widest step first
        _, demand = _shift_demand(reach, order)
        if cut is not None:
            cut = min(cut, levels)      # rows of fewer than 4 entries: after the last level
        sig = {j: entries[j] for j in demand[0]}
        if cut == 0:
            sig = self._register(m, y, sig)
        for k, b in enumerate(order):
            step = 1 << b
            late = cut is not None and k >= cut
            nxt = {}
            for j, rs in demand[k + 1].items():
                sides = {bool(r_ & step) for r_ in rs}
                if len(sides) == 2:
                    v = Signal(self._bits, name=f"rot_r{y}_l{k}_{j}")
                    m.d.comb += v.eq(Mux((r_late if late else r)[b], sig[j + step], sig[j]))
                    nxt[j] = v
                else:
                    nxt[j] = sig[j + step] if True in sides else sig[j]
            sig = nxt
            if k + 1 == cut:
                sig = self._register(m, y, sig)
        return sig

    def _register(self, m, y, sig):
        """The stage register: one per distinct node (data, no reset: the sequencer's valid
        bits qualify it)."""
        held, out = {}, {}
        for j, v in sig.items():
            if id(v) not in held:
                held[id(v)] = Signal(self._bits, name=f"pipe_r{y}_{j}", reset_less=True)
                with m.If(self.en):
                    m.d.sync += held[id(v)].eq(v)
            out[j] = held[id(v)]
        return out
