"""The neural engine's post-processor: MAC results to output values (``docs/postproc.md``).

One result beat (``lanes`` accumulators of one output-channel slot) becomes one output beat
(``lanes`` binary16 codes or int8 values) per cycle, through a fixed-latency pipeline that stalls
only when the output is not taken. The golden model is :mod:`npu_model.postproc`; the order of
operations below is the one it states.

* int32 accumulators (``MacFormat.INT8``): TOSA rescale by the slot's ``scale`` (int32) and
  ``shift``, plus the zero point, saturate to int8, then ReLU (at the zero point) or an int8
  clamp.
* binary32 accumulators: ``f32_mul(acc, scale)``, then one activation (ReLU, clamp, leaky ReLU,
  abs, or a piecewise-linear sigmoid / tanh / GELU / exp) built from one binary32 multiply, one add
  and a max/min; then binary16 (round to nearest even, or stochastic rounding from a per-lane
  LFSR) or int8 (round half even, plus the zero point, saturate).

Per-slot parameters come in groups on ``params`` and fill one of two banks; result beats read the
oldest full bank and release it after the group's last result.
"""

from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu_spec import postproc as spec
from npu_spec.config import NPUConfig
from npu_spec.formats import F32_MINUS_ONE as F32_MONE
from npu_spec.formats import F32_NEG_ZERO as F32_MZERO
from npu_spec.formats import F32_ONE

from ..lib.fp32 import F16_QNAN, F32, F32_QNAN, FP32AddPipe
from ..lib.fp32mul import (
    MulProduct,
    f32_mul_denormalise,
    f32_mul_finish,
    f32_mul_normalise,
    f32_mul_product,
    f32_mul_special,
)
from .layouts import MacFormat, MacOp, mac_result_layout, param_beat_layout, postproc_out_layout

__all__ = ["Act", "PostProcessor", "pipeline_latency", "post_processor_signature",
           "postproc_config_layout"]

Act = spec.Act



def postproc_config_layout():
    """Layer configuration of the post-processor (held stable while a layer runs).

    ============ ======= ===================================================================
    field        bits    meaning
    ============ ======= ===================================================================
    out_fp16     1       output binary16 codes (else int8 values)
    act          4       activation, :class:`Act` (0 none, 1 ReLU, 2 clamp, 3 leaky ReLU,
                         4 abs, 5 sigmoid, 6 tanh, 7 GELU, 8 exp); other codes are errors
    stochastic   1       binary16 outputs use stochastic rounding (else RNE)
    zero_point   8       int8 output zero point (signed)
    lo, hi       32      clamp bounds: binary32, or int8 in bits 0-7 for int32 accumulators
    alpha        32      leaky-ReLU slope (binary32)
    seed         32      LFSR seed, loaded by the ``lfsr_load`` strobe
    ============ ======= ===================================================================
    """
    return data.StructLayout({
        "out_fp16":   1,
        "act":        4,
        "stochastic": 1,
        "zero_point": signed(8),
        "lo":         32,
        "hi":         32,
        "alpha":      32,
        "seed":       32,
    })


def post_processor_signature(lanes, slots):
    """The ports of every post-processor build (:class:`PostProcessor` and
    ``npu.neural.postproc_seq.SequentialPostProcessor``): MAC results and their channel
    parameters in, output values out, the layer's configuration, the LFSR load and the error
    flag."""
    return wiring.Signature({
        "res":         In(stream.Signature(mac_result_layout(lanes, slots))),
        "params":      In(stream.Signature(param_beat_layout(slots))),
        "out":         Out(stream.Signature(postproc_out_layout(lanes, slots))),
        "cfg":         In(postproc_config_layout()),
        "lfsr_load":   In(1),
        "error":       Out(1),
        "error_clear": In(1),
    })


def pipeline_latency(config):
    """Cycles from a result beat's handshake to its output beat being valid (no stalls)."""
    return 17 if config.has_float else 4


def _lfsr_matrix():
    """Each bit of the state after :data:`spec.LFSR_STEPS` steps as a mask of old bits."""
    bits = [1 << i for i in range(32)]
    for _ in range(spec.LFSR_STEPS):
        lsb = bits[0]
        bits = bits[1:] + [0]
        for j in range(32):
            if (spec.LFSR_TAPS >> j) & 1:
                bits[j] ^= lsb
    return bits


