"""Binary32 arithmetic: a pipelined adder with max / min / compare, and binary16 operand decode.

The algorithms are the ones the golden model (``npu_model.fp``) specifies; ``docs/formats.md``
states the rules (round to nearest even, subnormals kept, canonical NaN, exact zero sign).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from npu_spec import mac as mac_spec
from npu_spec.formats import F16_QNAN, F32_NEG_INF, F32_ONE, F32_POS_INF, F32_QNAN

from .enums import hw_enum

__all__ = [
    "F16_QNAN", "F32_QNAN", "F32_ONE", "FP32_ADD_MODULE", "FP32AddPipe", "MacOp", "Operand",
    "count_leading_zeros", "count_trailing_zeros", "decode_operand",
    "product_to_f32",
]

#: The adder's operation: add, max, min, compare (the MAC array's operations).
MacOp = hw_enum(mac_spec.MacOp)



class F32(data.Struct):
    """The fields of a binary32 word, and its classes."""
    frac: 23
    exp:  8
    sign: 1

    def is_nan(self):
        return (self.exp == 0xFF) & (self.frac != 0)

    def is_inf(self):
        return (self.exp == 0xFF) & (self.frac == 0)

    def is_zero(self):
        return (self.exp == 0) & (self.frac == 0)

    def significand(self):
        """The significand with its hidden bit (24 bits; subnormals have none)."""
        return Cat(self.frac, self.exp != 0)

    def effective_exp(self):
        """The biased exponent of the significand's LSB scale (subnormals count as 1)."""
        return Mux(self.exp == 0, 1, self.exp)


def _lzc_tree(m, value, name):
    """``(all_zero, count)`` of a value whose width is a power of two, as a log-depth tree.

    Every node is a named signal, so each sub-tree is built (and simulated) once."""
    width = len(value)
    if width == 2:
        return ~value[1] & ~value[0], ~value[1]
    half = width // 2
    hi_zero, hi_count = _lzc_tree(m, value[half:], f"{name}h")
    lo_zero, lo_count = _lzc_tree(m, value[:half], f"{name}l")
    zero = Signal(name=f"{name}_z")
    count = Signal(len(hi_count) + 1, name=f"{name}_n")
    m.d.comb += [
        zero.eq(hi_zero & lo_zero),
        count.eq(Mux(hi_zero, Cat(lo_count, Const(1, 1)), Cat(hi_count, Const(0, 1)))),
    ]
    return zero, count


def count_leading_zeros(m, value, name):
    """Combinational count of leading zeros of ``value`` (``len(value)`` if it is zero).

    A log-depth tree over ``value`` padded with ones on the right to a power of two.
    """
    width = len(value)
    padded = 1 << (width - 1).bit_length()
    all_zero, tree = _lzc_tree(m, Cat(Const((1 << (padded - width)) - 1, padded - width), value)
                               if padded > width else value, f"{name}_t")
    count = Signal(range(width + 1), name=name)
    m.d.comb += count.eq(Mux(value == 0, width, tree))
    return count


def count_trailing_zeros(m, value, name):
    """Combinational count of trailing zeros of ``value`` (``len(value)`` if it is zero)."""
    return count_leading_zeros(m, Cat(*reversed(list(value))), name)


#: What the adder's stages A, B and C hold (``is_add``: the operation is an add, else ``sel``
#: holds the max / min / compare result already).
_STAGE_COMMON = {"is_add": 1, "sel": 32, "nan": 1, "inf": 1, "sign": 1}
_STAGE_A = data.StructLayout({**_STAGE_COMMON, "sub": 1, "exp": 8, "mbig": 24, "msmall": 24,
                              "diff": 8})
_STAGE_B = data.StructLayout({**_STAGE_COMMON, "sub": 1, "exp": 8, "total": 28})
_STAGE_C = data.StructLayout({**_STAGE_COMMON, "zero": 1, "exp": 9, "norm": 27})


#: Verilog module name of an :class:`FP32AddPipe` shared by a design's adders
#: (``npu.lib.shared``).
FP32_ADD_MODULE = "npu_fp32_add"


