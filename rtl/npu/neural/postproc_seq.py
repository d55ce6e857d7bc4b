"""A sequential int8-only post-processor for FPGAs short of logic (``docs/postproc.md``).

``NPUConfig.postproc_impl == "sequential"``: the ports and the results of
:class:`npu.neural.postproc.PostProcessor` for a build whose only format is int8, at a fraction
of the logic. One lane is rescaled at a time:

* the 32 x 32-bit TOSA rescale product ``acc * scale`` is built from the magnitudes in four
  16 x 16-bit steps on one multiplier (one ``SB_MAC16`` on the iCE40), lowest partial product
  first; the sign is applied to each partial product as it is added, and the accumulator keeps
  only the part not yet final (the low 16 bits leave it after the first and third steps), so
  the adder is 36 bits wide, not 64;
* the rounding shift uses ``floor((p + 2**(s-1)) / 2**s) == (floor(2p / 2**s) + 1) >> 1``: one
  arithmetic shift of ``2p`` that keeps only the 10 bits the result needs (beyond them the
  int8 result saturates whatever the zero point; the shifter checks the bits it drops), then an
  11-bit add that also adds the zero point; no 64-bit rounding adder;
* the two parameter banks (scale and shift per slot) are a block RAM, not flip-flops.

A result beat of ``lanes`` lanes takes ``4 * lanes + 5`` cycles (:attr:`cycles_per_beat`).
The golden model is :mod:`npu_model.postproc` (its int32 path), unchanged.
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory

from npu_spec.config import NPUConfig

from .layouts import (
    MacFormat,
    slot_shape,
)
from .postproc import Act, PostProcessor, post_processor_signature

__all__ = ["SequentialPostProcessor", "post_processor"]


class SequentialPostProcessor(wiring.Component):
    """Post-processor of one neural engine core, int8 only, one lane at a time.

    Parameters
    ----------
    config : NPUConfig
        A build whose only format is int8.

    Members
    -------
    res : In(stream of mac_result_layout(lanes, slots))
        MAC results; a beat is held (not taken) while its lanes are processed, and taken in
        the cycle its last lane's output is written. Only taken while a full parameter bank
        exists.
    params : In(stream of param_beat_layout(slots))
        Parameter beats (``bias`` is ignored); taken only while a bank is free.
    out : Out(stream of postproc_out_layout(lanes, slots))
        One output beat per result beat, in order.
    cfg : In(postproc_config_layout())
        Layer configuration (``out_fp16``, ``stochastic``, ``alpha`` and ``seed`` unused:
        binary16 outputs are errors).
    lfsr_load : In(1)
        Unused (there is no stochastic rounding without binary16).
    error : Out(1)
        Sticky: a result beat could not be processed (its output is zeros): a float format,
        binary16 output, or an activation other than none, ReLU and clamp.
    error_clear : In(1)
        Clear ``error`` (a new error in the same cycle wins).
    """

    def __init__(self, config):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        if config.formats != ("int8",):
            raise ValueError(f"the sequential post-processor is int8 only, not formats "
                             f"{config.formats!r}")
        self._config = config
        lanes, slots = config.macs, config.acc_slots
        super().__init__(post_processor_signature(lanes, slots))

    @property
    def config(self):
        return self._config

    @property
    def cycles_per_beat(self):
        """Cycles from one result handshake to the next, results and output never waiting."""
        return 4 * self._config.macs + 5

    def elaborate(self, platform):
        m = Module()
        lanes, slots = self._config.macs, self._config.acc_slots
        cfg = self.cfg
        r = self.res.payload

        # ---- Parameter banks: block RAM, slot + bank as the address --------------------
        sbits = slot_shape(slots).width
        m.submodules.banks = banks = Memory(
            shape=data.StructLayout({"scale": 32, "shift": 6}), depth=2 << sbits, init=[],
            attrs={"ram_style": "block"})
        wr = banks.write_port()
        rd = banks.read_port(domain="sync")
        full = Array(Signal(name=f"full{b}") for b in range(2))
        count = Array(Signal(16, name=f"count{b}") for b in range(2))
        wb = Signal()       # bank being filled
        rb = Signal()       # oldest bank (read by results)
        consumed = Signal(16)

        p = self.params.payload
        m.d.comb += self.params.ready.eq(~full[wb])
        p_take = self.params.valid & self.params.ready
        m.d.comb += [wr.en.eq(p_take), wr.addr.eq(Cat(p.slot, wb)),
                     wr.data.scale.eq(p.scale), wr.data.shift.eq(p.shift)]
        with m.If(p_take):
            m.d.sync += count[wb].eq(count[wb] + 1)
            with m.If(p.group_last):
                m.d.sync += [full[wb].eq(1), wb.eq(~wb)]
        # The read address is the waiting beat's: its scale and shift are there one cycle
        # later and stay while the beat is processed.
        m.d.comb += [rd.en.eq(1), rd.addr.eq(Cat(r.slot, rb))]
        scale, shift = rd.data.scale, rd.data.shift

        take = self.res.valid & self.res.ready
        with m.If(take):
            with m.If(consumed + 1 == count[rb]):
                m.d.sync += [full[rb].eq(0), count[rb].eq(0), rb.eq(~rb), consumed.eq(0)]
            with m.Else():
                m.d.sync += consumed.eq(consumed + 1)

        # ---- Beat check and the sticky error --------------------------------------------
        bad = Signal()
        m.d.comb += bad.eq((r.fmt != MacFormat.INT8) | cfg.out_fp16 | (cfg.act > Act.CLAMP))
        with m.If(take & bad):
            m.d.sync += self.error.eq(1)
        with m.Elif(self.error_clear):
            m.d.sync += self.error.eq(0)

        # ---- Sequencing: step c of a beat multiplies lane c // 4, partial product c % 4 ---
        with m.If(self.out.valid & self.out.ready):
            m.d.sync += self.out.valid.eq(0)
        c = Signal(range(4 * lanes + 4))
        running = Signal()
        final_lane = Signal()       # the last lane's output is written this cycle
        with m.If(~running & self.res.valid & full[rb] & (~self.out.valid | self.out.ready)):
            m.d.sync += [running.eq(1), c.eq(0)]
        with m.If(running):
            m.d.sync += c.eq(c + 1)
        with m.If(final_lane):
            m.d.sync += [running.eq(0), self.out.valid.eq(1),
                         self.out.payload.slot.eq(r.slot)]
        m.d.comb += self.res.ready.eq(final_lane)

        # Step: the magnitudes' 16-bit halves into the multiplier (registered product).
        step = running & (c < 4 * lanes)
        lane = c[2:]
        k = c[:2]
        acc = r.acc[lane]
        a_mag = Signal(32)
        b_mag = Signal(32)
        m.d.comb += [a_mag.eq(Mux(acc[31], -acc, acc)),
                     b_mag.eq(Mux(scale[31], -scale, scale))]
        op_a = Signal(16)
        op_b = Signal(16)
        m.d.comb += [op_a.eq(Mux(k[1], a_mag[16:], a_mag[:16])),
                     op_b.eq(Mux(k[0], b_mag[16:], b_mag[:16]))]
        pp = Signal(32)
        p_sign = Signal()
        p_valid = Signal()
        p_k = Signal(2)
        p_lane = Signal(range(lanes))
        m.d.sync += [pp.eq(op_a * op_b), p_sign.eq(acc[31] ^ scale[31]), p_valid.eq(step),
                     p_k.eq(k), p_lane.eq(lane)]

        # Accumulate: s holds the signed sum above the bits already final (lo, mid).
        s = Signal(signed(36))
        lo = Signal(16)
        mid = Signal(16)
        base = Signal(signed(36))
        m.d.comb += base.eq(Mux(p_k == 2, s, Mux(p_k == 0, 0, s >> 16)))
        term = Signal(signed(34))
        m.d.comb += term.eq(Mux(p_sign, -pp, pp))
        f_valid = Signal()
        f_lane = Signal(range(lanes))
        m.d.sync += [f_valid.eq(p_valid & (p_k == 3)), f_lane.eq(p_lane)]
        with m.If(p_valid):
            m.d.sync += s.eq(base + term)
            with m.If(p_k == 1):
                m.d.sync += lo.eq(s[:16])
            with m.If(p_k == 3):
                m.d.sync += mid.eq(s[:16])

        # Round and shift: u = floor(2p / 2**shift), clamped to [-512, 511] (registered):
        # beyond, y = (u + 1) >> 1 is outside [-255, 255] and y + zero point saturates. The
        # shifter keeps only the bits that can still reach u's low 10 bits (shifts by 32, 16,
        # ..., 1 in that order), and each stage checks that the bits it drops are copies of the
        # sign; u is out of range if one is not, or if u's bit 9 is not.
        prod = Cat(lo, mid, s[:32]).as_signed()          # |acc * scale| < 2**62
        v = Cat(Const(0, 1), prod)                       # 2p, 65 bits, sign in bit 64
        sign = v[64]
        in_range = []
        for k in reversed(range(6)):
            d = 1 << k
            keep = 9 + d                                 # 10 + the shifts still to come
            dropped = v[keep:9 + 2 * d]                  # dropped when this stage does not
            in_range.append(shift[k] | (dropped == Mux(sign, (1 << len(dropped)) - 1, 0)))
            v = Mux(shift[k], Cat(v[d:], sign.replicate(d)), v)[:keep]
        in_range.append(v[9] == sign)
        u_clamped = Signal(signed(10))
        g_valid = Signal()
        g_lane = Signal(range(lanes))
        m.d.sync += [u_clamped.eq(Mux(Cat(*in_range).all(), v[:10],
                                      Mux(sign, -512, 511))),
                     g_valid.eq(f_valid), g_lane.eq(f_lane)]
        # y + zero point = (u + 1 + 2 * zero point) >> 1: one 11-bit add (registered).
        h_valid = Signal()
        h_lane = Signal(range(lanes))
        yz = Signal(signed(11))
        m.d.sync += [yz.eq((u_clamped + Cat(Const(1, 1), cfg.zero_point).as_signed()) >> 1),
                     h_valid.eq(g_valid), h_lane.eq(g_lane)]

        # Saturation to int8, then ReLU (at the zero point) or the clamp, its three
        # comparisons side by side; the lane's output register.
        sat = Signal(signed(8))
        with m.If(~yz[10] & (yz[7:] != 0)):
            m.d.comb += sat.eq(127)
        with m.Elif(yz[10] & ~yz[7:].all()):
            m.d.comb += sat.eq(-128)
        with m.Else():
            m.d.comb += sat.eq(yz[:8])
        lo8, hi8 = cfg.lo[:8].as_signed(), cfg.hi[:8].as_signed()
        relu = Mux(sat < cfg.zero_point, cfg.zero_point, sat)
        clamped = Mux(sat < lo8, Mux(lo8 > hi8, hi8, lo8), Mux(sat > hi8, hi8, sat))
        value = Signal(signed(8))
        m.d.comb += value.eq(Mux(bad, 0, Mux(cfg.act == Act.RELU, relu,
                                                 Mux(cfg.act == Act.CLAMP, clamped, sat))))
        m.d.comb += final_lane.eq(h_valid & (h_lane == lanes - 1))
        for i in range(lanes):
            out_v = Signal(signed(8), name=f"out_{i}")
            with m.If(h_valid & (h_lane == i)):
                m.d.sync += out_v.eq(value)
            m.d.comb += self.out.payload.values[i].eq(out_v)
        return m


def post_processor(config, lanes_per_cycle=None):
    """The post-processor ``config.postproc_impl`` asks for: :class:`PostProcessor` with
    ``lanes_per_cycle``, or :class:`SequentialPostProcessor` (which ignores it)."""
    if isinstance(config, NPUConfig) and config.postproc_impl == "sequential":
        return SequentialPostProcessor(config)
    return PostProcessor(config, lanes_per_cycle)