def _pwl_rom():
    words = []
    for name in spec.PWL_FUNCS:
        a_tab, b_tab = spec.PWL_TABLES[name]
        words += [a | (b << 32) for a, b in zip(a_tab, b_tab)]
    return words


def _order_key(m, x, name):
    """Signed key ordered like binary32 ``x`` with -0 < +0 (NaNs handled by the caller)."""
    key = Signal(signed(33), name=name)
    # -|x| - 1 is the complement of |x| (no carry chain).
    m.d.comb += key.eq(Cat(x[:31] ^ x[31].replicate(31), x[31], x[31]))
    return key


def _lost_bits(m, value, amount, name):
    """Any set bit among the ``amount`` low bits of ``value`` (shifted out by ``>> amount``)."""
    mask = Signal(len(value), name=name)
    m.d.comb += mask.eq(Cat(*[amount > j for j in range(len(value))]))   # thermometer
    return (value & mask) != 0


def _narrow_shift(m, t, shift, name):
    """``t >> shift`` (arithmetic, ``shift`` of 6 bits) clamped to [-1024, 1023]: after the
    rounding step ``(w + 1) >> 1`` and a zero point of at most 128 in magnitude, a clamped
    value still saturates the int8 result the same way. The shifts by 32, 16, ..., 1 are
    applied in that order (floor divisions compose), and after each only the bits that can
    still reach the low 11 bits are kept (42, 26, 18, 14, 12, 11): a value that does not fit
    them is at least 1024 in magnitude at the end, so it is clamped by the sign of ``t``."""
    v, out_of_range = t, Const(0)
    for k, keep in zip(range(5, -1, -1), (42, 26, 18, 14, 12, 11)):
        shifted = Signal(signed(len(v)), name=f"{name}_s{k}")
        m.d.comb += shifted.eq(Mux(shift[k], v >> (1 << k), v))
        top = shifted[keep - 1:]
        fits = (top == 0) | (top == (1 << len(top)) - 1)
        out_of_range = out_of_range | ~fits
        v = shifted[:keep].as_signed()
    u = Signal(signed(12), name=name)
    m.d.comb += u.eq(Mux(out_of_range, Mux(t[-1], -1024, 1023), v))
    return u


def _is_nan(x):
    return (x[23:31] == 0xFF) & (x[:23] != 0)


def _f32_activation_bound(m, x, b, name):
    """ReLU ``max(x, +0)``, clamp ``min(max(x, lo), hi)`` or ``x`` itself, as ``b.relu`` and
    ``b.clamp`` say; ``max`` and ``min`` of binary32 as the model's: the quiet NaN if either
    operand is a NaN, else by the order key (-0 < +0), the first operand on a tie. ReLU needs
    no comparison (``x >= +0`` by key is a clear sign bit). The clamp compares ``x`` with each
    bound side by side, and the bounds with each other is ``b.ordered``, so the minimum does
    not wait for the maximum: ``max(x, lo)`` is ``x`` or ``lo``, so ``min`` of it is
    ``min(x, hi)`` or ``min(lo, hi)``. The result is one choice among ``x``, +0, ``lo``,
    ``hi`` and the quiet NaN."""
    kx = _order_key(m, x, f"{name}_kx")
    ge_lo = Signal(name=f"{name}_ge_lo")
    le_hi = Signal(name=f"{name}_le_hi")
    m.d.comb += [ge_lo.eq(kx >= b.klo), le_hi.eq(kx <= b.khi)]
    x_nan = _is_nan(x)
    nan = Signal(name=f"{name}_nan")
    take_x = Signal(name=f"{name}_x")
    take_zero = Signal(name=f"{name}_zero")
    take_lo = Signal(name=f"{name}_lo")
    m.d.comb += [
        nan.eq((b.relu & x_nan) | (b.clamp & (x_nan | b.lo_nan | b.hi_nan))),
        take_x.eq(Mux(b.relu, ~x[31], Mux(b.clamp, ge_lo & le_hi, 1))),
        take_zero.eq(b.relu),
        take_lo.eq(~ge_lo & b.ordered),
    ]
    out = Signal(32, name=name)
    m.d.comb += out.eq(Mux(nan, F32_QNAN, Mux(take_x, x, Mux(take_zero, 0,
                                                             Mux(take_lo, b.lo, b.hi)))))
    return out


