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


#: What the adder's stages A, B and C hold. Stage A keeps the operands as they are, with the
#: magnitude order and both exponent differences, so that the feedback of a result into an
#: operand (a fold) passes through one comparison only; stage B swaps them and aligns. ``is_add``:
#: the operation is an add, else ``sel`` holds the max / min / compare result already.
_STAGE_A = data.StructLayout({"op": MacOp, "a": 32, "b": 32, "a_ge_b": 1, "mag_eq": 1,
                              "nan": 1, "inf": 1, "d_ab": 8, "d_ba": 8})
_STAGE_COMMON = {"is_add": 1, "sel": 32, "nan": 1, "inf": 1, "sign": 1}
_STAGE_B = data.StructLayout({**_STAGE_COMMON, "sub": 1, "exp": 8, "floor": 27, "total": 28})
_STAGE_C = data.StructLayout({**_STAGE_COMMON, "zero": 1, "field": 9, "norm": 27})


#: Verilog module name of an :class:`FP32AddPipe` shared by a design's adders
#: (``npu.lib.shared``).
FP32_ADD_MODULE = "npu_fp32_add"


class FP32AddPipe(wiring.Component):
    """Pipelined binary32 ``a + b``, ``max``, ``min`` and compare, with a shared stall.

    Three register stages; ``result`` is combinational from the third one (the round and pack
    step), so a user registers it once more. All registers advance when ``en`` is high. They
    hold data only and have no reset (a reset's fan-out costs routing): a user knows from
    its own valid bits which results are meaningful.

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

        # ---- Stage A: classify, order by magnitude, both exponent differences ----
        a = F32(self.a)
        b = F32(self.b)
        a_nan, b_nan = a.is_nan(), b.is_nan()
        a_inf, b_inf = a.is_inf(), b.is_inf()
        mag_a = self.a[:31]
        mag_b = self.b[:31]
        ea = a.effective_exp()
        eb = b.effective_exp()

        sa = Signal(_STAGE_A, name="sa", reset_less=True)   # datapath: no reset
        with m.If(self.en):
            m.d.sync += [
                sa.op.eq(self.op), sa.a.eq(self.a), sa.b.eq(self.b),
                sa.a_ge_b.eq(mag_a >= mag_b),
                sa.mag_eq.eq(mag_a == mag_b),
                sa.nan.eq(a_nan | b_nan | (a_inf & b_inf & (a.sign != b.sign))),
                sa.inf.eq(a_inf | b_inf),
                sa.d_ab.eq(ea - eb),
                sa.d_ba.eq(eb - ea),
            ]

        # ---- Stage B: max/min/cmp; swap, align the smaller significand and add ----
        sa_a = F32(sa.a)
        sa_b = F32(sa.b)
        a_ge_b = sa.a_ge_b
        mag_eq = sa.mag_eq
        big = F32(Mux(a_ge_b, sa.a, sa.b))
        small = F32(Mux(a_ge_b, sa.b, sa.a))
        diff = Signal(8, name="sa_diff")
        m.d.comb += diff.eq(Mux(a_ge_b, sa.d_ab, sa.d_ba))
        sub = sa_a.sign != sa_b.sign

        # Order for max/min (-0 < +0), from the one magnitude comparison of stage A.
        unordered = sa_a.is_nan() | sa_b.is_nan()
        both_zero = (sa.a[:31] == 0) & (sa.b[:31] == 0)
        b_gt = Signal()
        b_lt = Signal()
        with m.If(sub):
            m.d.comb += [b_gt.eq(sa_a.sign), b_lt.eq(sa_b.sign)]
        with m.Elif(sa_a.sign):
            m.d.comb += [b_gt.eq(a_ge_b & ~mag_eq), b_lt.eq(~a_ge_b)]
        with m.Else():
            m.d.comb += [b_gt.eq(~a_ge_b), b_lt.eq(a_ge_b & ~mag_eq)]

        cmp_val = Signal(32)
        with m.If(unordered | both_zero | (mag_eq & ~sub)):
            m.d.comb += cmp_val.eq(0)
        with m.Elif(b_gt):
            m.d.comb += cmp_val.eq(F32_ONE)
        with m.Else():
            m.d.comb += cmp_val.eq(F32_ONE | (1 << 31))

        sel_val = Signal(32)  # max / min / cmp result
        with m.Switch(sa.op):
            with m.Case(MacOp.MAX):
                m.d.comb += sel_val.eq(Mux(unordered, F32_QNAN, Mux(b_gt, sa.b, sa.a)))
            with m.Case(MacOp.MIN):
                m.d.comb += sel_val.eq(Mux(unordered, F32_QNAN, Mux(b_lt, sa.b, sa.a)))
            with m.Default():
                m.d.comb += sel_val.eq(cmp_val)

        mbig = Signal(24, name="sa_mbig")
        msmall = Signal(24, name="sa_msmall")
        m.d.comb += [mbig.eq(big.significand()), msmall.eq(small.significand())]
        small3 = Signal(27)
        m.d.comb += small3.eq(msmall.shift_left(3))
        far = diff >= 27
        shifted = Signal(27)
        m.d.comb += shifted.eq(Mux(far, 0, small3 >> diff[:5]))
        # The sticky bit: a set bit of small3 below the shift distance (a thermometer mask of
        # the distance, a shift of a constant beside the shifter, no comparators).
        below = Signal(27, name="sa_below")
        m.d.comb += below.eq(Mux(far, (1 << 27) - 1, ~(Const((1 << 27) - 1, 27) << diff[:5])))
        aligned = Signal(28)
        m.d.comb += aligned.eq(shifted | ((small3 & below) != 0))
        # big3 + aligned, or big3 - aligned (big3 + ~aligned + 1), on one carry chain:
        # (2 X + 1) + (2 Y + c) is 2 (X + Y + c) + 1 when c is 1.
        big3 = mbig.shift_left(3)
        total = Signal(28)
        m.d.comb += total.eq((Cat(Const(1, 1), big3, Const(0, 1))
                              + Cat(sub, aligned ^ sub.replicate(28)))[1:29])

        # The left shift of stage C must not take the exponent below 1: a marker bit at
        # 26 - (exponent - 1) (none for an exponent above 27) caps the leading-zero count.
        big_exp = Signal(8, name="sa_big_exp")
        m.d.comb += big_exp.eq(big.effective_exp())
        floor = Signal(27, name="sa_floor")
        m.d.comb += floor.eq(Mux(big_exp > 27, 0, Const(1 << 26, 27) >> (big_exp - 1)[:5]))

        sb = Signal(_STAGE_B, name="sb", reset_less=True)
        with m.If(self.en):
            m.d.sync += [
                sb.is_add.eq(sa.op == MacOp.MAC), sb.sel.eq(sel_val), sb.nan.eq(sa.nan),
                # An infinite operand is the larger magnitude, so its sign is big.sign.
                sb.inf.eq(sa.inf), sb.sign.eq(big.sign), sb.sub.eq(sub),
                sb.exp.eq(big_exp),
                sb.floor.eq(floor),
                sb.total.eq(total),
            ]

        # ---- Stage C: normalise (right by one on carry, else left, not below exponent 1) ----
        # `field` is the exponent field less one of the normalised value: a subnormal result
        # (exponent 1, no hidden bit) has 0, as the packing in stage D needs.
        # `floor` caps the count at `room` (no comparison after the count).
        lz = count_leading_zeros(m, sb.total[:27] | sb.floor, name="sb_lz")
        room = sb.exp - 1
        shift = Signal(8)
        m.d.comb += shift.eq(lz)
        norm = Signal(27)
        field = Signal(9)
        with m.If(sb.total[27]):
            m.d.comb += [
                norm.eq(sb.total[1:28] | sb.total[0]),
                field.eq(sb.exp),
            ]
        with m.Else():
            m.d.comb += [
                norm.eq((sb.total[:27] << shift[:5])[:27]),
                field.eq(room - shift),
            ]

        sc = Signal(_STAGE_C, name="sc", reset_less=True)
        with m.If(self.en):
            m.d.sync += [
                sc.is_add.eq(sb.is_add), sc.sel.eq(sb.sel), sc.nan.eq(sb.nan), sc.inf.eq(sb.inf),
                # An exact zero sum is +0 unless both operands were -0.
                sc.sign.eq(Mux(sb.total == 0, sb.sign & ~sb.sub, sb.sign)),
                sc.zero.eq(sb.total == 0),
                sc.field.eq(field),
                sc.norm.eq(norm),
            ]

        # ---- Stage D (combinational): round to nearest even and pack ----
        # The encoding is monotonic in (exponent field, significand): the rounded significand
        # (hidden bit included) added to field << 23 carries into the exponent when it rounds
        # up to 2**24, or when a subnormal rounds up to the smallest normal. One carry chain:
        # (2 X + 1) + (2 Y + inc) is 2 (X + Y + inc) + 1 when inc is 1.
        inc = sc.norm[2] & (sc.norm[1] | sc.norm[0] | sc.norm[3])
        packed = Signal(34)
        m.d.comb += packed.eq((Cat(Const(1, 1), Const(0, 23), sc.field)
                               + Cat(inc, sc.norm[3:27]))[1:])

        sum_val = Signal(32)
        with m.If(sc.nan):
            m.d.comb += sum_val.eq(F32_QNAN)
        with m.Elif(sc.inf | (packed >= 0x7F80_0000)):
            m.d.comb += sum_val.eq(Mux(sc.sign, F32_NEG_INF, F32_POS_INF))
        with m.Elif(sc.zero):
            m.d.comb += sum_val.eq(sc.sign << 31)
        with m.Else():
            m.d.comb += sum_val.eq(Cat(packed[:31], sc.sign))

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