class FP32AddPipe(wiring.Component):
    """Pipelined binary32 ``a + b``, ``max``, ``min`` and compare, with a shared stall.

    Three register stages; ``result`` is combinational from the third one (the round and pack
    step), so a user registers it once more. All registers advance when ``en`` is high.

    Results follow ``docs/formats.md``: round to nearest even, subnormal inputs and outputs,
    infinities, every NaN result is ``0x7FC00000``, an exact zero sum is ``+0`` unless both
    operands are ``-0``. ``MAX``/``MIN`` give NaN if either input is NaN and order ``-0 < +0``;
    ``CMP`` gives ``+1.0`` if ``b > a``, ``-1.0`` if ``b < a``, else ``+0.0``.

    Members
    -------
    en : In(1)
        Advance the pipeline.
    a, b : In(32)
        Operands (binary32 bits). For ``MAX``, ``MIN`` and ``CMP``, ``a`` is the accumulator
        and ``b`` the new value.
    op : In(MacOp)
        Operation.
    result : Out(32)
        Result of the operands presented three ``en`` cycles earlier (combinational).
    """

    en:     In(1)
    a:      In(32)
    b:      In(32)
    op:     In(MacOp)
    result: Out(32)

    LATENCY = 3

    def elaborate(self, platform):
        m = Module()

        # ---- Stage A: classify, order by magnitude, exponent difference, max/min/cmp ----
        a = F32(self.a)
        b = F32(self.b)
        a_nan, b_nan = a.is_nan(), b.is_nan()
        a_inf, b_inf = a.is_inf(), b.is_inf()
        mag_a = self.a[:31]
        mag_b = self.b[:31]

        a_ge_b = mag_a >= mag_b
        big = F32(Mux(a_ge_b, self.a, self.b))
        small = F32(Mux(a_ge_b, self.b, self.a))
        big_e = Mux(big.exp == 0, 1, big.exp)
        small_e = Mux(small.exp == 0, 1, small.exp)

        # Order for max/min (-0 < +0), from the one magnitude comparison above.
        unordered = a_nan | b_nan
        both_zero = (mag_a == 0) & (mag_b == 0)
        mag_eq = mag_a == mag_b
        b_gt = Signal()
        b_lt = Signal()
        with m.If(a.sign != b.sign):
            m.d.comb += [b_gt.eq(a.sign), b_lt.eq(b.sign)]
        with m.Elif(a.sign):
            m.d.comb += [b_gt.eq(a_ge_b & ~mag_eq), b_lt.eq(~a_ge_b)]
        with m.Else():
            m.d.comb += [b_gt.eq(~a_ge_b), b_lt.eq(a_ge_b & ~mag_eq)]

        cmp_val = Signal(32)
        with m.If(unordered | both_zero | (mag_eq & (a.sign == b.sign))):
            m.d.comb += cmp_val.eq(0)
        with m.Elif(b_gt):
            m.d.comb += cmp_val.eq(F32_ONE)
        with m.Else():
            m.d.comb += cmp_val.eq(F32_ONE | (1 << 31))

        sel_val = Signal(32)  # max / min / cmp result, known already
        with m.Switch(self.op):
            with m.Case(MacOp.MAX):
                m.d.comb += sel_val.eq(Mux(unordered, F32_QNAN, Mux(b_gt, self.b, self.a)))
            with m.Case(MacOp.MIN):
                m.d.comb += sel_val.eq(Mux(unordered, F32_QNAN, Mux(b_lt, self.b, self.a)))
            with m.Default():
                m.d.comb += sel_val.eq(cmp_val)

        sa = Signal(_STAGE_A, name="sa")
        with m.If(self.en):
            m.d.sync += [
                sa.is_add.eq(self.op == MacOp.MAC),
                sa.sel.eq(sel_val),
                sa.nan.eq(a_nan | b_nan | (a_inf & b_inf & (a.sign != b.sign))),
                sa.inf.eq(a_inf | b_inf),
                # An infinite operand is the larger magnitude, so its sign is big.sign.
                sa.sign.eq(big.sign),
                sa.sub.eq(a.sign != b.sign),
                sa.exp.eq(big_e),
                sa.mbig.eq(Mux(big.exp != 0, (1 << 23) | big.frac, big.frac)),
                sa.msmall.eq(Mux(small.exp != 0, (1 << 23) | small.frac, small.frac)),
                sa.diff.eq(big_e - small_e),
            ]

        # ---- Stage B: align the smaller significand (guard, round, sticky) and add ----
        small3 = Signal(27)
        m.d.comb += small3.eq(sa.msmall.shift_left(3))
        shifted = Signal(27)
        m.d.comb += shifted.eq(Mux(sa.diff >= 27, 0, small3 >> sa.diff[:5]))
        # A set bit is shifted out iff the lowest set bit of small3 (at 3 + trailing zeros of
        # the significand) lies below the shift distance.
        small_tz = count_trailing_zeros(m, sa.msmall, name="sa_small_tz")
        sticky = (sa.msmall != 0) & ((small_tz + 3) < sa.diff)
        aligned = shifted | sticky
        big3 = sa.mbig.shift_left(3)
        total = Signal(28)
        m.d.comb += total.eq(Mux(sa.sub, big3 - aligned, big3 + aligned))

        sb = Signal(_STAGE_B, name="sb")
        with m.If(self.en):
            m.d.sync += [
                sb.is_add.eq(sa.is_add), sb.sel.eq(sa.sel), sb.nan.eq(sa.nan),
                sb.inf.eq(sa.inf), sb.sign.eq(sa.sign), sb.sub.eq(sa.sub), sb.exp.eq(sa.exp),
                sb.total.eq(total),
            ]

        # ---- Stage C: normalise (right by one on carry, else left, not below exponent 1) ----
        lz = count_leading_zeros(m, sb.total[:27], name="sb_lz")
        room = sb.exp - 1
        shift = Signal(8)
        m.d.comb += shift.eq(Mux(lz < room, lz, room))
        norm = Signal(27)
        norm_exp = Signal(9)
        with m.If(sb.total[27]):
            m.d.comb += [
                norm.eq(sb.total[1:28] | sb.total[0]),
                norm_exp.eq(sb.exp + 1),
            ]
        with m.Else():
            m.d.comb += [
                norm.eq((sb.total[:27] << shift[:5])[:27]),
                norm_exp.eq(sb.exp - shift),
            ]

        sc = Signal(_STAGE_C, name="sc")
        with m.If(self.en):
            m.d.sync += [
                sc.is_add.eq(sb.is_add), sc.sel.eq(sb.sel), sc.nan.eq(sb.nan), sc.inf.eq(sb.inf),
                # An exact zero sum is +0 unless both operands were -0.
                sc.sign.eq(Mux(sb.total == 0, sb.sign & ~sb.sub, sb.sign)),
                sc.zero.eq(sb.total == 0),
                sc.exp.eq(norm_exp),
                sc.norm.eq(norm),
            ]

        # ---- Stage D (combinational): round to nearest even and pack ----
        lsb = sc.norm[3]
        guard = sc.norm[2]
        rest = sc.norm[1] | sc.norm[0]
        rounded = Signal(25)
        m.d.comb += rounded.eq(sc.norm[3:27] + (guard & (rest | lsb)))
        sig = Signal(24)
        exp = Signal(9)
        with m.If(rounded[24]):
            m.d.comb += [sig.eq(rounded[1:25]), exp.eq(sc.exp + 1)]
        with m.Else():
            m.d.comb += [sig.eq(rounded[:24]), exp.eq(sc.exp)]
        exp_field = Mux(sig[23], exp, 0)

        sum_val = Signal(32)
        with m.If(sc.nan):
            m.d.comb += sum_val.eq(F32_QNAN)
        with m.Elif(sc.inf | (exp_field >= 0xFF)):
            m.d.comb += sum_val.eq(Mux(sc.sign, F32_NEG_INF, F32_POS_INF))
        with m.Elif(sc.zero):
            m.d.comb += sum_val.eq(sc.sign << 31)
        with m.Else():
            m.d.comb += sum_val.eq(Cat(sig[:23], exp_field[:8], sc.sign))

        m.d.comb += self.result.eq(Mux(sc.is_add, sum_val, sc.sel))
        return m


