"""The channel accumulator: a reduction across channels (one result per pixel).

The H ring holds a plane of partial results, word ``k`` = beat ``k`` of the plane. Each beat
of ``pre(A)`` leaving the lane pipeline reads its word (one cycle), is combined with it in the
horizontal filter's pipes (borrowed, three cycles; the first channel's beat is combined with
the identity instead) and is written back. A beat whose word is still in flight (planes of
fewer than five beats) holds the lane pipeline until the write is done: ``hazard``, from the
four words in flight. After the last channel an output pass reads the plane back, one beat per
lane pipeline step, into the lane pipeline (``MUL`` by ``SCALE``).
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..lib.fp32 import FP32AddPipe
from ..lib.pipe import delay
from .fold import reduction_fold
from .layouts import (
    SHAPE_BITS,
    Axis,
    EltOp,
    Mode,
    config_layout,
    fold_layout,
    lane_input_layout,
    lane_output_layout,
    ring_read_layout,
    ring_write_layout,
    sizes_layout,
)

__all__ = ["ChannelAcc"]


class ChannelAcc(wiring.Component):
    """Accumulator plane in the H ring, and its output pass.

    Parameters
    ----------
    geometry : Geometry
        ``L``, ``FL``, ``HD``.

    Members
    -------
    task, sizes : In(config_layout()), In(sizes_layout())
        The running task and its sizes.
    clear : In(1)
        Set up for a new task: accumulate from the first channel.
    lane : In(lane_output_layout(L))
        The lane pipeline's output (a beat of ``pre(A)`` while accumulating).
    en : In(1)
        The lane pipeline advances.
    active : Out(1)
        The task is a reduction across channels: the accumulator uses the H ring and the
        horizontal filter's pipes.
    accumulating : Out(1)
        Lane pipeline results go into the plane (until ``drain_start``).
    hazard : Out(1)
        The lane pipeline's output beat must wait: its word is in flight.
    done : Out(1)
        Every channel is accumulated and written.
    fold : Out(fold_layout(FL))
        Operands for the borrowed pipes.
    ring_write : Out(ring_write_layout(range(HD)))
        The write of the pipes' result.
    ring_read : Out(ring_read_layout(HD))
    ring_data : In(ArrayLayout(32, FL))
    drain_start : In(1)
        Start the output pass (from word 0).
    drain : In(1)
        Issue the next word of the output pass (taken when ``en``).
    beat_mask : In(L)
        The lanes of the issued word's beat that hold pixels.
    beat : Out(lane_input_layout(L))
        The output pass's beat for the lane pipeline.
    """

    def __init__(self, geometry):
        self._geometry = geometry
        L, FL, HD = geometry.lanes, geometry.filter_lanes, geometry.h_depth
        w = geometry.word
        super().__init__({
            "task":         In(config_layout()),
            "sizes":        In(sizes_layout()),
            "clear":        In(1),
            "lane":         In(lane_output_layout(L, w)),
            "en":           In(1),
            "active":       Out(1),
            "accumulating": Out(1),
            "hazard":       Out(1),
            "done":         Out(1),
            "fold":         Out(fold_layout(FL, w)),
            "ring_write":   Out(ring_write_layout(range(HD))),
            "ring_read":    Out(ring_read_layout(HD)),
            "ring_data":    In(data.ArrayLayout(w, FL)),
            "drain_start":  In(1),
            "drain":        In(1),
            "beat_mask":    In(L),
            "beat":         Out(lane_input_layout(L, w)),
        })

    def elaborate(self, platform):
        m = Module()
        g = self._geometry
        L, FL, HD = g.lanes, g.filter_lanes, g.h_depth
        task = self.task
        active = self.active
        m.d.comb += active.eq((task.mode == Mode.REDUCE) & (task.axis == Axis.CHANNEL))
        red_op, identity = reduction_fold(m, task.op, word=g.word if g.integer else None)

        # Accumulation: word k of channel c; the beat in the pipes and the words in flight.
        word = Signal(range(HD))
        channel = Signal(SHAPE_BITS)
        flight_layout = data.StructLayout({"valid": 1, "word": range(HD)})
        combining = Signal(flight_layout)   # the beat whose word is being read
        first = Signal()                    # ... of the first channel
        values = Signal(data.ArrayLayout(g.word, L))
        in_flight = [combining, *delay(m, combining, FP32AddPipe.LATENCY, name="flight")]
        writing = in_flight[-1]
        lane = self.lane
        m.d.comb += self.hazard.eq(lane.valid & Cat(*(f.valid & (f.word == word)
                                                      for f in in_flight)).any())
        issue = Signal()
        m.d.comb += issue.eq(active & self.accumulating & lane.valid & ~self.hazard)
        m.d.sync += combining.valid.eq(issue)
        with m.If(issue):
            m.d.sync += [combining.word.eq(word), first.eq(channel == 0), values.eq(lane.value)]
            with m.If(word == self.sizes.beats_plane - 1):
                m.d.sync += [word.eq(0), channel.eq(channel + 1)]
            with m.Else():
                m.d.sync += word.eq(word + 1)
        m.d.comb += self.done.eq((channel == task.channels)
                                 & ~Cat(*(f.valid for f in in_flight)).any())
        for i in range(FL):
            m.d.comb += [
                self.fold.a[i].eq(Mux(first, identity, self.ring_data[i])),
                self.fold.b[i].eq(values[i] if i < L else identity),
            ]
        m.d.comb += [self.fold.op.eq(red_op),
                     self.ring_write.valid.eq(writing.valid),
                     self.ring_write.word.eq(writing.word)]

        # The output pass reads word `drained`, one per lane pipeline step.
        drained = Signal(range(HD))
        with m.If(self.drain & self.en):
            m.d.sync += drained.eq(drained + 1)
        m.d.comb += [self.ring_read.addr.eq(Mux(self.accumulating, word, drained)),
                     self.ring_read.en.eq(self.accumulating | self.en)]
        beat = self.beat
        drain_valid = Signal()
        drain_mask = Signal(L)
        with m.If(self.en):
            m.d.sync += [drain_valid.eq(self.drain), drain_mask.eq(self.beat_mask)]
        m.d.comb += [beat.valid.eq(drain_valid), beat.mask.eq(drain_mask),
                     beat.op.eq(EltOp.MUL)]
        for i in range(L):
            m.d.comb += [beat.a[i].eq(self.ring_data[i]), beat.b[i].eq(task.scale)]

        with m.If(self.drain_start):
            m.d.sync += [self.accumulating.eq(0), drained.eq(0)]
        with m.If(self.clear):
            m.d.sync += [word.eq(0), channel.eq(0), self.accumulating.eq(1), drained.eq(0)]
        return m
