"""The post-processor: correctly rounded binary32 square root and reciprocal.

Both are digit recurrences producing one result bit per cycle (27 cycles), followed by one
rounding to nearest even with a sticky bit from the remainder (three cycles: normalise,
align, round and pack), so the results are correctly rounded (error at most 0.5 ulp, bit
exact with :func:`npu_model.planar.f32_sqrt` and :func:`npu_model.planar.f32_recip`). The
reciprocal square root runs the two in sequence.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..lib.fp32 import F32_QNAN, count_leading_zeros
from .convert import aligned_layout, f32_align, f32_normalise, f32_pack, normalised_layout
from .layouts import PostFn

__all__ = ["PostProcessor"]

_ITER = 27


class PostProcessor(wiring.Component):
    """Sequential square root / reciprocal / reciprocal square root.

    Members
    -------
    start : In(1)
        Start on ``x`` with function ``fn`` (ignored while busy).
    fn : In(PostFn)
        ``NONE`` returns ``x`` unchanged after one cycle.
    x : In(32)
        Operand (binary32 bits), sampled with ``start``.
    done : Out(1)
        One-cycle pulse with ``result`` valid (``result`` holds until the next start).
    result : Out(32)
    """

    start:  In(1)
    fn:     In(PostFn)
    x:      In(32)
    done:   Out(1)
    result: Out(32)

    def elaborate(self, platform):
        m = Module()

        # The operand and the recurrence's state are data, set before they are used (IDLE,
        # SETUP): no reset.
        val = Signal(32, reset_less=True)       # current operand
        is_sqrt = Signal()
        then_recip = Signal()  # rsqrt: a reciprocal follows the square root

        sign = val[31]
        e = val[23:31]
        frac = val[:23]
        sig = Cat(frac, e != 0)
        lz = count_leading_zeros(m, sig, name="pp_lz")
        sig_n = Signal(24)
        m.d.comb += sig_n.eq((sig << lz)[:24])
        e_n = Signal(signed(11))  # value = sig_n * 2**(e_n - 150)
        m.d.comb += e_n.eq(Mux(e == 0, 1, e) - lz)
        big_e = Signal(signed(11))  # e_n - 150, made even for the square root
        m.d.comb += big_e.eq(e_n - 150)

        # Recurrence state.
        rem = Signal(32, reset_less=True)
        q = Signal(_ITER, reset_less=True)
        rad = Signal(54, reset_less=True)    # square root radicand, consumed two bits per step
        divisor = Signal(24, reset_less=True)
        exp_out = Signal(signed(12), reset_less=True)
        count = Signal(range(_ITER + 1), reset_less=True)
        pack_sign = Signal(reset_less=True)

        # Rounding and packing over three cycles (PACK, ALIGN, ROUND), with registers between
        # the steps of `f32_round_pack`: the leading-zero count and normalising shift; the
        # subnormal shift with guard and sticky; the rounding increment and the packing.
        normalised = Signal(normalised_layout(_ITER + 1), reset_less=True)
        aligned = Signal(aligned_layout(), reset_less=True)
        packed = f32_pack(m, pack_sign, aligned, "pp_pack")

        m.d.comb += self.done.eq(0)
        with m.FSM():
            with m.State("IDLE"), m.If(self.start):
                m.d.sync += [
                    val.eq(self.x),
                    is_sqrt.eq((self.fn == PostFn.SQRT) | (self.fn == PostFn.RSQRT)),
                    then_recip.eq(self.fn == PostFn.RSQRT),
                ]
                with m.If(self.fn == PostFn.NONE):
                    m.d.sync += self.result.eq(self.x)
                    m.next = "DONE"
                with m.Else():
                    m.next = "SETUP"

            with m.State("SETUP"):
                # Special operands finish at once; others start the recurrence.
                nan = (e == 0xFF) & (frac != 0)
                inf = (e == 0xFF) & (frac == 0)
                zero = (e == 0) & (frac == 0)
                special = Signal(32)
                is_special = Signal()
                with m.If(is_sqrt):
                    with m.If(nan | (sign & ~zero)):
                        m.d.comb += [is_special.eq(1), special.eq(F32_QNAN)]
                    with m.Elif(inf | zero):
                        m.d.comb += [is_special.eq(1), special.eq(val)]
                with m.Else():
                    with m.If(nan):
                        m.d.comb += [is_special.eq(1), special.eq(F32_QNAN)]
                    with m.Elif(inf):
                        m.d.comb += [is_special.eq(1), special.eq(sign << 31)]
                    with m.Elif(zero):
                        m.d.comb += [is_special.eq(1), special.eq(Cat(Const(0x7F80_0000, 31),
                                                                         sign))]
                m.d.sync += [count.eq(0), q.eq(0), pack_sign.eq(Mux(is_sqrt, 0, sign))]
                with m.If(is_special):
                    m.d.sync += val.eq(special)
                    m.next = "FINISH"
                with m.Elif(is_sqrt):
                    # Radicand sig_n (or 2 * sig_n for an odd exponent) * 2**28: 51-53 bits,
                    # root of 26-27 bits; sqrt(x) = root * 2**((E - 28) / 2).
                    odd = big_e[0]
                    m.d.sync += [
                        rad.eq(Mux(odd, sig_n.shift_left(29), sig_n.shift_left(28))),
                        rem.eq(0),
                        exp_out.eq(((big_e - odd - 28) >> 1) - 1),
                    ]
                    m.next = "ITER"
                with m.Else():
                    # Q = floor(2**49 / sig_n): 1/x = Q * 2**(101 - e_n).
                    m.d.sync += [
                        divisor.eq(sig_n),
                        rem.eq(1 << 23),
                        exp_out.eq(100 - e_n),
                    ]
                    m.next = "ITER"

            with m.State("ITER"):
                with m.If(is_sqrt):
                    r4 = Cat(rad[52:54], rem[:30])
                    trial = Cat(Const(1, 2), q)
                    with m.If(r4 >= trial):
                        m.d.sync += [rem.eq(r4 - trial), q.eq(Cat(Const(1, 1), q))]
                    with m.Else():
                        m.d.sync += [rem.eq(r4), q.eq(Cat(Const(0, 1), q))]
                    m.d.sync += rad.eq(rad.shift_left(2))
                with m.Else():
                    with m.If(rem >= divisor):
                        m.d.sync += [rem.eq((rem - divisor).shift_left(1)),
                                     q.eq(Cat(Const(1, 1), q))]
                    with m.Else():
                        m.d.sync += [rem.eq(rem.shift_left(1)), q.eq(Cat(Const(0, 1), q))]
                m.d.sync += count.eq(count + 1)
                with m.If(count == _ITER - 1):
                    m.next = "PACK"

            with m.State("PACK"):
                m.d.sync += normalised.eq(f32_normalise(m, Cat(rem != 0, q), exp_out, "pp_pack"))
                m.next = "ALIGN"
            with m.State("ALIGN"):
                m.d.sync += aligned.eq(f32_align(m, normalised, "pp_pack"))
                m.next = "ROUND"
            with m.State("ROUND"):
                m.d.sync += val.eq(packed)
                m.next = "FINISH"

            with m.State("FINISH"):
                with m.If(then_recip):
                    m.d.sync += [then_recip.eq(0), is_sqrt.eq(0)]
                    m.next = "SETUP"
                with m.Else():
                    m.d.sync += self.result.eq(val)
                    m.next = "DONE"

            with m.State("DONE"):
                m.d.comb += self.done.eq(1)
                m.next = "IDLE"
        return m
