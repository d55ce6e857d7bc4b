"""The horizontal pooling filter: each input row folded over ``kx`` into H beats.

An *H beat* is ``FL = K L`` consecutive output columns of one input row. The filter walks the
H beats of every row of every channel in raster order, in groups of three consecutive ones;
in each cycle one window step ``kx`` of one beat of the group enters each lane's add/max/min
pipe (beat 0, 1, 2 of step 0, then of step 1, ...), so that the pipe's three-cycle latency is
hidden and its result feeds straight back. After ``kw`` steps the three results are written to
the H ring. A group starts when the input rows it reads are loaded and the H ring words it
writes are no longer read by the vertical filter's group.

A step is read from the line buffer one cycle after its issue and its data arrives the cycle
after that; the pipes take it then. In a reduction across channels the channel accumulator
borrows the pipes (``borrowed``).
"""

from amaranth.hdl import Array, Cat, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..lib.fp32 import FP32AddPipe
from ..lib.pipe import delay
from .fold import pooling_fold
from .intpath import add_pipe
from .layouts import (
    Mode,
    Spread,
    config_layout,
    fold_layout,
    hdesc_layout,
    keep_layout,
    read_layout,
    ring_keep_layout,
    ring_write_layout,
    sizes_layout,
)
from .walk import at_least, next_group

__all__ = ["HFilter"]


