"""The planar engine: elementwise, pooling and reduction over ``P * P`` lanes.

Datapath (``docs/planar.md`` has the full description and the golden contract):

* **first format converter** (INT8 / binary16 -> binary32, per lane);
* **lane pipeline** (per lane): a binary32 add/max/min/compare stage, a binary32 multiplier, a
  binary32 adder (9 stages). Every elementwise mode is one pass through it; pooling results
  pass through it to be multiplied by ``1/n``;
* **line buffer** (input rows): a ring of ``NB`` banks (``NB`` a prime above ``L`` and the
  largest stride), so that a beat's ``L`` consecutive elements and a window step's ``L``
  elements ``sx`` apart always fall in different banks; holds the few input rows the
  horizontal filter reads (pooling) or a broadcast vector (elementwise);
* **horizontal filter** (pooling, ``FL = K * L`` lanes, ``K = config.planar_pool_beats``):
  folds each window row over ``kx`` with a binary32 add/max/min pipe per lane, interleaving
  three beats so that the pipe accepts one step per cycle; its results go to the **H ring**
  (the line buffer between the filters, ``FL`` elements a word);
* **vertical filter** (pooling, ``FL`` lanes): folds the H ring rows of each window over
  ``ky`` the same way, into a **result queue** whose entries leave as up to ``K`` beats of
  ``L``; loader, horizontal and vertical filter run at the same time;
* **reduction tree** (``L -> L/2 -> ... -> 1``, one beat per cycle) and the **retention
  registers** (three, one per cycle of the accumulator latency);
* **post-processor** (scale multiply, then square root / reciprocal);
* **second format converter** (binary32 -> INT8 / binary16).

The engine processes ``L = P * P`` elements per beat (``P = config.planar_lanes``), a beat being
``L`` consecutive elements of one row of one channel (see :func:`beat_layout`).
"""

from functools import lru_cache

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.data import ArrayLayout, StructLayout
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..lib.fp32 import FP32AddPipe
from ..lib.fp32mul import FP32Mul
from npu_spec.config import NPUConfig
from npu_spec.planar import h_ring_depth, line_buffer_banks, recip_bits
from npu_spec.formats import F32_NEG_INF as F32_NINF
from npu_spec.formats import F32_NEG_ZERO as F32_NZ
from npu_spec.formats import F32_ONE
from npu_spec.formats import F32_POS_INF as F32_PINF
from ..lib.fp32 import MacOp
from .convert import from_f32, to_f32
from .layouts import (
    MAX_WINDOW,
    SHAPE_BITS,
    WINDOW_BITS,
    Axis,
    Bcast,
    EltOp,
    Error,
    Mode,
    PoolOp,
    PostFn,
    RedOp,
    beat_layout,
    config_layout,
)
from .postproc import PostProcessor

__all__ = ["LANE_LATENCY", "PlanarEngine", "div_params"]


#: Cycles from the lane pipeline's input register to its output register.
LANE_LATENCY = FP32AddPipe.LATENCY + FP32Mul.LATENCY + FP32AddPipe.LATENCY + 1


