"""The kernel extractor's body decoder (``docs/kernel_format.md``, "Body part").

Structure (one coefficient position per cycle at most)::

    body words -> 4-word ring -> S0 chunk walker -> S1, S1b coordinates
               -> S2 palette / zero / nnz -> coefs register

* the **ring** takes a 32-bit word whenever it holds at most 96 bits, so it always holds the
  up to 24 bits one step consumes (bitmap byte + a binary16 value) while the DMA keeps up; the
  walker reads a 24-bit window at the read pointer, which is also the stream's bit offset
  (for the value), and the byte at the pointer (for a chunk's bitmap: chunks start on a byte);
* **S0** walks the chunks of 8 positions: the chunk's bitmap (read from the stream in sparse
  bodies, all positions in dense ones) is scanned lowest bit first, one set bit per cycle; an
  empty sparse chunk takes one cycle. Positions are mixed-radix numbers (output channel,
  kernel column, kernel row, input channel); a digit step adds a carry of 0..16 with small
  per-radix tables of ``c mod r`` and ``c div r``. The next chunk's first position is a
  register; the one after it (+16) is computed in two register stages between chunk ends;
* **S1** and **S1b** give the item its coordinates (chunk base + bit, two digit steps per
  stage; S0 reads the first digit's table entries for the bit); S1b reads the palette
  (written by the header decoder);
* **S2** drops zero values, checks beats against the header's nnz and counts them down;
* the ``coefs`` register is the output.
"""

from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.kernel import CHUNK

from .kernel_header import KernelError, palette_width
from .layouts import KERNEL_WORD, coef_beat_layout, kernel_config_layout, slot_shape

__all__ = ["BUFFER_WORDS", "BodyDecoder", "REFILL_AT"]

#: Words in the body decoder's ring buffer, and the fill level (bits) up to which it takes a
#: word: it then always holds the up to 24 bits one step consumes while the DMA keeps up.
BUFFER_WORDS = 4
REFILL_AT = 32 * (BUFFER_WORDS - 1)

#: Largest carry into a digit in one step: a chunk's positions run 0..15 ahead of its base.
MAX_CARRY = 2 * CHUNK


def _lowest_set(m, mask, width, name):
    """Index of the lowest set bit of ``mask`` (0 when none), combinational."""
    idx = Signal(range(max(2, width)), name=name)
    for i in reversed(range(width)):
        with m.If(mask[i]):
            m.d.comb += idx.eq(i)
    return idx


def _at_most_one(bits):
    """At most one bit of ``bits`` is set (a tree of halves, no subtraction)."""
    if len(bits) == 1:
        return Const(1)
    half = len(bits) // 2
    low, high = bits[:half], bits[half:]
    return ((_at_most_one(low) & (high == 0)) | ((low == 0) & _at_most_one(high)))


