"""The planar engine's control: task latch, sizes, task check and the task sequence.

On ``go`` the task registers are latched. The control unit then computes the products of the
shape fields it and the other units need (bit-serially, without a multiplier: one cycle for an
elementwise task, up to :func:`setup_cycles` for the others; ``docs/planar.md``, "Counters
and sizes"), checks the task against the rules of :func:`npu_spec.planar.task_error` (a
rejected task ends at once and consumes nothing) and runs it:

* elementwise: the broadcast vector on B into the line buffer, then the beats of A, B, C into
  the lane pipeline;
* pooling: the beats of A into the line buffer while the filters walk (they issue their own
  steps), until every unit is idle;
* reduction: the beats of A into the lane pipeline (``pre``), plane by plane or the whole
  tensor, waiting for the reduction's result after each group; across channels, the
  accumulation and then the accumulator's output pass.

The control unit also chooses what enters the lane pipeline (its own operand beats, the result
queue's output beats, the channel accumulator's output pass) and what the line buffer reads (a
pooling step, or the broadcast vector's element of the next beat). The beat raster (channel,
row, beat) is a :class:`LoopNest`.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.formats import F32_ONE
from npu_spec.planar import ELT_ARITY, INT8_CHANNEL_SUM, INT8_ELT_OPS, INT8_SUM_ELEMENTS

from ..lib.loop import LoopNest
from .geometry import const_mul, div_params
from .intpath import f32_integer
from .layouts import (
    COUNT_BITS,
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
    Spread,
    config_layout,
    lane_input_layout,
    load_shape_layout,
    read_layout,
    sizes_layout,
)

__all__ = ["Control", "owb_bits", "setup_cycles"]


def owb_bits(geometry):
    """Bits of ``owb`` (filter words per output row) the sizes multiply by: a larger ``owb``
    makes a vertical group longer than the H ring (``BAD_SHAPE``)."""
    return min(geometry.h_bits + 1, SHAPE_BITS + 1)


def setup_cycles(geometry):
    """Cycles from a task's start (``go``) to its check (``clear``) at most: one, and for a
    pooling or reduction task without an early error the bit-serial products (``SHAPE_BITS +
    1`` cycles, then ``owb_bits + 1`` for pooling or ``SHAPE_BITS`` for a reduction over the
    tensor). A rejected task ends one cycle after its check."""
    return 1 + (SHAPE_BITS + 1) + max(owb_bits(geometry) + 1, SHAPE_BITS) + 1


def _last(codes):
    """The largest code of an enum (larger ones are errors)."""
    return max(member.value for member in codes)


class Control(wiring.Component):
    """Task latch, sizes, task check, the task sequence and the routing of operands.

    Parameters
    ----------
    geometry : Geometry
        The build (``L``, ``FL``, ``plane_depth``, ``HD``).
    has_fp16 : bool
        The build converts binary16 (else a binary16 task is rejected).

    Members
    -------
    go : In(1)
        Start a task (ignored while ``busy``): ``task_regs`` is latched.
    task_regs : In(config_layout())
        The task registers.
    task : Out(config_layout())
        The running task.
    sizes : Out(sizes_layout())
        Its sizes (valid once the check is done, ``clear``).
    busy : Out(1)
        From the cycle after ``go`` to ``finish``.
    clear : Out(1)
        The task is checked in this cycle; the units set up for it.
    finish : Out(1)
        The task ends in this cycle.
    code : Out(Error)
        The result of the check (``NONE``: the task ran), valid with ``finish``.
    a, b, c : In(stream.Signature(ArrayLayout(32, L)))
        The operand streams (binary32).
    load_start, load_shape : Out(1), Out(load_shape_layout())
        Start a load into the line buffer.
    load : Out(stream.Signature(ArrayLayout(32, L)))
        The beats to load (the vector on B, or the planes on A).
    load_done, all_loaded : In(1), In(1)
        The load's last beat is taken in this cycle; it has been taken.
    walk_start : Out(1)
        Start the pooling filters.
    h_busy, v_busy, queue_busy : In(1)
        The pooling units are busy.
    lane_en : In(1)
        The lane pipeline advances.
    lane_idle : In(1)
        No beat bound for the output is in the lane pipeline or the output register (the
        task finishes when its last result has left the engine).
    lane_in : Out(lane_input_layout(L))
        The beat entering the lane pipeline.
    queue_beat, drain_beat : In(lane_input_layout(L))
        The result queue's beat (pooling) and the channel accumulator's (output pass).
    beat_mask : Out(L)
        Lanes of the current beat that hold elements of the row.
    step_read : In(read_layout(geometry.ring_depth))
        The horizontal filter's read.
    read : Out(read_layout(geometry.ring_depth))
        The line buffer's read.
    accumulating, acc_done : In(1), In(1)
        The channel accumulator takes the lane pipeline's results; it has every channel.
    drain_start, drain : Out(1), Out(1)
        Start and run the accumulator's output pass.
    group_done : In(1)
        The reduction's result is taken.
    """

    def __init__(self, geometry, *, has_fp16=True):
        self._geometry = geometry
        self._has_fp16 = bool(has_fp16)
        L = geometry.lanes
        f32s = data.ArrayLayout(geometry.word, L)
        beat = lane_input_layout(L, geometry.word)
        super().__init__({
            "go":           In(1),
            "task_regs":    In(config_layout()),
            "task":         Out(config_layout()),
            "sizes":        Out(sizes_layout()),
            "busy":         Out(1),
            "clear":        Out(1),
            "finish":       Out(1),
            "code":         Out(Error),
            "a":            In(stream.Signature(f32s)),
            "b":            In(stream.Signature(f32s)),
            "c":            In(stream.Signature(f32s)),
            "load_start":   Out(1),
            "load_shape":   Out(load_shape_layout()),
            "load":         Out(stream.Signature(f32s)),
            "load_done":    In(1),
            "all_loaded":   In(1),
            "walk_start":   Out(1),
            "h_busy":       In(1),
            "v_busy":       In(1),
            "queue_busy":   In(1),
            "lane_en":      In(1),
            "lane_idle":    In(1),
            "lane_in":      Out(beat),
            "queue_beat":   In(beat),
            "drain_beat":   In(beat),
            "beat_mask":    Out(L),
            "step_read":    In(read_layout(geometry.ring_depth)),
            "read":         Out(read_layout(geometry.ring_depth)),
            "accumulating": In(1),
            "acc_done":     In(1),
            "drain_start":  Out(1),
            "drain":        Out(1),
            "group_done":   In(1),
        })

    def elaborate(self, platform):
        m = Module()
        g = self._geometry
        task = self.task
        C, H, W = task.channels, task.height, task.width

        # The sizes: beats per row at once, the products in the first cycles of the task.
        phase = Signal(data.StructLayout({"init": 1, "a": 1, "owb": 1, "b": 1, "c": 1}))
        sizes = Signal(sizes_layout())
        m.d.comb += [self.sizes.eq(sizes),
                     self.sizes.wb.eq((W + (g.lanes - 1)) >> g.lane_bits)]
        pool_sizes, group, bit = self._sizes(m, sizes, phase)

        # The beat raster: channel, row, beat of the row.
        m.submodules.raster = raster = LoopNest([("c", SHAPE_BITS), ("y", SHAPE_BITS),
                                                 ("xb", SHAPE_BITS + 1)])
        m.d.comb += [raster.limit.c.eq(C), raster.limit.y.eq(H),
                     raster.limit.xb.eq(self.sizes.wb)]
        for i in range(g.lanes):
            m.d.comb += self.beat_mask[i].eq(Cat(Const(i, g.lane_bits), raster.index.xb) < W)

        arity = Signal(2)
        with m.Switch(task.op):
            for op in EltOp:
                with m.Case(op):
                    m.d.comb += arity.eq(ELT_ARITY[op.value])
            with m.Default():
                m.d.comb += arity.eq(3)
        vector = Signal(SHAPE_BITS)     # elements of the broadcast vector
        with m.Switch(task.bcast):
            with m.Case(Bcast.CHANNEL):
                m.d.comb += vector.eq(C)
            with m.Case(Bcast.ROW):
                m.d.comb += vector.eq(W)
            with m.Case(Bcast.COLUMN):
                m.d.comb += vector.eq(H)
        uses_vector = (task.mode == Mode.ELTWISE) & (arity >= 2) & (task.bcast >= Bcast.CHANNEL)

        error, early = self._check(m, arity, vector, uses_vector, pool_sizes, group)
        fire = Signal()     # an elementwise beat enters the lane pipeline
        self._routes(m, raster, fire)
        self._sequence(m, raster, (phase, bit, early), fire, arity, vector, uses_vector, error)
        return m

    def _sizes(self, m, sizes, phase):
        """Registers ``sizes`` (but ``wb``) and the sizes only the check needs, bit-serially
        (one shift and add per product and cycle, no multiplier; see :func:`setup_cycles`):

        * ``phase.init`` (the task's first cycle): the products by constants, ``pool_rows``;
          the accumulators cleared;
        * ``phase.a`` (``SHAPE_BITS + 1`` cycles, over the bits of ``H``, most significant
          first): ``beats_plane = H wb``, ``rows = C H``, and ``(W + 2 px - kw) // sx`` by
          restoring division;
        * ``phase.owb`` (pooling, one cycle): ``OW`` and ``owb = ceil(OW / FL)``;
        * ``phase.b`` (pooling, :func:`owb_bits` cycles, over the bits of ``owb``): its
          products with ``H``, ``kh``, ``sy``, ``py`` and ``min(H, kh + 2 sy)``;
        * ``phase.c`` (a reduction over the tensor, ``SHAPE_BITS`` cycles, over the bits of
          ``C``): the beats of the tensor ``beats_plane C``.

        ``beats_group`` is registered with ``clear``. Returns the pooling sizes of the check,
        the beats of a reduction group (for the integer build's check) and ``bit`` (the
        multiplier bit of this cycle: the phase ends when it is 0)."""
        g = self._geometry
        task = self.task
        C, H, W = task.channels, task.height, task.width
        FL = g.filter_lanes
        nb = owb_bits(g)
        bit = Signal(range(SHAPE_BITS + 1))
        ow_num = Signal(SHAPE_BITS + 1)  # W + 2 px - kw (meaningful for a valid window)
        m.d.comb += ow_num.eq(W + 2 * task.px - task.kw)
        quotient = Signal(SHAPE_BITS + 1)    # ow_num // sx, so far
        remainder = Signal(WINDOW_BITS)
        pool_rows = Signal(24)           # min(C H, 3) W: input rows a horizontal group reads
        pool_hwords = Signal(24)         # min(H, kh + 2 sy) owb: H words a vertical group reads
        owb_over = Signal()              # owb >= 2^nb: a vertical group cannot fit the H ring
        tensor = Signal(COUNT_BITS)      # beats_plane C
        group = Signal(COUNT_BITS)       # beats of a reduction group (a plane or the tensor)
        m.d.comb += group.eq(Mux(task.axis == Axis.TENSOR, tensor, sizes.beats_plane))
        span = Mux(H < task.kh + 2 * task.sy, H, task.kh + 2 * task.sy)

        def shift_add(acc, multiplier, multiplicand):
            """One step of a product, most significant multiplier bit first."""
            return acc.eq((acc << 1) + Mux(multiplier.bit_select(bit, 1), multiplicand, 0))

        with m.If(phase.init):
            small = Mux((C == 1) & (H <= 2), H, Mux((H == 1) & (C == 2), 2, 3))
            m.d.sync += [
                sizes.step_cols.eq(const_mul(task.sx, FL)),
                sizes.beat_cols.eq(task.sx << g.lane_bits),
                pool_rows.eq(Mux(small == 1, W, Mux(small == 2, W << 1, (W << 1) + W))),
                sizes.beats_plane.eq(0), sizes.rows.eq(0), quotient.eq(0), remainder.eq(0),
                sizes.h_owb.eq(0), sizes.kh_owb.eq(0), sizes.sy_owb.eq(0), sizes.py_owb.eq(0),
                pool_hwords.eq(0), tensor.eq(0), bit.eq(SHAPE_BITS),
            ]
        with m.If(phase.a):
            h = Cat(H, Const(0, 1))
            partial = Cat(ow_num.bit_select(bit, 1), remainder)
            fits = partial >= task.sx
            m.d.sync += [
                shift_add(sizes.beats_plane, h, self.sizes.wb), shift_add(sizes.rows, h, C),
                quotient.eq(Cat(fits, quotient)),
                remainder.eq(Mux(fits, partial - task.sx, partial)),
                bit.eq(Mux(bit == 0, Mux(task.mode == Mode.POOL, nb - 1, SHAPE_BITS - 1),
                           bit - 1)),
            ]
        with m.If(phase.owb):
            ow = Signal(SHAPE_BITS + 1)
            m.d.comb += ow.eq(quotient + 1)
            owb_s, owb_ms = div_params(len(ow) + 1, [FL])
            owb = Signal(SHAPE_BITS + 1)
            m.d.comb += owb.eq(const_mul(ow + (FL - 1), owb_ms[FL])[owb_s:])
            m.d.sync += [sizes.owb.eq(owb), owb_over.eq(owb >> nb != 0)]
        with m.If(phase.b):
            owb = sizes.owb
            m.d.sync += [
                shift_add(pool_hwords, owb, span), shift_add(sizes.h_owb, owb, H),
                shift_add(sizes.kh_owb, owb, task.kh), shift_add(sizes.sy_owb, owb, task.sy),
                shift_add(sizes.py_owb, owb, task.py), bit.eq(bit - 1),
            ]
        with m.If(phase.c):
            m.d.sync += [shift_add(tensor, C, sizes.beats_plane), bit.eq(bit - 1)]
        with m.If(self.clear):
            m.d.sync += sizes.beats_group.eq(group)
        return (pool_rows, pool_hwords, owb_over), group, bit

    def _int8_unsupported(self, m, arity, group):
        """The integer build's rule (:func:`npu_spec.planar.int8_supported`; combinational):
        the task is not one it computes exactly."""
        task = self.task
        g = self._geometry
        _, bias_ok = f32_integer(m, task.bias, g.word, "bias")
        _, scalar_ok = f32_integer(m, task.scalar, g.word, "scalar")
        elt_ok = Signal()
        with m.Switch(task.op):
            with m.Case(*INT8_ELT_OPS):
                m.d.comb += elt_ok.eq(1)
        elt_ok = (elt_ok
                  & ((task.op != EltOp.GAIN_BIAS)
                     | (((task.scale == 0) | (task.scale == F32_ONE)) & bias_ok))
                  & ((arity < 2) | (task.bcast != Bcast.SCALAR) | scalar_ok))
        sum_ok = Mux(task.axis == Axis.CHANNEL, task.channels <= INT8_CHANNEL_SUM,
                     group <= INT8_SUM_ELEMENTS >> g.lane_bits)
        red_ok = ((task.pre <= EltOp.NEG) & (task.post == PostFn.NONE)
                  & (task.scale == F32_ONE) & ((task.op != RedOp.SUM) | sum_ok))
        pool_ok = (task.op == PoolOp.MAX) | (task.op == PoolOp.MIN)
        return Mux(task.mode == Mode.ELTWISE, ~elt_ok,
                   Mux(task.mode == Mode.POOL, ~pool_ok, ~red_ok))

    def _check(self, m, arity, vector, uses_vector, pool_sizes, group):
        """The task's :class:`Error` (combinational; valid in the cycle of ``clear``), and
        whether it is known without the sizes' products (an elementwise task, or an error
        that does not depend on them: the products then stay 0, the sizes of a task with a
        zero dimension)."""
        g = self._geometry
        task = self.task
        C, H, W = task.channels, task.height, task.width
        pool_rows, pool_hwords, owb_over = pool_sizes
        is_elt = task.mode == Mode.ELTWISE
        is_pool = task.mode == Mode.POOL
        is_red = task.mode == Mode.REDUCE
        is_cred = is_red & (task.axis == Axis.CHANNEL)
        bad_mode = Signal()
        bad_format = Signal()
        bad_shape = Signal()
        bad_window = Signal()
        unsupported = Signal()
        if g.integer:
            m.d.comb += unsupported.eq(self._int8_unsupported(m, arity, group))
        m.d.comb += [
            bad_mode.eq(~(is_elt | is_pool | is_red)
                        | (is_elt & ((task.op > _last(EltOp)) | (task.bcast > _last(Bcast))))
                        | (is_pool & (task.op > _last(PoolOp)))
                        | (is_red & ((task.op > _last(RedOp)) | (task.pre > EltOp.SQUARE)
                                     | (task.axis > _last(Axis))))
                        | (is_cred & (task.post != PostFn.NONE))),
            bad_format.eq(Const(int(not self._has_fp16)) & (task.in_fmt | task.out_fmt)),
            bad_shape.eq((C == 0) | (H == 0) | (W == 0)
                         | (uses_vector & (vector > g.plane_depth))
                         | (is_cred & (self.sizes.beats_plane > g.h_depth))
                         | (is_pool & ~bad_window & ((pool_rows > g.plane_depth)
                                                     | owb_over
                                                     | (pool_hwords + 2 > g.h_depth)))),
            bad_window.eq(is_pool & (
                (task.kh == 0) | (task.kw == 0) | (task.kh > MAX_WINDOW)
                | (task.kw > MAX_WINDOW) | (task.sy == 0) | (task.sx == 0)
                | (task.py >= task.kh) | (task.px >= task.kw)
                | (task.kh > H + 2 * task.py) | (task.kw > W + 2 * task.px))),
        ]
        error = Signal(Error)
        with m.If(bad_mode):
            m.d.comb += error.eq(Error.BAD_MODE)
        with m.Elif(bad_format):
            m.d.comb += error.eq(Error.BAD_FORMAT)
        with m.Elif(unsupported):
            m.d.comb += error.eq(Error.UNSUPPORTED)
        with m.Elif(bad_shape):
            m.d.comb += error.eq(Error.BAD_SHAPE)
        with m.Elif(bad_window):
            m.d.comb += error.eq(Error.BAD_WINDOW)
        early = Signal()
        m.d.comb += early.eq(is_elt | bad_mode | bad_format | (C == 0) | (H == 0) | (W == 0)
                             | bad_window)
        return error, early

    def _routes(self, m, raster, fire):
        """What enters the lane pipeline (unless the sequence gives a beat), what the loader
        takes, and what the line buffer reads."""
        g = self._geometry
        task = self.task
        is_pool = task.mode == Mode.POOL
        is_cred = (task.mode == Mode.REDUCE) & (task.axis == Axis.CHANNEL)
        with m.If(is_pool):
            m.d.comb += self.lane_in.eq(self.queue_beat)
        with m.If(is_cred & ~self.accumulating):
            m.d.comb += self.lane_in.eq(self.drain_beat)
        m.d.comb += self.load.payload.eq(Mux(is_pool, self.a.payload, self.b.payload))

        # A broadcast vector's element is read for the beat that enters the lane pipeline
        # next: the raster's position after this cycle.
        position = Signal(raster.index.shape())
        m.d.comb += position.eq(Mux(fire, raster.next, raster.index))
        vector_base = Signal(self.read.base.shape())
        with m.Switch(task.bcast):
            with m.Case(Bcast.CHANNEL):
                m.d.comb += vector_base.eq(position.c)
            with m.Case(Bcast.ROW):
                m.d.comb += vector_base.eq(Cat(Const(0, g.lane_bits), position.xb))
            with m.Case(Bcast.COLUMN):
                m.d.comb += vector_base.eq(position.y)
        with m.If(is_pool):
            m.d.comb += self.read.eq(self.step_read)
        with m.Else():
            m.d.comb += [self.read.en.eq(self.lane_en), self.read.base.eq(vector_base),
                         self.read.spread.eq(Mux(task.bcast == Bcast.ROW, Spread.ROW,
                                                 Spread.SAME)),
                         self.read.stride.eq(task.sx)]

    def _sequence(self, m, raster, setup, fire, arity, vector, uses_vector, error):
        """The task sequence (see the module documentation)."""
        phase, bit, early = setup
        task = self.task
        a, b, c = self.a, self.b, self.c
        is_elt = task.mode == Mode.ELTWISE
        is_pool = task.mode == Mode.POOL
        is_cred = (task.mode == Mode.REDUCE) & (task.axis == Axis.CHANNEL)
        need_b = (arity >= 2) & (task.bcast == Bcast.NONE)
        need_c = arity == 3
        fed = Signal()      # every beat of a reduction task has been fed
        last = raster.last
        # The task latch: data for the units, which act on it only while a task runs; no
        # reset (a reset's fan-out costs routing).
        latched = Signal(config_layout(), reset_less=True)
        m.d.comb += task.eq(latched)

        with m.FSM(name="control") as fsm:
            with m.State("IDLE"), m.If(self.go):
                m.d.sync += [latched.eq(self.task_regs), self.code.eq(Error.NONE)]
                m.next = "SIZES"
            # The sizes (``_sizes``), unless the check needs none of their products.
            with m.State("SIZES"):
                m.d.comb += phase.init.eq(1)
                with m.If(early):
                    m.next = "CHECK"
                with m.Else():
                    m.next = "SIZES_A"
            with m.State("SIZES_A"):
                m.d.comb += phase.a.eq(1)
                with m.If(bit == 0):
                    with m.If(is_pool):
                        m.next = "SIZES_OWB"
                    with m.Elif(task.axis == Axis.TENSOR):
                        m.next = "SIZES_C"
                    with m.Else():
                        m.next = "CHECK"
            with m.State("SIZES_OWB"):
                m.d.comb += phase.owb.eq(1)
                m.next = "SIZES_B"
            with m.State("SIZES_B"):
                m.d.comb += phase.b.eq(1)
                with m.If(bit == 0):
                    m.next = "CHECK"
            with m.State("SIZES_C"):
                m.d.comb += phase.c.eq(1)
                with m.If(bit == 0):
                    m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += [self.clear.eq(1), raster.restart.eq(1)]
                m.d.sync += fed.eq(0)
                with m.If(error != Error.NONE):
                    m.d.sync += self.code.eq(error)
                    m.next = "FINISH"
                with m.Elif(is_elt):
                    with m.If(uses_vector):
                        m.d.comb += [self.load_start.eq(1), self.load_shape.planes.eq(1),
                                     self.load_shape.rows.eq(1),
                                     self.load_shape.length.eq(vector)]
                        m.next = "ELT_LOAD"
                    with m.Else():
                        m.next = "ELT_RUN"
                with m.Elif(is_pool):
                    m.next = "POOL_START"
                with m.Else():
                    m.next = "RED_FEED"

            with m.State("ELT_LOAD"):
                m.d.comb += [self.load.valid.eq(b.valid), b.ready.eq(self.load.ready)]
                with m.If(self.load_done):
                    m.next = "ELT_RUN"
            with m.State("ELT_RUN"):
                b_ok = ~need_b | b.valid
                c_ok = ~need_c | c.valid
                m.d.comb += [
                    fire.eq(self.lane_en & a.valid & b_ok & c_ok),
                    a.ready.eq(self.lane_en & b_ok & c_ok),
                    b.ready.eq(self.lane_en & need_b & a.valid & c_ok),
                    c.ready.eq(self.lane_en & need_c & a.valid & b_ok),
                    raster.advance.eq(fire),
                    self.lane_in.valid.eq(fire), self.lane_in.op.eq(task.op),
                    self.lane_in.mask.eq(self.beat_mask),
                    self.lane_in.vector.eq(uses_vector),
                    self.lane_in.scalar.eq(task.bcast == Bcast.SCALAR),
                    self.lane_in.a.eq(a.payload), self.lane_in.b.eq(b.payload),
                    self.lane_in.c.eq(c.payload),
                ]
                with m.If(fire & raster.done):
                    m.next = "DRAIN"

            with m.State("POOL_START"):
                m.d.comb += [self.load_start.eq(1), self.load_shape.planes.eq(task.channels),
                             self.load_shape.rows.eq(task.height),
                             self.load_shape.length.eq(task.width), self.walk_start.eq(1)]
                m.next = "POOL_RUN"
            with m.State("POOL_RUN"):
                # The loader and the filters run at the same time (the filters issue their
                # own steps).
                m.d.comb += [self.load.valid.eq(a.valid), a.ready.eq(self.load.ready)]
                with m.If(~self.h_busy & ~self.v_busy & ~self.queue_busy & self.lane_idle
                          & self.all_loaded):
                    m.next = "FINISH"

            with m.State("RED_FEED"):
                feed = a.valid & self.lane_en
                m.d.comb += [a.ready.eq(self.lane_en), raster.advance.eq(feed),
                             self.lane_in.valid.eq(a.valid), self.lane_in.op.eq(task.pre),
                             self.lane_in.mask.eq(self.beat_mask),
                             self.lane_in.a.eq(a.payload)]
                with m.If(feed):
                    with m.If(raster.done):
                        m.d.sync += fed.eq(1)
                    with m.If(last.xb & last.y):
                        with m.If(is_cred):
                            with m.If(last.c):
                                m.next = "CRED_WAIT"
                        with m.Elif((task.axis == Axis.PLANE) | last.c):
                            m.next = "RED_WAIT"
            with m.State("CRED_WAIT"):
                # Every beat accumulated and written: read the plane back.
                with m.If(self.acc_done):
                    m.d.comb += [self.drain_start.eq(1), raster.restart.eq(1)]
                    m.next = "CRED_OUT"
            with m.State("CRED_OUT"):
                m.d.comb += [self.drain.eq(1), raster.advance.eq(self.lane_en)]
                with m.If(self.lane_en & last.xb & last.y):
                    m.next = "DRAIN"
            with m.State("RED_WAIT"):
                with m.If(self.group_done):
                    with m.If(fed):     # the last result leaves the output register
                        m.next = "DRAIN"
                    with m.Else():
                        m.next = "RED_FEED"

            with m.State("DRAIN"):
                with m.If(self.lane_idle & ~self.drain_beat.valid):
                    m.next = "FINISH"
            with m.State("FINISH"):
                m.d.comb += self.finish.eq(1)
                m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