@lru_cache(maxsize=None)
def _div_params(nbits, divisors):
    xs = range(1 << nbits)
    s = (max(divisors) - 1).bit_length()
    while True:
        ms = {d: -(-(1 << s) // d) for d in divisors}
        if all((x * ms[d]) >> s == x // d for d in divisors for x in xs):
            return s, ms
        s += 1


def div_params(nbits, divisors):
    """``(s, {d: M})``: ``x // d == (x * M) >> s`` for every ``x < 2**nbits`` and every
    divisor ``d`` (checked exhaustively), so that division by a constant, or by a small field
    through a table of ``M``, is a multiplication instead of a divider."""
    s, ms = _div_params(nbits, tuple(sorted(set(divisors))))
    return s, dict(ms)


def _next_group(m, desc, layout, succ, name):
    """The last valid of a filter's three beat descriptors, and the three that follow it
    (the group is valid only if the current one was full)."""
    last = Signal(layout, name=f"{name}_last")
    m.d.comb += last.eq(Mux(desc[2].valid, desc[2], Mux(desc[1].valid, desc[1], desc[0])))
    nxt = succ(last, f"{name}_next")
    first = Signal(layout, name=f"{name}0")
    m.d.comb += [first.eq(nxt), first.valid.eq(nxt.valid & desc[2].valid)]
    second = succ(first, f"{name}1")
    return last, (first, second, succ(second, f"{name}2"))


def _delay(m, sig, n, en, name):
    """``n`` registers after ``sig`` (advancing with ``en``); returns the list of stages."""
    stages = []
    prev = sig
    for k in range(n):
        s = Signal.like(sig, name=f"{name}_d{k + 1}")
        if en is None:
            m.d.sync += s.eq(prev)
        else:
            with m.If(en):
                m.d.sync += s.eq(prev)
        stages.append(s)
        prev = s
    return stages


class PlanarEngine(wiring.Component):
    """The planar engine.

    Parameters
    ----------
    config : NPUConfig
        ``planar_lanes`` (P) must be a power of two; the engine has ``L = P * P`` lanes and
        pooling filters of ``planar_pool_beats * L`` lanes.
    plane_depth : int
        Elements of the line buffer (a pooling plane ``H * W`` or a broadcast vector must fit).

    Members
    -------
    cfg : In(config_layout())
        Task configuration (the register map's fields), sampled on ``start``.
    start : In(1)
        Start a task (ignored while ``busy``).
    busy : Out(1)
        A task is running.
    done : Out(1)
        One-cycle pulse at the end of a task (also after a rejected one).
    error : Out(Error)
        Status of the last task (``NONE`` if it ran); rejected tasks consume no beat.
    a, b, c : In(stream.Signature(beat_layout(L)))
        Source operands A, B (or a broadcast vector), C.
    out : Out(stream.Signature(beat_layout(L)))
        Results.
    """

    def __init__(self, config, *, plane_depth=1024):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        p = config.planar_lanes
        if p & (p - 1):
            raise ValueError(f"planar_lanes must be a power of two, not {p!r}")
        if not isinstance(plane_depth, int) or plane_depth < 16:
            raise ValueError(f"plane_depth must be an integer of at least 16, "
                             f"not {plane_depth!r}")
        self._config = config
        self._lanes = p * p
        self._plane_depth = plane_depth
        beat = beat_layout(self._lanes)
        super().__init__({
            "cfg":   In(config_layout()),
            "start": In(1),
            "busy":  Out(1),
            "done":  Out(1),
            "error": Out(Error),
            "a":     In(stream.Signature(beat)),
            "b":     In(stream.Signature(beat)),
            "c":     In(stream.Signature(beat)),
            "out":   Out(stream.Signature(beat)),
        })

    @property
    def config(self):
        return self._config

    @property
    def lanes(self):
        return self._lanes

    @property
    def plane_depth(self):
        return self._plane_depth

    def elaborate(self, platform):
        m = Module()
        L = self._lanes
        lg = L.bit_length() - 1
        D = self._plane_depth
        K = self._config.planar_pool_beats
        FL = K * L            # lanes of the pooling filters
        NB, BD = line_buffer_banks(FL, D)
        DR = NB * BD
        HD = h_ring_depth(L, D)
        HDB = HD.bit_length() - 1
        task = Signal(config_layout())
        mode = task.mode
        is_elt = mode == Mode.ELTWISE
        is_pool = mode == Mode.POOL
        is_red = mode == Mode.REDUCE
        # Reductions across channels (one result per pixel) accumulate a plane in the H ring
        # through the lane pipeline; the others go through the reduction tree.
        is_cred = Signal()
        is_tree = Signal()
        m.d.comb += [is_cred.eq(is_red & (task.axis == Axis.CHANNEL)),
                     is_tree.eq(is_red & (task.axis != Axis.CHANNEL))]

        # ---------------------------------------------------------------- derived shapes
        C, H, W = task.channels, task.height, task.width
        wb = Signal(13)       # beats per row
        m.d.comb += wb.eq((W + (L - 1)) >> lg)
        beats_plane = Signal(26)
        beats_group = Signal(40)
        plane_elems = Signal(24)
        ow = Signal(13)       # output columns of a pooling task
        pool_rows = Signal(24)  # min(C H, 3) W: input rows a horizontal group may need
        pool_hwords = Signal(24)  # min(H, kh + 2 sy) ceil(OW / FL): H ring words a vertical
                                  # group may need
        lsx = Signal(16)     # FL * sx: window columns between two H beats
        lsx_beat = Signal(16)  # L * sx: between two output beats

        def has_window(x):
            """A window whose first column is ``x`` ends within the padded row."""
            return x + task.kw <= W + task.px

        # ---------------------------------------------------------------- error check
        arity = Signal(2)
        m.d.comb += arity.eq(Mux(task.op >= EltOp.FMA, 3, Mux(task.op >= EltOp.ADD, 2, 1)))
        err = Signal(Error)
        bad_mode = Signal()
        bad_shape = Signal()
        bad_window = Signal()
        bad_fmt = Signal()
        vec_len = Signal(12)
        with m.Switch(task.bcast):
            with m.Case(Bcast.CHANNEL):
                m.d.comb += vec_len.eq(C)
            with m.Case(Bcast.ROW):
                m.d.comb += vec_len.eq(W)
            with m.Case(Bcast.COLUMN):
                m.d.comb += vec_len.eq(H)
        uses_vec = is_elt & (arity >= 2) & (task.bcast >= Bcast.CHANNEL)
        m.d.comb += [
            bad_mode.eq((mode == 3)
                        | (is_elt & ((task.op > EltOp.ADDMUL) | (task.bcast > Bcast.COLUMN)))
                        | (is_pool & (task.op > PoolOp.AVG))
                        | (is_red & ((task.op > RedOp.MIN) | (task.pre > EltOp.SQUARE)
                                     | (task.axis > Axis.CHANNEL)))
                        | (is_cred & (task.post != PostFn.NONE))),
            bad_fmt.eq(Const(int(not self._config.has_fp16))
                       & (task.in_fmt | task.out_fmt)),
            bad_shape.eq((C == 0) | (H == 0) | (W == 0)
                         | (uses_vec & (vec_len > D))
                         | (is_cred & (beats_plane > HD))
                         | (is_pool & ~bad_window & ((pool_rows > D)
                                                      | (pool_hwords + 2 > HD)))),
            bad_window.eq(is_pool & (
                (task.kh == 0) | (task.kw == 0) | (task.kh > MAX_WINDOW)
                | (task.kw > MAX_WINDOW) | (task.sy == 0) | (task.sx == 0)
                | (task.py >= task.kh) | (task.px >= task.kw)
                | (task.kh > H + 2 * task.py) | (task.kw > W + 2 * task.px))),
        ]
        with m.If(bad_mode):
            m.d.comb += err.eq(Error.BAD_MODE)
        with m.Elif(bad_fmt):
            m.d.comb += err.eq(Error.BAD_FORMAT)
        with m.Elif(bad_shape):
            m.d.comb += err.eq(Error.BAD_SHAPE)
        with m.Elif(bad_window):
            m.d.comb += err.eq(Error.BAD_WINDOW)

        # ---------------------------------------------------------------- lane pipeline
        lane_en = Signal()
        in_valid = Signal()
        in_op = Signal(4)
        in_mask = Signal(L)
        in_a = [Signal(32, name=f"in_a{i}") for i in range(L)]
        in_b = [Signal(32, name=f"in_b{i}") for i in range(L)]
        in_c = [Signal(32, name=f"in_c{i}") for i in range(L)]
        s0_valid = Signal()
        s0_op = Signal(4)
        s0_mask = Signal(L)
        s0_a = [Signal(32, name=f"s0_a{i}") for i in range(L)]
        s0_b = [Signal(32, name=f"s0_b{i}") for i in range(L)]
        s0_c = [Signal(32, name=f"s0_c{i}") for i in range(L)]
        s0_vec = Signal()     # operand B comes from the line buffer
        s0_scalar = Signal()  # operand B is the SCALAR register
        in_vec = Signal()
        in_scalar = Signal()
        with m.If(lane_en):
            m.d.sync += [s0_valid.eq(in_valid), s0_op.eq(in_op), s0_mask.eq(in_mask),
                         s0_vec.eq(in_vec), s0_scalar.eq(in_scalar)]
            m.d.sync += [s.eq(v) for s, v in zip(s0_a + s0_b + s0_c, in_a + in_b + in_c)]

        # Line buffer: NB banks of BD words (one write and one read port each), a ring of
        # DR = NB * BD >= plane_depth elements; lane i's read data is ``lane_rd[i]``.
        banks = []
        for b in range(NB):
            bank = Memory(shape=32, depth=BD, init=[])
            m.submodules[f"line_buffer{b}"] = bank
            banks.append(bank)
        wports = [bank.write_port() for bank in banks]
        rports = [bank.read_port() for bank in banks]
        lane_rd = [Signal(32, name=f"lane_rd{i}") for i in range(FL)]

        v_d = _delay(m, s0_valid, LANE_LATENCY - 1, lane_en, "v")
        mask_d = _delay(m, s0_mask, LANE_LATENCY - 1, lane_en, "mask")
        lo_valid = Signal()
        lo_mask = Signal(L)
        with m.If(lane_en):
            m.d.sync += [lo_valid.eq(v_d[-1]), lo_mask.eq(mask_d[-1])]
        lo_val = []
        for i in range(L):
            b_eff = Signal(32, name=f"b_eff{i}")
            m.d.comb += b_eff.eq(Mux(s0_vec, lane_rd[i],
                                     Mux(s0_scalar, task.scalar, s0_b[i])))
            A, B, Cc = s0_a[i], b_eff, s0_c[i]
            x1 = Signal(32, name=f"x1_{i}")
            x2 = Signal(32, name=f"x2_{i}")
            pre_op = Signal(MacOp, name=f"pre_op{i}")
            m2 = Signal(32, name=f"m2_{i}")
            sq = Signal(name=f"sq{i}")
            a2 = Signal(32, name=f"a2_{i}")
            m.d.comb += [x1.eq(A), x2.eq(F32_NZ), pre_op.eq(MacOp.MAC), m2.eq(F32_ONE),
                         a2.eq(F32_NZ)]
            with m.Switch(s0_op):
                with m.Case(EltOp.RELU):
                    m.d.comb += [x2.eq(0), pre_op.eq(MacOp.MAX)]
                with m.Case(EltOp.ABS):
                    m.d.comb += x1.eq(A & 0x7FFF_FFFF)
                with m.Case(EltOp.NEG):
                    m.d.comb += x1.eq(A ^ F32_NZ)
                with m.Case(EltOp.SQUARE):
                    m.d.comb += sq.eq(1)
                with m.Case(EltOp.GAIN_BIAS):
                    m.d.comb += [m2.eq(task.scale), a2.eq(task.bias)]
                with m.Case(EltOp.ADD):
                    m.d.comb += x2.eq(B)
                with m.Case(EltOp.SUB):
                    m.d.comb += x2.eq(B ^ F32_NZ)
                with m.Case(EltOp.MUL):
                    m.d.comb += m2.eq(B)
                with m.Case(EltOp.MAX):
                    m.d.comb += [x2.eq(B), pre_op.eq(MacOp.MAX)]
                with m.Case(EltOp.MIN):
                    m.d.comb += [x2.eq(B), pre_op.eq(MacOp.MIN)]
                with m.Case(EltOp.CMP):
                    # The adder's compare gives +1 when its b exceeds its a.
                    m.d.comb += [x1.eq(B), x2.eq(A), pre_op.eq(MacOp.CMP)]
                with m.Case(EltOp.FMA):
                    m.d.comb += [x1.eq(B), m2.eq(Cc), a2.eq(A)]
                with m.Case(EltOp.ADDMUL):
                    m.d.comb += [x2.eq(B), m2.eq(Cc)]

            pre = FP32AddPipe()
            mul = FP32Mul()
            post = FP32AddPipe()
            m.submodules[f"pre{i}"] = pre
            m.submodules[f"mul{i}"] = mul
            m.submodules[f"post{i}"] = post
            m2_d = _delay(m, m2, FP32AddPipe.LATENCY, lane_en, f"m2_{i}")
            sq_d = _delay(m, sq, FP32AddPipe.LATENCY, lane_en, f"sq{i}")
            a2_d = _delay(m, a2, FP32AddPipe.LATENCY + FP32Mul.LATENCY, lane_en, f"a2_{i}")
            m.d.comb += [
                pre.en.eq(lane_en), pre.a.eq(x1), pre.b.eq(x2), pre.op.eq(pre_op),
                mul.en.eq(lane_en), mul.a.eq(pre.result),
                mul.b.eq(Mux(sq_d[-1], pre.result, m2_d[-1])),
                post.en.eq(lane_en), post.a.eq(mul.result), post.b.eq(a2_d[-1]),
                post.op.eq(MacOp.MAC),
            ]
            lv = Signal(32, name=f"lo_val{i}")
            with m.If(lane_en):
                m.d.sync += lv.eq(post.result)
            lo_val.append(lv)

        # ---------------------------------------------------------------- counters
        cnt_c = Signal(12)
        cnt_y = Signal(12)
        cnt_xb = Signal(13)
        beat_mask = Signal(L)
        for i in range(L):
            m.d.comb += beat_mask[i].eq(Cat(Const(i, lg), cnt_xb) < W)
        last_x = cnt_xb == wb - 1
        last_y = cnt_y == H - 1
        last_c = cnt_c == C - 1

        # The counters' values after the current beat (raster order: beat, row, channel).
        adv_c = Signal.like(cnt_c)
        adv_y = Signal.like(cnt_y)
        adv_xb = Signal.like(cnt_xb)
        m.d.comb += [adv_xb.eq(Mux(last_x, 0, cnt_xb + 1)),
                     adv_y.eq(Mux(last_x, Mux(last_y, 0, cnt_y + 1), cnt_y)),
                     adv_c.eq(Mux(last_x & last_y, cnt_c + 1, cnt_c))]

        def advance_counters():
            m.d.sync += [cnt_xb.eq(adv_xb), cnt_y.eq(adv_y), cnt_c.eq(adv_c)]

        # ---------------------------------------------------------------- first converter
        conv_a = [to_f32(m, self.a.payload.data[i], task.in_fmt, f"ia{i}") for i in range(L)]
        conv_b = [to_f32(m, self.b.payload.data[i], task.in_fmt, f"ib{i}") for i in range(L)]
        conv_c = [to_f32(m, self.c.payload.data[i], task.in_fmt, f"ic{i}") for i in range(L)]

        # ---------------------------------------------------------------- loader
        # Writes rows of ``ld_len`` elements (beats as in the streams) from stream A (pooling
        # planes) or B (broadcast vector) into the line buffer, a ring of ``DR`` elements:
        # element ``n`` (counted from the start of the task) goes to ring address ``n mod DR``,
        # that is bank ``n mod NB``, word ``(n div NB) mod BD``. ``L < NB`` consecutive
        # elements are in different banks, so a beat is written in one cycle.
        ld_x = Signal(13)
        ld_row = Signal(12)
        ld_c = Signal(12)
        ld_rows = Signal(12)
        ld_len = Signal(12)
        ld_planes = Signal(12)
        ld_all = Signal()      # every beat of the task's loads has been taken
        ld_src_b = Signal()
        ld_accept = Signal()   # a beat of the source stream is taken this cycle
        ld_q = Signal(range(BD))
        ld_r = Signal(range(NB))
        ld_count = Signal(40)  # elements written since the start of the task
        ld_left = Signal(13)
        m.d.comb += ld_left.eq(ld_len - ld_x)
        ld_n = Signal(range(L + 1))  # elements of the row in this beat
        m.d.comb += ld_n.eq(Mux(ld_left >= L, L, ld_left))
        ld_src = Array(Mux(ld_src_b, conv_b[i], conv_a[i]) for i in range(L))
        for b in range(NB):
            j = Signal(range(NB), name=f"ld_j{b}")
            m.d.comb += j.eq(Mux(ld_r <= b, b - ld_r, b + NB - ld_r))
            q = Signal(range(BD + 1), name=f"ld_q{b}")
            m.d.comb += q.eq(ld_q + (ld_r > b))
            m.d.comb += [wports[b].addr.eq(Mux(q == BD, 0, q)),
                         wports[b].data.eq(ld_src[j[:max(1, lg)] if L > 1 else 0]),
                         wports[b].en.eq(ld_accept & (j < ld_n))]
        ld_r_next = Signal(range(NB + L + 1))
        m.d.comb += ld_r_next.eq(ld_r + ld_n)
        ld_done = Signal()
        with m.If(ld_accept):
            m.d.sync += ld_count.eq(ld_count + ld_n)
            with m.If(ld_r_next >= NB):
                m.d.sync += [ld_r.eq(ld_r_next - NB), ld_q.eq(Mux(ld_q == BD - 1, 0, ld_q + 1))]
            with m.Else():
                m.d.sync += ld_r.eq(ld_r_next)
            with m.If(ld_left <= L):
                m.d.sync += ld_x.eq(0)
                with m.If(ld_row == ld_rows - 1):
                    m.d.sync += [ld_row.eq(0), ld_c.eq(ld_c + 1)]
                    with m.If(ld_c == ld_planes - 1):
                        m.d.comb += ld_done.eq(1)
                        m.d.sync += ld_all.eq(1)
                with m.Else():
                    m.d.sync += ld_row.eq(ld_row + 1)
            with m.Else():
                m.d.sync += ld_x.eq(ld_x + L)

        def start_loader(src_b, planes, rows, length):
            m.d.sync += [ld_src_b.eq(src_b), ld_planes.eq(planes), ld_rows.eq(rows),
                         ld_len.eq(length), ld_x.eq(0), ld_row.eq(0), ld_c.eq(0),
                         ld_q.eq(0), ld_r.eq(0), ld_count.eq(0), ld_all.eq(0)]

        # Reduction operation and its identity (tree, retention registers, channel
        # accumulator).
        red_op = Signal(MacOp)
        red_ident = Signal(32)
        with m.Switch(task.op):
            with m.Case(RedOp.MAX):
                m.d.comb += [red_op.eq(MacOp.MAX), red_ident.eq(F32_NINF)]
            with m.Case(RedOp.MIN):
                m.d.comb += [red_op.eq(MacOp.MIN), red_ident.eq(F32_PINF)]
            with m.Default():
                m.d.comb += [red_op.eq(MacOp.MAC), red_ident.eq(F32_NZ)]

        # ---------------------------------------------------------------- pooling
        # Separable: the horizontal filter folds each input row over kx into "H rows" of OW
        # elements (one H beat = L consecutive output columns), written to the H ring; the
        # vertical filter folds, for each output beat, the H beats of its kh rows over ky.
        # Both walk groups of three beats and interleave their steps (beat 0, 1, 2 of one
        # step, then the next step) so that each lane's add/max/min pipe takes one step per
        # cycle; they run at the same time as the loader and as each other.
        OWB = Signal(12)      # beats per output row: ceil(OW / L)
        HOWB = Signal(24)     # H * OWB
        khOWB = Signal(16)
        syOWB = Signal(16)
        pyOWB = Signal(16)
        CH = Signal(24)       # C * H rows in the task

        # -- horizontal filter: descriptors of H beats (global row ``row`` of the task, first
        # window column of lane 0 ``gxb``, ring address ``ring`` and element count ``glin`` of
        # the row's first element, H word index ``hw``).
        hdesc_layout = StructLayout({"valid": 1, "row": 24, "gxb": signed(16),
                                     "ring": range(DR), "glin": 40, "hw": 40})

        def hsucc(d, name):
            n = Signal(hdesc_layout, name=name)
            gx_n = Signal(signed(17), name=f"{name}_gx")
            ring_n = Signal(range(2 * DR), name=f"{name}_ring")
            m.d.comb += [gx_n.eq(d.gxb + lsx), ring_n.eq(d.ring + W)]
            m.d.comb += n.hw.eq(d.hw + 1)
            with m.If(has_window(gx_n)):
                m.d.comb += [n.valid.eq(d.valid), n.row.eq(d.row), n.gxb.eq(gx_n),
                             n.ring.eq(d.ring), n.glin.eq(d.glin)]
            with m.Else():
                m.d.comb += [n.valid.eq(d.valid & (d.row + 1 < CH)), n.row.eq(d.row + 1),
                             n.gxb.eq(-task.px),
                             n.ring.eq(Mux(ring_n >= DR, ring_n - DR, ring_n)),
                             n.glin.eq(d.glin + W)]
            return n

        hdesc = [Signal(hdesc_layout, name=f"hdesc{p}") for p in range(3)]
        h_kx = Signal(4)
        h_phi = Signal(2)
        h_on = Signal()
        h_issue = Signal()
        hcur = Signal(hdesc_layout)
        m.d.comb += hcur.eq(Array(hdesc)[h_phi])
        h_ev = Signal(FL)
        for i in range(FL):
            ix0 = Signal(signed(18), name=f"hix0_{i}")
            m.d.comb += ix0.eq(hcur.gxb + task.sx * i)
            ix = Signal(signed(18), name=f"hix_{i}")
            m.d.comb += ix.eq(ix0 + h_kx)
            has = hcur.valid & has_window(ix0)
            m.d.comb += h_ev[i].eq((ix >= 0) & (ix < W) & has)
        h_last, (h0, h1, h2) = _next_group(m, hdesc, hdesc_layout, hsucc, "h")
        hf0 = Signal(hdesc_layout)
        m.d.comb += [hf0.valid.eq(1), hf0.row.eq(0), hf0.gxb.eq(-task.px), hf0.ring.eq(0),
                     hf0.glin.eq(0), hf0.hw.eq(0)]
        hf1 = hsucc(hf0, "hf1")
        hf2 = hsucc(hf1, "hf2")

        # -- vertical filter: descriptors of output beats (first window row ``oyb``, first
        # window column of lane 0 ``gxb``, beat ``ob`` in the output row, H word index
        # ``roww`` of H row ``oyb``'s first beat; groups stay within a plane).
        vdesc_layout = StructLayout({"valid": 1, "oyb": signed(14), "gxb": signed(16),
                                     "ob": 12, "roww": signed(42)})

        def vsucc(d, name):
            n = Signal(vdesc_layout, name=name)
            oy_n = Signal(signed(15), name=f"{name}_oy")
            m.d.comb += oy_n.eq(d.oyb + task.sy)
            with m.If(d.ob + 1 < OWB):
                m.d.comb += [n.valid.eq(d.valid), n.oyb.eq(d.oyb), n.gxb.eq(d.gxb + lsx),
                             n.ob.eq(d.ob + 1), n.roww.eq(d.roww)]
            with m.Else():
                m.d.comb += [n.valid.eq(d.valid & (oy_n + task.kh <= H + task.py)),
                             n.oyb.eq(oy_n), n.gxb.eq(-task.px), n.ob.eq(0),
                             n.roww.eq(d.roww + syOWB)]
            return n

        def vfirst(wbase, name):
            n = Signal(vdesc_layout, name=name)
            m.d.comb += [n.valid.eq(1), n.oyb.eq(-task.py), n.gxb.eq(-task.px), n.ob.eq(0),
                         n.roww.eq(wbase - pyOWB)]
            return n

        vdesc = [Signal(vdesc_layout, name=f"vdesc{p}") for p in range(3)]
        v_ky = Signal(4)
        v_phi = Signal(2)
        v_kyW = Signal(16)    # ky * OWB
        v_on = Signal()
        v_issue = Signal()
        v_pwb = Signal(40)    # H word index of the walked plane's first H beat
        vcur = Signal(vdesc_layout)
        m.d.comb += vcur.eq(Array(vdesc)[v_phi])
        v_iy = Signal(signed(15))
        m.d.comb += v_iy.eq(vcur.oyb + v_ky)
        v_ev = Signal()
        m.d.comb += v_ev.eq(vcur.valid & (v_iy >= 0) & (v_iy < H))
        v_last, (v0, v1, v2) = _next_group(m, vdesc, vdesc_layout, vsucc, "v")
        vf0 = vfirst(v_pwb + HOWB, "vf0")
        vf1 = vsucc(vf0, "vf1")
        vf2 = vsucc(vf1, "vf2")
        vi0 = vfirst(Const(0, 40), "vi0")
        vi1 = vsucc(vi0, "vi1")
        vi2 = vsucc(vi1, "vi2")

        # -- flow control (counts since the start of the task: elements loaded, H beats
        # written). A group starts when its last beat's inputs are there and its results have
        # room; the loader (H filter) never overwrites what the H (V) filter's group still
        # reads.
        h_count = Signal(40)
        v_hi = Signal(signed(43))
        m.d.comb += v_hi.eq(v_last.roww + khOWB)
        v_end = Signal(41)
        m.d.comb += v_end.eq(v_pwb + HOWB)
        v_need = Mux(v_hi > v_end, v_end, v_hi)
        v_ready = h_count >= v_need
        v_low = Signal(signed(43))
        m.d.comb += v_low.eq(Mux(vdesc[0].roww < v_pwb, v_pwb, vdesc[0].roww))
        h_ready = ((ld_count >= h_last.glin + W)
                   & (~v_on | (h_last.hw < v_low + HD)))
        # The H filter reads a step one cycle after its issue, so the loader keeps the rows of
        # the H filter's group of one cycle before (``h_glin``, ``h_on_d``) as well.
        ld_space = Signal()
        h_glin = Signal.like(hdesc[0].glin)
        h_on_d = Signal()
        m.d.sync += [h_glin.eq(hdesc[0].glin), h_on_d.eq(h_on)]
        m.d.comb += ld_space.eq(~is_pool | ~(h_on | h_on_d)
                                | (ld_count + ld_n <= Mux(h_on_d, h_glin, hdesc[0].glin) + DR))

        def start_walk():
            m.d.sync += [hdesc[0].eq(hf0), hdesc[1].eq(hf1), hdesc[2].eq(hf2),
                         h_kx.eq(0), h_phi.eq(0), h_on.eq(1), h_count.eq(0),
                         vdesc[0].eq(vi0), vdesc[1].eq(vi1), vdesc[2].eq(vi2), v_pwb.eq(0),
                         v_ky.eq(0), v_phi.eq(0), v_kyW.eq(0), v_on.eq(1)]

        h_start = (h_kx == 0) & (h_phi == 0)
        m.d.comb += h_issue.eq(is_pool & h_on & (~h_start | h_ready))
        with m.If(h_issue):
            m.d.sync += h_phi.eq(Mux(h_phi == 2, 0, h_phi + 1))
            with m.If(h_phi == 2):
                with m.If(h_kx == task.kw - 1):
                    m.d.sync += h_kx.eq(0)
                    with m.If(h0.valid):
                        m.d.sync += [hdesc[0].eq(h0), hdesc[1].eq(h1), hdesc[2].eq(h2)]
                    with m.Else():
                        m.d.sync += h_on.eq(0)
                with m.Else():
                    m.d.sync += h_kx.eq(h_kx + 1)

        v_start = (v_ky == 0) & (v_phi == 0)
        q_room = Signal()     # the result queue has room for a group's three results
        m.d.comb += v_issue.eq(is_pool & v_on & (~v_start | (v_ready & q_room)))
        with m.If(v_issue):
            m.d.sync += v_phi.eq(Mux(v_phi == 2, 0, v_phi + 1))
            with m.If(v_phi == 2):
                with m.If(v_ky == task.kh - 1):
                    m.d.sync += [v_ky.eq(0), v_kyW.eq(0)]
                    with m.If(v0.valid):
                        m.d.sync += [vdesc[0].eq(v0), vdesc[1].eq(v1), vdesc[2].eq(v2)]
                    with m.Elif(cnt_c == C - 1):
                        m.d.sync += v_on.eq(0)
                    with m.Else():
                        m.d.sync += [cnt_c.eq(cnt_c + 1), v_pwb.eq(v_pwb + HOWB),
                                     vdesc[0].eq(vf0), vdesc[1].eq(vf1), vdesc[2].eq(vf2)]
                with m.Else():
                    m.d.sync += [v_ky.eq(v_ky + 1), v_kyW.eq(v_kyW + OWB)]

        # -- H ring: HD words of L elements (one write port for the H filter's results, one
        # read port for the V filter; word n of the task at address n mod HD).
        hring = Memory(shape=ArrayLayout(32, FL), depth=HD, init=[])
        m.submodules.h_ring = hring
        hr_w = hring.write_port()
        hr_r = hring.read_port()
        v_word = Signal(signed(43))
        m.d.comb += v_word.eq(vcur.roww + v_kyW + vcur.ob)

        # -- channel accumulator (reduction across channels): the H ring holds a plane of
        # partial results, word k = beat k of the plane. Each beat of pre(A) leaving the lane
        # pipeline reads its word (one cycle), is combined with it in the horizontal filter's
        # pipes (three cycles) and written back. A beat whose word is still in flight (planes
        # of fewer than five beats) holds the lane pipeline until the write is done.
        cred_acc = Signal()   # accumulating (cleared for the output pass)
        acc_k = Signal(range(HD))
        acc_c = Signal(12)
        acc_issue = Signal()
        hazard = Signal()
        ac_valid = Signal()
        ac_first = Signal()
        ac_word = Signal(range(HD))
        ac_val = [Signal(32, name=f"ac_val{i}") for i in range(L)]
        acw_d = _delay(m, Cat(ac_valid, ac_word), FP32AddPipe.LATENCY, None, "acw")
        in_flight_words = [Cat(ac_valid, ac_word)] + acw_d
        acw_valid = acw_d[-1][0]
        acw_word = acw_d[-1][1:]
        m.d.comb += hazard.eq(lo_valid & Cat(*(f[0] & (f[1:] == acc_k)
                                               for f in in_flight_words)).any())
        m.d.comb += acc_issue.eq(is_cred & cred_acc & lo_valid & ~hazard)
        m.d.sync += ac_valid.eq(acc_issue)
        with m.If(acc_issue):
            m.d.sync += [ac_word.eq(acc_k), ac_first.eq(acc_c == 0)]
            m.d.sync += [ac_val[i].eq(lo_val[i]) for i in range(L)]
            with m.If(acc_k == beats_plane - 1):
                m.d.sync += [acc_k.eq(0), acc_c.eq(acc_c + 1)]
            with m.Else():
                m.d.sync += acc_k.eq(acc_k + 1)
        acc_busy = Cat(*(f[0] for f in in_flight_words)).any()
        # The output pass reads the plane back, word dr_k, one beat per lane pipeline step.
        dr_k = Signal(range(HD))
        dr_issue = Signal()
        dr_valid = Signal()
        dr_mask = Signal(L)
        with m.If(lane_en):
            m.d.sync += [dr_valid.eq(dr_issue), dr_mask.eq(beat_mask)]

        with m.If(is_cred):
            m.d.comb += [hr_r.addr.eq(Mux(cred_acc, acc_k, dr_k)),
                         hr_r.en.eq(cred_acc | lane_en)]
        with m.Else():
            m.d.comb += [hr_r.addr.eq(v_word[:HDB]), hr_r.en.eq(1)]

        # Line buffer read addresses: lane i reads ring address base + off_i, with
        # off_i = sx * i (pooling), i (row vector) or 0; different lanes of a pooling step
        # or a row vector read different banks (NB is a prime above L and above sx).
        # The base's bank and word (a multiplication) are registered, and the bank select
        # works from the register: a pooling step is read one cycle after its issue; an
        # elementwise beat's vector element is read in the cycle the beat enters the lane
        # pipeline, from the register computed with the counters' next values.
        rd_en = Signal()
        m.d.comb += rd_en.eq(is_pool | lane_en)
        elt_fire = Signal()   # an elementwise beat enters the lane pipeline
        nx_c = Mux(elt_fire, adv_c, cnt_c)
        nx_y = Mux(elt_fire, adv_y, cnt_y)
        nx_xb = Mux(elt_fire, adv_xb, cnt_xb)
        rd_base = Signal(signed(30))
        with m.If(is_pool):
            m.d.comb += rd_base.eq(hcur.ring + hcur.gxb + h_kx)
        with m.Else(), m.Switch(task.bcast):
            with m.Case(Bcast.CHANNEL):
                m.d.comb += rd_base.eq(nx_c)
            with m.Case(Bcast.ROW):
                m.d.comb += rd_base.eq(Cat(Const(0, lg), nx_xb))
            with m.Case(Bcast.COLUMN):
                m.d.comb += rd_base.eq(nx_y)
        # -15 <= rd_base < 2 DR (line_buffer_banks); bank and word by a multiplication.
        rd_ring = Signal(range(DR))
        m.d.comb += rd_ring.eq(Mux(rd_base < 0, rd_base + DR,
                                   Mux(rd_base >= DR, rd_base - DR, rd_base)))
        nb_s, nb_m = div_params(len(rd_ring), [NB])
        rd_qn = Signal(range(BD))
        rd_qb = Signal(range(BD))
        rd_rb = Signal(range(NB))
        m.d.comb += rd_qn.eq((rd_ring * nb_m[NB])[nb_s:])
        m.d.sync += [rd_qb.eq(rd_qn), rd_rb.eq(rd_ring - rd_qn * NB)]
        lane_bank = []
        lane_word = []
        for i in range(FL):
            qo = Signal(range(BD), name=f"rd_qo{i}")
            ro = Signal(range(NB), name=f"rd_ro{i}")
            qtab = Array(Const((s * i) // NB, range(BD)) for s in range(16))
            rtab = Array(Const((s * i) % NB, range(NB)) for s in range(16))
            with m.If(is_pool):
                m.d.comb += [qo.eq(qtab[task.sx]), ro.eq(rtab[task.sx])]
            with m.Elif(task.bcast == Bcast.ROW):
                m.d.comb += [qo.eq(i // NB), ro.eq(i % NB)]
            r_s = Signal(range(2 * NB), name=f"rd_rs{i}")
            m.d.comb += r_s.eq(rd_rb + ro)
            q_s = Signal(range(2 * BD + 1), name=f"rd_qs{i}")
            m.d.comb += q_s.eq(rd_qb + qo + (r_s >= NB))
            r_i = Signal(range(NB), name=f"rd_bank{i}")
            q_i = Signal(range(BD), name=f"rd_word{i}")
            m.d.comb += [r_i.eq(Mux(r_s >= NB, r_s - NB, r_s)),
                         q_i.eq(Mux(q_s >= BD, q_s - BD, q_s))]
            lane_bank.append(r_i)
            lane_word.append(q_i)
        for b in range(NB):
            terms = [Mux(lane_bank[i] == b, lane_word[i], 0) for i in range(FL)]
            addr = terms[0]
            for t in terms[1:]:
                addr = addr | t
            m.d.comb += [rports[b].addr.eq(addr), rports[b].en.eq(rd_en)]
        bank_data = Array(rports[b].data for b in range(NB))
        for i in range(FL):
            rb_d = Signal(range(NB), name=f"rd_bank_d{i}")
            with m.If(rd_en):
                m.d.sync += rb_d.eq(lane_bank[i])
            m.d.comb += lane_rd[i].eq(bank_data[rb_d])

        pool_ident = Signal(32)
        pool_op = Signal(MacOp)
        with m.Switch(task.op):
            with m.Case(PoolOp.MAX):
                m.d.comb += [pool_ident.eq(F32_NINF), pool_op.eq(MacOp.MAX)]
            with m.Case(PoolOp.MIN):
                m.d.comb += [pool_ident.eq(F32_PINF), pool_op.eq(MacOp.MIN)]
            with m.Default():
                m.d.comb += [pool_ident.eq(F32_NZ), pool_op.eq(MacOp.MAC)]

        # -- horizontal filter pipeline (never stalls): one cycle later the line buffer data
        # is there; three more and the pipe's result, written to the H ring.
        # Stage 1: the step's bank and word are in the register; stage 2: its data is there.
        h_step = Signal(StructLayout({"valid": 1, "first": 1, "last": 1, "ev": FL,
                                      "info": 41}))   # info: the H beat's valid, hw
        m.d.comb += h_step.eq(Cat(h_issue, h_kx == 0, h_kx == task.kw - 1, h_ev,
                                  hcur.valid, hcur.hw))
        h_stages = _delay(m, h_step, 2, None, "hstep")
        hw = h_stages[-1]
        hw_valid, hw_first, hw_last, hw_ev, hw_info = (hw.valid, hw.first, hw.last, hw.ev,
                                                       hw.info)
        hcap_d = _delay(m, Cat(hw_valid & hw_last, hw_info), FP32AddPipe.LATENCY, None, "hcap")
        hcap = hcap_d[-1]
        h_busy = Cat(*(s.valid for s in h_stages), *(s[0] for s in hcap_d)).any()
        hcap_valid = hcap[0] & hcap[1]
        hcap_hw = hcap[2:42]
        m.d.comb += [hr_w.addr.eq(Mux(acw_valid, acw_word, hcap_hw[:HDB])),
                     hr_w.en.eq(hcap_valid | acw_valid)]
        with m.If(hcap_valid):
            m.d.sync += h_count.eq(hcap_hw + 1)
        for i in range(FL):
            pp = FP32AddPipe()
            m.submodules[f"hpool{i}"] = pp
            acv = ac_val[i] if i < L else red_ident
            m.d.comb += [
                pp.en.eq(1),
                pp.a.eq(Mux(is_cred, Mux(ac_first, red_ident, hr_r.data[i]),
                            Mux(hw_first, pool_ident, pp.result))),
                pp.b.eq(Mux(is_cred, acv, Mux(hw_ev[i], lane_rd[i], pool_ident))),
                pp.op.eq(Mux(is_cred, red_op, pool_op)),
                hr_w.data[i].eq(pp.result),
            ]

        # -- vertical filter pipeline (never stalls; a group starts only when the result
        # queue has room for its three results).
        w_valid = Signal()
        w_first = Signal()
        w_last = Signal()
        w_ev = Signal()
        w_info = Signal(1 + 14 + 16)   # the output beat's valid, oyb, gxb
        m.d.sync += [w_valid.eq(v_issue), w_first.eq(v_ky == 0),
                     w_last.eq(v_ky == task.kh - 1), w_ev.eq(v_ev),
                     w_info.eq(Cat(vcur.valid, vcur.oyb, vcur.gxb))]
        cap_d = _delay(m, Cat(w_valid & w_last, w_info), FP32AddPipe.LATENCY, None, "cap")
        cap = cap_d[-1]
        v_res = []
        for i in range(FL):
            pp = FP32AddPipe()
            m.submodules[f"vpool{i}"] = pp
            m.d.comb += [
                pp.en.eq(1),
                pp.a.eq(Mux(w_first, pool_ident, pp.result)),
                pp.b.eq(Mux(w_ev, hr_r.data[i], pool_ident)),
                pp.op.eq(pool_op),
            ]
            v_res.append(pp.result)

        # -- result queue: QD entries of one vertical filter result (FL values, the window
        # position of its lane 0); each leaves as up to K output beats of L lanes, one per lane
        # pipeline step. ``q_cnt`` counts entries held and reserved by started groups.
        QD = 8
        q_layout = StructLayout({"val": ArrayLayout(32, FL), "oyb": signed(14),
                                 "gxb": signed(16)})
        rqueue = Memory(shape=q_layout, depth=QD, init=[])
        m.submodules.result_queue = rqueue
        q_w = rqueue.write_port()
        q_r = rqueue.read_port(domain="comb")
        q_wp = Signal(4)
        q_rp = Signal(4)
        q_cnt = Signal(range(QD + 1))
        m.d.comb += q_room.eq(q_cnt <= QD - 3)
        cap_valid = Signal()
        m.d.comb += [
            cap_valid.eq(cap[0] & cap[1]),
            q_w.addr.eq(q_wp[:3]), q_w.en.eq(cap_valid),
            q_w.data.oyb.eq(cap[2:16]), q_w.data.gxb.eq(cap[16:32]),
            q_r.addr.eq(q_rp[:3]),
        ]
        m.d.comb += [q_w.data.val[i].eq(v_res[i]) for i in range(FL)]
        with m.If(cap_valid):
            m.d.sync += q_wp.eq(q_wp + 1)
        q_any = Signal()
        m.d.comb += q_any.eq(q_wp != q_rp)
        q_k = Signal(range(max(K, 2)))     # output beat of the head entry
        q_off = Signal(16)                 # its first window column: head gxb + q_k L sx
        q_gxb = Signal(signed(18))
        m.d.comb += q_gxb.eq(q_r.data.gxb + q_off)
        q_more = Signal()                  # the head entry has another output beat
        m.d.comb += q_more.eq((q_k != K - 1) & has_window(q_gxb + lsx_beat))
        q_take = Signal()                  # the head output beat enters the lane pipeline
        m.d.comb += q_take.eq(is_pool & q_any & lane_en)
        q_pop = Signal()
        m.d.comb += q_pop.eq(q_take & ~q_more)
        with m.If(q_take):
            with m.If(q_more):
                m.d.sync += [q_k.eq(q_k + 1), q_off.eq(q_off + lsx_beat)]
            with m.Else():
                m.d.sync += [q_k.eq(0), q_off.eq(0), q_rp.eq(q_rp + 1)]
        # Reserve three entries at a group's start; release a reservation when an invalid
        # beat of a group ends (nothing written) or when an entry leaves.
        q_rel = Signal(2)
        m.d.comb += q_rel.eq((cap[0] & ~cap[1]) + q_pop)
        m.d.sync += q_cnt.eq(q_cnt + Mux(v_issue & v_start, 3, 0) - q_rel)
        pool_busy = Signal()
        m.d.comb += pool_busy.eq(h_busy | w_valid | Cat(*(s[0] for s in cap_d)).any()
                                 | (q_cnt != 0))

        # Divisors of the average: valid rows times valid columns of each window.
        q_oyb = q_r.data.oyb
        rows_lo = Mux(q_oyb < 0, 0, q_oyb)
        rows_hi = Mux(q_oyb + task.kh > H, H, q_oyb + task.kh)
        n_rows = Signal(5)
        m.d.comb += n_rows.eq(rows_hi - rows_lo)
        rom = Array(Const(recip_bits(n), 32) for n in range(MAX_WINDOW * MAX_WINDOW + 1))
        emit_scale = []
        emit_has = Signal(L)
        for i in range(L):
            ix0 = Signal(signed(18), name=f"eix0_{i}")
            m.d.comb += ix0.eq(q_gxb + task.sx * i)
            m.d.comb += emit_has[i].eq(q_any & has_window(ix0))
            cols_lo = Mux(ix0 < 0, 0, ix0)
            cols_hi = Mux(ix0 + task.kw > W, W, ix0 + task.kw)
            n_cols = Signal(5, name=f"ncols{i}")
            m.d.comb += n_cols.eq(cols_hi - cols_lo)
            sc = Signal(32, name=f"pscale{i}")
            m.d.comb += sc.eq(Mux(task.op == PoolOp.AVG, rom[(n_rows * n_cols)[:7]], F32_ONE))
            emit_scale.append(sc)
        with m.If(is_pool):
            m.d.comb += [in_op.eq(EltOp.MUL), in_mask.eq(emit_has), in_valid.eq(emit_has[0])]
            for i in range(L):
                val = (Array(q_r.data.val[k * L + i] for k in range(K))[q_k] if K > 1
                       else q_r.data.val[i])
                m.d.comb += [in_a[i].eq(val), in_b[i].eq(emit_scale[i])]

        with m.If(is_cred & ~cred_acc):
            m.d.comb += [in_op.eq(EltOp.MUL), in_mask.eq(dr_mask), in_valid.eq(dr_valid)]
            for i in range(L):
                m.d.comb += [in_a[i].eq(hr_r.data[i]), in_b[i].eq(task.scale)]

        # ---------------------------------------------------------------- reduction
        level = [Mux(lo_mask[i], lo_val[i], red_ident) for i in range(L)]
        depth = 0
        while len(level) > 1:
            nxt = []
            for k in range(len(level) // 2):
                node = FP32AddPipe()
                m.submodules[f"tree{depth}_{k}"] = node
                m.d.comb += [node.en.eq(1), node.a.eq(level[2 * k]), node.b.eq(level[2 * k + 1]),
                             node.op.eq(red_op)]
                nxt.append(node.result)
            level = nxt
            depth += 1
        tree_out = level[0]
        tree_in_valid = lo_valid & is_tree & lane_en
        tree_valid = (_delay(m, tree_in_valid, FP32AddPipe.LATENCY * depth, None, "tv")[-1]
                      if depth else tree_in_valid)

        ret = FP32AddPipe()
        m.submodules.retention = ret
        parts = Array(Signal(32, name=f"part{j}") for j in range(3))
        r_idx = Signal(2)
        r_cnt = Signal(40)
        r_issue = Signal()
        rv = _delay(m, Cat(r_issue & tree_valid, r_idx), FP32AddPipe.LATENCY, None, "rv")
        fwd = rv[-1][0] & (rv[-1][1:] == r_idx)
        m.d.comb += [ret.en.eq(1), ret.op.eq(red_op)]
        with m.If(rv[-1][0]):
            m.d.sync += parts[rv[-1][1:]].eq(ret.result)
        scale_mul = FP32Mul()
        m.submodules.scale_mul = scale_mul
        m.d.comb += [scale_mul.en.eq(1), scale_mul.b.eq(task.scale)]
        pp_unit = PostProcessor()
        m.submodules.post_processor = pp_unit
        m.d.comb += [pp_unit.fn.eq(task.post), pp_unit.x.eq(scale_mul.result)]
        red_out = from_f32(m, pp_unit.result, task.out_fmt, "red_out")
        red_valid = Signal()
        group_done = Signal()
        wcnt = Signal(3)

        with m.FSM(name="reduce"):
            with m.State("COLLECT"):
                m.d.comb += [r_issue.eq(is_tree),
                             ret.a.eq(Mux(fwd, ret.result, parts[r_idx])),
                             ret.b.eq(tree_out)]
                with m.If(tree_valid & is_tree):
                    m.d.sync += [r_idx.eq(Mux(r_idx == 2, 0, r_idx + 1)), r_cnt.eq(r_cnt + 1)]
                in_flight = Cat(*(s[0] for s in rv)).any()
                with m.If(is_tree & self.busy & (r_cnt == beats_group) & (beats_group != 0)
                          & ~in_flight & ~tree_valid):
                    m.d.sync += wcnt.eq(0)
                    m.next = "COMBINE1"
            with m.State("COMBINE1"):
                m.d.comb += [ret.a.eq(parts[0]), ret.b.eq(parts[1])]
                m.next = "WAIT1"
            with m.State("WAIT1"):
                m.d.sync += wcnt.eq(wcnt + 1)
                with m.If(wcnt == FP32AddPipe.LATENCY - 2):
                    m.d.sync += wcnt.eq(0)
                    m.next = "COMBINE2"
            with m.State("COMBINE2"):
                m.d.comb += [ret.a.eq(ret.result), ret.b.eq(parts[2])]
                m.next = "WAIT2"
            with m.State("WAIT2"):
                m.d.sync += wcnt.eq(wcnt + 1)
                with m.If(wcnt == FP32AddPipe.LATENCY - 2):
                    m.d.sync += wcnt.eq(0)
                    m.next = "SCALE"
            with m.State("SCALE"):
                m.d.comb += scale_mul.a.eq(ret.result)
                m.d.sync += wcnt.eq(wcnt + 1)
                with m.If(wcnt == FP32Mul.LATENCY):
                    m.d.comb += pp_unit.start.eq(1)
                    m.next = "POST"
            with m.State("POST"), m.If(pp_unit.done):
                m.next = "OUTPUT"
            with m.State("OUTPUT"):
                m.d.comb += red_valid.eq(1)
                with m.If(self.out.ready):
                    m.d.comb += group_done.eq(1)
                    m.d.sync += [r_idx.eq(0), r_cnt.eq(0)]
                    m.d.sync += [parts[j].eq(red_ident) for j in range(3)]
                    m.next = "COLLECT"

        # ---------------------------------------------------------------- output stream
        pending = Signal(range(2 * LANE_LATENCY + 4))
        out_fire = self.out.valid & self.out.ready
        lane_out_fire = out_fire & ~is_tree
        cred_in = is_cred & cred_acc   # lane pipeline results go to the channel accumulator
        m.d.sync += pending.eq(pending + (in_valid & lane_en & ~is_tree & ~cred_in)
                               - lane_out_fire)
        lane_out = [from_f32(m, lo_val[i], task.out_fmt, f"out{i}") for i in range(L)]
        with m.If(is_tree):
            m.d.comb += [self.out.valid.eq(red_valid),
                         self.out.payload.data[0].eq(red_out)]
        with m.Else():
            m.d.comb += self.out.valid.eq(lo_valid & ~cred_in)
            for i in range(L):
                m.d.comb += self.out.payload.data[i].eq(Mux(lo_mask[i], lane_out[i], 0))
        m.d.comb += lane_en.eq(Mux(is_tree, 1,
                                   Mux(cred_in, ~hazard, ~lo_valid | self.out.ready)))

        # ---------------------------------------------------------------- control
        # (W + 2 px - kw) // sx by a table of multipliers (meaningful only for a valid window).
        ow_num = Signal(SHAPE_BITS + 1)
        m.d.comb += ow_num.eq(W + 2 * task.px - task.kw)
        sx_s, sx_m = div_params(len(ow_num), range(1, 2 ** WINDOW_BITS))
        # ceil(OW / FL) (FL need not be a power of two).
        owb_s, owb_ms = div_params(len(ow) + 1, [FL])
        owb_m = owb_ms[FL]
        m.d.comb += [self.busy.eq(0), self.done.eq(0)]
        need_b = (arity >= 2) & (task.bcast == Bcast.NONE)
        need_c = arity == 3
        with m.FSM(name="control"):
            with m.State("IDLE"), m.If(self.start):
                m.d.sync += [task.eq(self.cfg), self.error.eq(Error.NONE)]
                m.next = "SIZES"
            with m.State("SIZES"):
                m.d.comb += self.busy.eq(1)
                # Products of shape fields, registered once per task.
                m.d.sync += [
                    plane_elems.eq(H * W), beats_plane.eq(H * wb), lsx.eq(task.sx * FL),
                    lsx_beat.eq(task.sx << lg),
                    CH.eq(C * H), pool_rows.eq(Mux(C * H < 3, C * H, 3) * W),
                    ow.eq((ow_num * Array(Const(sx_m.get(k, 0)) for k in range(16))[task.sx])
                          [sx_s:] + 1),
                ]
                with m.If(is_pool):
                    m.next = "SIZES2"
                with m.Else():
                    m.next = "CHECK"
            with m.State("SIZES2"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += OWB.eq((ow + (FL - 1)) * owb_m >> owb_s)
                m.next = "SIZES3"
            with m.State("SIZES3"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [
                    pool_hwords.eq(Mux(H < task.kh + 2 * task.sy, H, task.kh + 2 * task.sy)
                                   * OWB),
                    HOWB.eq(H * OWB), khOWB.eq(task.kh * OWB), syOWB.eq(task.sy * OWB),
                    pyOWB.eq(task.py * OWB),
                ]
                m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [
                    beats_group.eq(Mux(task.axis == Axis.TENSOR, beats_plane * C,
                                       beats_plane)),
                    cnt_c.eq(0), cnt_y.eq(0), cnt_xb.eq(0),
                    h_on.eq(0), v_on.eq(0),
                    r_idx.eq(0), r_cnt.eq(0),
                    acc_k.eq(0), acc_c.eq(0), cred_acc.eq(1), dr_k.eq(0),
                ]
                m.d.sync += [parts[j].eq(red_ident) for j in range(3)]
                with m.If(err != Error.NONE):
                    m.d.sync += self.error.eq(err)
                    m.next = "FINISH"
                with m.Elif(is_elt):
                    with m.If(uses_vec):
                        start_loader(1, 1, 1, vec_len)
                        m.next = "ELT_LOAD"
                    with m.Else():
                        m.next = "ELT_RUN"
                with m.Elif(is_pool):
                    m.next = "POOL_START"
                with m.Else():
                    m.next = "RED_FEED"

            with m.State("ELT_LOAD"):
                m.d.comb += [self.busy.eq(1), ld_accept.eq(self.b.valid), self.b.ready.eq(1)]
                with m.If(ld_done):
                    m.next = "ELT_RUN"

            with m.State("ELT_RUN"):
                m.d.comb += self.busy.eq(1)
                b_ok = ~need_b | self.b.valid
                c_ok = ~need_c | self.c.valid
                fire = lane_en & self.a.valid & b_ok & c_ok
                m.d.comb += [
                    self.a.ready.eq(lane_en & b_ok & c_ok),
                    self.b.ready.eq(lane_en & need_b & self.a.valid & c_ok),
                    self.c.ready.eq(lane_en & need_c & self.a.valid & b_ok),
                    in_valid.eq(fire), in_op.eq(task.op), in_mask.eq(beat_mask),
                    in_vec.eq(uses_vec), in_scalar.eq(task.bcast == Bcast.SCALAR),
                ]
                for i in range(L):
                    m.d.comb += [in_a[i].eq(conv_a[i]), in_b[i].eq(conv_b[i]),
                                 in_c[i].eq(conv_c[i])]
                m.d.comb += elt_fire.eq(fire)
                with m.If(fire):
                    advance_counters()
                    with m.If(last_x & last_y & last_c):
                        m.next = "DRAIN"

            with m.State("POOL_START"):
                m.d.comb += self.busy.eq(1)
                start_loader(0, C, H, W)
                start_walk()
                m.next = "POOL_RUN"

            with m.State("POOL_RUN"):
                # The loader and both filters run at the same time (the filters issue their
                # steps by themselves, see above).
                m.d.comb += [self.busy.eq(1), self.a.ready.eq(ld_space & ~ld_all),
                             ld_accept.eq(self.a.valid & ld_space & ~ld_all)]
                with m.If(~h_on & ~v_on & ~pool_busy & (pending == 0) & ld_all):
                    m.next = "FINISH"

            with m.State("RED_FEED"):
                m.d.comb += self.busy.eq(1)
                m.d.comb += [self.a.ready.eq(lane_en), in_valid.eq(self.a.valid),
                             in_op.eq(task.pre), in_mask.eq(beat_mask)]
                for i in range(L):
                    m.d.comb += in_a[i].eq(conv_a[i])
                with m.If(self.a.valid & lane_en):
                    advance_counters()
                    with m.If(last_x & last_y):
                        with m.If(is_cred):
                            with m.If(last_c):
                                m.next = "CRED_WAIT"
                        with m.Elif((task.axis == Axis.PLANE) | last_c):
                            m.next = "RED_WAIT"
            with m.State("CRED_WAIT"):
                # Every beat accumulated and written: read the plane back.
                m.d.comb += self.busy.eq(1)
                with m.If((acc_c == C) & ~acc_busy):
                    m.d.sync += [cred_acc.eq(0), dr_k.eq(0), cnt_y.eq(0), cnt_xb.eq(0)]
                    m.next = "CRED_OUT"
            with m.State("CRED_OUT"):
                m.d.comb += [self.busy.eq(1), dr_issue.eq(1)]
                with m.If(lane_en):
                    m.d.sync += dr_k.eq(dr_k + 1)
                    advance_counters()
                    with m.If(last_x & last_y):
                        m.next = "DRAIN"
            with m.State("RED_WAIT"):
                m.d.comb += self.busy.eq(1)
                with m.If(group_done):
                    with m.If(cnt_c == C):
                        m.next = "FINISH"
                    with m.Else():
                        m.next = "RED_FEED"

            with m.State("DRAIN"):
                m.d.comb += self.busy.eq(1)
                with m.If((pending == 0) & ~dr_valid):
                    m.next = "FINISH"
            with m.State("FINISH"):
                m.d.comb += [self.busy.eq(1), self.done.eq(1)]
                m.next = "IDLE"

        return m
