"""Binary32 multiplier: round to nearest even, subnormals, canonical NaN.

Bit exact with :func:`npu_model.fp.f32_mul` (see ``docs/formats.md``): the exact 48-bit product
of the two 24-bit significands is normalised, shifted right into the subnormal range if needed
(bits shifted out kept as a sticky bit) and rounded once, to nearest with ties to even.
Overflow gives infinity; ``inf * 0`` and any NaN operand give ``0x7FC00000``; the sign of a zero
or infinite result is the exclusive or of the operand signs.

Two ways to use it:

* :class:`FP32Mul`, a component with a fixed ``LATENCY`` of 5 ``en`` cycles (operands,
  product, normalised product, product at binary32 precision, result);
* :func:`f32_mul_product` + :func:`f32_mul_round`, the two combinational halves it is made of
  (product, then normalise/round/pack), for users that place their own registers; the second
  half is :func:`f32_mul_normalise`, :func:`f32_mul_denormalise` and :func:`f32_mul_finish`,
  for users that register between them.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .fp32 import F32, F32_QNAN, count_leading_zeros

__all__ = ["FP32Mul", "MulNormal", "MulProduct", "MulRounding", "f32_mul_denormalise",
           "f32_mul_finish", "f32_mul_normalise", "f32_mul_pack", "f32_mul_product",
           "f32_mul_round", "f32_mul_special"]


class MulProduct(data.Struct):
    """The exact product ``(-1)**sign * prod * 2**(bexp - 126 - 47)`` and its class.

    ``bexp`` is the sum of the operands' effective biased exponents minus 127 (subnormal
    operands count as exponent 1), so that a product with its leading one at bit 47 has the
    biased result exponent ``bexp``.
    """
    prod: 48
    bexp: signed(11)
    sign: 1
    inf:  1
    nan:  1


def f32_mul_product(m, a, b, name):
    """Combinational first half: decode ``a`` and ``b`` (binary32 bits) and multiply.

    Returns a :class:`MulProduct` view (a signal named ``name``).
    """
    out = Signal(MulProduct, name=name)
    fa, fb = F32(a), F32(b)
    nan, inf = f32_mul_special(fa, fb)
    m.d.comb += [
        out.prod.eq(fa.significand() * fb.significand()),
        out.bexp.eq(fa.effective_exp() + fb.effective_exp() - 127),
        out.sign.eq(fa.sign ^ fb.sign),
        out.nan.eq(nan),
        out.inf.eq(inf),
    ]
    return out


def f32_mul_special(a, b):
    """``(nan, inf)`` of the product of the :class:`~npu.lib.fp32.F32` views ``a`` and ``b``:
    a NaN operand or ``inf * 0`` gives NaN, else an infinite operand gives infinity."""
    nan = (a.is_nan() | b.is_nan() | (a.is_inf() & b.is_zero()) | (b.is_inf() & a.is_zero()))
    return nan, a.is_inf() | b.is_inf()


class MulNormal(data.Struct):
    """A product normalised to a leading one at bit 47 (:func:`f32_mul_normalise`): ``norm``,
    the biased exponent ``be`` of its leading one (below 1 the value is subnormal), and the
    class of the product."""
    norm: 48
    be:   signed(12)
    sign: 1
    zero: 1
    inf:  1
    nan:  1


def f32_mul_normalise(m, p, name):
    """Combinational first step of the rounding: the leading-zero count of a
    :class:`MulProduct` view ``p`` and the left shift by it. Returns a :class:`MulNormal`
    view (a signal named ``name``)."""
    out = Signal(MulNormal, name=name)
    lz = count_leading_zeros(m, p.prod, name=f"{name}_lz")
    m.d.comb += [
        out.norm.eq((p.prod << lz)[:48]),
        out.be.eq(p.bexp - lz + 1),
        out.sign.eq(p.sign),
        out.zero.eq(p.prod == 0),
        out.inf.eq(p.inf),
        out.nan.eq(p.nan),
    ]
    return out


class MulRounding(data.Struct):
    """A product shifted to its binary32 precision (:func:`f32_mul_denormalise`): the 24 kept
    bits ``mant`` (hidden bit included; a subnormal has none), the guard and sticky bits, the
    exponent field less one of a normal result (0 for a subnormal) and the class."""
    mant:   24
    guard:  1
    sticky: 1
    field:  13
    sign:   1
    zero:   1
    inf:    1
    nan:    1


def f32_mul_denormalise(m, n, name):
    """Combinational: a :class:`MulNormal` view ``n`` shifted right into the subnormal range if
    its exponent is below 1 (the bits shifted out kept as a sticky bit). Returns a
    :class:`MulRounding` view (a signal named ``name``)."""
    out = Signal(MulRounding, name=name)
    be = n.be
    # Below exponent 1 the value is subnormal: shift right so the least significant kept bit
    # has weight 2**-149.
    rsh = Signal(range(64), name=f"{name}_rsh")
    m.d.comb += rsh.eq(Mux(be >= 1, 0, Mux(be < -60, 63, 1 - be)))
    # The bits shifted out only matter as a sticky bit: those of `norm` below `rsh` (a
    # thermometer mask: a shift of a constant, no comparators), so the shifter is 48 bits wide.
    shifted = Signal(48, name=f"{name}_shifted")
    m.d.comb += shifted.eq(n.norm >> rsh)
    below = Signal(48, name=f"{name}_below")
    m.d.comb += below.eq(~(Const((1 << 48) - 1, 48) << rsh))
    m.d.comb += [
        out.mant.eq(shifted[24:48]),
        out.guard.eq(shifted[23]),
        out.sticky.eq((shifted[:23] != 0) | ((n.norm & below) != 0)),
        out.field.eq(Mux(be >= 1, be - 1, 0)),
        out.sign.eq(n.sign),
        out.zero.eq(n.zero),
        out.inf.eq(n.inf),
        out.nan.eq(n.nan),
    ]
    return out


def f32_mul_finish(m, r, name):
    """Combinational: round a :class:`MulRounding` view ``r`` to nearest even and pack it.
    Returns a 32-bit signal named ``name``."""
    out = Signal(32, name=name)
    inc = r.guard & (r.sticky | r.mant[0])
    # The encoding is monotonic in (exponent field, significand): adding the rounded
    # significand (hidden bit included) to (field - 1) << 23 carries into the exponent when the
    # significand rounds up to 2**24, or when a subnormal rounds up to the smallest normal.
    # One carry chain: (2 X + 1) + (2 Y + inc) is 2 (X + Y + inc) + 1 when inc is 1, and
    # 2 (X + Y) + 1 when it is 0.
    total = Signal(38, name=f"{name}_total")
    m.d.comb += total.eq((Cat(Const(1, 1), Const(0, 23), r.field)
                          + Cat(inc, r.mant))[1:])
    with m.If(r.nan):
        m.d.comb += out.eq(F32_QNAN)
    with m.Elif(r.inf):
        m.d.comb += out.eq(Cat(Const(0, 23), Const(0xFF, 8), r.sign))
    with m.Elif(r.zero):
        m.d.comb += out.eq(r.sign << 31)
    with m.Elif(total >= 0x7F80_0000):
        m.d.comb += out.eq(Cat(Const(0, 23), Const(0xFF, 8), r.sign))
    with m.Else():
        m.d.comb += out.eq(Cat(total[:31], r.sign))
    return out


def f32_mul_pack(m, n, name):
    """Combinational second step of the rounding: :func:`f32_mul_denormalise`, then
    :func:`f32_mul_finish`. ``n`` is a :class:`MulNormal` view; returns a 32-bit signal named
    ``name``."""
    return f32_mul_finish(m, f32_mul_denormalise(m, n, f"{name}_d"), name)


def f32_mul_round(m, p, name):
    """Combinational second half: normalise, round to nearest even and pack a product
    (:func:`f32_mul_normalise`, then :func:`f32_mul_pack`).

    ``p`` is a :class:`MulProduct` view; returns a 32-bit signal named ``name``.
    """
    return f32_mul_pack(m, f32_mul_normalise(m, p, f"{name}_n"), name)


class FP32Mul(wiring.Component):
    """Pipelined binary32 multiplier.

    Operands presented in a cycle with ``en`` high give their product on ``result``
    ``LATENCY`` (5) ``en``-cycles later: stage 0 registers the operands, stage 1 the exact
    product, stage 2 the normalised product (:func:`f32_mul_normalise`), stage 3 the product
    at its binary32 precision with guard and sticky bits (:func:`f32_mul_denormalise`), stage 4
    the rounded, packed result (:func:`f32_mul_finish`). Every stage holds while ``en`` is
    low. The operand
    register lets a user feed a combinational result (an adder's round and pack) straight in,
    and the multiply then runs from registers into registers; the registers have no reset.

    Members
    -------
    en : In(1)
        Advance the pipeline.
    a, b : In(32)
        Operands (binary32 bits).
    result : Out(32)
        ``a * b`` of the operands presented ``LATENCY`` ``en``-cycles earlier (registered).
    """

    en:     In(1)
    a:      In(32)
    b:      In(32)
    result: Out(32)

    LATENCY = 5

    def elaborate(self, platform):
        m = Module()

        # Stage 0: the operands.
        a = Signal(32, name="s0_a", reset_less=True)
        b = Signal(32, name="s0_b", reset_less=True)
        with m.If(self.en):
            m.d.sync += [a.eq(self.a), b.eq(self.b)]

        # Stage 1: exact product.
        prod = f32_mul_product(m, a, b, "s0")
        s1 = Signal(MulProduct, name="s1", reset_less=True)
        with m.If(self.en):
            m.d.sync += s1.eq(prod)

        # Stage 2: normalised product.
        norm = f32_mul_normalise(m, s1, "s1n")
        s2 = Signal(MulNormal, name="s2", reset_less=True)
        with m.If(self.en):
            m.d.sync += s2.eq(norm)

        # Stage 3: at binary32 precision (subnormal shift), guard and sticky bits.
        rounding = f32_mul_denormalise(m, s2, "s2d")
        s3 = Signal(MulRounding, name="s3", reset_less=True)
        with m.If(self.en):
            m.d.sync += s3.eq(rounding)

        # Stage 4: round, pack.
        packed = f32_mul_finish(m, s3, "s3r")
        with m.If(self.en):
            m.d.sync += self.result.eq(packed)
        return m
