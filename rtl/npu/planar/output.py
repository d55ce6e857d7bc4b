"""The output stage: the second format converter, the output stream and the lane pipeline's
advance.

Results leave from the lane pipeline (elementwise, pooling, the channel accumulator's output
pass) or from the reduction (one value in lane 0). The lane pipeline advances when its output
beat can go: always in a reduction over planes or the tensor (the tree never stalls), when the
accumulator's word is free while accumulating across channels, else when the output register
can take the beat or there is none. The conversion is split over two registers (the
alignment, then the rounding into the register the beat leaves from: two cycles of latency,
a beat a cycle as before); ``idle`` holds while either is full.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .convert import narrow_align, narrow_layout, narrow_round
from .geometry import LANE_LATENCY
from .intpath import to_int8
from .layouts import Axis, Fmt, Mode, beat_layout, config_layout, lane_output_layout

__all__ = ["OutputStage"]


class OutputStage(wiring.Component):
    """Second format converter, output stream, lane pipeline advance.

    Parameters
    ----------
    lanes : int
        ``L``.
    word : int or None
        None: binary32 values; else the integer build's value width (the results are
        saturated to int8: its tasks have INT8 outputs).

    Members
    -------
    task : In(config_layout())
        The running task.
    lane : In(lane_output_layout(L))
        The lane pipeline's output beat.
    entering : In(1)
        A beat is at the lane pipeline's input (``valid``).
    accumulating : In(1)
        The channel accumulator takes the lane pipeline's results.
    hazard : In(1)
        The channel accumulator cannot take the output beat in this cycle.
    tree : In(stream.Signature(32))
        The reduction's results (binary32).
    out : Out(stream.Signature(beat_layout(L)))
        The engine's results.
    lane_en : Out(1)
        The lane pipeline advances.
    idle : Out(1)
        No beat bound for ``out`` is in the lane pipeline or the two output registers (a
        reduction's result included).
    """

    def __init__(self, lanes, *, word=None):
        self._lanes = lanes
        self._word = word
        super().__init__({
            "task":         In(config_layout()),
            "lane":         In(lane_output_layout(lanes, word or 32)),
            "entering":     In(1),
            "accumulating": In(1),
            "hazard":       In(1),
            "tree":         In(stream.Signature(32)),
            "out":          Out(stream.Signature(beat_layout(lanes))),
            "lane_en":      Out(1),
            "idle":         Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        task, lane, out = self.task, self.lane, self.out
        is_red = task.mode == Mode.REDUCE
        is_tree = is_red & (task.axis != Axis.CHANNEL)
        to_acc = is_red & (task.axis == Axis.CHANNEL) & self.accumulating
        out_fmt = task.out_fmt == Fmt.FP16

        # Two registers: stage 1 holds each lane's value (lane 0: a reduction's result) aligned
        # for the narrowing (`narrow_align`), stage 2 the converted beat, which leaves. They
        # advance together (`adv`) when stage 2 is empty or its beat leaves in this cycle, so
        # a beat a cycle still goes out, and the data processor's write path starts at
        # flip-flops.
        L = self._lanes
        float_values = self._word is None
        s1_layout = data.StructLayout({
            "mask": L,
            "lane": data.ArrayLayout(narrow_layout() if float_values else 32, L)})
        s1_valid = Signal()
        s1 = Signal(s1_layout, reset_less=True)
        s2_valid = Signal()
        s2 = Signal.like(out.payload, reset_less=True)
        adv = ~s2_valid | out.ready
        m.d.comb += [out.valid.eq(s2_valid), out.payload.eq(s2)]

        m.d.comb += self.lane_en.eq(Mux(is_tree, 1, Mux(to_acc, ~self.hazard,
                                                        ~lane.valid | adv)))
        # Beats in the lane pipeline that will leave on `out` (and those in the two stages).
        pending = Signal(range(2 * LANE_LATENCY + 6))
        m.d.sync += pending.eq(pending + (self.entering & self.lane_en & ~is_tree & ~to_acc)
                               - (out.valid & out.ready & ~is_tree))
        m.d.comb += self.idle.eq((pending == 0) & ~s1_valid & ~s2_valid)

        # A reduction's result in lane 0 (the other lanes masked), or the lanes of the beat.
        m.d.comb += self.tree.ready.eq(adv)
        beat_valid = Mux(is_tree, self.tree.valid, lane.valid & ~to_acc)
        beat_mask = Mux(is_tree, 1, lane.mask)
        with m.If(adv):
            m.d.sync += [s1_valid.eq(beat_valid), s1.mask.eq(beat_mask), s2_valid.eq(s1_valid)]
        for i in range(L):
            if float_values:
                value = lane.value[i]
                if i == 0:
                    value = Mux(is_tree, self.tree.payload, value)
                staged = narrow_align(m, value, out_fmt, f"out{i}")
                narrowed = narrow_round(m, s1.lane[i], out_fmt, f"out{i}")
            else:   # integers, sign-extended to 32 bits (the reduction's result is 32 bits)
                staged = lane.value[i].as_signed()
                if i == 0:
                    staged = Mux(is_tree, self.tree.payload.as_signed(), staged)
                narrowed = to_int8(m, s1.lane[i].as_signed(), f"out{i}")
            with m.If(adv):
                m.d.sync += [s1.lane[i].eq(staged),
                             s2.data[i].eq(Mux(s1.mask[i], narrowed, 0))]
        return m
