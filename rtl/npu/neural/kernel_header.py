"""The kernel extractor's header decoder (``docs/kernel_format.md``, "Header part").

A group's header part holds, per output channel, three words (bias, scale, then
``npu_spec.kernel.SHIFT_WORD``: shift, a reserved byte and the channel's nonzero count), then
the palette if the body is palettized. The decoder emits one parameter beat per channel, keeps
each channel's nonzero count for the body decoder and writes the palette, one entry per cycle.
"""

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec import kernel as kernel_spec
from npu_spec.kernel import CHANNEL_WORDS, MAX_SHIFT, SHIFT_WORD

from ..lib.csr import register_layout
from ..lib.enums import hw_enum
from .layouts import KERNEL_WORD, kernel_config_layout, param_beat_layout, slot_shape

__all__ = ["ChannelWord", "HeaderDecoder", "KernelError", "NnzWriteSignature",
           "PaletteWriteSignature", "palette_width"]

#: Error codes of the kernel extractor.
KernelError = hw_enum(kernel_spec.KernelError)


class ChannelWord(enum.Enum, shape=range(CHANNEL_WORDS)):
    """The header words of one output channel, in order."""
    BIAS = 0
    SCALE = 1
    SHIFT = 2


def palette_width(config):
    """Bits of a palette entry: binary16 codes, or int8 values (sign-extended when read)."""
    return 16 if config.has_fp16 else 8


class PaletteWriteSignature(wiring.Signature):
    """Writes into the 256-entry palette memory, from the writer's side.

    Members
    -------
    en : Out(1)
    addr : Out(8)
    data : Out(width)
    """

    def __init__(self, width):
        super().__init__({"en": Out(1), "addr": Out(8), "data": Out(width)})


class NnzWriteSignature(wiring.Signature):
    """A channel's nonzero count from the header, from the writer's side.

    Members
    -------
    en : Out(1)
    addr : Out(slot_shape(slots))
        The channel (slot).
    data : Out(16)
        Its nnz.
    """

    def __init__(self, slots):
        super().__init__({"en": Out(1), "addr": Out(slot_shape(slots)), "data": Out(16)})


