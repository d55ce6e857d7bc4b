"""Binary32 add / max / min / compare in six register stages, without a clock enable.

The arithmetic of :class:`npu.lib.fp32.FP32AddPipe` (``docs/formats.md``: round to nearest
even, subnormals kept, canonical NaN, exact zero sign), with each of its three stages cut in two
so that no stage holds more than one carry chain or one shifter, for the ECP5 MAC lane
(:mod:`npu.neural.mac_ecp5`):

====  ==========================================================================================
A1    magnitude comparison and equality (carry chains), operand classes, both exponent
      differences
A2    order the operands (swap), max / min / compare result, select the exponent difference
B1    align the smaller significand (shift, guard, round and sticky bits)
B2    add or subtract the significands; the limit of the normalising shift as a marker bit
C1    leading-zero count, limited so the exponent stays at least 1 (by the marker: no compare)
C2    normalising shift and exponent
D     round to nearest even and pack (combinational from C2's registers)
====  ==========================================================================================

Every register advances in every cycle; ``result`` belongs to the operands presented
:attr:`FP32AddDeep.LATENCY` cycles earlier.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.formats import F32_NEG_INF, F32_ONE, F32_POS_INF, F32_QNAN

from .fp32 import F32, MacOp, count_leading_zeros, count_trailing_zeros

__all__ = ["FP32AddDeep"]

_COMMON = {"is_add": 1, "sel": 32, "nan": 1, "inf": 1, "sign": 1}
_A1 = data.StructLayout({"op": MacOp, "a": 32, "b": 32, "a_ge_b": 1, "mag_eq": 1,
                         "a_nan": 1, "b_nan": 1, "a_inf": 1, "b_inf": 1, "both_zero": 1,
                         "d_ab": 8, "d_ba": 8})
_A2 = data.StructLayout({**_COMMON, "sub": 1, "exp": 8, "mbig": 24, "msmall": 24, "diff": 8})
_B1 = data.StructLayout({**_COMMON, "sub": 1, "exp": 8, "big3": 27, "aligned": 27})
_B2 = data.StructLayout({**_COMMON, "sub": 1, "exp": 8, "total": 28, "limit": 27})
_C1 = data.StructLayout({**_COMMON, "sub": 1, "exp": 8, "total": 28, "shift": 8})
_C2 = data.StructLayout({**_COMMON, "zero": 1, "exp": 9, "exp1": 9, "ge_fe": 1, "ge_ff": 1,
                         "norm": 27})


def _pass(m, dst, src, names):
    m.d.sync += [getattr(dst, name).eq(getattr(src, name)) for name in names]


class FP32AddDeep(wiring.Component):
    """Pipelined binary32 ``a + b``, ``max``, ``min`` and compare in six stages, no stall.

    Parameters
    ----------
    reset_less : bool
        Stage registers without a reset (neither the domain's nor a ``ResetInserter``'s), for
        a pipeline whose control says which of its values count: fewer reset nets to route.

    Members
    -------
    a, b : In(32)
        Operands (binary32 bits). For ``MAX``, ``MIN`` and ``CMP``, ``a`` is the accumulator
        and ``b`` the new value.
    op : In(MacOp)
        Operation.
    result : Out(32)
        Result of the operands presented ``LATENCY`` cycles earlier (combinational from the
        last register stage).
    """

    a:      In(32)
    b:      In(32)
    op:     In(MacOp)
    result: Out(32)

    LATENCY = 6

    def __init__(self, *, reset_less=False):
        self._reset_less = bool(reset_less)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        common = list(_COMMON)

        # ---- A1: compare magnitudes, classify, both exponent differences ----
        a, b = F32(self.a), F32(self.b)
        s1 = Signal(_A1, name="s1", reset_less=self._reset_less)
        m.d.sync += [
            s1.op.eq(self.op), s1.a.eq(self.a), s1.b.eq(self.b),
            s1.a_ge_b.eq(self.a[:31] >= self.b[:31]),
            s1.mag_eq.eq(self.a[:31] == self.b[:31]),
            s1.a_nan.eq(a.is_nan()), s1.b_nan.eq(b.is_nan()),
            s1.a_inf.eq(a.is_inf()), s1.b_inf.eq(b.is_inf()),
            s1.both_zero.eq((self.a[:31] == 0) & (self.b[:31] == 0)),
            s1.d_ab.eq(a.effective_exp() - b.effective_exp()),
            s1.d_ba.eq(b.effective_exp() - a.effective_exp()),
        ]

        # ---- A2: order the operands, max / min / compare ----
        a, b = F32(s1.a), F32(s1.b)
        big = F32(Mux(s1.a_ge_b, s1.a, s1.b))
        small = F32(Mux(s1.a_ge_b, s1.b, s1.a))
        unordered = s1.a_nan | s1.b_nan
        b_gt = Signal()
        b_lt = Signal()
        with m.If(a.sign != b.sign):
            m.d.comb += [b_gt.eq(a.sign), b_lt.eq(b.sign)]
        with m.Elif(a.sign):
            m.d.comb += [b_gt.eq(s1.a_ge_b & ~s1.mag_eq), b_lt.eq(~s1.a_ge_b)]
        with m.Else():
            m.d.comb += [b_gt.eq(~s1.a_ge_b), b_lt.eq(s1.a_ge_b & ~s1.mag_eq)]
        cmp_val = Signal(32)
        with m.If(unordered | s1.both_zero | (s1.mag_eq & (a.sign == b.sign))):
            m.d.comb += cmp_val.eq(0)
        with m.Elif(b_gt):
            m.d.comb += cmp_val.eq(F32_ONE)
        with m.Else():
            m.d.comb += cmp_val.eq(F32_ONE | (1 << 31))
        sel_val = Signal(32)
        with m.Switch(s1.op):
            with m.Case(MacOp.MAX):
                m.d.comb += sel_val.eq(Mux(unordered, F32_QNAN, Mux(b_gt, s1.b, s1.a)))
            with m.Case(MacOp.MIN):
                m.d.comb += sel_val.eq(Mux(unordered, F32_QNAN, Mux(b_lt, s1.b, s1.a)))
            with m.Default():
                m.d.comb += sel_val.eq(cmp_val)
        s2 = Signal(_A2, name="s2", reset_less=self._reset_less)
        m.d.sync += [
            s2.is_add.eq(s1.op == MacOp.MAC),
            s2.sel.eq(sel_val),
            s2.nan.eq(unordered | (s1.a_inf & s1.b_inf & (a.sign != b.sign))),
            s2.inf.eq(s1.a_inf | s1.b_inf),
            s2.sign.eq(big.sign),
            s2.sub.eq(a.sign != b.sign),
            s2.exp.eq(big.effective_exp()),
            s2.mbig.eq(big.significand()),
            s2.msmall.eq(small.significand()),
            s2.diff.eq(Mux(s1.a_ge_b, s1.d_ab, s1.d_ba)),
        ]

        # ---- B1: align the smaller significand (guard, round, sticky) ----
        small3 = s2.msmall.shift_left(3)
        shifted = Signal(27)
        m.d.comb += shifted.eq(Mux(s2.diff >= 27, 0, small3 >> s2.diff[:5]))
        small_tz = count_trailing_zeros(m, s2.msmall, name="s2_small_tz")
        sticky = (s2.msmall != 0) & ((small_tz + 3) < s2.diff)
        s3 = Signal(_B1, name="s3", reset_less=self._reset_less)
        _pass(m, s3, s2, common + ["sub", "exp"])
        m.d.sync += [s3.big3.eq(s2.mbig.shift_left(3)), s3.aligned.eq(shifted | sticky)]

        # ---- B2: add or subtract ----
        s4 = Signal(_B2, name="s4", reset_less=self._reset_less)
        _pass(m, s4, s3, common + ["sub", "exp"])
        m.d.sync += s4.total.eq(Mux(s3.sub, s3.big3 - s3.aligned, s3.big3 + s3.aligned))
        # The normalising shift may be at most `room = exp - 1` (exp >= 1): a one at bit
        # 26 - room (none when room >= 27, beyond the 27 bits) stops the leading-zero count
        # there, so C1 counts min(leading zeros, room) without a comparison.
        room = s3.exp - 1
        m.d.sync += s4.limit.eq(Mux(room < 27, Const(1 << 26, 27) >> room[:5], 0))

        # ---- C1: leading zeros, limited to keep the exponent at least 1 ----
        lz = count_leading_zeros(m, s4.total[:27] | s4.limit, name="s4_lz")
        s5 = Signal(_C1, name="s5", reset_less=self._reset_less)
        _pass(m, s5, s4, common + ["sub", "exp", "total"])
        m.d.sync += s5.shift.eq(lz)

        # ---- C2: normalise (right by one on carry, else left) ----
        norm = Signal(27)
        norm_exp = Signal(9)
        with m.If(s5.total[27]):
            m.d.comb += [norm.eq(s5.total[1:28] | s5.total[0]), norm_exp.eq(s5.exp + 1)]
        with m.Else():
            m.d.comb += [norm.eq((s5.total[:27] << s5.shift[:5])[:27]),
                         norm_exp.eq(s5.exp - s5.shift)]
        s6 = Signal(_C2, name="s6", reset_less=self._reset_less)
        _pass(m, s6, s5, ["is_add", "sel", "nan", "inf"])
        m.d.sync += [
            # An exact zero sum is +0 unless both operands were -0.
            s6.sign.eq(Mux(s5.total == 0, s5.sign & ~s5.sub, s5.sign)),
            s6.zero.eq(s5.total == 0),
            s6.exp.eq(norm_exp),
            # For the rounding step: the exponent after a carry out of the significand, and
            # the overflow tests of both cases, so that stage D has one carry chain.
            s6.exp1.eq(norm_exp + 1),
            s6.ge_fe.eq(norm_exp >= 0xFE),
            s6.ge_ff.eq(norm_exp >= 0xFF),
            s6.norm.eq(norm),
        ]

        # ---- D (combinational): round to nearest even and pack ----
        rounded = Signal(25)
        m.d.comb += rounded.eq(s6.norm[3:27] + (s6.norm[2] & (s6.norm[1] | s6.norm[0]
                                                              | s6.norm[3])))
        sig = Signal(24)
        exp_field = Signal(9)
        overflow = Signal()
        with m.If(rounded[24]):
            # Carry out: the significand is 2**24, its leading bit lands on the hidden bit.
            m.d.comb += [sig.eq(rounded[1:25]), exp_field.eq(s6.exp1), overflow.eq(s6.ge_fe)]
        with m.Else():
            m.d.comb += [sig.eq(rounded[:24]), exp_field.eq(Mux(rounded[23], s6.exp, 0)),
                         overflow.eq(rounded[23] & s6.ge_ff)]
        sum_val = Signal(32)
        with m.If(s6.nan):
            m.d.comb += sum_val.eq(F32_QNAN)
        with m.Elif(s6.inf | overflow):
            m.d.comb += sum_val.eq(Mux(s6.sign, F32_NEG_INF, F32_POS_INF))
        with m.Elif(s6.zero):
            m.d.comb += sum_val.eq(s6.sign << 31)
        with m.Else():
            m.d.comb += sum_val.eq(Cat(sig[:23], exp_field[:8], s6.sign))
        m.d.comb += self.result.eq(Mux(s6.is_add, sum_val, s6.sel))
        return m
