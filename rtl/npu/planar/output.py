"""The output stage: the second format converter, the output stream and the lane pipeline's
advance.

Results leave from the lane pipeline (elementwise, pooling, the channel accumulator's output
pass) or from the reduction (one value in lane 0). The lane pipeline advances when its output
beat can go: always in a reduction over planes or the tensor (the tree never stalls), when the
accumulator's word is free while accumulating across channels, else when the output register
can take the beat or there is none. The converted beat leaves from a register (one cycle of
latency, a beat a cycle as before); ``idle`` holds while that register is full.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .convert import from_f32
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
        No beat bound for ``out`` is in the lane pipeline or the output register (a
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

        # The output register: the converted beat is registered before it leaves the engine
        # (the data processor's write path starts at flip-flops). It takes a beat when it is
        # empty or its beat leaves in this cycle, so a beat a cycle still goes out.
        reg_valid = Signal()
        reg_data = Signal.like(out.payload, reset_less=True)
        take = ~reg_valid | out.ready
        m.d.comb += [out.valid.eq(reg_valid), out.payload.eq(reg_data)]

        m.d.comb += self.lane_en.eq(Mux(is_tree, 1, Mux(to_acc, ~self.hazard,
                                                        ~lane.valid | take)))
        # Beats in the lane pipeline that will leave on `out` (and one in the output register).
        pending = Signal(range(2 * LANE_LATENCY + 5))
        m.d.sync += pending.eq(pending + (self.entering & self.lane_en & ~is_tree & ~to_acc)
                               - (out.valid & out.ready & ~is_tree))
        m.d.comb += self.idle.eq((pending == 0) & ~reg_valid)

        # A reduction's result in lane 0 (the other lanes 0), or the lanes of the beat.
        if self._word is None:
            tree_value = from_f32(m, self.tree.payload, out_fmt, "tree_out")
            lane_values = [from_f32(m, lane.value[i], out_fmt, f"out{i}")
                           for i in range(self._lanes)]
        else:
            tree_value = to_int8(m, self.tree.payload.as_signed(), "tree_out")
            lane_values = [to_int8(m, lane.value[i].as_signed(), f"out{i}")
                           for i in range(self._lanes)]
        m.d.comb += self.tree.ready.eq(take)
        beat = Signal.like(out.payload)
        beat_valid = Signal()
        with m.If(is_tree):
            m.d.comb += [beat_valid.eq(self.tree.valid), beat.data[0].eq(tree_value)]
        with m.Else():
            m.d.comb += beat_valid.eq(lane.valid & ~to_acc)
            for i in range(self._lanes):
                m.d.comb += beat.data[i].eq(Mux(lane.mask[i], lane_values[i], 0))
        with m.If(take):
            m.d.sync += [reg_valid.eq(beat_valid), reg_data.eq(beat)]
        return m
