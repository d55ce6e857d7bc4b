"""The micro build's planar unit: int8 max and min pooling, one buffer element a cycle
(``docs/micro.md``).

The unit reads the planar task registers and the ``PE_A`` / ``PE_OUT`` datasets through the
register-file port, checks the task as :func:`npu_spec.planar.task_error` does for the
``icebreaker`` build, then::

    for c, oy, ox:                                     # raster order of the result
        v = the first valid element of the window
        for ky, kx: if (oy sy - py + ky, ox sx - px + kx) inside H x W: v = op(v, A[c, y, x])
        OUT[c, oy, ox] = v

reading ``A[c, y, x]`` at ``A.base + c A.cstride + y A.rstride + x`` and writing
``OUT.base + c OUT.cstride + oy OUT.rstride + ox``: the golden model's result
(:func:`npu_model.planar.pool`: a window's valid elements folded in order, padding never
taken) written where its result beats land (``npu_model.system``) when the datasets are laid
out as the task (below).

Errors: :class:`npu_spec.planar.PlanarError` in the golden order, and :data:`UNSUPPORTED` for
what the unit does not do: the elementwise and reduction modes, and datasets whose width or
height differ from the task's (operand ``A``: ``W x H``; ``OUT``: ``OW x OH``) or with fewer
channels (the golden model reinterprets such streams beat by beat), and a flow-controlled
operand whose ring (``slots * max(1, planes)`` planes) is smaller than the task's channels: the
golden model takes such an operand from its producer as it streams, while the ring planes
are reused, and the buffer no longer holds the early channels when a micro task runs after
its producer. With a ring of at least the channels, plane ``c`` is at ``c`` and the buffer
holds what the producer wrote.
"""

from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from npu_spec import dataproc
from npu_spec import planar as spec
from npu_spec.config import preset
from npu_spec.micro import UNSUPPORTED
from npu_spec.planar import Axis, Bcast, EltOp, Mode, PlanarError, PoolOp, PostFn, RedOp

from ..lib.csr import register_layout

__all__ = ["UNSUPPORTED", "MicroPlanar"]

#: The build whose planar engine the unit stands for.
CONFIG = preset("icebreaker")
#: Its lanes (``planar_lanes ** 2``), pooling words and line buffer: the limits of
#: :func:`npu_spec.planar.pool_fits`.
LANES = CONFIG.planar_lanes ** 2
PLANE_DEPTH = spec.LINE_BUFFER_DEPTH
RING_WORDS = spec.h_ring_depth(LANES, PLANE_DEPTH)

if LANES != 4 or CONFIG.planar_pool_beats != 1 or CONFIG.has_fp16:
    raise AssertionError("the micro planar unit is built for 4 lanes, 1-beat pooling words and "
                         "no binary16")
# (no multiplications in the unit: Yosys would give even a constant one a DSP)
ABITS = 14

_PE = spec.PLANAR_ENGINE
_DP = dataproc.DATA_PROCESSOR
_A = dataproc.pe_port_base("A")
_OUT = dataproc.pe_port_base("OUT")

#: The register words the unit reads at its start, in order (the fields it keeps or checks).
_READS = (
    (_PE.address("MODE"), _PE["MODE"]),
    (_PE.address("SHAPE0"), _PE["SHAPE0"]),
    (_PE.address("SHAPE1"), _PE["SHAPE1"]),
    (_PE.address("WINDOW"), _PE["WINDOW"]),
    (_A + 1, _DP["PE_A_SHAPE0"]),
    (_A + 2, _DP["PE_A_SHAPE1"]),
    (_OUT + 1, _DP["PE_OUT_SHAPE0"]),
    (_OUT + 2, _DP["PE_OUT_SHAPE1"]),
)

#: The registers the run reads again when it needs them (bases and strides; never kept in
#: flip-flops): word address of each.
_RUN = {
    "a_base": _A + 0, "a_shape1": _A + 2, "a_cs": _A + 3, "a_rs": _A + 4,
    "o_base": _OUT + 0, "o_cs": _OUT + 3, "o_rs": _OUT + 4,
}

#: Flags of the fields only the checks use (decided as each register is read): the planar
#: unit's and the neural unit's pooling mode's.
Flags = data.StructLayout({
    "bad_mode": 1, "bad_fmt": 1, "avg": 1, "not_pool": 1, "min": 1, "a_bad": 1, "o_bad": 1,
})

