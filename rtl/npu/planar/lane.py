"""The lane pipeline: a binary32 datapath per lane (or per ``share`` lanes), shared by every mode.

Each lane computes ``y = op1(x1, x2) * m2 + a2`` with a binary32 add/max/min/compare pipe
(:class:`FP32AddPipe`), a multiplier (:class:`FP32Mul`) and an adder, then an output register
(:data:`LANE_LATENCY` cycles from the input register); :class:`Lane` chooses ``x1``, ``x2``,
``m2`` and ``a2`` for each elementwise operation (``docs/planar.md``, "Modes and registers"),
so that unused stages get identities (``* 1.0``, ``+ (-0.0)``). Pooling results enter as
``MUL`` by the average's divisor, a reduction's beats as its pre-operation, the channel
accumulator's output pass as ``MUL`` by ``SCALE``. With ``share`` > 1
(``NPUConfig.planar_fp_share``) each :class:`Lane` serves ``share`` lanes of the beat, one per
cycle, and a beat takes ``share`` cycles (:class:`LanePipeline`).

The integer build's lane (:class:`IntLane`) has one :class:`~.intpath.IntAddPipe` and the
output register (:data:`INT_LANE_LATENCY` cycles): it computes the operations of
:data:`npu_spec.planar.INT8_ELT_OPS` on integers, and ``MUL`` (a pooling result, the
accumulator's output pass: the multiplier is 1 in every task the build runs) passes A.
"""

from amaranth.hdl import Array, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.formats import F32_NEG_ZERO, F32_ONE

from ..lib.fp32 import FP32AddPipe, MacOp
from ..lib.fp32mul import FP32Mul
from ..lib.pipe import DelayLine, delay
from ..lib.shared import place
from .geometry import LANE_LATENCY
from .intpath import IntAddPipe
from .layouts import EltOp, lane_input_layout, lane_output_layout

__all__ = ["INT_LANE_LATENCY", "LANE_LATENCY", "LANE_MODULE", "IntLane", "Lane", "LanePipeline"]

#: Verilog module name of a :class:`Lane` shared by the lanes of a pipeline (``npu.lib.shared``).
LANE_MODULE = "npu_planar_lane"
#: Cycles from the lane pipeline's input register to its output register, integer build.
INT_LANE_LATENCY = IntAddPipe.LATENCY + 1

_SIGN = 0x8000_0000
_MAGNITUDE = 0x7FFF_FFFF