def _radix_table(m, radix, name):
    """For carries ``c = 0..MAX_CARRY`` into a digit of radix ``radix``: ``c mod radix`` and
    ``c div radix``, registered from ``radix``."""
    table = {"mod": [Signal(4, name=f"{name}_mod{c}") for c in range(MAX_CARRY + 1)],
             "div": [Signal(5, name=f"{name}_div{c}") for c in range(MAX_CARRY + 1)]}
    with m.Switch(radix):
        for r in range(1, min(MAX_CARRY + 1, 1 << len(radix))):
            with m.Case(r):
                for c in range(MAX_CARRY + 1):
                    m.d.sync += [table["mod"][c].eq(c % r), table["div"][c].eq(c // r)]
        with m.Default():
            for c in range(MAX_CARRY + 1):
                m.d.sync += [table["mod"][c].eq(c), table["div"][c].eq(0)]
    return {k: Array(v) for k, v in table.items()}


def _digit_step(m, radix, table, value, carry, name):
    """``value + carry`` in a digit of radix ``radix``: (new value, carry out),
    combinational. ``value - radix`` is formed alongside the table lookup, so the step is one
    add and a select."""
    mod = Signal(4, name=f"{name}_mod")
    div = Signal(5, name=f"{name}_div")
    m.d.comb += [mod.eq(table["mod"][carry]), div.eq(table["div"][carry])]
    return _digit_add(m, radix, value, mod, div, name)


def _digit_add(m, radix, value, mod, div, name):
    """``_digit_step`` with the table's ``mod`` and ``div`` of the carry already read."""
    out, wrap = _digit_sum(m, radix, value, mod, name)
    c = Signal(5, name=f"{name}_carry")
    m.d.comb += c.eq(div + wrap)
    return out, c


def _digit_sum(m, radix, value, mod, name):
    """``value + mod`` in a digit of radix ``radix``: (new value, 1 if it wrapped)."""
    out = Signal(len(value), name=name)
    below = Signal(signed(8), name=f"{name}_below")
    over = Signal(signed(8), name=f"{name}_over")
    wrap = Signal(name=f"{name}_wrap")
    m.d.comb += [
        below.eq(value - radix),
        over.eq(below + mod),
        wrap.eq(over >= 0),
        out.eq(Mux(wrap, over, value + mod)),
    ]
    return out, wrap


def _digit_step_late(m, radix, table, value, carry, late, name):
    """``_digit_step`` of the carry ``carry + late``, ``late`` a bit that comes late: the
    table entries of both carries are read from ``carry`` alone, ``late`` only chooses."""
    entries = {}
    for key, width in (("mod", 4), ("div", 5)):
        column = list(table[key])
        above = Array(column[1:] + column[-1:])     # entry c + 1 (the last one repeated)
        low, high = (Signal(width, name=f"{name}_{key}{k}") for k in ("0", "1"))
        m.d.comb += [low.eq(table[key][carry]), high.eq(above[carry])]
        entries[key] = Mux(late, high, low)
    return _digit_add(m, radix, value, entries["mod"], entries["div"], name)


def _mul_mod8(a, b):
    """``a * b mod 8`` by shift and add (no multiplier)."""
    return (Mux(b[0], a, 0) + Mux(b[1], a.shift_left(1), 0)
            + Mux(b[2], a.shift_left(2), 0))[:3]


class BodyDecoder(wiring.Component):
    """Decodes one body part per ``start`` into coefficient beats.

    Parameters
    ----------
    config : NPUConfig

    Members
    -------
    cfg : In(kernel_config_layout(slots))
        The group's configuration (held while busy).
    fp16 : In(1)
        The coefficients are binary16 (and the build has binary16).
    bad_config : In(1)
        The configuration is refused: a start reports ``BAD_CONFIG`` and drains the part.
    start : In(1)
        Decode a body part (only while not busy).
    words : In(stream.Signature(KERNEL_WORD))
        The body part.
    nnz : In(data.ArrayLayout(16, slots))
        Each channel's nonzero count (from the header decoder).
    palette_addr : Out(8), palette_en : Out(1)
        Palette read; ``palette_data`` holds the entry in the next cycle.
    palette_data : In(palette_width(config))
    coefs : Out(stream.Signature(coef_beat_layout(slots)))
        Coefficient beats.
    busy : Out(1)
        A part is being decoded or drained, or a beat waits.
    finish : Out(1)
        The part ended cleanly and its last beat was taken (combinational).
    fail : Out(1), code : Out(KernelError)
        The part is malformed (combinational, one cycle): ``EARLY_END``, ``TRAILING``,
        ``NNZ_MISMATCH`` (a channel got fewer beats than its nnz) or ``BAD_CONFIG``. The
        decoder stops emitting and consumes the part up to its last word.
    excess : Out(1)
        A channel got a nonzero coefficient beyond its nnz (combinational, one cycle): an
        ``NNZ_MISMATCH`` found in S2, whatever the state; the decoder then abandons the part
        like on ``fail``.
    """

    def __init__(self, config):
        self._config = config
        slots = config.acc_slots
        super().__init__({
            "cfg":          In(kernel_config_layout(slots)),
            "fp16":         In(1),
            "bad_config":   In(1),
            "start":        In(1),
            "words":        In(stream.Signature(KERNEL_WORD)),
            "nnz":          In(data.ArrayLayout(16, slots)),
            "palette_addr": Out(8),
            "palette_en":   Out(1),
            "palette_data": In(palette_width(config)),
            "coefs":        Out(stream.Signature(coef_beat_layout(slots))),
            "busy":         Out(1),
            "finish":       Out(1),
            "fail":         Out(1),
            "code":         Out(KernelError),
            "excess":       Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        slots = self._config.acc_slots
        s = SimpleNamespace()
        # Per-slot state: beats still expected and "had a beat" in the body.
        s.left = Array(Signal(16, name=f"left{k}") for k in range(slots))
        s.seen = Array(Signal(name=f"seen{k}") for k in range(slots))
        self._ring(m, s)
        self._positions(m, s)
        self._walker(m, s)
        self._pipeline(m, s)
        self._control(m, s)
        return m

    def _fail(self, m, code):
        m.d.comb += [self.fail.eq(1), self.code.eq(code)]

    def _ring(self, m, s):
        """The word ring and the 24-bit window at the read pointer."""
        # Data: no reset (only the words `cnt` counts are read).
        s.ring = Array(Signal(32, name=f"ring{k}", reset_less=True) for k in range(BUFFER_WORDS))
        s.wr_slot = Signal(range(BUFFER_WORDS))
        s.rd_ptr = Signal(range(32 * BUFFER_WORDS))
        s.cnt = Signal(range(32 * BUFFER_WORDS + 1))
        s.got_last = Signal()         # the part's final word has been accepted
        s.take_word = Signal()        # body word accepted this cycle
        s.consume = Signal(range(32))  # bits consumed this cycle
        m.d.comb += s.take_word.eq(self.words.valid & self.words.ready)
        with m.If(s.take_word):
            m.d.sync += [s.ring[s.wr_slot].eq(self.words.payload.data),
                         s.wr_slot.eq(s.wr_slot + 1)]
            with m.If(self.words.payload.last):
                m.d.sync += s.got_last.eq(1)
        m.d.sync += [
            s.rd_ptr.eq(s.rd_ptr + s.consume),
            s.cnt.eq(s.cnt + Mux(s.take_word, 32, 0) - s.consume),
        ]
        # The window: the word at the pointer and the next one, then a shift within the word.
        s.window = Signal(24)
        pair = Array(Cat(s.ring[k], s.ring[(k + 1) % BUFFER_WORDS][:24])
                     for k in range(BUFFER_WORDS))
        m.d.comb += s.window.eq(pair[s.rd_ptr[5:]].bit_select(s.rd_ptr[:5], 24))
        s.align = Signal(3)           # bit offset of the window within its byte
        m.d.comb += s.align.eq(s.rd_ptr[:3])
        # A chunk's bitmap byte is read only at the chunk's start, and a chunk's end pads the
        # stream to a byte: the bitmap is the byte at the pointer, a 16-way choice, not the
        # 128-way bit window (the walker's step reads it on its one-cycle loop).
        s.bitmap = Signal(8)
        ring_bytes = Array(s.ring[k][8 * j:8 * j + 8]
                           for k in range(BUFFER_WORDS) for j in range(4))
        m.d.comb += s.bitmap.eq(ring_bytes[s.rd_ptr[3:]])

    def _positions(self, m, s):
        """Mixed-radix position arithmetic and the chunk bases."""
        cfg = self.cfg
        s.radices = {"oc": cfg.ocg, "kx": cfg.kw, "ky": cfg.kh}
        s.tables = {digit: _radix_table(m, radix, f"t_{digit}")
                    for digit, radix in s.radices.items()}

        def step(value, carry, digit, name):
            return _digit_step(m, s.radices[digit], s.tables[digit], value, carry,
                               f"{name}_{digit}")
        s.step = step

        slots = self._config.acc_slots

        def coord(name):
            return {"oc": Signal(range(max(2, slots)), name=f"{name}_oc"),
                    "kx": Signal(4, name=f"{name}_kx"),
                    "ky": Signal(4, name=f"{name}_ky"),
                    "ic": Signal(13, name=f"{name}_ic")}
        s.coord = coord

        # Chunk bases. base is the current chunk's first position, nxt the next chunk's; the
        # one after (base + 16) is computed in two register stages (digits oc and kx, then ky
        # and ic) between chunk ends, so no cycle holds the whole three-digit carry chain.
        s.base = coord("base")
        s.nxt = coord("next")
        s.half = {"oc": Signal.like(s.base["oc"], name="half_oc"),
                  "kx": Signal(4, name="half_kx"),
                  "ky": Signal(4, name="half_ky"),     # not yet stepped
                  "ic": Signal(13, name="half_ic"),    # not yet stepped
                  "carry": Signal(5, name="half_carry")}
        s.half_first = Signal()       # first setup cycle: half := nxt + 8, else nxt + 16
        # The oc digit's carry in is 8 or 16: fixed table entries. Its carry out is the entry's
        # div plus the wrap of its sum, which only chooses between two kx entries read
        # alongside (this step runs once per chunk, and chunks may end in every cycle).
        oc_table = {key: list(column) for key, column in s.tables["oc"].items()}
        half_mod = Signal(4, name="ha_oc_mod")
        half_div = Signal(5, name="ha_oc_div")
        m.d.comb += [
            half_mod.eq(Mux(s.half_first, oc_table["mod"][CHUNK], oc_table["mod"][2 * CHUNK])),
            half_div.eq(Mux(s.half_first, oc_table["div"][CHUNK], oc_table["div"][2 * CHUNK])),
        ]
        half_oc, half_wrap = _digit_sum(m, s.radices["oc"], s.nxt["oc"], half_mod, "ha_oc")
        half_kx, half_c2 = _digit_step_late(m, s.radices["kx"], s.tables["kx"], s.nxt["kx"],
                                            half_div, half_wrap, "ha_kx")
        after_ky, after_c3 = step(s.half["ky"], s.half["carry"], "ky", "hb")
        after = {"oc": s.half["oc"], "kx": s.half["kx"], "ky": after_ky,
                 "ic": (s.half["ic"] + after_c3)[:13]}

        def load_half():
            """Load ``half`` with (nxt + half_step) in its first two digits."""
            m.d.sync += [s.half["oc"].eq(half_oc), s.half["kx"].eq(half_kx),
                         s.half["ky"].eq(s.nxt["ky"]), s.half["ic"].eq(s.nxt["ic"]),
                         s.half["carry"].eq(half_c2)]
        s.load_half = load_half

        def step_chunk_bases(advance):
            """``load_half``; ``nxt`` takes the position after it; if ``advance``, also move
            to the next chunk."""
            load_half()
            if advance:
                m.d.sync += [s.base[k].eq(s.nxt[k]) for k in s.base]
            m.d.sync += [s.nxt[k].eq(after[k]) for k in s.nxt]
        s.step_chunk_bases = step_chunk_bases

    def _walker(self, m, s):
        """S0: what this cycle's step would consume and emit (combinational)."""
        cfg = self.cfg
        slots = self._config.acc_slots
        s.is_last = Signal()          # current chunk is the body's final one
        m.d.comb += s.is_last.eq(s.nxt["ic"] >= cfg.icg)
        last_mask = Signal(CHUNK)     # valid positions of the final chunk
        p8 = Signal(3)                # positions mod 8 (shift-and-add: no multiplier)
        ocg3 = Signal(3)
        m.d.comb += ocg3.eq(cfg.ocg)
        m.d.comb += p8.eq(_mul_mod8(_mul_mod8(_mul_mod8(cfg.icg[:3], cfg.kh[:3]), cfg.kw[:3]),
                                    ocg3))
        m.d.sync += last_mask.eq(Mux(p8 == 0, 0xFF, (Const(1, 9) << p8) - 1))

        s.have_chunk = Signal()       # pend holds the rest of a chunk being scanned
        s.pend = Signal(CHUNK)
        s.hold_mask = Signal(slots)   # channels with nnz 0 still owed a hold beat
        vbits = Signal(5)
        m.d.comb += vbits.eq(Mux(cfg.palette != 0, cfg.palette, Mux(self.fp16, 16, 8)))

        head = Signal()               # this step reads the chunk's bitmap byte (byte-aligned)
        m.d.comb += head.eq(~s.have_chunk & cfg.sparse)
        cur = Signal(CHUNK)
        m.d.comb += cur.eq(Mux(s.have_chunk, s.pend,
                               Mux(cfg.sparse, s.bitmap, 0xFF)
                               & Mux(s.is_last, last_mask, 0xFF)))
        s.pick = _lowest_set(m, cur, CHUNK, "pick")
        s.any_pos = Signal()
        s.rest = Signal(CHUNK)
        m.d.comb += [s.any_pos.eq(cur != 0),
                     s.rest.eq(cur & ~(Const(1, CHUNK) << s.pick))]
        s.chunk_end = Signal()        # at most one position left (not through pick: shorter)
        m.d.comb += s.chunk_end.eq(_at_most_one(cur))
        # Bits the step consumes: `used` (the bitmap byte if read, the value if a position is
        # left), then at the chunk's end up to the next byte. Both outcomes of `any_pos` are
        # worked out from registers alongside the bitmap read; the bitmap only chooses.
        used = [Signal(range(25), name=f"used{k}") for k in range(2)]
        m.d.comb += [used[0].eq(Mux(head, 8, 0)), used[1].eq(used[0] + vbits)]
        padded = [Signal(range(32), name=f"padded{k}") for k in range(2)]
        m.d.comb += [padded[k].eq(used[k] + (-(s.align + used[k]))[:3]) for k in range(2)]
        s.need = Signal(range(32))
        # (no position left: the chunk ends.)
        m.d.comb += s.need.eq(Mux(s.any_pos, Mux(s.chunk_end, padded[1], used[1]), padded[0]))
        s.enough = Signal()           # (the padding is in the same byte as the value's end)
        m.d.comb += s.enough.eq(Mux(s.any_pos, s.cnt >= used[1], s.cnt >= used[0]))
        s.src = Signal(16)
        m.d.comb += s.src.eq(Mux(head, s.window[8:24], s.window[:16]))
        s.hold_slot = _lowest_set(m, s.hold_mask, slots, "hold_slot")

    def _pipeline(self, m, s):
        """S1, S1b, S2 and the coefs register, which move together; S0's effects."""
        cfg = self.cfg
        slots = self._config.acc_slots
        coord, step = s.coord, s.step
        out = self.coefs
        s.adv = Signal()
        m.d.comb += s.adv.eq(~out.valid | out.ready)
        s.s0_go = Signal()            # S0 takes a step this cycle
        s.s0_item = Signal()          # ... with an item for S1
        s.s0_hold = Signal()

        # S1: the item with its chunk base and bit; the adder's first two digits.
        s.s1_valid = Signal()
        s1_hold = Signal()
        s1_raw = Signal(16, reset_less=True)           # raw value, or the palette index in bits 0-7
        s1_base = coord("s1_base")
        # The oc digit's table entries for the item's bit, read in S0 (the bit is at most 7).
        s1_mod = Signal(4, reset_less=True)
        s1_div = Signal(5, reset_less=True)
        s1_slot = Signal(slot_shape(slots), reset_less=True)
        s1_oc, s1_c1 = _digit_add(m, s.radices["oc"], s1_base["oc"], s1_mod, s1_div, "s1_oc")
        s1_kx, s1_c2 = step(s1_base["kx"], s1_c1, "kx", "s1")

        # S1b: the adder's last digits; the palette is read.
        s.s1b_valid = Signal()
        s1b_hold = Signal()
        s1b_raw = Signal(16, reset_less=True)
        s1b_slot = Signal(slot_shape(slots), reset_less=True)
        s1b_kx = Signal(4, reset_less=True)
        s1b_ky = Signal(4, reset_less=True)
        s1b_ic = Signal(13, reset_less=True)
        s1b_carry = Signal(5, reset_less=True)
        s1b_ky_out, s1b_c3 = step(s1b_ky, s1b_carry, "ky", "s1b")
        index_mask = Signal(8)
        m.d.comb += index_mask.eq((Const(1, 9) << cfg.palette[:4]) - 1)
        m.d.comb += [self.palette_en.eq(s.adv), self.palette_addr.eq(s1b_raw[:8] & index_mask)]

        # S2: palette data, zero check, nnz check and count.
        s.s2_valid = Signal()
        s2_hold = Signal()
        s2_raw = Signal(16, reset_less=True)
        s2_slot = Signal(slot_shape(slots), reset_less=True)
        s2_ic = Signal(12, reset_less=True)
        s2_ky = Signal(4, reset_less=True)
        s2_kx = Signal(4, reset_less=True)
        coef = Signal(16)
        pal_out = (self.palette_data if self._config.has_fp16
                   else self.palette_data.as_signed())
        m.d.comb += coef.eq(Mux(~s2_hold & (cfg.palette != 0), pal_out, s2_raw))
        zero = Signal()
        m.d.comb += zero.eq(Mux(self.fp16, coef[:15] == 0, coef[:8] == 0))
        s2_left = Signal(16)          # beats the slot may still take
        s2_seen = Signal()            # the slot had a beat in this body
        m.d.comb += [s2_left.eq(s.left[s2_slot]), s2_seen.eq(s.seen[s2_slot])]
        s2_emit = Signal()
        s2_over = Signal()            # a nonzero beyond the channel's nnz
        m.d.comb += [
            s2_emit.eq(s.s2_valid & (s2_hold | ~zero)),
            s2_over.eq(s.s2_valid & ~s2_hold & ~zero & (s2_left == 0)),
        ]
        s.s2_error = Signal()
        m.d.comb += s.s2_error.eq(s.adv & s2_over)

        with m.If(s.adv):
            m.d.sync += out.valid.eq(s2_emit & ~s2_over)
            with m.If(s2_emit & ~s2_over):
                m.d.sync += [
                    out.payload.coef.eq(Mux(s2_hold, 0, coef)),
                    out.payload.slot.eq(s2_slot),
                    out.payload.ic.eq(s2_ic),
                    out.payload.ky.eq(s2_ky),
                    out.payload.kx.eq(s2_kx),
                    out.payload.first.eq(s2_hold | ~s2_seen),
                    out.payload.last.eq(s2_hold | (s2_left == 1)),
                    out.payload.hold.eq(s2_hold),
                ]
                with m.If(~s2_hold):
                    m.d.sync += [s.left[s2_slot].eq(s2_left - 1), s.seen[s2_slot].eq(1)]
            m.d.sync += [
                s.s2_valid.eq(s.s1b_valid & ~s.s2_error),
                s2_hold.eq(s1b_hold),
                s2_raw.eq(s1b_raw),
                s2_slot.eq(s1b_slot),
                s2_ic.eq(Mux(s1b_hold, 0, s1b_ic + s1b_c3)),
                s2_ky.eq(Mux(s1b_hold, 0, s1b_ky_out)),
                s2_kx.eq(Mux(s1b_hold, 0, s1b_kx)),
            ]
            m.d.sync += [
                s.s1b_valid.eq(s.s1_valid & ~s.s2_error),
                s1b_hold.eq(s1_hold),
                s1b_raw.eq(s1_raw),
                s1b_slot.eq(Mux(s1_hold, s1_slot, s1_oc)),
                s1b_kx.eq(s1_kx),
                s1b_ky.eq(s1_base["ky"]),
                s1b_ic.eq(s1_base["ic"]),
                s1b_carry.eq(s1_c2),
            ]
            m.d.sync += s.s1_valid.eq(s.s0_item & ~s.s2_error)
            with m.If(s.s0_item):
                m.d.sync += [
                    s1_hold.eq(s.s0_hold),
                    s1_raw.eq(Mux(self.fp16 | (cfg.palette != 0), s.src,
                                  Cat(s.src[:8], s.src[7].replicate(8)))),
                    s1_mod.eq(s.tables["oc"]["mod"][s.pick]),
                    s1_div.eq(s.tables["oc"]["div"][s.pick]),
                    s1_slot.eq(s.hold_slot),
                ]
                m.d.sync += [s1_base[k].eq(s.base[k]) for k in s.base]
        m.d.comb += self.excess.eq(s.s2_error)

        # S0 step effects.
        with m.If(s.s0_go & ~s.s0_hold):
            m.d.comb += s.consume.eq(s.need)
            with m.If(s.chunk_end):
                m.d.sync += [s.have_chunk.eq(0), s.pend.eq(0)]
                s.step_chunk_bases(advance=True)
            with m.Else():
                m.d.sync += [s.have_chunk.eq(1), s.pend.eq(s.rest)]
        with m.If(s.s0_go & s.s0_hold):
            m.d.sync += s.hold_mask.eq(s.hold_mask & ~(Const(1, slots) << s.hold_slot))

    def _control(self, m, s):
        """The decoder's states; busy until the FSM is idle and the output register empty,
        so that no beat of a part (even one that failed) is delivered after busy falls."""
        cfg = self.cfg
        slots = self._config.acc_slots
        words = self.words
        refill = ~s.got_last & (s.cnt <= REFILL_AT)
        with m.FSM() as fsm:
            m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") | self.coefs.valid)
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [s.cnt.eq(0), s.rd_ptr.eq(0), s.wr_slot.eq(0),
                                 s.got_last.eq(0), s.have_chunk.eq(0), s.pend.eq(0),
                                 s.s1_valid.eq(0), s.s1b_valid.eq(0), s.s2_valid.eq(0)]
                    m.d.sync += [s.left[k].eq(self.nnz[k]) for k in range(slots)]
                    m.d.sync += [s.seen[k].eq(0) for k in range(slots)]
                    m.d.sync += s.hold_mask.eq(Cat((self.nnz[k] == 0) & (k < cfg.ocg)
                                                   for k in range(slots)))
                    m.d.sync += [s.base[k].eq(0) for k in s.base]
                    m.d.sync += [s.nxt[k].eq(0) for k in s.nxt]
                    m.d.sync += s.half_first.eq(1)
                    with m.If(self.bad_config):
                        self._fail(m, KernelError.BAD_CONFIG)
                        m.next = "DRAIN"
                    with m.Else():
                        m.next = "SETUP"

            # Two setup cycles (half := 0 + 8; nxt := 8, half := 0 + 16), then the walk.
            with m.State("SETUP"):
                m.d.sync += s.half_first.eq(0)
                m.d.comb += words.ready.eq(refill)
                s.load_half()
                m.next = "SETUP2"

            with m.State("SETUP2"):
                m.d.comb += words.ready.eq(refill)
                s.step_chunk_bases(advance=False)
                m.next = "RUN"

            with m.State("RUN"):
                m.d.comb += words.ready.eq(refill)
                # S0 is not held by an nnz error found in S2 in the same cycle (that would put
                # the palette read on the step loop): the error below overrides its effects,
                # and the part is abandoned anyway.
                with m.If(s.adv):
                    with m.If(s.hold_mask != 0):
                        m.d.comb += [s.s0_go.eq(1), s.s0_item.eq(1), s.s0_hold.eq(1)]
                    with m.Elif(s.enough):
                        m.d.comb += [s.s0_go.eq(1), s.s0_item.eq(s.any_pos)]
                        with m.If(s.chunk_end & s.is_last):
                            m.next = "TAIL"
                    with m.Elif(s.got_last):
                        with m.If(~s.s2_error):
                            self._fail(m, KernelError.EARLY_END)
                        m.next = "IDLE"
                with m.If(s.s2_error):
                    m.next = "DRAIN"
                    with m.If(s.got_last | (s.take_word & words.payload.last)):
                        m.next = "IDLE"

            with m.State("TAIL"):
                short = Cat((s.left[k] != 0) & (k < cfg.ocg) for k in range(slots)) != 0
                with m.If(s.s2_error):
                    m.next = "IDLE"
                    with m.If(~s.got_last):
                        m.next = "DRAIN"
                with m.Elif(~s.s1_valid & ~s.s1b_valid & ~s.s2_valid):
                    with m.If(~s.got_last):
                        self._fail(m, KernelError.TRAILING)
                        m.next = "DRAIN"
                    with m.Elif(s.cnt >= 32):
                        self._fail(m, KernelError.TRAILING)
                        m.next = "IDLE"
                    with m.Elif(short):
                        self._fail(m, KernelError.NNZ_MISMATCH)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "FLUSH"

            with m.State("FLUSH"):
                with m.If(~self.coefs.valid):
                    m.d.comb += self.finish.eq(1)
                    m.next = "IDLE"

            with m.State("DRAIN"):
                m.d.comb += words.ready.eq(1)
                with m.If(words.valid & words.payload.last):
                    m.next = "IDLE"
