"""The planar engine: elementwise, pooling and reduction over ``P * P`` lanes.

Datapath (``docs/planar.md`` has the full description and the golden contract):

* **first format converter** (INT8 / binary16 -> binary32, per lane);
* **lane pipeline** (per lane): a binary32 add/max/min/compare stage, a binary32 multiplier, a
  binary32 adder (9 stages). Every elementwise mode is one pass through it; pooling results
  pass through it to be multiplied by ``1/n``;
* **line buffer** (the plane memory): holds one input plane for pooling (the vertical and
  horizontal window walk reads it, each input element is fetched from the stream once), or a
  broadcast vector in elementwise mode;
* **window filter** (per lane, pooling): folds a window with a binary32 add/max/min pipe,
  interleaving three output beats so that the pipe accepts one step per cycle;
* **reduction tree** (``L -> L/2 -> ... -> 1``, one beat per cycle) and the **retention
  registers** (three, one per cycle of the accumulator latency);
* **post-processor** (scale multiply, then square root / reciprocal);
* **second format converter** (binary32 -> INT8 / binary16).

The engine processes ``L = P * P`` elements per beat (``P = config.planar_lanes``), a beat being
``L`` consecutive elements of one row of one channel (see :func:`beat_layout`).
"""

from fractions import Fraction

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..arith.fp32 import FP32AddPipe
from ..arith.fp32mul import FP32Mul
from ..config import NPUConfig
from ..layouts import MacOp
from .convert import from_f32, to_f32
from .layouts import (
    MAX_WINDOW,
    Bcast,
    EltOp,
    Error,
    Mode,
    PoolOp,
    RedOp,
    beat_layout,
    config_layout,
)
from .postproc import PostProcessor

__all__ = ["LANE_LATENCY", "PlanarEngine", "recip_bits"]

F32_ONE = 0x3F80_0000
F32_NZ = 0x8000_0000
F32_PINF = 0x7F80_0000
F32_NINF = 0xFF80_0000

#: Cycles from the lane pipeline's input register to its output register.
LANE_LATENCY = FP32AddPipe.LATENCY + FP32Mul.LATENCY + FP32AddPipe.LATENCY + 1