class HFilter(wiring.Component):
    """The horizontal filter of a pooling task, and its ``FL`` add/max/min pipes.

    Parameters
    ----------
    geometry : Geometry
        ``FL``, ``DR``, ``HD``.
    shared : SharedModules or None
        Library of shared blocks (``npu.lib.shared``; Verilog output only): the pipes are
        instances of one converted ``FP32AddPipe`` (an ``IntAddPipe`` in the integer build).

    Members
    -------
    flush : In(1)
        Synchronous clear of every register here and in the pipes (the engine's flush; it
        reaches the pipes also when they are instances of a shared module).
    task, sizes : In(config_layout()), In(sizes_layout())
        The running task and its sizes.
    start : In(1)
        Start the walk of a pooling task.
    clear : In(1)
        Stop (a new task is being set up).
    loaded : In(count_bits)
        Elements in the line buffer since the start of the task (the counts here are modulo
        ``2**count_bits`` and ``2**hword_bits``, see :class:`Geometry`).
    ring_keep : In(ring_keep_layout(hword_bits))
        The first H word the vertical filter's group still reads.
    read : Out(read_layout(geometry.ring_depth))
        The line-buffer read of the step issued in this cycle.
    data : In(ArrayLayout(32, FL))
        Line-buffer data, two cycles after ``read``.
    keep : Out(keep_layout(count_bits))
        The first input element this filter still reads (the loader's limit).
    write : Out(ring_write_layout(hword_bits))
        An H beat's result is written to H word ``write.word`` (modulo ``HD``): the result is
        ``fold``.
    count : Out(hword_bits)
        H words written since the start of the task.
    busy : Out(1)
        The walk is on or steps are in the pipes.
    borrowed : In(1)
        The pipes compute ``borrow`` instead (a reduction across channels).
    borrow : In(fold_layout(FL))
    fold : Out(ArrayLayout(32, FL))
        The pipes' results.
    """

    def __init__(self, geometry, *, shared=None):
        self._geometry = geometry
        self._shared = shared
        fl = geometry.filter_lanes
        super().__init__({
            "flush":     In(1),
            "task":      In(config_layout()),
            "sizes":     In(sizes_layout()),
            "start":     In(1),
            "clear":     In(1),
            "loaded":    In(geometry.count_bits),
            "ring_keep": In(ring_keep_layout(geometry.hword_bits)),
            "read":      Out(read_layout(geometry.ring_depth)),
            "data":      In(data.ArrayLayout(geometry.word, fl)),
            "keep":      Out(keep_layout(geometry.count_bits)),
            "write":     Out(ring_write_layout(geometry.hword_bits)),
            "count":     Out(geometry.hword_bits),
            "busy":      Out(1),
            "borrowed":  In(1),
            "borrow":    In(fold_layout(fl, geometry.word)),
            "fold":      Out(data.ArrayLayout(geometry.word, fl)),
        })

    def _has_window(self, x):
        """A window whose first column is ``x`` ends within the padded row."""
        task = self.task
        return x + task.kw <= task.width + task.px

    def _successor(self, m, d, name):
        """The H beat after ``d``: the next ``FL`` columns of the row, or the next row."""
        g = self._geometry
        task = self.task
        n = Signal(hdesc_layout(g.ring_depth, g.count_bits, g.hword_bits), name=name)
        gx = Signal(signed(17), name=f"{name}_gx")
        ring = Signal(range(2 * g.ring_depth), name=f"{name}_ring")
        m.d.comb += [gx.eq(d.gxb + self.sizes.step_cols), ring.eq(d.ring + task.width)]
        m.d.comb += n.hw.eq(d.hw + 1)
        with m.If(self._has_window(gx)):
            m.d.comb += [n.valid.eq(d.valid), n.row.eq(d.row), n.gxb.eq(gx),
                         n.ring.eq(d.ring), n.row_start.eq(d.row_start)]
        with m.Else():
            m.d.comb += [n.valid.eq(d.valid & (d.row + 1 < self.sizes.rows)),
                         n.row.eq(d.row + 1), n.gxb.eq(-task.px),
                         n.ring.eq(Mux(ring >= g.ring_depth, ring - g.ring_depth, ring)),
                         n.row_start.eq(d.row_start + task.width)]
        return n

    def elaborate(self, platform):
        m = Module()
        g = self._geometry
        FL = g.filter_lanes
        task = self.task
        layout = hdesc_layout(g.ring_depth, g.count_bits, g.hword_bits)
        is_pool = task.mode == Mode.POOL

        def successor(d, name):
            return self._successor(m, d, name)

        # The walk: the group of three H beats, the step kx and the beat phi of the group.
        group = [Signal(layout, name=f"beat{p}") for p in range(3)]
        kx = Signal(4)
        phi = Signal(2)
        on = Signal()
        starting = Signal()     # the first group is being computed (`next_group`)
        issue = Signal()
        current = Signal(layout)
        m.d.comb += current.eq(Array(group)[phi])
        # The next group, or after ``start`` the first (the same chain of successors).
        initial = Signal(layout)
        m.d.comb += [initial.valid.eq(1), initial.row.eq(0), initial.gxb.eq(-task.px),
                     initial.ring.eq(0), initial.row_start.eq(0), initial.hw.eq(0)]
        reload = Signal()
        last, goes_on, following, ahead = next_group(m, group, layout, successor, "h",
                                                     lambda _: (starting, initial), reload)

        # A group starts when the rows it reads are loaded and the H words it writes are free.
        ready = (at_least(self.loaded, last.row_start + task.width, g.count_bits)
                 & (~self.ring_keep.valid
                    | ~at_least(last.hw, self.ring_keep.word + g.h_depth, g.hword_bits)))
        group_start = (kx == 0) & (phi == 0)
        group_end = (phi == 2) & (kx == task.kw - 1)
        m.d.comb += issue.eq(is_pool & on & ~starting & (~group_start | ready)
                             & (~group_end | ahead))
        with m.If(issue):
            m.d.sync += phi.eq(Mux(phi == 2, 0, phi + 1))
            with m.If(phi == 2):
                with m.If(kx == task.kw - 1):
                    m.d.sync += kx.eq(0)
                    with m.If(goes_on):
                        m.d.comb += reload.eq(1)
                        m.d.sync += [group[p].eq(following[p]) for p in range(3)]
                    with m.Else():
                        m.d.sync += on.eq(0)
                with m.Else():
                    m.d.sync += kx.eq(kx + 1)
        with m.If(starting & ahead):
            m.d.comb += reload.eq(1)
            m.d.sync += [group[p].eq(following[p]) for p in range(3)]
            m.d.sync += starting.eq(0)
        with m.If(self.clear):
            m.d.sync += [on.eq(0), starting.eq(0)]
        with m.If(self.start):
            m.d.comb += reload.eq(1)
            m.d.sync += [group[p].valid.eq(0) for p in range(3)]
            m.d.sync += [group[0].row_start.eq(0), kx.eq(0), phi.eq(0), on.eq(1),
                         starting.eq(1)]

        # The step's read; lane i's window starts at column gxb + sx i and reads column
        # gxb + sx i + kx (a padding column reads the identity).
        m.d.comb += [self.read.en.eq(1), self.read.base.eq(current.ring + current.gxb + kx),
                     self.read.spread.eq(Spread.STEP), self.read.stride.eq(task.sx)]
        valid_cols = Signal(FL)
        for i in range(FL):
            x0 = Signal(signed(18), name=f"x0_{i}")
            m.d.comb += x0.eq(current.gxb + task.sx * i)
            x = Signal(signed(18), name=f"x_{i}")
            m.d.comb += x.eq(x0 + kx)
            m.d.comb += valid_cols[i].eq((x >= 0) & (x < task.width) & current.valid
                                         & self._has_window(x0))

        # The loader keeps the rows of the group of this cycle and of the cycle before (a step
        # is read one cycle after its issue).
        on_before = Signal()
        start_before = Signal(g.count_bits)
        m.d.sync += [on_before.eq(on), start_before.eq(group[0].row_start)]
        m.d.comb += [self.keep.valid.eq(is_pool & (on | on_before)),
                     self.keep.first.eq(Mux(on_before, start_before, group[0].row_start))]

        # Stage 1: the step's bank and word are registered in the line buffer; stage 2: its
        # data is there and enters the pipes. The last step's result leaves the pipe three
        # cycles later.
        step_layout = data.StructLayout({"valid": 1, "first": 1, "last": 1, "cols": FL,
                                         "beat": 1, "hw": g.hword_bits})
        step = Signal(step_layout)
        m.d.comb += [step.valid.eq(issue), step.first.eq(kx == 0),
                     step.last.eq(kx == task.kw - 1), step.cols.eq(valid_cols),
                     step.beat.eq(current.valid), step.hw.eq(current.hw)]
        stages = delay(m, step, 2, name="step")
        at_pipe = stages[-1]
        end_layout = data.StructLayout({"valid": 1, "beat": 1, "hw": g.hword_bits})
        end = Signal(end_layout)
        m.d.comb += [end.valid.eq(at_pipe.valid & at_pipe.last), end.beat.eq(at_pipe.beat),
                     end.hw.eq(at_pipe.hw)]
        ends = delay(m, end, FP32AddPipe.LATENCY, name="end")
        result = ends[-1]
        m.d.comb += [self.write.valid.eq(result.valid & result.beat),
                     self.write.word.eq(result.hw)]
        with m.If(self.write.valid):
            m.d.sync += self.count.eq(result.hw + 1)
        with m.If(self.start):
            m.d.sync += self.count.eq(0)
        m.d.comb += self.busy.eq(on | Cat(*(s.valid for s in stages),
                                          *(e.valid for e in ends)).any())

        word = self._geometry.word if self._geometry.integer else None
        pool_op, identity = pooling_fold(m, task.op, word=word)
        for i in range(FL):
            pipe = add_pipe(m, f"pipe{i}", self._shared, word, reset=self.flush)
            m.d.comb += [
                pipe.en.eq(1),
                pipe.a.eq(Mux(self.borrowed, self.borrow.a[i],
                              Mux(at_pipe.first, identity, pipe.result))),
                pipe.b.eq(Mux(self.borrowed, self.borrow.b[i],
                              Mux(at_pipe.cols[i], self.data[i], identity))),
                pipe.op.eq(Mux(self.borrowed, self.borrow.op, pool_op)),
                self.fold[i].eq(pipe.result),
            ]
        return ResetInserter(self.flush)(m)
