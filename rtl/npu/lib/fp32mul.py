"""Binary32 multiplier: round to nearest even, subnormals, canonical NaN.

Bit exact with :func:`npu_model.fp.f32_mul` (see ``docs/formats.md``): the exact 48-bit product
of the two 24-bit significands is normalised, shifted right into the subnormal range if needed
(bits shifted out kept as a sticky bit) and rounded once, to nearest with ties to even.
Overflow gives infinity; ``inf * 0`` and any NaN operand give ``0x7FC00000``; the sign of a zero
or infinite result is the exclusive or of the operand signs.

Two ways to use it:

* :class:`FP32Mul`, a component with a fixed ``LATENCY`` of 2 ``en`` cycles;
* :func:`f32_mul_product` + :func:`f32_mul_round`, the two combinational halves it is made of
  (product, then normalise/round/pack), for users that place their own registers.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .fp32 import F32, F32_QNAN, count_leading_zeros

__all__ = ["FP32Mul", "MulProduct", "f32_mul_product", "f32_mul_round",
           "f32_mul_special"]


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


def f32_mul_round(m, p, name):
    """Combinational second half: normalise, round to nearest even and pack a product.

    ``p`` is a :class:`MulProduct` view; returns a 32-bit signal named ``name``.
    """
    out = Signal(32, name=name)
    lz = count_leading_zeros(m, p.prod, name=f"{name}_lz")
    norm = Signal(48, name=f"{name}_norm")
    m.d.comb += norm.eq((p.prod << lz)[:48])
    # Biased exponent of the leading one; below 1 the value is subnormal: shift right so the
    # least significant kept bit has weight 2**-149.
    be = Signal(signed(12), name=f"{name}_be")
    m.d.comb += be.eq(p.bexp - lz + 1)
    rsh = Signal(range(64), name=f"{name}_rsh")
    m.d.comb += rsh.eq(Mux(be >= 1, 0, Mux(be < -60, 63, 1 - be)))
    # The bits shifted out only matter as a sticky bit: those of `norm` below `rsh` (a
    # thermometer mask), so the shifter is 48 bits wide.
    shifted = Signal(48, name=f"{name}_shifted")
    m.d.comb += shifted.eq(norm >> rsh)
    below = Signal(48, name=f"{name}_below")
    m.d.comb += below.eq(Cat(*[rsh > j for j in range(48)]))
    lost = (norm & below) != 0
    mant = shifted[24:48]
    guard = shifted[23]
    sticky = (shifted[:23] != 0) | lost
    rounded = Signal(25, name=f"{name}_rnd")
    m.d.comb += rounded.eq(mant + (guard & (sticky | mant[0])))
    # The encoding is monotonic in (exponent field, significand): adding the rounded
    # significand (hidden bit included) to (field - 1) << 23 carries into the exponent when the
    # significand rounds up to 2**24, or when a subnormal rounds up to the smallest normal.
    field = Mux(be >= 1, be - 1, 0)
    total = Signal(40, name=f"{name}_total")
    m.d.comb += total.eq(Cat(Const(0, 23), field[:13]) + rounded)
    with m.If(p.nan):
        m.d.comb += out.eq(F32_QNAN)
    with m.Elif(p.inf):
        m.d.comb += out.eq(Cat(Const(0, 23), Const(0xFF, 8), p.sign))
    with m.Elif(p.prod == 0):
        m.d.comb += out.eq(p.sign << 31)
    with m.Elif(total >= 0x7F80_0000):
        m.d.comb += out.eq(Cat(Const(0, 23), Const(0xFF, 8), p.sign))
    with m.Else():
        m.d.comb += out.eq(Cat(total[:31], p.sign))
    return out


class FP32Mul(wiring.Component):
    """Pipelined binary32 multiplier.

    Operands presented in a cycle with ``en`` high give their product on ``result``
    ``LATENCY`` (2) ``en``-cycles later: stage 1 registers the exact product, stage 2 registers
    the rounded, packed result. Both stages hold while ``en`` is low.

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

    LATENCY = 2

    def elaborate(self, platform):
        m = Module()

        # Stage 1: exact product.
        prod = f32_mul_product(m, self.a, self.b, "s0")
        s1 = Signal(MulProduct, name="s1")
        with m.If(self.en):
            m.d.sync += s1.eq(prod)

        # Stage 2: normalise, round, pack.
        packed = f32_mul_round(m, s1, "s1r")
        with m.If(self.en):
            m.d.sync += self.result.eq(packed)
        return m
