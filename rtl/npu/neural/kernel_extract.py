"""Kernel extract: decompresses kernel groups streamed by the kernel DMA.

The blob format (header and body parts, raw / sparse / palettized / both) is specified in
``docs/kernel_format.md``; ``npu_model.kernel_codec`` is its encoder and the golden model of
this block (:func:`npu_model.kernel_codec.beats`).

Structure of the body decoder (one coefficient position per cycle at most)::

    body words -> 4-word ring -> S0 chunk walker -> S1, S1b coordinates
               -> S2 palette / zero / nnz -> coefs register

* the **ring** takes a 32-bit word whenever it holds at most 96 bits, so it always holds the
  up to 24 bits one step consumes (bitmap byte + a binary16 value) while the DMA keeps up; the
  walker reads a 24-bit window at the read pointer, which is also the stream's bit offset;
* **S0** walks the chunks of 8 positions: the chunk's bitmap (read from the stream in sparse
  bodies, all positions in dense ones) is scanned lowest bit first, one set bit per cycle; an
  empty sparse chunk takes one cycle. Positions are mixed-radix numbers (output channel,
  kernel column, kernel row, input channel); a digit step adds a carry of 0..16 with small
  per-radix tables of ``c mod r`` and ``c div r``. The next chunk's first position is a
  register; the one after it (+16) is computed in two register stages between chunk ends;
* **S1** and **S1b** give the item its coordinates (chunk base + bit, two digit steps per
  stage); S1b reads the palette (a 256-entry memory written by the header);
* **S2** drops zero values, checks beats against the header's nnz and counts them down;
* the ``coefs`` register is the output.
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu_spec import kernel as kernel_spec
from npu_spec.config import NPUConfig

from ..lib.enums import hw_enum
from .layouts import slot_shape
from .layouts import (
    KERNEL_WORD,
    MAX_KERNEL,
    coef_beat_layout,
    kernel_config_layout,
    param_beat_layout,
)

__all__ = ["KernelError", "KernelExtract"]

#: Words in the body decoder's ring buffer, and the fill level (bits) up to which it takes a
#: word: it then always holds the up to 24 bits one step consumes while the DMA keeps up.
BUFFER_WORDS = 4
REFILL_AT = 32 * (BUFFER_WORDS - 1)


#: Error codes of :class:`KernelExtract`.
KernelError = hw_enum(kernel_spec.KernelError)


def _lowest_set(m, mask, width, name):
    """Index of the lowest set bit of ``mask`` (0 when none), combinational."""
    idx = Signal(range(max(2, width)), name=name)
    for i in reversed(range(width)):
        with m.If(mask[i]):
            m.d.comb += idx.eq(i)
    return idx


class KernelExtract(wiring.Component):
    """Kernel extractor of one neural engine core.

    Decodes a group's header part once (``start_header``) and its body part any number of
    times (``start_body``, once per work unit). ``cfg`` must be held stable from the start
    pulse until ``busy`` falls; starts while busy are ignored.

    Members
    -------
    cfg : In(kernel_config_layout(slots))
        The group's configuration.
    header, body : In(stream.Signature(KERNEL_WORD))
        The two parts of the blob, 32-bit little-endian words, ``last`` on the final word.
    start_header : In(1)
        Pulse: decode one header part (one ``params`` beat per channel, store nnz and palette).
    start_body : In(1)
        Pulse: decode one body part (``coefs`` beats).
    params : Out(stream.Signature(param_beat_layout(slots)))
        Per-channel parameters, in slot order.
    coefs : Out(stream.Signature(coef_beat_layout(slots)))
        Coefficient beats (see ``docs/kernel_format.md``).
    busy : Out(1)
        A part is being decoded (or drained after an error).
    done : Out(1)
        One-cycle pulse: the part finished cleanly and every beat has been accepted.
    error : Out(1)
        Sticky until the next start: the part was malformed (``error_code`` says how). The
        extractor stopped emitting and consumed the part up to its ``last`` word.
    error_code : Out(KernelError)
    """

    def __init__(self, config):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self._config = config
        slots = config.acc_slots
        super().__init__({
            "cfg":          In(kernel_config_layout(slots)),
            "header":       In(stream.Signature(KERNEL_WORD)),
            "body":         In(stream.Signature(KERNEL_WORD)),
            "start_header": In(1),
            "start_body":   In(1),
            "params":       Out(stream.Signature(param_beat_layout(slots))),
            "coefs":        Out(stream.Signature(coef_beat_layout(slots))),
            "busy":         Out(1),
            "done":         Out(1),
            "error":        Out(1),
            "error_code":   Out(KernelError),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        conf = self._config
        slots = conf.acc_slots
        cfg = self.cfg
        has_fp16 = conf.has_fp16
        int8_ok = conf.has_int8 or conf.has_mixed

        # Configuration check (combinational; cfg is static while busy).
        fp16 = Signal()
        m.d.comb += fp16.eq(cfg.coef_fp16 & Const(int(has_fp16), 1))
        bad_config = Signal()
        m.d.comb += bad_config.eq(
            ~cfg.palette.matches(0, 1, 2, 4, 6, 8)
            | (cfg.icg == 0)
            | (cfg.kh == 0) | (cfg.kh > MAX_KERNEL)
            | (cfg.kw == 0) | (cfg.kw > MAX_KERNEL)
            | (cfg.ocg == 0) | (cfg.ocg > slots)
            | (cfg.coef_fp16 & Const(int(not has_fp16), 1))
            | (~cfg.coef_fp16 & Const(int(not int8_ok), 1)))

        # Status.
        error = Signal()
        error_code = Signal(KernelError)
        done = Signal()
        m.d.sync += done.eq(0)
        m.d.comb += [self.error.eq(error), self.error_code.eq(error_code),
                     self.done.eq(done)]

        def fail(code):
            m.d.sync += [error.eq(1), error_code.eq(code)]

        # Per-slot state: header nnz; beats still expected and "had a beat" in the body.
        nnz = Array(Signal(16, name=f"nnz{s}") for s in range(slots))
        left = Array(Signal(16, name=f"left{s}") for s in range(slots))
        seen = Array(Signal(name=f"seen{s}") for s in range(slots))

        # Palette memory: 256 entries, int8 entries stored sign-extended.
        pal_width = 16 if has_fp16 else 8
        m.submodules.palette = palette = Memory(shape=pal_width, depth=256, init=[])
        pal_wr = palette.write_port()
        pal_rd = palette.read_port()

        # ---------------------------------------------------------------- header decoder
        h_slot = Signal(slot_shape(slots + 1))
        h_word = Signal(range(3))
        bias = Signal(32)
        scale = Signal(32)
        params_free = Signal()
        m.d.comb += params_free.eq(~self.params.valid | self.params.ready)
        with m.If(self.params.valid & self.params.ready):
            m.d.sync += self.params.valid.eq(0)

        pal_entries = Signal(9)       # 2**bits
        m.d.comb += pal_entries.eq(Const(1, 9) << cfg.palette)
        pal_index = Signal(9)         # next entry to write
        pal_data = Signal(32)         # word being written out
        pal_sub = Signal(2)           # entry within pal_data
        pal_busy = Signal()           # pal_data holds entries to write
        pal_final = Signal()          # pal_data is the palette's final word
        per_word = Signal(3)
        m.d.comb += per_word.eq(Mux(fp16, 2, 4))

        # ---------------------------------------------------------------- body decoder
        # Word buffer: four words in a ring; the decoder reads a 24-bit window at bit rd_ptr.
        ring = Array(Signal(32, name=f"ring{k}") for k in range(BUFFER_WORDS))
        wr_slot = Signal(range(BUFFER_WORDS))
        rd_ptr = Signal(range(32 * BUFFER_WORDS))
        cnt = Signal(range(32 * BUFFER_WORDS + 1))
        got_last = Signal()           # the part's final word has been accepted
        take_word = Signal()          # body word accepted this cycle
        consume = Signal(range(32))   # bits consumed this cycle
        m.d.comb += take_word.eq(self.body.valid & self.body.ready)
        with m.If(take_word):
            m.d.sync += [ring[wr_slot].eq(self.body.payload.data), wr_slot.eq(wr_slot + 1)]
            with m.If(self.body.payload.last):
                m.d.sync += got_last.eq(1)
        m.d.sync += [
            rd_ptr.eq(rd_ptr + consume),
            cnt.eq(cnt + Mux(take_word, 32, 0) - consume),
        ]
        # The window: the word at the pointer and the next one, then a shift within the word.
        window = Signal(24)
        pair = Array(Cat(ring[k], ring[(k + 1) % BUFFER_WORDS][:24])
                     for k in range(BUFFER_WORDS))
        m.d.comb += window.eq(pair[rd_ptr[5:]].bit_select(rd_ptr[:5], 24))
        align = Signal(3)             # bit offset of the window within its byte
        m.d.comb += align.eq(rd_ptr[:3])

        # Mixed-radix tables (registered from cfg): for c = 0..16 positions carried into a
        # digit of radix r (r = ocg, kw, kh): c mod r and c div r.
        def radix_tables(radix, name):
            tab = {"mod": [Signal(4, name=f"{name}_mod{c}") for c in range(17)],
                   "div": [Signal(5, name=f"{name}_div{c}") for c in range(17)]}
            with m.Switch(radix):
                for r in range(1, min(17, 1 << len(radix))):
                    with m.Case(r):
                        for c in range(17):
                            m.d.sync += [tab["mod"][c].eq(c % r), tab["div"][c].eq(c // r)]
                with m.Default():
                    for c in range(17):
                        m.d.sync += [tab["mod"][c].eq(c), tab["div"][c].eq(0)]
            return {k: Array(v) for k, v in tab.items()}

        radices = {"oc": cfg.ocg, "kx": cfg.kw, "ky": cfg.kh}
        tables = {digit: radix_tables(radix, f"t_{digit}") for digit, radix in radices.items()}

        def coord(name):
            return {"oc": Signal(range(max(2, slots)), name=f"{name}_oc"),
                    "kx": Signal(4, name=f"{name}_kx"),
                    "ky": Signal(4, name=f"{name}_ky"),
                    "ic": Signal(13, name=f"{name}_ic")}

        def digit_step(value, carry, digit, name):
            """``value + carry`` in a digit: (new value, carry out), combinational. ``value -
            r`` is formed alongside the table lookup, so the step is one add and a select."""
            tab = tables[digit]
            out = Signal(len(value), name=f"{name}_{digit}")
            below = Signal(signed(8), name=f"{name}_{digit}_below")
            over = Signal(signed(8), name=f"{name}_{digit}_over")
            mod = Signal(4, name=f"{name}_{digit}_mod")
            div = Signal(5, name=f"{name}_{digit}_div")
            c = Signal(5, name=f"{name}_{digit}_carry")
            m.d.comb += [
                below.eq(value - radices[digit]),
                mod.eq(tab["mod"][carry]),
                div.eq(tab["div"][carry]),
                over.eq(below + mod),
                out.eq(Mux(over >= 0, over, value + mod)),
                c.eq(div + (over >= 0)),
            ]
            return out, c

        # Chunk bases. base is the current chunk's first position, nxt the next chunk's; the
        # one after (base + 16) is computed in two register stages (digits oc and kx, then ky
        # and ic) between chunk ends, so no cycle holds the whole three-digit carry chain.
        base = coord("base")
        nxt = coord("next")
        half = {"oc": Signal.like(base["oc"], name="half_oc"),
                "kx": Signal(4, name="half_kx"),
                "ky": Signal(4, name="half_ky"),     # not yet stepped
                "ic": Signal(13, name="half_ic"),    # not yet stepped
                "carry": Signal(5, name="half_carry")}
        half_first = Signal()         # first setup cycle: half := nxt + 8, else nxt + 16
        half_step = Signal(5)
        m.d.comb += half_step.eq(Mux(half_first, 8, 16))
        half_oc, half_c1 = digit_step(nxt["oc"], half_step, "oc", "ha")
        half_kx, half_c2 = digit_step(nxt["kx"], half_c1, "kx", "ha")
        after_ky, after_c3 = digit_step(half["ky"], half["carry"], "ky", "hb")
        after = {"oc": half["oc"], "kx": half["kx"], "ky": after_ky,
                 "ic": (half["ic"] + after_c3)[:13]}

        def step_chunk_bases(advance):
            """Load ``half`` with (nxt + half_step) in its first two digits; if ``advance``,
            also move to the next chunk."""
            m.d.sync += [half["oc"].eq(half_oc), half["kx"].eq(half_kx),
                         half["ky"].eq(nxt["ky"]), half["ic"].eq(nxt["ic"]),
                         half["carry"].eq(half_c2)]
            if advance:
                m.d.sync += [base[k].eq(nxt[k]) for k in base]
            m.d.sync += [nxt[k].eq(after[k]) for k in nxt]

        is_last = Signal()            # current chunk is the body's final one
        m.d.comb += is_last.eq(nxt["ic"] >= cfg.icg)
        last_mask = Signal(8)         # valid positions of the final chunk
        p8 = Signal(3)                # positions mod 8 (shift-and-add: no multiplier)

        def mul_mod8(a, b):
            return (Mux(b[0], a, 0) + Mux(b[1], a.shift_left(1), 0)
                    + Mux(b[2], a.shift_left(2), 0))[:3]

        ocg3 = Signal(3)
        m.d.comb += ocg3.eq(cfg.ocg)
        m.d.comb += p8.eq(mul_mod8(mul_mod8(mul_mod8(cfg.icg[:3], cfg.kh[:3]), cfg.kw[:3]),
                                   ocg3))
        m.d.sync += last_mask.eq(Mux(p8 == 0, 0xFF, (Const(1, 9) << p8) - 1))

        have_chunk = Signal()         # pend holds the rest of a chunk being scanned
        pend = Signal(8)
        hold_mask = Signal(slots)     # channels with nnz 0 still owed a hold beat
        vbits = Signal(5)
        m.d.comb += vbits.eq(Mux(cfg.palette != 0, cfg.palette, Mux(fp16, 16, 8)))

        # S0 step (combinational): what this cycle would consume and emit.
        head = Signal()               # this step reads the chunk's bitmap byte
        m.d.comb += head.eq(~have_chunk & cfg.sparse)
        cur = Signal(8)
        m.d.comb += cur.eq(Mux(have_chunk, pend,
                               Mux(cfg.sparse, window[:8], 0xFF)
                               & Mux(is_last, last_mask, 0xFF)))
        pick = _lowest_set(m, cur, 8, "pick")
        any_pos = Signal()
        rest = Signal(8)
        m.d.comb += [any_pos.eq(cur != 0),
                     rest.eq(cur & ~(Const(1, 8) << pick))]
        chunk_end = Signal()          # at most one position left (not through pick: shorter)
        m.d.comb += chunk_end.eq((cur & (cur - 1)[:8]) == 0)
        used = Signal(range(25))
        m.d.comb += used.eq(Mux(head, 8, 0) + Mux(any_pos, vbits, 0))
        pad = Signal(3)
        m.d.comb += pad.eq(Mux(chunk_end, -(align + used), 0))
        need = Signal(range(32))
        m.d.comb += need.eq(used + pad)
        enough = Signal()             # (the padding is in the same byte as the value's end)
        m.d.comb += enough.eq(cnt >= used)
        src = Signal(16)
        m.d.comb += src.eq(Mux(head, window[8:24], window[:16]))
        hold_slot = _lowest_set(m, hold_mask, slots, "hold_slot")

        # The pipeline (S1, S2 and the coefs register) moves together.
        adv = Signal()
        m.d.comb += adv.eq(~self.coefs.valid | self.coefs.ready)
        s0_go = Signal()              # S0 takes a step this cycle
        s0_item = Signal()            # ... with an item for S1
        s0_hold = Signal()

        # S1: the item with its chunk base and bit; the adder's first two digits.
        s1_valid = Signal()
        s1_hold = Signal()
        s1_raw = Signal(16)           # raw value, or the palette index in bits 0-7
        s1_base = coord("s1_base")
        s1_pick = Signal(3)
        s1_slot = Signal(slot_shape(slots))
        s1_oc, s1_c1 = digit_step(s1_base["oc"], s1_pick, "oc", "s1")
        s1_kx, s1_c2 = digit_step(s1_base["kx"], s1_c1, "kx", "s1")

        # S1b: the adder's last digits; the palette is read.
        s1b_valid = Signal()
        s1b_hold = Signal()
        s1b_raw = Signal(16)
        s1b_slot = Signal(slot_shape(slots))
        s1b_kx = Signal(4)
        s1b_ky = Signal(4)
        s1b_ic = Signal(13)
        s1b_carry = Signal(5)
        s1b_ky_out, s1b_c3 = digit_step(s1b_ky, s1b_carry, "ky", "s1b")
        index_mask = Signal(8)
        m.d.comb += index_mask.eq((Const(1, 9) << cfg.palette[:4]) - 1)
        m.d.comb += [pal_rd.en.eq(adv), pal_rd.addr.eq(s1b_raw[:8] & index_mask)]

        # S2: palette data, zero check, nnz check and count.
        s2_valid = Signal()
        s2_hold = Signal()
        s2_raw = Signal(16)
        s2_slot = Signal(slot_shape(slots))
        s2_ic = Signal(12)
        s2_ky = Signal(4)
        s2_kx = Signal(4)
        coef = Signal(16)
        pal_out = pal_rd.data if has_fp16 else pal_rd.data.as_signed()
        m.d.comb += coef.eq(Mux(~s2_hold & (cfg.palette != 0), pal_out, s2_raw))
        zero = Signal()
        m.d.comb += zero.eq(Mux(fp16, coef[:15] == 0, coef[:8] == 0))
        s2_left = Signal(16)          # beats the slot may still take
        s2_seen = Signal()            # the slot had a beat in this body
        m.d.comb += [s2_left.eq(left[s2_slot]), s2_seen.eq(seen[s2_slot])]
        s2_emit = Signal()
        s2_over = Signal()            # a nonzero beyond the channel's nnz
        m.d.comb += [
            s2_emit.eq(s2_valid & (s2_hold | ~zero)),
            s2_over.eq(s2_valid & ~s2_hold & ~zero & (s2_left == 0)),
        ]
        s2_error = Signal()
        m.d.comb += s2_error.eq(adv & s2_over)

        with m.If(adv):
            m.d.sync += self.coefs.valid.eq(s2_emit & ~s2_over)
            with m.If(s2_emit & ~s2_over):
                m.d.sync += [
                    self.coefs.payload.coef.eq(Mux(s2_hold, 0, coef)),
                    self.coefs.payload.slot.eq(s2_slot),
                    self.coefs.payload.ic.eq(s2_ic),
                    self.coefs.payload.ky.eq(s2_ky),
                    self.coefs.payload.kx.eq(s2_kx),
                    self.coefs.payload.first.eq(s2_hold | ~s2_seen),
                    self.coefs.payload.last.eq(s2_hold | (s2_left == 1)),
                    self.coefs.payload.hold.eq(s2_hold),
                ]
                with m.If(~s2_hold):
                    m.d.sync += [left[s2_slot].eq(s2_left - 1), seen[s2_slot].eq(1)]
            m.d.sync += [
                s2_valid.eq(s1b_valid & ~s2_error),
                s2_hold.eq(s1b_hold),
                s2_raw.eq(s1b_raw),
                s2_slot.eq(s1b_slot),
                s2_ic.eq(Mux(s1b_hold, 0, s1b_ic + s1b_c3)),
                s2_ky.eq(Mux(s1b_hold, 0, s1b_ky_out)),
                s2_kx.eq(Mux(s1b_hold, 0, s1b_kx)),
            ]
            m.d.sync += [
                s1b_valid.eq(s1_valid & ~s2_error),
                s1b_hold.eq(s1_hold),
                s1b_raw.eq(s1_raw),
                s1b_slot.eq(Mux(s1_hold, s1_slot, s1_oc)),
                s1b_kx.eq(s1_kx),
                s1b_ky.eq(s1_base["ky"]),
                s1b_ic.eq(s1_base["ic"]),
                s1b_carry.eq(s1_c2),
            ]
            m.d.sync += s1_valid.eq(s0_item & ~s2_error)
            with m.If(s0_item):
                m.d.sync += [
                    s1_hold.eq(s0_hold),
                    s1_raw.eq(Mux(fp16 | (cfg.palette != 0), src,
                                  Cat(src[:8], src[7].replicate(8)))),
                    s1_pick.eq(pick),
                    s1_slot.eq(hold_slot),
                ]
                m.d.sync += [s1_base[k].eq(base[k]) for k in base]
        with m.If(s2_error):
            fail(KernelError.NNZ_MISMATCH)

        # S0 step effects.
        with m.If(s0_go & ~s0_hold):
            m.d.comb += consume.eq(need)
            with m.If(chunk_end):
                m.d.sync += [have_chunk.eq(0), pend.eq(0)]
                step_chunk_bases(advance=True)
            with m.Else():
                m.d.sync += [have_chunk.eq(1), pend.eq(rest)]
        with m.If(s0_go & s0_hold):
            m.d.sync += hold_mask.eq(hold_mask & ~(Const(1, slots) << hold_slot))

        # ---------------------------------------------------------------- control
        # Busy until the FSM is idle and both output registers are empty, so that no beat
        # of a part (even one that failed) is delivered after busy falls.
        active = Signal()
        m.d.comb += active.eq(0)
        m.d.comb += self.busy.eq(active | self.coefs.valid | self.params.valid)
        with m.FSM(name="fsm") as fsm:
            with m.State("IDLE"):
                with m.If(~self.busy & (self.start_header | self.start_body)):
                    m.d.sync += [error.eq(0), error_code.eq(KernelError.NONE)]
                with m.If(~self.busy & self.start_header):
                    m.d.sync += [h_slot.eq(0), h_word.eq(0), pal_index.eq(0),
                                 pal_busy.eq(0)]
                    with m.If(bad_config):
                        fail(KernelError.BAD_CONFIG)
                        m.next = "H_DRAIN"
                    with m.Else():
                        m.next = "H_CHANNEL"
                with m.Elif(~self.busy & self.start_body):
                    m.d.sync += [cnt.eq(0), rd_ptr.eq(0), wr_slot.eq(0), got_last.eq(0),
                                 have_chunk.eq(0), pend.eq(0), s1_valid.eq(0), s1b_valid.eq(0),
                                 s2_valid.eq(0)]
                    m.d.sync += [left[s].eq(nnz[s]) for s in range(slots)]
                    m.d.sync += [seen[s].eq(0) for s in range(slots)]
                    m.d.sync += hold_mask.eq(Cat((nnz[s] == 0) & (s < cfg.ocg)
                                                 for s in range(slots)))
                    m.d.sync += [base[k].eq(0) for k in base]
                    m.d.sync += [nxt[k].eq(0) for k in nxt]
                    m.d.sync += half_first.eq(1)
                    with m.If(bad_config):
                        fail(KernelError.BAD_CONFIG)
                        m.next = "B_DRAIN"
                    with m.Else():
                        m.next = "B_SETUP"

            # Header: three words per channel, then the palette.
            with m.State("H_CHANNEL"):
                m.d.comb += active.eq(1)
                word = self.header.payload.data
                is_w2 = h_word == 2
                final = is_w2 & (h_slot == cfg.ocg - 1) & (cfg.palette == 0)
                m.d.comb += self.header.ready.eq(~is_w2 | params_free)
                with m.If(self.header.valid & self.header.ready):
                    m.d.sync += h_word.eq(Mux(is_w2, 0, h_word + 1))
                    with m.If(h_word == 0):
                        m.d.sync += bias.eq(word)
                    with m.If(h_word == 1):
                        m.d.sync += scale.eq(word)
                    reserved = is_w2 & ((word[8:16] != 0) | (word[6:8] != 0))
                    with m.If(is_w2 & ~reserved):
                        m.d.sync += [
                            self.params.valid.eq(1),
                            self.params.payload.slot.eq(h_slot),
                            self.params.payload.bias.eq(bias),
                            self.params.payload.scale.eq(scale),
                            self.params.payload.shift.eq(word[:6]),
                            self.params.payload.group_last.eq(h_slot == cfg.ocg - 1),
                            nnz[h_slot].eq(word[16:32]),
                            h_slot.eq(h_slot + 1),
                        ]
                    with m.If(reserved):
                        fail(KernelError.RESERVED)
                        m.next = "H_DRAIN"
                        with m.If(self.header.payload.last):
                            m.next = "IDLE"
                    with m.Elif(final):
                        with m.If(self.header.payload.last):
                            m.next = "H_FLUSH"
                        with m.Else():
                            fail(KernelError.TRAILING)
                            m.next = "H_DRAIN"
                    with m.Elif(self.header.payload.last):
                        fail(KernelError.EARLY_END)
                        m.next = "IDLE"
                    with m.Elif(is_w2 & (h_slot == cfg.ocg - 1)):
                        m.next = "H_PALETTE"

            with m.State("H_PALETTE"):
                # One entry written per cycle; the next word is taken while the current
                # word's final entry is written.
                m.d.comb += active.eq(1)
                word_done = pal_busy & ((pal_sub + 1 == per_word)
                                        | (pal_index + 1 == pal_entries))
                take = ~pal_busy | (word_done & ~pal_final)
                m.d.comb += self.header.ready.eq(take)
                with m.If(pal_busy):
                    entry = Mux(fp16, pal_data.word_select(pal_sub[0], 16),
                                pal_data.word_select(pal_sub, 8).as_signed())
                    m.d.comb += [pal_wr.en.eq(1), pal_wr.addr.eq(pal_index),
                                 pal_wr.data.eq(entry)]
                    m.d.sync += [pal_index.eq(pal_index + 1), pal_sub.eq(pal_sub + 1)]
                    with m.If(pal_index + 1 == pal_entries):
                        m.next = "H_FLUSH"
                    with m.If(word_done):
                        m.d.sync += pal_busy.eq(0)
                with m.If(self.header.valid & take):
                    next_index = Mux(pal_busy, pal_index + 1, pal_index)
                    last_word = next_index + per_word >= pal_entries
                    m.d.sync += [pal_data.eq(self.header.payload.data), pal_sub.eq(0),
                                 pal_final.eq(last_word)]
                    with m.If(last_word & ~self.header.payload.last):
                        fail(KernelError.TRAILING)
                        m.next = "H_DRAIN"
                    with m.Elif(~last_word & self.header.payload.last):
                        fail(KernelError.EARLY_END)
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += pal_busy.eq(1)

            with m.State("H_FLUSH"):
                m.d.comb += active.eq(1)
                with m.If(~self.params.valid):
                    m.d.sync += done.eq(1)
                    m.next = "IDLE"

            with m.State("H_DRAIN"):
                m.d.comb += [active.eq(1), self.header.ready.eq(1)]
                with m.If(self.header.valid & self.header.payload.last):
                    m.next = "IDLE"

            # Body: two setup cycles (half := 0 + 8; nxt := 8, half := 0 + 16), then the walk.
            with m.State("B_SETUP"):
                m.d.comb += active.eq(1)
                m.d.sync += half_first.eq(0)
                m.d.comb += self.body.ready.eq(~got_last & (cnt <= REFILL_AT))
                m.d.sync += [half["oc"].eq(half_oc), half["kx"].eq(half_kx),
                             half["ky"].eq(nxt["ky"]), half["ic"].eq(nxt["ic"]),
                             half["carry"].eq(half_c2)]
                m.next = "B_SETUP2"

            with m.State("B_SETUP2"):
                m.d.comb += active.eq(1)
                m.d.comb += self.body.ready.eq(~got_last & (cnt <= REFILL_AT))
                step_chunk_bases(advance=False)
                m.next = "B_RUN"

            with m.State("B_RUN"):
                m.d.comb += active.eq(1)
                m.d.comb += self.body.ready.eq(~got_last & (cnt <= REFILL_AT))
                # S0 is not held by an nnz error found in S2 in the same cycle (that would put
                # the palette read on the step loop): the error below overrides its effects,
                # and the part is abandoned anyway.
                with m.If(adv):
                    with m.If(hold_mask != 0):
                        m.d.comb += [s0_go.eq(1), s0_item.eq(1), s0_hold.eq(1)]
                    with m.Elif(enough):
                        m.d.comb += [s0_go.eq(1), s0_item.eq(any_pos)]
                        with m.If(chunk_end & is_last):
                            m.next = "B_TAIL"
                    with m.Elif(got_last):
                        with m.If(~s2_error):
                            fail(KernelError.EARLY_END)
                        m.next = "IDLE"
                with m.If(s2_error):
                    m.next = "B_DRAIN"
                    with m.If(got_last | (take_word & self.body.payload.last)):
                        m.next = "IDLE"

            with m.State("B_TAIL"):
                m.d.comb += active.eq(1)
                short = Cat((left[s] != 0) & (s < cfg.ocg) for s in range(slots)) != 0
                with m.If(s2_error):
                    m.next = "IDLE"
                    with m.If(~got_last):
                        m.next = "B_DRAIN"
                with m.Elif(~s1_valid & ~s1b_valid & ~s2_valid):
                    with m.If(~got_last):
                        fail(KernelError.TRAILING)
                        m.next = "B_DRAIN"
                    with m.Elif(cnt >= 32):
                        fail(KernelError.TRAILING)
                        m.next = "IDLE"
                    with m.Elif(short):
                        fail(KernelError.NNZ_MISMATCH)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "B_FLUSH"

            with m.State("B_FLUSH"):
                m.d.comb += active.eq(1)
                with m.If(~self.coefs.valid):
                    m.d.sync += done.eq(1)
                    m.next = "IDLE"

            with m.State("B_DRAIN"):
                m.d.comb += [active.eq(1), self.body.ready.eq(1)]
                with m.If(self.body.valid & self.body.payload.last):
                    m.next = "IDLE"

        del fsm
        return m