class Lane(wiring.Component):
    """One lane: the operands of ``op``, the three binary32 units and the output register.

    ``result`` is the value of the operands presented :data:`LANE_LATENCY` ``en``-cycles
    before (every stage advances only while ``en`` is high).

    Members
    -------
    en : In(1)
        Advance the pipeline.
    op : In(EltOp)
        The elementwise operation.
    a, b, c : In(32)
        Operands A, B, C (binary32).
    scale, bias : In(32)
        ``SCALE`` and ``BIAS`` (binary32), for gain-bias.
    result : Out(32)
        ``op(A, B, C)`` (binary32), registered.
    """

    en:     In(1)
    op:     In(EltOp)
    a:      In(32)
    b:      In(32)
    c:      In(32)
    scale:  In(32)
    bias:   In(32)
    result: Out(32)

    def elaborate(self, platform):
        m = Module()
        a, b, c = self.a, self.b, self.c

        # Operands of each stage: pre = op1(x1, x2), then pre * m2 (or pre * pre), + a2.
        x1 = Signal(32)
        x2 = Signal(32)
        pre_op = Signal(MacOp)
        m2 = Signal(32)
        square = Signal()
        a2 = Signal(32)
        m.d.comb += [x1.eq(a), x2.eq(F32_NEG_ZERO), pre_op.eq(MacOp.MAC), m2.eq(F32_ONE),
                     a2.eq(F32_NEG_ZERO)]
        with m.Switch(self.op):
            with m.Case(EltOp.RELU):
                m.d.comb += [x2.eq(0), pre_op.eq(MacOp.MAX)]
            with m.Case(EltOp.ABS):
                m.d.comb += x1.eq(a & _MAGNITUDE)
            with m.Case(EltOp.NEG):
                m.d.comb += x1.eq(a ^ _SIGN)
            with m.Case(EltOp.SQUARE):
                m.d.comb += square.eq(1)
            with m.Case(EltOp.GAIN_BIAS):
                m.d.comb += [m2.eq(self.scale), a2.eq(self.bias)]
            with m.Case(EltOp.ADD):
                m.d.comb += x2.eq(b)
            with m.Case(EltOp.SUB):
                m.d.comb += x2.eq(b ^ _SIGN)
            with m.Case(EltOp.MUL):
                m.d.comb += m2.eq(b)
            with m.Case(EltOp.MAX):
                m.d.comb += [x2.eq(b), pre_op.eq(MacOp.MAX)]
            with m.Case(EltOp.MIN):
                m.d.comb += [x2.eq(b), pre_op.eq(MacOp.MIN)]
            with m.Case(EltOp.CMP):
                # The adder's compare gives +1 when its b exceeds its a.
                m.d.comb += [x1.eq(b), x2.eq(a), pre_op.eq(MacOp.CMP)]
            with m.Case(EltOp.FMA):
                m.d.comb += [x1.eq(b), m2.eq(c), a2.eq(a)]
            with m.Case(EltOp.ADDMUL):
                m.d.comb += [x2.eq(b), m2.eq(c)]

        # The three units; the operands of the later stages wait for the earlier ones.
        m.submodules.pre = pre = FP32AddPipe()
        m.submodules.mul = mul = FP32Mul()
        m.submodules.post = post = FP32AddPipe()
        at_mul = data.StructLayout({"m2": 32, "square": 1})
        at_mul_in = Signal(at_mul)
        m.d.comb += [at_mul_in.m2.eq(m2), at_mul_in.square.eq(square)]
        # Data only, like the units' registers (the lane pipeline's valid bits travel apart):
        # no reset.
        at_mul_d = delay(m, at_mul_in, FP32AddPipe.LATENCY, en=self.en, name="at_mul",
                         reset_less=True)[-1]
        a2_d = delay(m, a2, FP32AddPipe.LATENCY + FP32Mul.LATENCY, en=self.en, name="a2",
                     reset_less=True)[-1]
        m.d.comb += [
            pre.en.eq(self.en), pre.a.eq(x1), pre.b.eq(x2), pre.op.eq(pre_op),
            mul.en.eq(self.en), mul.a.eq(pre.result),
            mul.b.eq(Mux(at_mul_d.square, pre.result, at_mul_d.m2)),
            post.en.eq(self.en), post.a.eq(mul.result), post.b.eq(a2_d),
            post.op.eq(MacOp.MAC),
        ]
        result = Signal(32, reset_less=True)    # the output register (data: no reset)
        with m.If(self.en):
            m.d.sync += result.eq(post.result)
        m.d.comb += self.result.eq(result)
        return m


