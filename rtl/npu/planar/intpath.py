"""The arithmetic of the integer build (``NPUConfig.planar_impl == "int8"``).

The integer build keeps the engine's structure (control, line buffer, filters, rings, queue,
tree) and replaces its binary32 units by two's-complement integer ones: it runs only the tasks
whose golden binary32 result is an integer reached without rounding
(:func:`npu_spec.planar.int8_supported`), so the integers equal the golden values.

* :class:`IntAddPipe`: add, max, min, compare with :class:`~npu.lib.fp32.FP32AddPipe`'s ports
  and latency (the filters interleave three beats over its three stages);
* :class:`ToInt`: the first format converter (INT8 in the low byte, sign-extended);
* :func:`to_int8`: the second format converter (saturate to int8, as a 16-bit element);
* :func:`f32_integer`: a binary32 constant's integer value and whether it is a small integer
  (the check of ``BIAS`` and ``SCALAR``).
"""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.planar import INT8_CONST_LIMIT

from ..lib.fp32 import F32, FP32_ADD_MODULE, FP32AddPipe, MacOp
from ..lib.shared import place
from .layouts import Fmt, beat_layout

__all__ = ["INT_ADD_MODULE", "IntAddPipe", "ToInt", "add_pipe", "f32_integer", "to_int8"]

#: Verilog module name of an :class:`IntAddPipe` shared by several users (``npu.lib.shared``).
INT_ADD_MODULE = "npu_planar_int_add"


class IntAddPipe(wiring.Component):
    """Pipelined ``a + b``, ``max``, ``min`` and compare of ``width``-bit signed integers.

    The result is computed from the operands and then delayed by three registers, so that
    ``result`` is the value of the operands presented :attr:`LATENCY` ``en``-cycles before, as
    with ``FP32AddPipe``. ``CMP`` gives ``+1`` if ``b > a``, ``-1`` if ``b < a``, else ``0``;
    ``MAX`` / ``MIN`` take ``a`` as the accumulator and ``b`` as the new value. The sum wraps
    (the integer build's rules keep every sum in range).

    Parameters
    ----------
    width : int
        Bits of the operands and of the result.

    Members
    -------
    en : In(1)
        Advance the pipeline.
    a, b : In(signed(width))
        Operands.
    op : In(MacOp)
        Operation.
    result : Out(signed(width))
        Result of the operands presented three ``en`` cycles earlier.
    """

    LATENCY = 3

    def __init__(self, width):
        if not isinstance(width, int) or width < 2:
            raise ValueError(f"width must be an integer of at least 2, not {width!r}")
        self._width = width
        super().__init__({
            "en":     In(1),
            "a":      In(signed(width)),
            "b":      In(signed(width)),
            "op":     In(MacOp),
            "result": Out(signed(width)),
        })

    @property
    def width(self):
        return self._width

    def elaborate(self, platform):
        m = Module()
        a, b = self.a, self.b
        value = Signal(signed(self._width))
        with m.Switch(self.op):
            with m.Case(MacOp.MAX):
                m.d.comb += value.eq(Mux(b > a, b, a))
            with m.Case(MacOp.MIN):
                m.d.comb += value.eq(Mux(b < a, b, a))
            with m.Case(MacOp.CMP):
                m.d.comb += value.eq(Mux(b > a, 1, Mux(b < a, -1, 0)))
            with m.Default():
                m.d.comb += value.eq(a + b)
        prev = value
        for k in range(self.LATENCY):
            stage = Signal(signed(self._width), name=f"stage{k + 1}")
            with m.If(self.en):
                m.d.sync += stage.eq(prev)
            prev = stage
        m.d.comb += self.result.eq(prev)
        return m


def add_pipe(m, name, shared, word, *, reset):
    """An add/max/min/compare pipe called ``name`` in ``m``: an ``FP32AddPipe`` (``word``
    None), else an :class:`IntAddPipe` of ``word`` bits; an instance of a shared module with
    ``shared`` (``npu.lib.shared.place``)."""
    if word is None:
        return place(m, name, shared, FP32_ADD_MODULE, FP32AddPipe, reset=reset)
    return place(m, name, shared, f"{INT_ADD_MODULE}{word}", lambda: IntAddPipe(word),
                 reset=reset)


class ToInt(wiring.Component):
    """The integer build's first format converter on a stream (combinational): the INT8 in
    each element's low byte, sign-extended to ``width`` bits.

    Members
    -------
    fmt : In(Fmt)
        Format of the incoming elements (only INT8 reaches the integer build: the task check
        rejects binary16).
    i : In(stream.Signature(beat_layout(lanes)))
        Beats of 16-bit elements.
    o : Out(stream.Signature(ArrayLayout(signed(width), lanes)))
        The same beats as integers; ``valid`` and ``ready`` pass through.
    """

    def __init__(self, lanes, width):
        self._lanes = lanes
        super().__init__({
            "fmt": In(Fmt),
            "i":   In(stream.Signature(beat_layout(lanes))),
            "o":   Out(stream.Signature(data.ArrayLayout(signed(width), lanes))),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.o.valid.eq(self.i.valid), self.i.ready.eq(self.o.ready)]
        for k in range(self._lanes):
            m.d.comb += self.o.payload[k].eq(self.i.payload.data[k][:8].as_signed())
        return m


def to_int8(m, value, name):
    """A signed integer ``value`` saturated to int8, sign-extended to a 16-bit element
    (combinational)."""
    out = Signal(signed(16), name=name)
    m.d.comb += out.eq(Mux(value > 127, 127, Mux(value < -128, -128, value)))
    return out


def f32_integer(m, bits, width, name):
    """``(value, ok)`` of binary32 ``bits`` (combinational): ``ok`` when it is an integer of
    magnitude below :data:`~npu_spec.planar.INT8_CONST_LIMIT` (either zero included), and
    then ``value`` is that integer in ``width`` bits (the rule of
    :func:`npu_spec.planar.f32_small_integer`)."""
    f = F32(bits)
    e = Signal(signed(10), name=f"{name}_e")
    m.d.comb += e.eq(f.exp - 127)
    top = INT8_CONST_LIMIT.bit_length() - 1             # magnitudes below 2**top
    sig = Signal(24 + top, name=f"{name}_sig")          # the significand at 2**(e - 23)
    m.d.comb += sig.eq((f.frac | (1 << 23)) << e.as_unsigned()[:(top - 1).bit_length()])
    zero = (f.exp == 0) & (f.frac == 0)
    in_range = (e >= 0) & (e < top)
    integral = sig[:23] == 0
    value = Signal(signed(width), name=f"{name}_value")
    ok = Signal(name=f"{name}_ok")
    magnitude = sig[23:]
    m.d.comb += [
        ok.eq(zero | (in_range & integral)),
        value.eq(Mux(zero, 0, Mux(f.sign, -magnitude, magnitude))),
    ]
    return value, ok