#: The task as the planar unit keeps it: the fields the loops use, and the flags.
Task = data.StructLayout({
    "w": 12, "h": 12, "c": 12, "kh": 4, "kw": 4, "sy": 4, "sx": 4, "py": 4, "px": 4,
    "o_w": 12, "o_h": 12, "fl": Flags,
})


def fields(t):
    """The pooling task's fields (``w h c kh kw sy sx py px o_w o_h`` and the flags ``fl``)
    as :class:`Task` ``t`` holds them."""
    return SimpleNamespace(**{n: getattr(t, n) for n in (
        "w", "h", "c", "kh", "kw", "sy", "sx", "py", "px", "o_w", "o_h", "fl")})


def start_reads():
    """The word addresses of :data:`_READS`, in order."""
    return [a for a, _ in _READS]


def latch(reg_data, f):
    """``{k: statements}``: what read ``k - 1`` of :data:`_READS` (``reg_data``, valid when the
    read counter is ``k``) sets in the fields ``f`` (:func:`fields`)."""
    v = [data.View(register_layout(reg), reg_data) for _, reg in _READS]
    fl = f.fl
    return {
        1: [fl.bad_mode.eq(_bad_mode(v[0])), fl.bad_fmt.eq(v[0].in_fmt | v[0].out_fmt),
            fl.avg.eq((v[0].mode == Mode.POOL) & (v[0].op == PoolOp.AVG)),
            fl.not_pool.eq(v[0].mode != Mode.POOL), fl.min.eq(v[0].op == PoolOp.MIN)],
        2: [f.w.eq(v[1].width), f.h.eq(v[1].height)],
        3: [f.c.eq(v[2].channels)],
        4: [f.kh.eq(v[3].kh), f.kw.eq(v[3].kw), f.sy.eq(v[3].sy), f.sx.eq(v[3].sx),
            f.py.eq(v[3].py), f.px.eq(v[3].px)],
        5: [fl.a_bad.eq((v[4].width != f.w) | (v[4].height != f.h))],
        6: [fl.a_bad.eq(fl.a_bad | (v[5].channels < f.c))],
        7: [f.o_w.eq(v[6].width), f.o_h.eq(v[6].height)],
        8: [fl.o_bad.eq(v[7].channels < f.c)],
    }


def checks(m, f, r):
    """The task's error (combinational), from the fields ``f`` and the sizes the states of
    :func:`size_states` leave in the registers ``r``: ``OH`` in ``r.oy``, ``OW`` in ``r.ox``,
    the H-ring words in ``r.ring`` (``r.ylast``, ``r.xlast``: the last window origins)."""
    code = Signal(4)
    fl = f.fl
    bad_window = ((Cat(f.kh == 0, f.kw == 0, f.sy == 0, f.sx == 0).any())
                  | (f.kh > spec.MAX_WINDOW) | (f.kw > spec.MAX_WINDOW)
                  | (f.py >= f.kh) | (f.px >= f.kw) | (r.ylast < 0) | (r.xlast < 0))
    # min(C H, 3) W <= plane depth
    ch3 = Mux((f.c >= 3) | (f.h >= 3) | ((f.c == 2) & (f.h == 2)), 3, Mux(f.c == 1, f.h, f.c))
    lines = Mux(ch3 == 3, (f.w << 1) + f.w, Mux(ch3 == 2, f.w << 1, f.w))
    fits = (lines <= PLANE_DEPTH) & (r.ring + 2 <= RING_WORDS)
    zero = Cat(f.c == 0, f.h == 0, f.w == 0).any()
    layout = fl.a_bad | (f.o_w != r.ox) | (f.o_h != r.oy) | fl.o_bad
    order = [
        (fl.bad_mode, PlanarError.BAD_MODE),
        (fl.bad_fmt, PlanarError.BAD_FORMAT),
        (fl.avg, PlanarError.UNSUPPORTED),
        (fl.not_pool, UNSUPPORTED),
        (zero | (~bad_window & ~fits), PlanarError.BAD_SHAPE),
        (bad_window, PlanarError.BAD_WINDOW),
        (layout, UNSUPPORTED),
    ]
    with m.If(order[0][0]):
        m.d.comb += code.eq(order[0][1])
    for cond, value in order[1:]:
        with m.Elif(cond):
            m.d.comb += code.eq(value)
    return code


