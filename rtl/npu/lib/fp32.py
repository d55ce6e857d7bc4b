"""Binary32 arithmetic: a pipelined adder with max / min / compare, and binary16 operand decode.

The algorithms are the ones the golden model (``npu_model.fp``) specifies; ``docs/formats.md``
states the rules (round to nearest even, subnormals kept, canonical NaN, exact zero sign).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from npu_spec import mac as mac_spec
from npu_spec.formats import F16_QNAN, F32_ONE, F32_QNAN

from .enums import hw_enum

__all__ = [
    "F16_QNAN", "F32_QNAN", "F32_ONE", "FP32AddPipe", "MacOp", "Operand", "count_leading_zeros",
    "count_trailing_zeros", "decode_operand",
    "product_to_f32",
]

#: The adder's operation: add, max, min, compare (the MAC array's operations).
MacOp = hw_enum(mac_spec.MacOp)



class F32(data.Struct):
    frac: 23
    exp:  8
    sign: 1


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
        a_nan = (a.exp == 0xFF) & (a.frac != 0)
        b_nan = (b.exp == 0xFF) & (b.frac != 0)
        a_inf = (a.exp == 0xFF) & (a.frac == 0)
        b_inf = (b.exp == 0xFF) & (b.frac == 0)
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

        sa_is_add = Signal(name="sa_is_add")
        sa_sel    = Signal(32, name="sa_sel")
        sa_nan    = Signal(name="sa_nan")
        sa_inf    = Signal(name="sa_inf")
        sa_sign   = Signal(name="sa_sign")
        sa_sub    = Signal(name="sa_sub")
        sa_exp    = Signal(8, name="sa_exp")
        sa_mbig   = Signal(24, name="sa_mbig")
        sa_msmall = Signal(24, name="sa_msmall")
        sa_diff   = Signal(8, name="sa_diff")
        with m.If(self.en):
            m.d.sync += [
                sa_is_add.eq(self.op == MacOp.MAC),
                sa_sel.eq(sel_val),
                sa_nan.eq(a_nan | b_nan | (a_inf & b_inf & (a.sign != b.sign))),
                sa_inf.eq(a_inf | b_inf),
                # An infinite operand is the larger magnitude, so its sign is big.sign.
                sa_sign.eq(big.sign),
                sa_sub.eq(a.sign != b.sign),
                sa_exp.eq(big_e),
                sa_mbig.eq(Mux(big.exp != 0, (1 << 23) | big.frac, big.frac)),
                sa_msmall.eq(Mux(small.exp != 0, (1 << 23) | small.frac, small.frac)),
                sa_diff.eq(big_e - small_e),
            ]

        # ---- Stage B: align the smaller significand (guard, round, sticky) and add ----
        small3 = Signal(27)
        m.d.comb += small3.eq(sa_msmall.shift_left(3))
        shifted = Signal(27)
        m.d.comb += shifted.eq(Mux(sa_diff >= 27, 0, small3 >> sa_diff[:5]))
        # A set bit is shifted out iff the lowest set bit of small3 (at 3 + trailing zeros of
        # the significand) lies below the shift distance.
        small_tz = count_trailing_zeros(m, sa_msmall, name="sa_small_tz")
        sticky = (sa_msmall != 0) & ((small_tz + 3) < sa_diff)
        aligned = shifted | sticky
        big3 = sa_mbig.shift_left(3)
        total = Signal(28)
        m.d.comb += total.eq(Mux(sa_sub, big3 - aligned, big3 + aligned))

        sb_is_add = Signal(name="sb_is_add")
        sb_sel    = Signal(32, name="sb_sel")
        sb_nan    = Signal(name="sb_nan")
        sb_inf    = Signal(name="sb_inf")
        sb_sign   = Signal(name="sb_sign")
        sb_sub    = Signal(name="sb_sub")
        sb_exp    = Signal(8, name="sb_exp")
        sb_total  = Signal(28, name="sb_total")
        with m.If(self.en):
            m.d.sync += [
                sb_is_add.eq(sa_is_add), sb_sel.eq(sa_sel), sb_nan.eq(sa_nan),
                sb_inf.eq(sa_inf), sb_sign.eq(sa_sign), sb_sub.eq(sa_sub), sb_exp.eq(sa_exp),
                sb_total.eq(total),
            ]

        # ---- Stage C: normalise (right by one on carry, else left, not below exponent 1) ----
        lz = count_leading_zeros(m, sb_total[:27], name="sb_lz")
        room = sb_exp - 1
        shift = Signal(8)
        m.d.comb += shift.eq(Mux(lz < room, lz, room))
        norm = Signal(27)
        norm_exp = Signal(9)
        with m.If(sb_total[27]):
            m.d.comb += [
                norm.eq(sb_total[1:28] | sb_total[0]),
                norm_exp.eq(sb_exp + 1),
            ]
        with m.Else():
            m.d.comb += [
                norm.eq((sb_total[:27] << shift[:5])[:27]),
                norm_exp.eq(sb_exp - shift),
            ]

        sc_is_add = Signal(name="sc_is_add")
        sc_sel    = Signal(32, name="sc_sel")
        sc_nan    = Signal(name="sc_nan")
        sc_inf    = Signal(name="sc_inf")
        sc_sign   = Signal(name="sc_sign")
        sc_zero   = Signal(name="sc_zero")
        sc_exp    = Signal(9, name="sc_exp")
        sc_norm   = Signal(27, name="sc_norm")
        with m.If(self.en):
            m.d.sync += [
                sc_is_add.eq(sb_is_add), sc_sel.eq(sb_sel), sc_nan.eq(sb_nan),
                sc_inf.eq(sb_inf),
                # An exact zero sum is +0 unless both operands were -0.
                sc_sign.eq(Mux(sb_total == 0, sb_sign & ~sb_sub, sb_sign)),
                sc_zero.eq(sb_total == 0),
                sc_exp.eq(norm_exp),
                sc_norm.eq(norm),
            ]

        # ---- Stage D (combinational): round to nearest even and pack ----
        lsb = sc_norm[3]
        guard = sc_norm[2]
        rest = sc_norm[1] | sc_norm[0]
        rounded = Signal(25)
        m.d.comb += rounded.eq(sc_norm[3:27] + (guard & (rest | lsb)))
        sig = Signal(24)
        exp = Signal(9)
        with m.If(rounded[24]):
            m.d.comb += [sig.eq(rounded[1:25]), exp.eq(sc_exp + 1)]
        with m.Else():
            m.d.comb += [sig.eq(rounded[:24]), exp.eq(sc_exp)]
        exp_field = Mux(sig[23], exp, 0)

        sum_val = Signal(32)
        with m.If(sc_nan):
            m.d.comb += sum_val.eq(F32_QNAN)
        with m.Elif(sc_inf | (exp_field >= 0xFF)):
            m.d.comb += sum_val.eq(Mux(sc_sign, 0xFF80_0000, 0x7F80_0000))
        with m.Elif(sc_zero):
            m.d.comb += sum_val.eq(sc_sign << 31)
        with m.Else():
            m.d.comb += sum_val.eq(Cat(sig[:23], exp_field[:8], sc_sign))

        m.d.comb += self.result.eq(Mux(sc_is_add, sum_val, sc_sel))
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


def product_to_f32(m, sign, sig, exp, inf, nan, name):
    """Combinational binary32 bits of the exact product ``(-1)**sign * sig * 2**exp``.

    ``sig`` is the 22-bit product of two 11-bit significands and ``exp`` the sum of their
    exponents; every such value is a normal binary32 number (or zero), so no rounding occurs.
    ``nan`` and ``inf`` are the product's class (``inf * 0`` already folded into ``nan``).
    """
    out = Signal(32, name=name)
    lz = count_leading_zeros(m, sig, name=f"{name}_lz")
    norm = Signal(22)
    m.d.comb += norm.eq(sig << lz)
    biased = Signal(signed(10))
    m.d.comb += biased.eq(exp - lz + (21 + 127))
    with m.If(nan):
        m.d.comb += out.eq(F32_QNAN)
    with m.Elif(inf):
        m.d.comb += out.eq(Mux(sign, 0xFF80_0000, 0x7F80_0000))
    with m.Elif(sig == 0):
        m.d.comb += out.eq(sign << 31)
    with m.Else():
        m.d.comb += out.eq(Cat(Const(0, 2), norm[:21], biased[:8], sign))
    return out