class HeaderDecoder(wiring.Component):
    """Decodes one header part per ``start``.

    Parameters
    ----------
    config : NPUConfig
    palette : bool
        Build the palette path (default). Without it (the dense int8 extractor, which refuses
        palettized groups at the start) a header ends after its channel words, ``palette`` is
        never written, and a channel's bias and scale words go straight into the ``params``
        register (a word waits while a parameter beat waits) rather than being held first.

    Members
    -------
    cfg : In(kernel_config_layout(slots))
        The group's configuration (held while busy).
    fp16 : In(1)
        The coefficients are binary16 (and the build has binary16).
    bad_config : In(1)
        The configuration is refused: a start reports ``BAD_CONFIG`` and drains the part.
    start : In(1)
        Decode a header part (only while not busy).
    words : In(stream.Signature(KERNEL_WORD))
        The header part.
    params : Out(stream.Signature(param_beat_layout(slots)))
        One beat per channel, in slot order.
    nnz : Out(data.ArrayLayout(16, slots))
        Each channel's nonzero count, from the last header.
    nnz_write : Out(NnzWriteSignature(slots))
        The same counts as writes (combinational, one per channel), for a decoder that keeps
        them in a memory instead of ``nnz`` (which synthesis then removes if unused).
    palette : Out(PaletteWriteSignature(palette_width(config)))
        Palette writes.
    busy : Out(1)
        A part is being decoded or drained, or a parameter beat waits.
    finish : Out(1)
        The part ended cleanly and its last parameter beat was taken (combinational).
    fail : Out(1), code : Out(KernelError)
        The part is malformed (combinational, one cycle): ``RESERVED``, ``TRAILING``,
        ``EARLY_END`` or ``BAD_CONFIG``. The decoder then consumes the part up to its last
        word.
    """

    def __init__(self, config, *, palette=True):
        self._config = config
        self._palette = bool(palette)
        slots = config.acc_slots
        super().__init__({
            "cfg":        In(kernel_config_layout(slots)),
            "fp16":       In(1),
            "bad_config": In(1),
            "start":      In(1),
            "words":      In(stream.Signature(KERNEL_WORD)),
            "params":     Out(stream.Signature(param_beat_layout(slots))),
            "nnz":        Out(data.ArrayLayout(16, slots)),
            "nnz_write":  Out(NnzWriteSignature(slots)),
            "palette":    Out(PaletteWriteSignature(palette_width(config))),
            "busy":       Out(1),
            "finish":     Out(1),
            "fail":       Out(1),
            "code":       Out(KernelError),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        slots = self._config.acc_slots

        def fail(code):
            m.d.comb += [self.fail.eq(1), self.code.eq(code)]

        slot = Signal(slot_shape(slots + 1))
        word_index = Signal(ChannelWord)
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
        m.d.comb += per_word.eq(Mux(self.fp16, 2, 4))

        words = self.words
        with m.FSM() as fsm:
            m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") | self.params.valid)
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [slot.eq(0), word_index.eq(ChannelWord.BIAS), pal_index.eq(0),
                                 pal_busy.eq(0)]
                    with m.If(self.bad_config):
                        fail(KernelError.BAD_CONFIG)
                        m.next = "DRAIN"
                    with m.Else():
                        m.next = "CHANNEL"

            # Three words per channel, then the palette.
            with m.State("CHANNEL"):
                shift_word = data.View(register_layout(SHIFT_WORD), words.payload.data)
                is_shift = word_index == ChannelWord.SHIFT
                last_slot = slot == cfg.ocg - 1
                final = is_shift & last_slot
                if self._palette:
                    final &= cfg.palette == 0
                direct = not self._palette      # bias and scale straight into params
                if direct:
                    bias, scale = self.params.payload.bias, self.params.payload.scale
                    m.d.comb += words.ready.eq(params_free)
                else:
                    m.d.comb += words.ready.eq(~is_shift | params_free)
                with m.If(words.valid & words.ready):
                    with m.Switch(word_index):
                        with m.Case(ChannelWord.BIAS):
                            m.d.sync += [bias.eq(words.payload.data),
                                         word_index.eq(ChannelWord.SCALE)]
                        with m.Case(ChannelWord.SCALE):
                            m.d.sync += [scale.eq(words.payload.data),
                                         word_index.eq(ChannelWord.SHIFT)]
                        with m.Case(ChannelWord.SHIFT):
                            m.d.sync += word_index.eq(ChannelWord.BIAS)
                    reserved = is_shift & ((shift_word.reserved != 0)
                                           | (shift_word.shift > MAX_SHIFT))
                    m.d.comb += [self.nnz_write.en.eq(is_shift & ~reserved),
                                 self.nnz_write.addr.eq(slot),
                                 self.nnz_write.data.eq(shift_word.nnz)]
                    with m.If(is_shift & ~reserved):
                        m.d.sync += [
                            self.params.valid.eq(1),
                            self.params.payload.slot.eq(slot),
                            *([] if direct else [self.params.payload.bias.eq(bias),
                                                 self.params.payload.scale.eq(scale)]),
                            self.params.payload.shift.eq(shift_word.shift),
                            self.params.payload.group_last.eq(last_slot),
                            self.nnz[slot].eq(shift_word.nnz),
                            slot.eq(slot + 1),
                        ]
                    with m.If(reserved):
                        fail(KernelError.RESERVED)
                        m.next = "DRAIN"
                        with m.If(words.payload.last):
                            m.next = "IDLE"
                    with m.Elif(final):
                        with m.If(words.payload.last):
                            m.next = "FLUSH"
                        with m.Else():
                            fail(KernelError.TRAILING)
                            m.next = "DRAIN"
                    with m.Elif(words.payload.last):
                        fail(KernelError.EARLY_END)
                        m.next = "IDLE"
                    if self._palette:
                        with m.Elif(is_shift & last_slot):
                            m.next = "PALETTE"

            if self._palette:
                with m.State("PALETTE"):
                    # One entry written per cycle; the next word is taken while the current
                    # word's final entry is written.
                    word_done = pal_busy & ((pal_sub + 1 == per_word)
                                            | (pal_index + 1 == pal_entries))
                    take = ~pal_busy | (word_done & ~pal_final)
                    m.d.comb += words.ready.eq(take)
                    with m.If(pal_busy):
                        entry = Mux(self.fp16, pal_data.word_select(pal_sub[0], 16),
                                    pal_data.word_select(pal_sub, 8).as_signed())
                        m.d.comb += [self.palette.en.eq(1), self.palette.addr.eq(pal_index),
                                     self.palette.data.eq(entry)]
                        m.d.sync += [pal_index.eq(pal_index + 1), pal_sub.eq(pal_sub + 1)]
                        with m.If(pal_index + 1 == pal_entries):
                            m.next = "FLUSH"
                        with m.If(word_done):
                            m.d.sync += pal_busy.eq(0)
                    with m.If(words.valid & take):
                        next_index = Mux(pal_busy, pal_index + 1, pal_index)
                        last_word = next_index + per_word >= pal_entries
                        m.d.sync += [pal_data.eq(words.payload.data), pal_sub.eq(0),
                                     pal_final.eq(last_word)]
                        with m.If(last_word & ~words.payload.last):
                            fail(KernelError.TRAILING)
                            m.next = "DRAIN"
                        with m.Elif(~last_word & words.payload.last):
                            fail(KernelError.EARLY_END)
                            m.next = "IDLE"
                        with m.Else():
                            m.d.sync += pal_busy.eq(1)

            with m.State("FLUSH"):
                with m.If(~self.params.valid):
                    m.d.comb += self.finish.eq(1)
                    m.next = "IDLE"

            with m.State("DRAIN"):
                m.d.comb += words.ready.eq(1)
                with m.If(words.valid & words.payload.last):
                    m.next = "IDLE"
        return m