def size_states(m, unit, f, r, after):
    """The states ``SIZES``, ``ARING`` and ``RING``: ``OH`` and ``OW`` into ``r.oy``, ``r.ox``
    (window origins in ``r.iy0``, ``r.ix0``, all 0 on entry), the flow-controlled operand's
    ring planes against ``C`` (``r.k`` counting slots, ``r.planes`` adding planes; a short
    ring sets ``a_bad``) and the H-ring words (``r.ring``, rows counted in ``r.j``), by
    repeated addition (no multiplier, no divider); then state ``after``. ``PE_A_SHAPE1`` is
    read again from the register file (``unit.reg_addr``, ``unit.reg_data``)."""
    a_shape1 = _RUN["a_shape1"]
    ds = data.View(register_layout(_DP["PE_A_SHAPE1"]), unit.reg_data)
    # registered (the fields are set a cycle or more before SIZES, and held): the adders are
    # off the comparisons' path into the loop's enables
    m.d.sync += [r.ylast.eq(f.h + (f.py << 1) - f.kh), r.xlast.eq(f.w + (f.px << 1) - f.kw)]
    with m.State("SIZES"):
        m.d.comb += unit.reg_addr.eq(a_shape1)
        busy_y = r.iy0 <= r.ylast
        busy_x = r.ix0 <= r.xlast
        with m.If(busy_y):
            m.d.sync += [r.oy.eq(r.oy + 1), r.iy0.eq(r.iy0 + f.sy)]
        with m.If(busy_x):
            m.d.sync += [r.ox.eq(r.ox + 1), r.ix0.eq(r.ix0 + f.sx)]
        # no loop for a zero stride (a bad window: never used)
        with m.If(~(busy_y | busy_x) | (f.sy == 0) | (f.sx == 0)):
            m.d.sync += [r.k.eq(0), r.planes.eq(0)]
            m.next = "ARING"

    with m.State("ARING"):
        # slots x max(1, planes) ring planes, counted up to C
        m.d.comb += unit.reg_addr.eq(a_shape1)
        with m.If((r.k < ds.slots) & (r.planes < f.c)):
            m.d.sync += [r.planes.eq(r.planes + Mux(ds.planes == 0, 1, ds.planes)),
                         r.k.eq(r.k + 1)]
        with m.Else():
            m.d.sync += [f.fl.a_bad.eq(f.fl.a_bad | ((ds.slots != 0) & (r.planes < f.c))),
                         r.j.eq(0), r.ring.eq(0)]
            m.next = "RING"

    with m.State("RING"):
        # H-ring words: min(H, kh + 2 sy) x ceil(OW / L), saturating
        # (j below both bounds: two comparisons side by side, no multiplexer in series)
        more = (r.j < f.h) & (r.j < f.kh + (f.sy << 1))
        owb = (r.ox + LANES - 1) >> 2
        with m.If(more & (r.ring <= RING_WORDS)):
            m.d.sync += [r.ring.eq(r.ring + Mux(owb > RING_WORDS, RING_WORDS + 1, owb)),
                         r.j.eq(r.j + 1)]
        with m.Else():
            m.next = after


def fold(m, fl, rdata, best, first, valid):
    """The window's value with the element ``rdata`` (read last cycle) folded in when
    ``valid`` (combinational); registers ``best`` and clears ``first`` as it folds."""
    v = rdata[:8].as_signed()
    take = Mux(fl.min, v < best, v > best) | first
    with m.If(valid & take):
        m.d.sync += [best.eq(v), first.eq(0)]
    return Mux(valid & take, v, best)


def _bad_mode(mode):
    """Whether the ``MODE`` register's view ``mode`` holds an unknown code
    (:class:`npu_spec.planar.PlanarError` ``BAD_MODE``; combinational)."""
    elt = (mode.op > max(EltOp)) | (mode.bcast > max(Bcast))
    pool = mode.op > max(PoolOp)
    red = ((mode.op > max(RedOp)) | (mode.pre > EltOp.SQUARE) | (mode.axis > max(Axis))
           | ((mode.axis == Axis.CHANNEL) & (mode.post != PostFn.NONE)))
    return Mux(mode.mode == Mode.ELTWISE, elt,
               Mux(mode.mode == Mode.POOL, pool, Mux(mode.mode == Mode.REDUCE, red, 1)))