class IntLane(wiring.Component):
    """One lane of the integer build: ``op1(x1, x2)`` in an :class:`IntAddPipe`, then the
    output register (:data:`INT_LANE_LATENCY` ``en``-cycles).

    Parameters
    ----------
    word : int
        Bits of the values.

    Members
    -------
    en : In(1)
        Advance the pipeline.
    op : In(EltOp)
        The elementwise operation (one of ``INT8_ELT_OPS``, or ``MUL``, which passes A).
    a, b, c : In(signed(word))
        Operands A, B, C (C is not used).
    scale : In(signed(word))
        Nonzero when ``SCALE`` is 1.0 (gain-bias passes A), zero when it is +0.0.
    bias : In(signed(word))
        ``BIAS`` as an integer.
    result : Out(signed(word))
        ``op(A, B)``, registered.
    """

    def __init__(self, word):
        self._word = word
        shape = signed(word)
        super().__init__({"en": In(1), "op": In(EltOp), "a": In(shape), "b": In(shape),
                          "c": In(shape), "scale": In(shape), "bias": In(shape),
                          "result": Out(shape)})

    def elaborate(self, platform):
        m = Module()
        a, b = self.a, self.b
        x1 = Signal(signed(self._word))
        x2 = Signal(signed(self._word))
        pre_op = Signal(MacOp)
        m.d.comb += [x1.eq(a), x2.eq(0), pre_op.eq(MacOp.MAC)]
        with m.Switch(self.op):
            with m.Case(EltOp.RELU):
                m.d.comb += pre_op.eq(MacOp.MAX)
            with m.Case(EltOp.ABS):
                m.d.comb += x1.eq(Mux(a < 0, -a, a))
            with m.Case(EltOp.NEG):
                m.d.comb += x1.eq(-a)
            with m.Case(EltOp.GAIN_BIAS):
                m.d.comb += [x1.eq(Mux(self.scale != 0, a, 0)), x2.eq(self.bias)]
            with m.Case(EltOp.ADD):
                m.d.comb += x2.eq(b)
            with m.Case(EltOp.SUB):
                m.d.comb += x2.eq(-b)
            with m.Case(EltOp.MAX):
                m.d.comb += [x2.eq(b), pre_op.eq(MacOp.MAX)]
            with m.Case(EltOp.MIN):
                m.d.comb += [x2.eq(b), pre_op.eq(MacOp.MIN)]
            with m.Case(EltOp.CMP):
                m.d.comb += [x1.eq(b), x2.eq(a), pre_op.eq(MacOp.CMP)]
        m.submodules.pre = pre = IntAddPipe(self._word)
        m.d.comb += [pre.en.eq(self.en), pre.a.eq(x1), pre.b.eq(x2), pre.op.eq(pre_op)]
        with m.If(self.en):
            m.d.sync += self.result.eq(pre.result)
        return m


