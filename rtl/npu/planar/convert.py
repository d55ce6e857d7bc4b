"""Format converters and the binary32 rounding primitive (all combinational).

* :class:`ToF32`: the first format converter on an operand stream (a beat of 16-bit elements
  to a beat of binary32 values).
* :func:`to_f32`: the first format converter of one element, INT8 or binary16 to binary32
  (exact).
* :func:`from_f32`: the second format converter, binary32 to binary16 (RNE, overflow to
  infinity, NaN to ``0x7E00``) or INT8 (RNE, saturating, NaN to 0), sign-extended to 16 bits;
  its two steps :func:`narrow_align` and :func:`narrow_round` for a user that registers
  between them.
* :func:`f32_round_pack`: round ``(-1)**sign * sig * 2**exp`` to binary32 (RNE, subnormals);
  its three steps :func:`f32_normalise`, :func:`f32_align` and :func:`f32_pack` for a user that
  registers between them.

They match :mod:`npu_model.fp` bit for bit.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..lib.fp32 import F32_QNAN, count_leading_zeros, decode_operand
from .layouts import Fmt, beat_layout

__all__ = ["ToF32", "aligned_layout", "f32_align", "f32_normalise", "f32_pack", "f32_round_pack",
           "from_f32", "narrow_align", "narrow_layout", "narrow_round", "normalised_layout",
           "to_f32"]


class ToF32(wiring.Component):
    """The first format converter on a stream (combinational).

    Parameters
    ----------
    lanes : int
        Elements per beat.

    Members
    -------
    fmt : In(Fmt)
        Format of the incoming elements.
    i : In(stream.Signature(beat_layout(lanes)))
        Beats of 16-bit elements.
    o : Out(stream.Signature(ArrayLayout(32, lanes)))
        The same beats in binary32 (exact); ``valid`` and ``ready`` pass through.
    """

    def __init__(self, lanes):
        self._lanes = lanes
        super().__init__({
            "fmt": In(Fmt),
            "i":   In(stream.Signature(beat_layout(lanes))),
            "o":   Out(stream.Signature(data.ArrayLayout(32, lanes))),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.o.valid.eq(self.i.valid), self.i.ready.eq(self.o.ready)]
        for k in range(self._lanes):
            m.d.comb += self.o.payload[k].eq(
                to_f32(m, self.i.payload.data[k], self.fmt == Fmt.FP16, f"x{k}"))
        return m


def to_f32(m, raw, is_fp16, name):
    """Binary32 bits of a 16-bit element (INT8 in the low byte, or binary16).

    The element is ``(-1)**sign * sig * 2**exp`` with an 11-bit ``sig``; it is normalised with
    an 11-bit leading-zero count and shift (every such value is a normal binary32 number)."""
    op = decode_operand(m, raw, ~Value.cast(is_fp16).bool(), f"{name}_dec")
    lz = count_leading_zeros(m, op.sig, name=f"{name}_lz")
    norm = Signal(11, name=f"{name}_norm")
    m.d.comb += norm.eq(op.sig << lz)
    biased = Signal(signed(10), name=f"{name}_exp")
    m.d.comb += biased.eq(op.exp - lz + (10 + 127))
    out = Signal(32, name=name)
    with m.If(op.nan):
        m.d.comb += out.eq(F32_QNAN)
    with m.Elif(op.inf):
        m.d.comb += out.eq(Cat(Const(0xFF << 23, 31), op.sign))
    with m.Elif(op.sig == 0):
        m.d.comb += out.eq(op.sign << 31)
    with m.Else():
        m.d.comb += out.eq(Cat(Const(0, 13), norm[:10], biased[:8], op.sign))
    return out


def _round_shift(m, sig, rsh, name):
    """``(sig >> rsh, guard, sticky)`` of a 24-bit significand, ``rsh`` below 32."""
    wide = Signal(56, name=f"{name}_wide")
    m.d.comb += wide.eq(Cat(Const(0, 32), sig) >> rsh)
    return wide[32:], wide[31], wide[:31] != 0


def from_f32(m, bits, is_fp16, name):
    """16-bit element of binary32 ``bits``: binary16, or INT8 sign-extended. Combinational:
    :func:`narrow_align` then :func:`narrow_round`, which a user may register between."""
    return narrow_round(m, narrow_align(m, bits, is_fp16, name), is_fp16, name)


def narrow_layout():
    """The result of :func:`narrow_align`: the significand at the format's rounding point
    with guard and sticky bits, and the classes the rounding step needs."""
    return data.StructLayout({"sign": 1, "nan": 1, "inf": 1, "big": 1, "field16": 9,
                              "mant": 24, "guard": 1, "sticky": 1})


def narrow_align(m, bits, is_fp16, name):
    """First step of :func:`from_f32`: the significand of binary32 ``bits`` shifted to the
    binary16 rounding point (13 bits dropped when normal, more when subnormal) or to the
    binary point (INT8); one shifter serves both formats."""
    out = Signal(narrow_layout(), name=f"{name}_al")
    e = bits[23:31]
    frac = bits[:23]
    sig = Cat(frac, e != 0)
    e_eff = Mux(e == 0, 1, e)
    e16 = Signal(signed(10), name=f"{name}_e16")
    m.d.comb += e16.eq(e_eff - 112)
    rsh = Signal(range(32), name=f"{name}_rsh")
    with m.If(is_fp16):
        m.d.comb += rsh.eq(Mux(e16 >= 1, 13, Mux(e16 < -16, 31, 14 - e16)))
    with m.Else():
        m.d.comb += rsh.eq(Mux(e_eff >= 150, 0, Mux(e_eff < 119, 31, 150 - e_eff)))
    mant, guard, sticky = _round_shift(m, sig, rsh, name)
    inf = (e == 0xFF) & (frac == 0)
    m.d.comb += [
        out.sign.eq(bits[31]), out.nan.eq((e == 0xFF) & (frac != 0)), out.inf.eq(inf),
        out.big.eq((e_eff >= 150) | inf), out.field16.eq(Mux(e16 >= 1, e16 - 1, 0)),
        out.mant.eq(mant), out.guard.eq(guard), out.sticky.eq(sticky),
    ]
    return out


def narrow_round(m, a, is_fp16, name):
    """Last step of :func:`from_f32`: round an aligned value (:func:`narrow_align`, aligned
    for the same format) to nearest even and pack it as binary16 (overflow to infinity, NaN
    to ``0x7E00``) or saturate it to INT8 (NaN to 0)."""
    out = Signal(16, name=name)
    inc = a.guard & (a.sticky | a.mant[0])
    total16 = Signal(20, name=f"{name}_t16")
    m.d.comb += total16.eq(Cat(Const(0, 10), a.field16) + a.mant[:12] + inc)
    h = Signal(16, name=f"{name}_h16")
    with m.If(a.nan):
        m.d.comb += h.eq(0x7E00)
    with m.Elif(a.inf | (total16 >= 0x7C00)):
        m.d.comb += h.eq(Cat(Const(0x7C00, 15), a.sign))
    with m.Else():
        m.d.comb += h.eq(Cat(total16[:15], a.sign))

    mag = Signal(25, name=f"{name}_mag")
    m.d.comb += mag.eq(a.mant + inc)
    i8 = Signal(signed(16), name=f"{name}_i8")
    with m.If(a.nan):
        m.d.comb += i8.eq(0)
    with m.Elif(a.sign):
        m.d.comb += i8.eq(Mux(a.big | (mag >= 128), -128, -mag[:8]))
    with m.Else():
        m.d.comb += i8.eq(Mux(a.big | (mag >= 127), 127, mag[:8]))

    m.d.comb += out.eq(Mux(is_fp16, h, i8))
    return out


def f32_round_pack(m, sign, sig, exp, name):
    """Binary32 bits of ``(-1)**sign * sig * 2**exp`` rounded to nearest even.

    ``sig`` is unsigned (at least 26 bits wide, at most 64), ``exp`` signed. Subnormal results
    are rounded at ``2**-149``; overflow gives infinity; ``sig == 0`` gives a signed zero.
    Combinational: the composition of :func:`f32_normalise`, :func:`f32_align` and
    :func:`f32_pack`, which a sequential user may register between.
    """
    norm = f32_normalise(m, sig, exp, name)
    aligned = f32_align(m, norm, name)
    return f32_pack(m, sign, aligned, name)


def normalised_layout(width):
    """The result of :func:`f32_normalise` for a ``width``-bit significand."""
    return data.StructLayout({"norm": width, "be": signed(14), "rsh": range(64), "zero": 1})


def aligned_layout():
    """The result of :func:`f32_align`: 24 significand bits with guard and sticky."""
    return data.StructLayout({"mant": 24, "guard": 1, "sticky": 1, "field": 14, "huge": 1,
                              "zero": 1})


def f32_normalise(m, sig, exp, name):
    """First step of :func:`f32_round_pack`: the leading one of ``sig`` at its top bit, the
    biased exponent of that bit and the right shift a subnormal result needs."""
    width = len(sig)
    out = Signal(normalised_layout(width), name=f"{name}_n")
    lz = count_leading_zeros(m, sig, name=f"{name}_lz")
    be = Signal(signed(14), name=f"{name}_be")  # biased exponent of the leading one
    m.d.comb += [
        be.eq(exp + (width - 1 + 127) - lz),
        out.norm.eq((sig << lz)[:width]),
        out.be.eq(be),
        out.rsh.eq(Mux(be >= 1, 0, Mux(be < -60, 63, 1 - be))),
        out.zero.eq(sig == 0),
    ]
    return out


def f32_align(m, n, name):
    """Second step: shift a normalised significand (:func:`f32_normalise`) right to binary32
    precision (further for a subnormal), with the guard and sticky bits."""
    width = len(n.norm)
    out = Signal(aligned_layout(), name=f"{name}_a")
    wide = Signal(width + 64, name=f"{name}_wide")
    m.d.comb += wide.eq(Cat(Const(0, 64), n.norm) >> n.rsh)
    shifted = wide[64:]
    m.d.comb += [
        out.mant.eq(shifted[width - 24:]),
        out.guard.eq(shifted[width - 25]),
        out.sticky.eq((shifted[:width - 25] != 0) | (wide[:64] != 0)),
        out.field.eq(Mux(n.be >= 1, n.be - 1, 0)),
        out.huge.eq(n.be > 300),
        out.zero.eq(n.zero),
    ]
    return out


def f32_pack(m, sign, a, name):
    """Last step: round an aligned significand (:func:`f32_align`) to nearest even and pack."""
    out = Signal(32, name=name)
    rounded = Signal(25, name=f"{name}_rnd")
    m.d.comb += rounded.eq(a.mant + (a.guard & (a.sticky | a.mant[0])))
    total = Signal(40, name=f"{name}_total")
    m.d.comb += total.eq(Cat(Const(0, 23), a.field) + rounded)
    with m.If(a.zero):
        m.d.comb += out.eq(sign << 31)
    with m.Elif(a.huge | (total >= 0x7F80_0000)):
        m.d.comb += out.eq(Cat(Const(0x7F80_0000, 31), sign))
    with m.Else():
        m.d.comb += out.eq(Cat(total[:31], sign))
    return out


__all__ += ["F32_QNAN"]