class MicroPlanar(wiring.Component):
    """Planar unit of the micro build: int8 max and min pooling.

    Members
    -------
    start : In(1)
        Pulse: the task's registers are written; run it.
    done : Out(1)
        Pulse: the task ended.
    error : Out(4)
        Valid with ``done``: 0, a :class:`npu_spec.planar.PlanarError` code or
        :data:`UNSUPPORTED`.
    reg_addr, reg_data : Out(16), In(32)
        Register-file read port (``reg_data`` valid the cycle after ``reg_addr``).
    buf_addr, buf_wdata, buf_we, buf_rdata : Out(14), Out(16), Out(1), In(16)
        Buffer port (``buf_rdata`` valid the cycle after ``buf_addr``).
    """

    start: In(1)
    done: Out(1)
    error: Out(4)
    reg_addr: Out(16)
    reg_data: In(32)
    buf_addr: Out(ABITS)
    buf_wdata: Out(16)
    buf_we: Out(1)
    buf_rdata: In(16)

    def elaborate(self, platform):
        m = Module()
        t = Signal(Task)
        f = fields(t)
        s = self._state()
        r = SimpleNamespace(oy=s.oy, ox=s.ox, iy0=s.iy0, ix0=s.ix0, ylast=s.ylast,
                            xlast=s.xlast, k=s.c, planes=s.ca, j=s.iy, ring=s.ya)
        idx = Signal(range(len(_READS) + 1))
        code = checks(m, f, r)
        self._run(m, f, s, r, code, idx, latch(self.reg_data, f))
        return m

    def _state(self):
        """The run's registers; the sizing states use them too (:func:`size_states`)."""
        return SimpleNamespace(
            err=Signal(4),
            c=Signal(12), oy=Signal(13), ox=Signal(13), ky=Signal(4), kx=Signal(4),
            iy0=Signal(signed(15)), ix0=Signal(signed(15)), iy=Signal(signed(15)),
            ix=Signal(signed(15)), ya0=Signal(ABITS), ya=Signal(ABITS),
            ca=Signal(ABITS), ob=Signal(ABITS), orow=Signal(ABITS),
            best=Signal(signed(8)), first=Signal(), st_valid=Signal(),
            # (H + 2 py - kh) and (W + 2 px - kw): the last window origin, if any
            ylast=Signal(signed(15)), xlast=Signal(signed(15)),
        )

    def _read(self, m, name):
        """Address the run-time register ``name``: its value is ``reg_data`` a cycle on."""
        m.d.comb += self.reg_addr.eq(_RUN[name])

    def _rdata(self, name):
        """``reg_data`` as the view of the run-time register ``name``."""
        reg = {"a_base": "PE_A_BASE", "a_shape1": "PE_A_SHAPE1", "a_cs": "PE_A_CSTRIDE",
               "a_rs": "PE_A_RSTRIDE", "o_base": "PE_OUT_BASE", "o_cs": "PE_OUT_CSTRIDE",
               "o_rs": "PE_OUT_RSTRIDE"}[name]
        return data.View(register_layout(_DP[reg]), self.reg_data)

    def _run(self, m, t, s, r, code, idx, latch):
        last_kx = s.kx == t.kw - 1
        last_ky = s.ky == t.kh - 1
        inside = (s.iy >= 0) & (s.iy < t.h) & (s.ix >= 0) & (s.ix < t.w)
        # the element read last cycle, folded into the window's value
        folded = fold(m, t.fl, self.buf_rdata, s.best, s.first, s.st_valid)
        m.d.sync += s.st_valid.eq(0)
        rdata = {name: self._rdata(name) for name in _RUN}
        # the start's reads (from IDLE on: read 0 is addressed while idle); states that read
        # a register again address it instead
        m.d.comb += self.reg_addr.eq(Array(Const(a, 16) for a, _ in _READS)[
            Mux(idx < len(_READS), idx, 0)])

        with m.FSM():
            with m.State("IDLE"):
                m.d.sync += idx.eq(0)
                with m.If(self.start):
                    m.d.sync += idx.eq(1)
                    m.next = "LOAD"

            with m.State("LOAD"):
                with m.Switch(idx):
                    for k, stmts in latch.items():
                        with m.Case(k):
                            m.d.sync += stmts
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == len(_READS)):
                    m.d.sync += [s.oy.eq(0), s.ox.eq(0), s.iy0.eq(0), s.ix0.eq(0)]
                    m.next = "SIZES"

            size_states(m, self, t, r, "CHECK")

            with m.State("CHECK"):
                self._read(m, "a_base")
                m.d.sync += [s.err.eq(code), s.c.eq(0), s.oy.eq(0), s.ox.eq(0),
                             s.iy0.eq(-t.py), s.ix0.eq(-t.px)]
                with m.If(code != 0):
                    m.next = "DONE"
                with m.Else():
                    m.next = "INIT_A"

            with m.State("INIT_A"):
                self._read(m, "o_base")
                m.d.sync += s.ca.eq(rdata["a_base"].addr)
                m.next = "INIT_O"

            with m.State("INIT_O"):
                self._read(m, "a_rs")
                m.d.sync += [s.ob.eq(rdata["o_base"].addr), s.orow.eq(rdata["o_base"].addr),
                             s.ya0.eq(s.ca), s.ky.eq(0)]
                m.next = "PAD"

            with m.State("PAD"):
                # the window's first row: py rows above the channel's first
                self._read(m, "a_rs")
                with m.If(s.ky != t.py):
                    m.d.sync += [s.ya0.eq(s.ya0 - rdata["a_rs"].stride), s.ky.eq(s.ky + 1)]
                with m.Else():
                    m.next = "WINDOW_START"

            with m.State("WINDOW_START"):
                self._read(m, "a_rs")
                m.d.sync += [s.ky.eq(0), s.kx.eq(0), s.iy.eq(s.iy0), s.ix.eq(s.ix0),
                             s.ya.eq(s.ya0), s.first.eq(1)]
                m.next = "WINDOW"

            with m.State("WINDOW"):
                self._read(m, "a_rs")
                m.d.comb += self.buf_addr.eq(s.ya + s.ix[:ABITS])
                m.d.sync += s.st_valid.eq(inside)
                with m.If(~last_kx):
                    m.d.sync += [s.kx.eq(s.kx + 1), s.ix.eq(s.ix + 1)]
                with m.Else():
                    m.d.sync += [s.kx.eq(0), s.ix.eq(s.ix0), s.ky.eq(s.ky + 1),
                                 s.iy.eq(s.iy + 1), s.ya.eq(s.ya + rdata["a_rs"].stride)]
                    with m.If(last_ky):
                        m.next = "WRITE"

            with m.State("WRITE"):
                self._read(m, "o_rs")
                m.d.comb += [self.buf_addr.eq(s.orow + s.ox[:ABITS]),
                             self.buf_wdata.eq(Cat(folded, folded[7].replicate(8))),
                             self.buf_we.eq(1)]
                m.next = "NEXT"

            self._next_states(m, t, s, rdata)

            with m.State("DONE"):
                m.d.comb += [self.done.eq(1), self.error.eq(s.err)]
                m.next = "IDLE"

    def _next_states(self, m, t, s, rdata):
        """Step to the next output (ox fastest, then oy, then the channel): the row and
        channel steps add the strides read again from the register file."""
        with m.State("NEXT"):
            m.next = "WINDOW_START"
            with m.If(s.ox != t.o_w - 1):
                m.d.sync += [s.ox.eq(s.ox + 1), s.ix0.eq(s.ix0 + t.sx)]
            with m.Else():
                m.d.sync += [s.ox.eq(0), s.ix0.eq(-t.px), s.ky.eq(0)]
                with m.If(s.oy != t.o_h - 1):
                    self._read(m, "a_rs")
                    m.d.sync += [s.oy.eq(s.oy + 1), s.iy0.eq(s.iy0 + t.sy),
                                 s.orow.eq(s.orow + rdata["o_rs"].stride)]
                    m.next = "ROW_STEP"
                with m.Else():
                    self._read(m, "a_cs")
                    m.d.sync += [s.oy.eq(0), s.iy0.eq(-t.py), s.c.eq(s.c + 1)]
                    with m.If(s.c == t.c - 1):
                        m.next = "DONE"
                    with m.Else():
                        m.next = "CHANNEL_A"

        with m.State("ROW_STEP"):
            # the next window row: sy input rows on
            self._read(m, "a_rs")
            with m.If(s.ky != t.sy):
                m.d.sync += [s.ya0.eq(s.ya0 + rdata["a_rs"].stride), s.ky.eq(s.ky + 1)]
            with m.Else():
                m.next = "WINDOW_START"

        with m.State("CHANNEL_A"):
            self._read(m, "o_cs")
            m.d.sync += s.ca.eq(s.ca + rdata["a_cs"].stride)
            m.next = "CHANNEL_O"

        with m.State("CHANNEL_O"):
            self._read(m, "a_rs")
            out = s.ob + rdata["o_cs"].stride
            m.d.sync += [s.ob.eq(out), s.orow.eq(out), s.ya0.eq(s.ca), s.ky.eq(0)]
            m.next = "PAD"
