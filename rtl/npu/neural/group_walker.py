"""The group walker: which convolution groups the channels of an output-channel group span.

An output-channel group is up to ``acc_slots`` consecutive output channels; with convolution
groups (grouped or depthwise layers) its channels may belong to several of them, each with its
own input channels. The walker steps through the group's channels one per cycle, keeping the
convolution group and the index within it, so no division is needed.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["GroupWalker"]


class GroupWalker(wiring.Component):
    """Walks the output channels of one output-channel group.

    Parameters
    ----------
    slots : int
        Accumulator slots: the most channels a group has.

    Members
    -------
    ocpg, icpg : In(12)
        Output and input channels per convolution group (the layer's registers).
    remaining : In(24)
        Output channels from the group's first one to the layer's end (``K - base``).
    restart : In(1)
        A layer starts: its first group begins in convolution group 0.
    begin : In(1)
        A group begins: ``ocg`` becomes ``min(slots, remaining)``, ``index`` 0.
    step : In(1)
        Walk channel ``index`` (the outputs below describe it before the step).
    ocg : Out(range(slots + 1))
        Channels in the group.
    index : Out(range(slots + 1))
        Channels walked.
    walking : Out(1)
        Combinational: ``index < ocg``.
    slot_base : Out(base_bits)
        Combinational: input-channel offset of channel ``index``'s convolution group from the
        group's first one (``(g - g0) * icpg``).
    in_base : Out(base_bits)
        Combinational: the first input channel the group reads (``g0 * icpg``), modulo
        ``2**base_bits`` (row requests carry its low 12 bits).
    in_count : Out(base_bits)
        Registered, once every channel has been walked (set by each step): input channels the
        group reads (``(g_last - g0 + 1) * icpg``).

    The offsets are kept in ``base_bits = max(12, (slots * 4095).bit_length())`` bits: the
    group spans at most ``slots`` convolution groups, so ``slot_base`` and ``in_count`` are
    below ``slots * 4095`` and their differences of offsets modulo ``2**base_bits`` are exact.
    """

    def __init__(self, slots):
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be a positive integer, not {slots!r}")
        self._slots = slots
        bits = max(12, (slots * 4095).bit_length())
        super().__init__({
            "ocpg":      In(12),
            "icpg":      In(12),
            "remaining": In(24),
            "restart":   In(1),
            "begin":     In(1),
            "step":      In(1),
            "ocg":       Out(range(slots + 1)),
            "index":     Out(range(slots + 1)),
            "walking":   Out(1),
            "slot_base": Out(bits),
            "in_base":   Out(bits),
            "in_count":  Out(bits),
        })

    def elaborate(self, platform):
        m = Module()
        slots = self._slots
        within = Signal(12)       # index of channel `index` within its convolution group
        # Input-channel offsets, kept by adding `icpg` whenever the convolution group steps,
        # so the walker has no multiplier: `group_base = g * icpg` for channel `index`'s
        # convolution group `g`; `first_base` the same for the group's first channel. Each
        # step sets `in_count` for the channels walked so far, so it is a register when the
        # sequencer checks it against the buffer.
        bits = len(self.in_base)
        group_base = Signal(bits)
        first_base = Signal(bits)
        with m.If(self.restart):
            m.d.sync += [within.eq(0), group_base.eq(0)]
        with m.If(self.begin):
            m.d.sync += [
                self.ocg.eq(Mux(self.remaining >= slots, slots, self.remaining)),
                first_base.eq(group_base),
                self.index.eq(0),
            ]
        with m.If(self.step):
            group_end = within + 1 == self.ocpg
            m.d.sync += [
                self.in_count.eq(self.slot_base + self.icpg),
                group_base.eq(Mux(group_end, group_base + self.icpg, group_base)),
                within.eq(Mux(group_end, 0, within + 1)),
                self.index.eq(self.index + 1),
            ]
        m.d.comb += [
            self.walking.eq(self.index < self.ocg),
            self.slot_base.eq(group_base - first_base),
            self.in_base.eq(first_base),
        ]
        return m