def recip_bits(n):
    """Binary32 bits of ``1/n`` rounded to nearest even (pure Python, exact)."""
    if n < 1:
        return F32_PINF
    x = Fraction(1, n)
    e = 0
    while x < 1:
        x *= 2
        e -= 1
    sig = x * (1 << 23)
    q = sig.numerator // sig.denominator
    r = sig - q
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and q & 1):
        q += 1
    if q == 1 << 24:
        q, e = 1 << 23, e + 1
    return ((e + 127) << 23) | (q & 0x7F_FFFF)


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
        ``planar_lanes`` (P) must be a power of two; the engine has ``L = P * P`` lanes.
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
        task = Signal(config_layout())
        mode = task.mode
        is_elt = mode == Mode.ELTWISE
        is_pool = mode == Mode.POOL
        is_red = mode == Mode.REDUCE

        # ---------------------------------------------------------------- derived shapes
        C, H, W = task.channels, task.height, task.width
        wb = Signal(13)       # beats per row
        m.d.comb += wb.eq((W + (L - 1)) >> lg)
        beats_plane = Signal(26)
        beats_group = Signal(40)
        plane_elems = Signal(24)
        syW = Signal(signed(18))
        pyW = Signal(signed(18))
        lsx = Signal(16)     # L * sx

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
                        | (is_red & ((task.op > RedOp.MIN) | (task.pre > EltOp.SQUARE)))),
            bad_fmt.eq(Const(int(not self._config.has_fp16))
                       & (task.in_fmt | task.out_fmt)),
            bad_shape.eq((C == 0) | (H == 0) | (W == 0)
                         | (uses_vec & (vec_len > D))
                         | (is_pool & (plane_elems > D))),
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

        # Line buffer: one write port (the loader), one read port per lane.
        mem = Memory(shape=32, depth=D, init=[])
        m.submodules.line_buffer = mem
        wports = [mem.write_port() for _ in range(L)]
        rports = [mem.read_port() for _ in range(L)]

        v_d = _delay(m, s0_valid, LANE_LATENCY - 1, lane_en, "v")
        mask_d = _delay(m, s0_mask, LANE_LATENCY - 1, lane_en, "mask")
        lo_valid = Signal()
        lo_mask = Signal(L)
        with m.If(lane_en):
            m.d.sync += [lo_valid.eq(v_d[-1]), lo_mask.eq(mask_d[-1])]
        lo_val = []
        for i in range(L):
            b_eff = Signal(32, name=f"b_eff{i}")
            m.d.comb += b_eff.eq(Mux(s0_vec, rports[i].data,
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

        def advance_counters():
            with m.If(last_x):
                m.d.sync += cnt_xb.eq(0)
                with m.If(last_y):
                    m.d.sync += [cnt_y.eq(0), cnt_c.eq(cnt_c + 1)]
                with m.Else():
                    m.d.sync += cnt_y.eq(cnt_y + 1)
            with m.Else():
                m.d.sync += cnt_xb.eq(cnt_xb + 1)

        # ---------------------------------------------------------------- loader
        # Writes ``rows`` rows of ``row_len`` elements (beats as in the streams) into the line
        # buffer from stream A (pooling plane) or B (broadcast vector).
        # ---------------------------------------------------------------- first converter
        conv_a = [to_f32(m, self.a.payload.data[i], task.in_fmt, f"ia{i}") for i in range(L)]
        conv_b = [to_f32(m, self.b.payload.data[i], task.in_fmt, f"ib{i}") for i in range(L)]
        conv_c = [to_f32(m, self.c.payload.data[i], task.in_fmt, f"ic{i}") for i in range(L)]

        ld_x = Signal(12)
        ld_row = Signal(12)
        ld_addr = Signal(range(D))
        ld_rows = Signal(12)
        ld_len = Signal(12)
        ld_done = Signal()
        ld_src_b = Signal()
        ld_accept = Signal()  # a beat of the source stream is taken this cycle
        ld_left = Signal(13)
        m.d.comb += ld_left.eq(ld_len - ld_x)
        ld_n = Signal(range(L + 1))  # elements of the row in this beat
        m.d.comb += ld_n.eq(Mux(ld_left >= L, L, ld_left))
        for i in range(L):
            m.d.comb += [wports[i].addr.eq(ld_addr + i),
                         wports[i].data.eq(Mux(ld_src_b, conv_b[i], conv_a[i])),
                         wports[i].en.eq(ld_accept & (i < ld_n))]
        with m.If(ld_accept):
            m.d.sync += ld_addr.eq(ld_addr + ld_n)
            with m.If(ld_left <= L):
                m.d.sync += [ld_x.eq(0), ld_row.eq(ld_row + 1)]
                with m.If(ld_row == ld_rows - 1):
                    m.d.comb += ld_done.eq(1)
            with m.Else():
                m.d.sync += ld_x.eq(ld_x + L)

        def start_loader(src_b, rows, length):
            m.d.sync += [ld_src_b.eq(src_b), ld_rows.eq(rows), ld_len.eq(length),
                         ld_x.eq(0), ld_row.eq(0), ld_addr.eq(0)]

        # ---------------------------------------------------------------- pooling walk
        oy_base = Signal(signed(14))    # oy * sy - py
        oy_addr = Signal(signed(26))    # oy_base * W
        gx_base = Signal(signed(16))    # first output column of the group * sx - px
        ky = Signal(4)
        kx = Signal(4)
        phi = Signal(2)
        row_addr = Signal(signed(26))   # (oy_base + ky) * W
        walk_issue = Signal()
        iy = Signal(signed(14))
        m.d.comb += iy.eq(oy_base + ky)
        row_ok = (iy >= 0) & (iy < H)
        phase_off = Array([Const(0, 18), lsx, lsx * 2])[phi]
        ev = Signal(L)
        lane_has = Signal(L)  # lane's output exists (for the current phase)
        for i in range(L):
            ix0 = Signal(signed(18), name=f"ix0_{i}")
            m.d.comb += ix0.eq(gx_base + phase_off + task.sx * i)
            ix = Signal(signed(18), name=f"ix_{i}")
            m.d.comb += ix.eq(ix0 + kx)
            m.d.comb += lane_has[i].eq(ix0 + task.kw <= W + task.px)
            m.d.comb += ev[i].eq(row_ok & (ix >= 0) & (ix < W) & lane_has[i])
            addr = Signal(signed(26), name=f"raddr{i}")
            m.d.comb += addr.eq(row_addr + ix)
            with m.If(is_pool):
                m.d.comb += [rports[i].addr.eq(addr[:len(rports[i].addr)]),
                             rports[i].en.eq(1)]
            with m.Else():
                with m.Switch(task.bcast):
                    with m.Case(Bcast.CHANNEL):
                        m.d.comb += rports[i].addr.eq(cnt_c)
                    with m.Case(Bcast.ROW):
                        m.d.comb += rports[i].addr.eq(Cat(Const(i, lg), cnt_xb))
                    with m.Case(Bcast.COLUMN):
                        m.d.comb += rports[i].addr.eq(cnt_y)
                m.d.comb += rports[i].en.eq(lane_en)

        # One cycle later the line buffer data is there; three more and the pipe's result.
        w_valid = Signal()
        w_first = Signal()
        w_last = Signal()
        w_phi = Signal(2)
        w_ev = Signal(L)
        m.d.sync += [w_valid.eq(walk_issue), w_first.eq((ky == 0) & (kx == 0)),
                     w_last.eq((ky == task.kh - 1) & (kx == task.kw - 1)),
                     w_phi.eq(phi), w_ev.eq(ev)]
        cap = _delay(m, Cat(w_valid & w_last, w_phi), FP32AddPipe.LATENCY, None, "cap")[-1]
        cap_busy = Signal()
        pend_caps = _delay(m, w_valid, FP32AddPipe.LATENCY, None, "wv")
        m.d.comb += cap_busy.eq(w_valid | Cat(*pend_caps).any())
        pool_ident = Signal(32)
        pool_op = Signal(MacOp)
        with m.Switch(task.op):
            with m.Case(PoolOp.MAX):
                m.d.comb += [pool_ident.eq(F32_NINF), pool_op.eq(MacOp.MAX)]
            with m.Case(PoolOp.MIN):
                m.d.comb += [pool_ident.eq(F32_PINF), pool_op.eq(MacOp.MIN)]
            with m.Default():
                m.d.comb += [pool_ident.eq(F32_NZ), pool_op.eq(MacOp.MAC)]
        sums = [[Signal(32, name=f"sum{p}_{i}") for i in range(L)] for p in range(3)]
        for i in range(L):
            pp = FP32AddPipe()
            m.submodules[f"pool{i}"] = pp
            m.d.comb += [
                pp.en.eq(1),
                pp.a.eq(Mux(w_first, pool_ident, pp.result)),
                pp.b.eq(Mux(w_ev[i], rports[i].data, pool_ident)),
                pp.op.eq(pool_op),
            ]
            with m.If(cap[0]), m.Switch(cap[1:]):
                for p in range(3):
                    with m.Case(p):
                        m.d.sync += sums[p][i].eq(pp.result)

        # Divisors of the average: valid rows times valid columns of each window.
        rows_lo = Mux(oy_base < 0, 0, oy_base)
        rows_hi = Mux(oy_base + task.kh > H, H, oy_base + task.kh)
        n_rows = Signal(5)
        m.d.comb += n_rows.eq(rows_hi - rows_lo)
        rom = Array(Const(recip_bits(n), 32) for n in range(MAX_WINDOW * MAX_WINDOW + 1))
        emit_phi = Signal(2)
        emit_scale = []
        emit_has = Signal(L)
        for i in range(L):
            ix0 = Signal(signed(18), name=f"eix0_{i}")
            m.d.comb += ix0.eq(gx_base + Array([Const(0, 18), lsx, lsx * 2])[emit_phi]
                               + task.sx * i)
            m.d.comb += emit_has[i].eq(ix0 + task.kw <= W + task.px)
            cols_lo = Mux(ix0 < 0, 0, ix0)
            cols_hi = Mux(ix0 + task.kw > W, W, ix0 + task.kw)
            n_cols = Signal(5, name=f"ncols{i}")
            m.d.comb += n_cols.eq(cols_hi - cols_lo)
            sc = Signal(32, name=f"pscale{i}")
            m.d.comb += sc.eq(Mux(task.op == PoolOp.AVG, rom[(n_rows * n_cols)[:7]], F32_ONE))
            emit_scale.append(sc)
        next_gx = gx_base + lsx * 3
        row_more = next_gx + task.kw <= W + task.px          # another group in this row
        next_oy = oy_base + task.sy
        plane_more = next_oy + task.kh <= H + task.py        # another output row

        # ---------------------------------------------------------------- reduction
        red_op = Signal(MacOp)
        red_ident = Signal(32)
        with m.Switch(task.op):
            with m.Case(RedOp.MAX):
                m.d.comb += [red_op.eq(MacOp.MAX), red_ident.eq(F32_NINF)]
            with m.Case(RedOp.MIN):
                m.d.comb += [red_op.eq(MacOp.MIN), red_ident.eq(F32_PINF)]
            with m.Default():
                m.d.comb += [red_op.eq(MacOp.MAC), red_ident.eq(F32_NZ)]
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
        tree_in_valid = lo_valid & is_red & lane_en
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
                m.d.comb += [r_issue.eq(is_red),
                             ret.a.eq(Mux(fwd, ret.result, parts[r_idx])),
                             ret.b.eq(tree_out)]
                with m.If(tree_valid & is_red):
                    m.d.sync += [r_idx.eq(Mux(r_idx == 2, 0, r_idx + 1)), r_cnt.eq(r_cnt + 1)]
                in_flight = Cat(*(s[0] for s in rv)).any()
                with m.If(is_red & self.busy & (r_cnt == beats_group) & (beats_group != 0)
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
        lane_out_fire = out_fire & ~is_red
        m.d.sync += pending.eq(pending + (in_valid & lane_en & ~is_red) - lane_out_fire)
        lane_out = [from_f32(m, lo_val[i], task.out_fmt, f"out{i}") for i in range(L)]
        with m.If(is_red):
            m.d.comb += [self.out.valid.eq(red_valid),
                         self.out.payload.data[0].eq(red_out)]
        with m.Else():
            m.d.comb += self.out.valid.eq(lo_valid)
            for i in range(L):
                m.d.comb += self.out.payload.data[i].eq(Mux(lo_mask[i], lane_out[i], 0))
        m.d.comb += lane_en.eq(is_red | ~lo_valid | self.out.ready)

        # ---------------------------------------------------------------- control
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
                    plane_elems.eq(H * W), beats_plane.eq(H * wb), syW.eq(task.sy * W),
                    pyW.eq(task.py * W), lsx.eq(task.sx << lg),
                ]
                m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [
                    beats_group.eq(Mux(task.axis, beats_plane * C, beats_plane)),
                    cnt_c.eq(0), cnt_y.eq(0), cnt_xb.eq(0),
                    r_idx.eq(0), r_cnt.eq(0),
                ]
                m.d.sync += [parts[j].eq(red_ident) for j in range(3)]
                with m.If(err != Error.NONE):
                    m.d.sync += self.error.eq(err)
                    m.next = "FINISH"
                with m.Elif(is_elt):
                    with m.If(uses_vec):
                        start_loader(1, 1, vec_len)
                        m.next = "ELT_LOAD"
                    with m.Else():
                        m.next = "ELT_RUN"
                with m.Elif(is_pool):
                    start_loader(0, H, W)
                    m.next = "POOL_LOAD"
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
                with m.If(fire):
                    advance_counters()
                    with m.If(last_x & last_y & last_c):
                        m.next = "DRAIN"

            with m.State("POOL_LOAD"):
                m.d.comb += [self.busy.eq(1), ld_accept.eq(self.a.valid), self.a.ready.eq(1)]
                m.d.sync += [oy_base.eq(-task.py), oy_addr.eq(-pyW), gx_base.eq(-task.px),
                             row_addr.eq(-pyW), ky.eq(0), kx.eq(0), phi.eq(0)]
                with m.If(ld_done):
                    m.next = "POOL_WALK"

            with m.State("POOL_WALK"):
                m.d.comb += [self.busy.eq(1), walk_issue.eq(1)]
                m.d.sync += phi.eq(Mux(phi == 2, 0, phi + 1))
                with m.If(phi == 2):
                    with m.If(kx == task.kw - 1):
                        m.d.sync += kx.eq(0)
                        with m.If(ky == task.kh - 1):
                            m.d.sync += [ky.eq(0), row_addr.eq(oy_addr)]
                            m.next = "POOL_CAPTURE"
                        with m.Else():
                            m.d.sync += [ky.eq(ky + 1), row_addr.eq(row_addr + W)]
                    with m.Else():
                        m.d.sync += kx.eq(kx + 1)

            with m.State("POOL_CAPTURE"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += emit_phi.eq(0)
                with m.If(~cap_busy & ~cap[0]):
                    m.next = "POOL_EMIT"

            with m.State("POOL_EMIT"):
                m.d.comb += [self.busy.eq(1), in_op.eq(EltOp.MUL), in_mask.eq(emit_has),
                             in_valid.eq(emit_has[0])]
                for i in range(L):
                    m.d.comb += [in_a[i].eq(Array(sums[p][i] for p in range(3))[emit_phi]),
                                 in_b[i].eq(emit_scale[i])]
                with m.If(lane_en):
                    m.d.sync += emit_phi.eq(emit_phi + 1)
                    with m.If(emit_phi == 2):
                        with m.If(row_more):
                            m.d.sync += gx_base.eq(next_gx)
                            m.next = "POOL_WALK"
                        with m.Elif(plane_more):
                            m.d.sync += [gx_base.eq(-task.px), oy_base.eq(next_oy),
                                         oy_addr.eq(oy_addr + syW), row_addr.eq(oy_addr + syW)]
                            m.next = "POOL_WALK"
                        with m.Elif(cnt_c == C - 1):
                            m.next = "DRAIN"
                        with m.Else():
                            m.d.sync += cnt_c.eq(cnt_c + 1)
                            start_loader(0, H, W)
                            m.next = "POOL_LOAD"

            with m.State("RED_FEED"):
                m.d.comb += self.busy.eq(1)
                m.d.comb += [self.a.ready.eq(1), in_valid.eq(self.a.valid),
                             in_op.eq(task.pre), in_mask.eq(beat_mask)]
                for i in range(L):
                    m.d.comb += in_a[i].eq(conv_a[i])
                with m.If(self.a.valid):
                    advance_counters()
                    with m.If(last_x & last_y & (~task.axis.bool() | last_c)):
                        m.next = "RED_WAIT"
            with m.State("RED_WAIT"):
                m.d.comb += self.busy.eq(1)
                with m.If(group_done):
                    with m.If(cnt_c == C):
                        m.next = "FINISH"
                    with m.Else():
                        m.next = "RED_FEED"

            with m.State("DRAIN"):
                m.d.comb += self.busy.eq(1)
                with m.If(pending == 0):
                    m.next = "FINISH"
            with m.State("FINISH"):
                m.d.comb += [self.busy.eq(1), self.done.eq(1)]
                m.next = "IDLE"

        return m