class LanePipeline(wiring.Component):
    """The input register and ``lanes // share`` :class:`Lane` s.

    Operand B of a lane is ``i.b``, or the line buffer's read data ``vector`` (one cycle after
    the beat enters, when ``i.vector``), or ``scalar`` (when ``i.scalar``).

    With ``share`` > 1 each lane's units serve ``share`` lanes of the beat: a beat stays in the
    input register for ``share`` ``en``-cycles (phases), and in phase ``p`` unit ``k`` takes
    lane ``p * lanes // share + k``. The results are gathered in one register per phase; the
    whole beat is on ``o`` in the ``en``-cycle of ``step``, when the next beat is taken.
    Everything that follows the beats (control, queue, accumulator, reduction) advances on
    ``step`` instead of ``en``.

    Parameters
    ----------
    lanes : int
        ``L``, lanes of a beat.
    shared : SharedModules or None
        Library of shared blocks (``npu.lib.shared``; Verilog output only): the lanes are
        instances of one converted :class:`Lane`.
    word : int or None
        None: binary32 lanes (:class:`Lane`); else integer lanes of this width
        (:class:`IntLane`, the integer build).
    share : int
        Lanes of the beat served by one :class:`Lane` (a power of two dividing ``lanes``;
        binary32 lanes only): a beat every ``share`` cycles.

    Members
    -------
    flush : In(1)
        Synchronous clear of every register here and in the lanes (the engine's flush; it
        reaches the lanes also when they are instances of a shared module).
    en : In(1)
        Advance the whole pipeline, input register included.
    step : Out(1)
        Combinational: the beat on ``i`` is taken in this cycle and the beat on ``o`` leaves
        (``en`` in the last phase; ``en`` itself when ``share`` is 1).
    i : In(lane_input_layout(lanes))
        The beat entering (taken on ``step``).
    vector : In(ArrayLayout(32, lanes))
        Line-buffer read data for a beat in the input register (held until the next ``step``).
    scale, bias, scalar : In(32)
        ``SCALE``, ``BIAS`` and ``SCALAR`` (binary32).
    o : Out(lane_output_layout(lanes))
        The beat leaving, :attr:`latency` steps after the input register (``o.valid`` only in
        a ``step`` cycle).
    """

    def __init__(self, lanes, *, shared=None, word=None, share=1):
        if share < 1 or share & (share - 1) or lanes % share:
            raise ValueError(f"share must be a power of two dividing lanes ({lanes}), "
                             f"not {share!r}")
        if share > 1 and word is not None:
            raise ValueError(f"share must be 1 for integer lanes, not {share!r}")
        self._lanes = lanes
        self._shared = shared
        self._word = word
        self._share = share
        w = word or 32
        super().__init__({
            "flush":  In(1),
            "en":     In(1),
            "step":   Out(1),
            "i":      In(lane_input_layout(lanes, w)),
            "vector": In(data.ArrayLayout(w, lanes)),
            "scale":  In(w),
            "bias":   In(w),
            "scalar": In(w),
            "o":      Out(lane_output_layout(lanes, w)),
        })

    @property
    def lanes(self):
        return self._lanes

    @property
    def share(self):
        return self._share

    @property
    def unit_latency(self):
        """``en``-cycles from a lane's operands to its result register."""
        return LANE_LATENCY if self._word is None else INT_LANE_LATENCY

    @property
    def pad(self):
        """Registers after each lane's result, so that the last phase's result reaches its
        phase register just before a ``step``."""
        return (self._share - 1 - self.unit_latency) % self._share

    @property
    def latency(self):
        """Steps from the input register to the output register."""
        if self._share == 1:
            return self.unit_latency
        return (self.unit_latency + self.pad + 1) // self._share

    def elaborate(self, platform):
        m = Module()
        w = self._word or 32
        S = self._share
        units = self._lanes // S
        # The input register: its data has no reset (only its valid bit).
        beat = Signal(lane_input_layout(self._lanes, w), reset_less=True)
        beat_valid = Signal()
        phase = Signal(range(S), name="phase")              # en-cycles of the beat in it
        m.d.comb += self.step.eq(self.en & (phase == S - 1))
        with m.If(self.step):
            m.d.sync += [beat.eq(self.i), beat_valid.eq(self.i.valid)]
        if S > 1:
            with m.If(self.en):
                m.d.sync += phase.eq(phase + 1)   # S is a power of two: wraps

        # Valid and mask, from the input register's first phase to the output.
        m.submodules.flags = flags = DelayLine(
            data.StructLayout({"valid": 1, "mask": self._lanes}),
            self.unit_latency if S == 1 else S + self.unit_latency + self.pad, enable=True)
        m.d.comb += [flags.en.eq(self.en), flags.i.valid.eq(beat_valid),
                     flags.i.mask.eq(beat.mask),
                     self.o.valid.eq(flags.o.valid & (phase == S - 1)),
                     self.o.mask.eq(flags.o.mask)]

        # Unit k takes lane `p * units + k` in phase p.
        def pick(values, k):
            return values[k] if S == 1 else Array(values[p * units + k] for p in range(S))[phase]

        results = []
        for k in range(units):
            if self._word is None:
                lane = place(m, f"lane{k}", self._shared, LANE_MODULE, Lane, reset=self.flush)
            else:
                lane = place(m, f"lane{k}", self._shared, f"{LANE_MODULE}_int{w}",
                             lambda: IntLane(w), reset=self.flush)
            m.d.comb += [
                lane.en.eq(self.en), lane.op.eq(beat.op), lane.a.eq(pick(beat.a, k)),
                lane.b.eq(Mux(beat.vector, pick(self.vector, k),
                              Mux(beat.scalar, self.scalar, pick(beat.b, k)))),
                lane.c.eq(pick(beat.c, k)), lane.scale.eq(self.scale), lane.bias.eq(self.bias),
            ]
            results.append(lane.result)
        if S == 1:
            m.d.comb += [self.o.value[k].eq(results[k]) for k in range(units)]
            return ResetInserter(self.flush)(m)

        # Phase registers: a result of phase p (after the pad) arrives when `phase` is p - 1.
        for k in range(units):
            result = (delay(m, results[k], self.pad, en=self.en, name=f"pad{k}",
                            reset_less=True)[-1]
                      if self.pad else results[k])
            for p in range(S):
                held = Signal(w, name=f"held{p * units + k}", reset_less=True)
                with m.If(self.en & (phase == (p - 1) % S)):
                    m.d.sync += held.eq(result)
                m.d.comb += self.o.value[p * units + k].eq(held)
        return ResetInserter(self.flush)(m)