class PostProcessor(wiring.Component):
    """Post-processor of one neural engine core (``lanes = config.macs``).

    Parameters
    ----------
    config : NPUConfig
    lanes_per_cycle : int, optional
        Lane datapaths built (a divisor of ``lanes``; default all): a result beat is processed
        as ``lanes / lanes_per_cycle`` sub-beats on consecutive cycles, so the throughput is one
        beat per :attr:`cycles_per_beat` cycles for proportionally less logic.

    Members
    -------
    res : In(stream of mac_result_layout(lanes, slots))
        MAC results; a beat is taken only while a full parameter bank exists.
    params : In(stream of param_beat_layout(slots))
        Parameter beats (``bias`` is ignored); taken only while a bank is free.
    out : Out(stream of postproc_out_layout(lanes, slots))
        One output beat per result beat, in order, ``pipeline_latency(config)`` cycles after
        the result's handshake.
    cfg : In(postproc_config_layout())
        Layer configuration.
    lfsr_load : In(1)
        Load every lane's LFSR from ``cfg.seed``.
    error : Out(1)
        Sticky: a result beat could not be processed (its output is zeros).
    error_clear : In(1)
        Clear ``error`` (a new error in the same cycle wins).
    """

    def __init__(self, config, lanes_per_cycle=None):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        lanes, slots = config.macs, config.acc_slots
        if lanes_per_cycle is None:
            lanes_per_cycle = lanes
        if (not isinstance(lanes_per_cycle, int) or isinstance(lanes_per_cycle, bool)
                or lanes_per_cycle < 1 or lanes % lanes_per_cycle):
            raise ValueError(f"lanes_per_cycle must divide the {lanes} lanes, "
                             f"not {lanes_per_cycle!r}")
        self._config = config
        self._lpc = lanes_per_cycle
        super().__init__(post_processor_signature(lanes, slots))

    @property
    def config(self):
        return self._config

    @property
    def lanes_per_cycle(self):
        return self._lpc

    @property
    def cycles_per_beat(self):
        """Cycles a result beat occupies the pipeline (``lanes / lanes_per_cycle``)."""
        return self._config.macs // self._lpc

    @property
    def latency(self):
        return pipeline_latency(self._config)

    def elaborate(self, platform):
        m = Module()
        config = self._config
        lanes, slots = config.macs, config.acc_slots
        has_int, has_float = config.has_int8, config.has_float
        cfg = self.cfg
        last = self.latency - 1     # index of the output stage
        en = Signal()

        def reg(value, name, shape=None, reset_less=True):
            # Data registers have no reset: every use is qualified by a `valid` register
            # (which has one), so the core's clear need not reach them.
            sig = Signal(shape if shape is not None else value.shape(), name=name,
                         reset_less=reset_less)
            with m.If(en):
                m.d.sync += sig.eq(value)
            return sig

        def delay(value, n, name):
            for i in range(n):
                value = reg(value, f"{name}_{i}")
            return value

        # ---- Parameter banks: word (bank, slot) of a small memory (LUT RAM on the ECP5) ----
        bank_word = data.StructLayout({"scale": 32, "shift": 6})
        slot_bits = max(1, (slots - 1).bit_length())
        m.submodules.banks = banks = Memory(shape=bank_word, depth=2 << slot_bits, init=[])
        bank_w = banks.write_port()
        bank_r = banks.read_port(domain="comb")
        full = Array(Signal(name=f"full{b}") for b in range(2))
        count = Array(Signal(16, name=f"count{b}") for b in range(2))
        wb = Signal()       # bank being filled
        rb = Signal()       # oldest bank (read by results)
        consumed = Signal(16)

        p = self.params.payload
        m.d.comb += self.params.ready.eq(~full[wb])
        p_take = self.params.valid & self.params.ready
        m.d.comb += [bank_w.addr.eq(Cat(p.slot, wb)),
                     bank_w.data.scale.eq(p.scale), bank_w.data.shift.eq(p.shift),
                     bank_w.en.eq(p_take)]
        with m.If(p_take):
            m.d.sync += count[wb].eq(count[wb] + 1)
            with m.If(p.group_last):
                m.d.sync += [full[wb].eq(1), wb.eq(~wb)]

        # A result beat is issued as `folds` sub-beats of `units` lanes (one per cycle); it is
        # taken (ready) with its last sub-beat.
        units, folds = self._lpc, lanes // self._lpc
        r = self.res.payload
        issue = Signal()
        sub = Signal(range(folds), name="sub")
        last_sub = Signal()
        m.d.comb += [
            issue.eq(self.res.valid & full[rb] & en),
            last_sub.eq(sub == folds - 1),
            self.res.ready.eq(en & full[rb] & last_sub),
        ]
        if folds > 1:
            with m.If(issue):
                m.d.sync += sub.eq(Mux(last_sub, 0, sub + 1))
        take = self.res.valid & self.res.ready

        def lane_mux(values, j):
            if folds == 1:
                return values[j]
            return Array(values[k * units + j] for k in range(folds))[sub]
        with m.If(take):
            with m.If(consumed + 1 == count[rb]):
                # The group's last result: release the bank (its parameters are in flight).
                m.d.sync += [full[rb].eq(0), count[rb].eq(0), rb.eq(~rb), consumed.eq(0)]
            with m.Else():
                m.d.sync += consumed.eq(consumed + 1)
        m.d.comb += bank_r.addr.eq(Cat(r.slot, rb))
        sel_scale, sel_shift = bank_r.data.scale, bank_r.data.shift

        # ---- Beat check and the sticky error ----------------------------------------------
        is_int = r.fmt == MacFormat.INT8
        bad = Signal()
        m.d.comb += bad.eq(Mux(
            cfg.act > int(Act.EXP), 1,
            Mux(is_int,
                (not has_int) | cfg.out_fp16 | (cfg.act > int(Act.CLAMP)),
                not has_float)))
        with m.If(take & bad):
            m.d.sync += self.error.eq(1)
        with m.Elif(self.error_clear):
            m.d.sync += self.error.eq(0)

        # ---- Pipeline control ---------------------------------------------------------------
        valid = [reg(issue, "valid_0", reset_less=False)]
        for i in range(1, last):
            valid.append(reg(valid[-1], f"valid_{i}", reset_less=False))
        sub_pre = delay(sub, last - 1, "sub")       # at S(last - 2)
        sub_ctl = reg(sub_pre, f"sub_{last - 1}")   # at S(last - 1)
        last_ctl = delay(last_sub, last, "last")
        out_valid = reg(valid[last - 1] & last_ctl, "out_valid", reset_less=False)
        m.d.comb += [
            en.eq(~out_valid | self.out.ready),
            self.out.valid.eq(out_valid),
        ]

        def output(j, value):
            # The output register of lane `k * units + j`, written by sub-beat k.
            for k in range(folds):
                lane = k * units + j
                out_v = Signal(16, name=f"out_{lane}", reset_less=True)
                with m.If(en & valid[last - 1] & (sub_ctl == k)):
                    m.d.sync += out_v.eq(value)
                m.d.comb += self.out.payload.values[lane].eq(out_v)

        # ---- LFSRs: one per lane, advanced once per beat as it reaches the output ----------
        rnd_out = (self._lfsrs(m, en & valid[last - 1] & last_ctl, en & valid[last - 1], sub_ctl,
                               sub_pre, reg)
                   if has_float else [])

        slot_out = delay(r.slot, last + 1, "slot")
        m.d.comb += self.out.payload.slot.eq(slot_out)

        # S0: input registers.
        int0 = reg(is_int, "int0")
        bad0 = reg(bad, "bad0")
        scale0 = reg(sel_scale, "scale0")
        shift0 = reg(sel_shift, "shift0")
        shift1 = reg(shift0, "shift1")
        int_ctl = delay(int0, last - 1, "int")   # at S(last - 1)
        bad_ctl = delay(bad0, last - 1, "bad")

        act = cfg.act
        RELU, CLAMP, LEAKY, ABS = int(Act.RELU), int(Act.CLAMP), int(Act.LEAKY), int(Act.ABS)
        SIGMOID, TANH, GELU, EXP = (int(Act.SIGMOID), int(Act.TANH), int(Act.GELU),
                                    int(Act.EXP))
        if has_float:
            bound = self._bound_operands(m, act, cfg)
        for i in range(units):
            acc0 = reg(lane_mux([r.acc[n] for n in range(lanes)], i), f"acc0_{i}", 32)

            # S1: the shared multiplier (int32 x int32, or 24 x 24 significands).
            ea, fa = acc0[23:31], acc0[:23]
            eb, fb = scale0[23:31], scale0[:23]
            if has_int and has_float:
                op_a = Mux(int0, acc0.as_signed(), Cat(fa, ea != 0).as_unsigned())
                op_b = Mux(int0, scale0.as_signed(), Cat(fb, eb != 0).as_unsigned())
                prod = reg(op_a * op_b, f"prod1_{i}", signed(66))
            elif has_int:
                prod = reg(acc0.as_signed() * scale0.as_signed(), f"prod1_{i}", signed(64))
            else:
                prod = reg(Cat(fa, ea != 0) * Cat(fb, eb != 0), f"prod1_{i}", 48)

            if has_int:
                # S2: round half up, arithmetic shift, zero point, saturate to int8.
                # (p + 2**(s-1)) >> s == (floor(p / 2**(s-1)) + 1) >> 1 for s >= 1: no wide add.
                w = _narrow_shift(m, prod[:64].as_signed(), Mux(shift1 == 0, 0, shift1 - 1),
                                  f"w_{i}")
                w_shift = shift1
                if has_float:
                    # Float builds have stages to spare on the int32 path: the shift result is
                    # registered before the rounding step (S2), and what follows moves one
                    # stage later.
                    w = reg(w, f"w2_{i}")
                    w_shift = reg(shift1, f"wshift2_{i}")
                u = Signal(signed(11), name=f"u_{i}")
                m.d.comb += u.eq(Mux(w_shift == 0, w, (w + 1) >> 1))
                y = Signal(signed(12), name=f"yz_{i}")
                m.d.comb += y.eq(u + cfg.zero_point)
                sat = reg(Mux(y > 127, 127, Mux(y < -128, -128, y)), f"sat2_{i}", signed(8))
                # S3 (S4 in float builds): ReLU at the zero point, or clamp to int8 bounds.
                lo8, hi8 = cfg.lo[:8].as_signed(), cfg.hi[:8].as_signed()
                relu = Mux(sat < cfg.zero_point, cfg.zero_point, sat)
                clamped = Mux(sat < lo8, lo8, sat)
                clamped = Mux(clamped > hi8, hi8, clamped)
                iv = Mux(act == RELU, relu, Mux(act == CLAMP, clamped, sat))
                if not has_float:
                    output(i, Mux(bad_ctl, 0, iv).as_signed())
                    continue
                int4 = reg(iv, f"int4_{i}", signed(8))
                int_val = delay(int4, last - 5, f"intv_{i}")  # at S(last - 1)
            else:
                int_val = Const(0, signed(8))

            # S1 (float): the product's class and exponent, beside the shared product.
            p1 = Signal(MulProduct, name=f"p1_{i}")
            nan, inf = f32_mul_special(F32(acc0), F32(scale0))
            cls = reg(Cat(nan, inf, acc0[31] ^ scale0[31]), f"cls1_{i}", 3)
            bexp = reg(Mux(ea == 0, 1, ea) + Mux(eb == 0, 1, eb) - 127, f"bexp1_{i}",
                       signed(11))
            m.d.comb += [p1.prod.eq(prod[:48]), p1.bexp.eq(bexp), p1.nan.eq(cls[0]),
                         p1.inf.eq(cls[1]), p1.sign.eq(cls[2])]
            # S2-S4: y1 = f32_mul(acc, scale): normalise (S2), shift to binary32 precision
            # (S3), round and pack (S4).
            n2 = reg(f32_mul_normalise(m, p1, f"y1n_{i}"), f"n2_{i}")
            d3 = reg(f32_mul_denormalise(m, n2, f"y1d_{i}"), f"d3_{i}")
            y1 = reg(f32_mul_finish(m, d3, f"y1r_{i}"), f"y1_{i}")

            # S5: activation operands; the PWL table is read with the segment of y1.
            e1 = y1[23:31]
            e0 = 127 + spec.PWL_EMIN
            octave = Mux(e1 < e0, 0, Mux(e1 >= e0 + spec.PWL_OCTAVES, 7, e1 - (e0 - 1)))
            func = Mux(act == TANH, 1, Mux(act == GELU, 2, Mux(act == EXP, 3, 0)))
            rom = Memory(shape=64, depth=128 * len(spec.PWL_FUNCS), init=_pwl_rom())
            m.submodules[f"pwl_{i}"] = rom
            rp = rom.read_port(domain="sync")
            m.d.comb += [
                rp.en.eq(en),
                rp.addr.eq(Cat(y1[20:23], octave[:3], y1[31], func[:2])),
            ]
            y1_neg = y1[31] & (y1[:31] != 0) & ~_is_nan(y1)
            a_sel = Mux((act == LEAKY) & y1_neg, cfg.alpha,
                        Mux((act == ABS) & y1[31], F32_MONE, F32_ONE))
            use_rom = (act == SIGMOID) | (act == TANH) | (act == GELU) | (act == EXP)
            x5 = reg(y1, f"x5_{i}")
            a5 = reg(a_sel, f"asel5_{i}", 32)
            rom5 = reg(use_rom, f"rom5_{i}", 1)
            # Tails other than GELU's positive side have a = 0: x is replaced by -0 so that
            # -0 * 0 + b is exactly b (1, +0, +-1 or -0), infinities included (exp's positive
            # segments also have a = 0, b = 1: x * 0 + 1 = 1 for finite x). GELU's positive
            # tail (a = 1, b = -0) gives x exactly, as the model's tail rule says.
            tail5 = reg(use_rom & (octave == 7) & ~_is_nan(y1) & ~((act == GELU) & ~y1[31]),
                        f"tail5_{i}", 1)
            x_op = Mux(tail5, F32_MZERO, x5)
            a_op = Mux(rom5, rp.data[:32], a5)
            b_op = Signal(32, name=f"bop5_{i}")
            m.d.comb += b_op.eq(Mux(rom5, rp.data[32:], F32_MZERO))

            # S6-S9: f32_mul(x, a): the product (S6), then the three steps of S2-S4.
            p6 = reg(f32_mul_product(m, x_op, a_op, f"m2p_{i}"), f"p6_{i}")
            n7 = reg(f32_mul_normalise(m, p6, f"m2n_{i}"), f"n7_{i}")
            d8 = reg(f32_mul_denormalise(m, n7, f"m2d_{i}"), f"d8_{i}")
            m9 = reg(f32_mul_finish(m, d8, f"m2r_{i}"), f"m9_{i}")
            b9 = delay(b_op, 4, f"b_{i}")
            # S10..S12: f32_add(product, b).
            adder = FP32AddPipe()
            m.submodules[f"add_{i}"] = adder
            m.d.comb += [adder.en.eq(en), adder.a.eq(m9), adder.b.eq(b9),
                         adder.op.eq(MacOp.MAC)]
            # S13: register the sum.
            s13 = reg(adder.result, f"s13_{i}")
            # S14: ReLU = max(x, +0); clamp = min(max(x, lo), hi).
            c14 = reg(_f32_activation_bound(m, s13, bound, f"bound_{i}"), f"c14_{i}", 32)

            # S15, S16: to binary16 or int8: the significand shifted to its place (S15), then
            # rounded and packed.
            f16 = self._to_f16(m, c14, rnd_out[i], cfg.stochastic, f"f16_{i}", reg)
            i8 = self._to_int8(m, c14, cfg.zero_point, f"i8_{i}", reg)
            value = Mux(bad_ctl, 0,
                        Mux(int_ctl, int_val.as_signed(), Mux(cfg.out_fp16, f16, i8)))
            output(i, value)
        return m

    @staticmethod
    def _bound_operands(m, act, cfg):
        """The lanes' shared operands of S14 (``_f32_activation_bound``), from the layer's
        configuration (which holds while the layer runs): the bounds, their order keys, and
        whether they are in order (``lo <= hi`` by their keys; registered, no reset: it is
        ready long before a layer's first result)."""
        relu = Signal(name="bound_relu")
        clamp = Signal(name="bound_clamp")
        m.d.comb += [relu.eq(act == int(Act.RELU)), clamp.eq(act == int(Act.CLAMP))]
        klo, khi = _order_key(m, cfg.lo, "bound_klo"), _order_key(m, cfg.hi, "bound_khi")
        ordered = Signal(name="bound_ordered", reset_less=True)
        m.d.sync += ordered.eq(klo <= khi)
        return SimpleNamespace(relu=relu, clamp=clamp, lo=cfg.lo, hi=cfg.hi, klo=klo, khi=khi,
                               lo_nan=_is_nan(cfg.lo), hi_nan=_is_nan(cfg.hi), ordered=ordered)

    def _lfsrs(self, m, advance, step, sub_ctl, sub_pre, reg):
        """One LFSR per lane; returns the random bits of each lane datapath (of lane
        ``k * units + j`` for sub-beat ``k = sub_ctl``).

        Beats stay in order, so this is the sequence of the model (one advance per result
        beat); the beat at the conversion stage uses the advanced state's low bits. At full
        rate every lane's state is a register, advanced by ``advance`` (the beat's last
        sub-beat, which is its only one). Folded (``folds > 1``), each lane datapath owns the
        states of its ``folds`` lanes in a small memory and one next-state circuit, and
        advances lane ``k * units + j`` when ``step`` (any sub-beat at that stage) comes with
        ``sub_ctl == k``: each lane still advances once per beat, at its own sub-beat. The
        folded state is read and advanced a stage early (``sub_pre``, through ``reg``), so the
        rounding stage gets its random bits from a register: the same lane's previous
        sub-beat is ``folds >= 2`` stages ahead and has written its state by then."""
        lanes = self._config.macs
        units, folds = self._lpc, lanes // self._lpc
        cfg = self.cfg
        matrix = _lfsr_matrix()
        consts = [(spec.LFSR_LANE_CONST * (i + 1)) & 0xFFFF_FFFF for i in range(lanes)]

        def advanced(state, name):
            nxt = Signal(32, name=name)
            m.d.comb += nxt.eq(Cat(*[(state & mask).xor() for mask in matrix]))
            return nxt

        if folds == 1:
            rnd_lane = []
            for i in range(lanes):
                c = consts[i]
                state = Signal(32, name=f"lfsr{i}", init=c)
                nxt = advanced(state, f"lfsr{i}_next")
                with m.If(self.lfsr_load):
                    m.d.sync += state.eq(Mux((cfg.seed ^ c) == 0, c, cfg.seed ^ c))
                with m.Elif(advance):
                    m.d.sync += state.eq(nxt)
                rnd_lane.append(nxt[:spec.LFSR_BITS])
            return rnd_lane

        # Folded: a lane whose `fresh` bit is set has the loaded state `seed ^ c` (the seed
        # register is 0 after reset, so the reset state is `c`); otherwise its memory word.
        seed = Signal(32, name="lfsr_seed")
        with m.If(self.lfsr_load):
            m.d.sync += seed.eq(cfg.seed)
        rnd = []
        for j in range(units):
            mem = Memory(shape=32, depth=folds, init=[])
            m.submodules[f"lfsr_mem{j}"] = mem
            rd = mem.read_port(domain="comb")
            wr = mem.write_port()
            fresh = Signal(folds, name=f"lfsr_fresh{j}", init=(1 << folds) - 1)
            c = Signal(32, name=f"lfsr_c{j}")
            m.d.comb += c.eq(Array(Const(consts[k * units + j], 32)
                                   for k in range(folds))[sub_pre])
            loaded = Mux((seed ^ c) == 0, c, seed ^ c)
            state = Signal(32, name=f"lfsr_state{j}")
            m.d.comb += [
                rd.addr.eq(sub_pre),
                state.eq(Mux(fresh.bit_select(sub_pre, 1), loaded, rd.data)),
            ]
            nxt = reg(advanced(state, f"lfsr_next{j}"), f"lfsr_next{j}_q")
            m.d.comb += [wr.addr.eq(sub_ctl), wr.data.eq(nxt), wr.en.eq(step)]
            with m.If(self.lfsr_load):
                m.d.sync += fresh.eq((1 << folds) - 1)
            with m.Elif(step):
                m.d.sync += fresh.bit_select(sub_ctl, 1).eq(0)
            rnd.append(nxt[:spec.LFSR_BITS])
        return rnd

    @staticmethod
    def _to_f16(m, z, rnd, stochastic, name, reg):
        """binary32 ``z`` to binary16 bits: RNE, or stochastic with the 13-bit ``rnd``. The
        aligned significand and the class go through ``reg`` (a pipeline register) before
        the rounding."""
        out = Signal(16, name=name)
        e = z[23:31]
        frac = z[:23]
        sig = Cat(frac, e != 0)
        ee = Mux(e == 0, 1, e)
        d = Signal(5, name=f"{name}_d")
        m.d.comb += d.eq(Mux(ee >= 113, 0, Mux(ee < 113 - 31, 31, 113 - ee)))
        t = Signal(24, name=f"{name}_t0")
        m.d.comb += t.eq(sig >> d)
        t = reg(t, f"{name}_t")
        sticky = reg(_lost_bits(m, sig, d, f"{name}_lost"), f"{name}_sticky", 1)
        base = reg(Mux(ee >= 113, ee - 113, 0)[:8], f"{name}_base", 8)
        nan = reg((e == 0xFF) & (frac != 0), f"{name}_nan", 1)
        inf = reg(e == 0xFF, f"{name}_inf", 1)
        sign = reg(z[31], f"{name}_sign", 1)
        addend = Signal(13, name=f"{name}_add")
        m.d.comb += addend.eq(Mux(stochastic, rnd, 0xFFF + t[13]))
        total = Signal(25, name=f"{name}_sum")
        m.d.comb += total.eq(Mux(stochastic, t, t | sticky) + addend)
        bits = Signal(20, name=f"{name}_bits")
        m.d.comb += bits.eq(Cat(Const(0, 10), base) + total[13:25])
        with m.If(nan):
            m.d.comb += out.eq(F16_QNAN)
        with m.Elif(inf | (bits >= 0x7C00)):
            m.d.comb += out.eq(Cat(Const(0x7C00, 15), sign))
        with m.Else():
            m.d.comb += out.eq(Cat(bits[:15], sign))
        return out

    @staticmethod
    def _to_int8(m, z, zero_point, name, reg):
        """binary32 ``z`` rounded half to even, clamped to [-256, 255], plus the zero point,
        saturated to int8; 16 bits (sign-extended). NaN counts as 0. The shifted significand
        and the class go through ``reg`` (a pipeline register) before the rounding."""
        out = Signal(16, name=name)
        e = z[23:31]
        frac = z[:23]
        sig = Cat(frac, e != 0)
        ee = Mux(e == 0, 1, e)
        # |z| < 512 unless e >= 136; then the shift 150 - e is at least 15.
        rs1 = Signal(5, name=f"{name}_rs")     # shift keeping the guard bit: 149 - e, <= 31
        m.d.comb += rs1.eq(Mux(ee < 149 - 31, 31, 149 - ee))
        q = Signal(24, name=f"{name}_q0")
        m.d.comb += q.eq(sig >> rs1)
        # The rounded magnitude has 11 bits: only q's low 12 are kept.
        q = reg(q[:12], f"{name}_q", 12)
        sticky = reg(_lost_bits(m, sig, rs1, f"{name}_lost"), f"{name}_sticky", 1)
        nan = reg((e == 0xFF) & (frac != 0), f"{name}_nan", 1)
        big = reg(e >= 136, f"{name}_big", 1)
        sign = reg(z[31], f"{name}_sign", 1)
        mag = Signal(11, name=f"{name}_mag")
        m.d.comb += mag.eq(q[1:] + (q[0] & (sticky | q[1])))
        r = Signal(signed(12), name=f"{name}_r")
        with m.If(nan):
            m.d.comb += r.eq(0)
        with m.Elif(big):
            m.d.comb += r.eq(Mux(sign, -256, 255))
        with m.Else():
            m.d.comb += r.eq(Mux(sign, -mag, Mux(mag > 255, 255, mag)))
        y = Signal(signed(13), name=f"{name}_y")
        m.d.comb += y.eq(r + zero_point)
        m.d.comb += out.eq(Mux(y > 127, 127, Mux(y < -128, -128, y)).as_signed())
        return out