class Operand(data.Struct):
    """A MAC operand in a common form: ``(-1)**sign * sig * 2**exp``, or a special."""
    sig:  11
    exp:  signed(7)
    sign: 1
    inf:  1
    nan:  1


def decode_operand(m, bits, is_int8, name):
    """Combinational decode of a 16-bit operand (binary16, or int8 in the low byte)."""
    op = Signal(Operand, name=name)
    int_val = bits[:8].as_signed()
    e = bits[10:15]
    f = bits[:10]
    with m.If(is_int8):
        m.d.comb += [
            op.sign.eq(int_val < 0),
            op.sig.eq(Mux(int_val < 0, -int_val, int_val)),
            op.exp.eq(0),
        ]
    with m.Else():
        m.d.comb += op.sign.eq(bits[15])
        with m.If(e == 0):
            m.d.comb += [op.sig.eq(f), op.exp.eq(-24)]
        with m.Elif(e == 31):
            m.d.comb += [op.inf.eq(f == 0), op.nan.eq(f != 0)]
        with m.Else():
            m.d.comb += [op.sig.eq((1 << 10) | f), op.exp.eq(e - 25)]
    return op


def product_to_f32(m, sign, sig, exp, inf, nan, name, *, lz=None):
    """Combinational binary32 bits of the exact product ``(-1)**sign * sig * 2**exp``.

    ``sig`` is the 22-bit product of two 11-bit significands and ``exp`` the sum of their
    exponents; every such value is a normal binary32 number (or zero), so no rounding occurs.
    ``nan`` and ``inf`` are the product's class (``inf * 0`` already folded into ``nan``).
    ``lz`` is ``sig``'s leading-zero count if computed (and registered) earlier; by default
    it is counted here.
    """
    out = Signal(32, name=name)
    if lz is None:
        lz = count_leading_zeros(m, sig, name=f"{name}_lz")
    norm = Signal(22)
    m.d.comb += norm.eq(sig << lz)
    biased = Signal(signed(10))
    m.d.comb += biased.eq(exp - lz + (21 + 127))
    with m.If(nan):
        m.d.comb += out.eq(F32_QNAN)
    with m.Elif(inf):
        m.d.comb += out.eq(Mux(sign, F32_NEG_INF, F32_POS_INF))
    with m.Elif(sig == 0):
        m.d.comb += out.eq(sign << 31)
    with m.Else():
        m.d.comb += out.eq(Cat(Const(0, 2), norm[:21], biased[:8], sign))
    return out


