"""The vertical pooling filter: the H beats of each window's rows folded over ``ky``.

A *V beat* is ``FL`` consecutive outputs of one output row. The filter walks the V beats of a
channel in raster order, in groups of three (a group may span output rows, never channels);
in each cycle one step ``ky`` of one beat of the group enters each lane's add/max/min pipe:
the H beat of row ``oy sy - py + ky`` (the identity for a padding row). After ``kh`` steps
the result goes to the result queue. A group starts when the H beats of its rows are in the H
ring and the queue has room for its three results, so the filter never stalls inside a group.
"""

from amaranth.hdl import Array, Cat, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..lib.fp32 import FP32AddPipe
from ..lib.pipe import delay
from .fold import pooling_fold
from .intpath import add_pipe
from .layouts import (
    SHAPE_BITS,
    Mode,
    config_layout,
    ring_keep_layout,
    ring_read_layout,
    sizes_layout,
    vdesc_layout,
    vresult_layout,
)
from .walk import at_least, next_group

__all__ = ["VFilter"]


class VFilter(wiring.Component):
    """The vertical filter of a pooling task, and its ``FL`` add/max/min pipes.

    Parameters
    ----------
    geometry : Geometry
        ``FL``, ``HD``.
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
    count : In(hword_bits)
        H words written since the start of the task (the H word indices here are modulo
        ``2**hword_bits``, see :class:`Geometry`).
    room : In(1)
        The result queue has room for a group's three results.
    ring_read : Out(ring_read_layout(HD))
        The H ring read of the step issued in this cycle (data in the next cycle).
    ring_data : In(ArrayLayout(32, FL))
    keep : Out(ring_keep_layout(hword_bits))
        The first H word this filter's group still reads.
    result : Out(vresult_layout(FL))
        Group starts, results and the ends of invalid beats, for the result queue.
    busy : Out(1)
        The walk is on or steps are in the pipes.
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
            "count":     In(geometry.hword_bits),
            "room":      In(1),
            "ring_read": Out(ring_read_layout(geometry.h_depth)),
            "ring_data": In(data.ArrayLayout(geometry.word, fl)),
            "keep":      Out(ring_keep_layout(geometry.hword_bits)),
            "result":    Out(vresult_layout(fl, geometry.buffer_shape)),
            "busy":      Out(1),
        })

    def _successor(self, m, d, name):
        """The V beat after ``d``: the next ``FL`` outputs of the row, or the next row."""
        task, sizes = self.task, self.sizes
        n = Signal(vdesc_layout(self._geometry.hword_bits), name=name)
        oy = Signal(signed(15), name=f"{name}_oy")
        m.d.comb += oy.eq(d.oyb + task.sy)
        with m.If(d.ob + 1 < sizes.owb):
            m.d.comb += [n.valid.eq(d.valid), n.oyb.eq(d.oyb), n.gxb.eq(d.gxb + sizes.step_cols),
                         n.ob.eq(d.ob + 1), n.roww.eq(d.roww)]
        with m.Else():
            m.d.comb += [n.valid.eq(d.valid & (oy + task.kh <= task.height + task.py)),
                         n.oyb.eq(oy), n.gxb.eq(-self.task.px), n.ob.eq(0),
                         n.roww.eq(d.roww + sizes.sy_owb)]
        return n

    def _plane_start(self, m, plane_word, name):
        """The first V beat of a plane whose first H word is ``plane_word``."""
        task = self.task
        first = Signal(vdesc_layout(self._geometry.hword_bits), name=name)
        m.d.comb += [first.valid.eq(1), first.oyb.eq(-task.py), first.gxb.eq(-task.px),
                     first.ob.eq(0), first.roww.eq(plane_word - self.sizes.py_owb)]
        return first

    def elaborate(self, platform):
        m = Module()
        g = self._geometry
        FL = g.filter_lanes
        task, sizes = self.task, self.sizes
        layout = vdesc_layout(g.hword_bits)
        hb = g.hword_bits
        is_pool = task.mode == Mode.POOL

        # The walk: the group, the step ky (and ky * owb), the beat phi of the group, the
        # plane and the H word index of its first H beat.
        group = [Signal(layout, name=f"beat{p}") for p in range(3)]
        ky = Signal(4)
        phi = Signal(2)
        ky_owb = Signal(16)
        on = Signal()
        starting = Signal()     # the first group is being computed (`next_group`)
        issue = Signal()
        plane = Signal(SHAPE_BITS)
        plane_word = Signal(hb)
        current = Signal(layout)
        m.d.comb += current.eq(Array(group)[phi])
        # The next group: of this plane, or the first of the next plane, or after ``start`` of
        # the first plane (the same chain of successors).
        plane_first = self._plane_start(m, Mux(starting, 0, plane_word + sizes.h_owb),
                                        "plane_first")
        reload = Signal()
        last, goes_on, following, ahead = next_group(
            m, group, layout, lambda d, name: self._successor(m, d, name), "v",
            lambda goes_on: (starting | ~goes_on, plane_first), reload)

        # A group starts when the H words of its rows are written (up to the plane's end) and
        # the queue has room.
        high = Signal(hb)
        m.d.comb += high.eq(last.roww + sizes.kh_owb)
        plane_end = Signal(hb)
        m.d.comb += plane_end.eq(plane_word + sizes.h_owb)
        ready = at_least(self.count, Mux(at_least(plane_end, high, hb), high, plane_end), hb)
        m.d.comb += [self.keep.valid.eq(on),
                     self.keep.word.eq(Mux(at_least(group[0].roww, plane_word, hb),
                                           group[0].roww, plane_word))]
        group_start = (ky == 0) & (phi == 0)
        group_end = (phi == 2) & (ky == task.kh - 1)
        m.d.comb += issue.eq(is_pool & on & ~starting & (~group_start | (ready & self.room))
                             & (~group_end | ahead))
        with m.If(issue):
            m.d.sync += phi.eq(Mux(phi == 2, 0, phi + 1))
            with m.If(phi == 2):
                with m.If(ky == task.kh - 1):
                    m.d.sync += [ky.eq(0), ky_owb.eq(0)]
                    with m.If(goes_on):
                        m.d.comb += reload.eq(1)
                        m.d.sync += [group[p].eq(following[p]) for p in range(3)]
                    with m.Elif(plane == task.channels - 1):
                        m.d.sync += on.eq(0)
                    with m.Else():
                        m.d.comb += reload.eq(1)
                        m.d.sync += [plane.eq(plane + 1), plane_word.eq(plane_word + sizes.h_owb)]
                        m.d.sync += [group[p].eq(following[p]) for p in range(3)]
                with m.Else():
                    m.d.sync += [ky.eq(ky + 1), ky_owb.eq(ky_owb + sizes.owb)]
        with m.If(starting & ahead):
            m.d.comb += reload.eq(1)
            m.d.sync += [group[p].eq(following[p]) for p in range(3)]
            m.d.sync += starting.eq(0)
        with m.If(self.clear):
            m.d.sync += [on.eq(0), starting.eq(0)]
        with m.If(self.start):
            m.d.comb += reload.eq(1)
            m.d.sync += [group[p].valid.eq(0) for p in range(3)]
            m.d.sync += [group[0].roww.eq(0), plane.eq(0), plane_word.eq(0), ky.eq(0),
                         phi.eq(0), ky_owb.eq(0), on.eq(1), starting.eq(1)]

        # The step's H word; its data arrives in the next cycle with the registered step.
        word = Signal(hb)
        m.d.comb += word.eq(current.roww + ky_owb + current.ob)
        m.d.comb += [self.ring_read.en.eq(1), self.ring_read.addr.eq(word[:g.h_bits])]
        iy = Signal(signed(15))
        m.d.comb += iy.eq(current.oyb + ky)
        step_layout = data.StructLayout({"valid": 1, "first": 1, "last": 1, "row": 1,
                                         "beat": 1, "oyb": signed(14), "gxb": signed(16)})
        at_pipe = Signal(step_layout)
        m.d.sync += [at_pipe.valid.eq(issue), at_pipe.first.eq(ky == 0),
                     at_pipe.last.eq(ky == task.kh - 1),
                     at_pipe.row.eq(current.valid & (iy >= 0) & (iy < task.height)),
                     at_pipe.beat.eq(current.valid), at_pipe.oyb.eq(current.oyb),
                     at_pipe.gxb.eq(current.gxb)]
        end_layout = data.StructLayout({"valid": 1, "beat": 1, "oyb": signed(14),
                                        "gxb": signed(16)})
        end = Signal(end_layout)
        m.d.comb += [end.valid.eq(at_pipe.valid & at_pipe.last), end.beat.eq(at_pipe.beat),
                     end.oyb.eq(at_pipe.oyb), end.gxb.eq(at_pipe.gxb)]
        ends = delay(m, end, FP32AddPipe.LATENCY, name="end")
        done = ends[-1]
        m.d.comb += [self.result.start.eq(issue & group_start),
                     self.result.valid.eq(done.valid & done.beat),
                     self.result.empty.eq(done.valid & ~done.beat),
                     self.result.entry.oyb.eq(done.oyb), self.result.entry.gxb.eq(done.gxb)]
        m.d.comb += self.busy.eq(on | at_pipe.valid | Cat(*(e.valid for e in ends)).any())

        word = self._geometry.word if self._geometry.integer else None
        pool_op, identity = pooling_fold(m, task.op, word=word)
        for i in range(FL):
            pipe = add_pipe(m, f"pipe{i}", self._shared, word, reset=self.flush)
            m.d.comb += [
                pipe.en.eq(1),
                pipe.a.eq(Mux(at_pipe.first, identity, pipe.result)),
                pipe.b.eq(Mux(at_pipe.row, self.ring_data[i], identity)),
                pipe.op.eq(pool_op),
                self.result.entry.value[i].eq(pipe.result),
            ]
        return ResetInserter(self.flush)(m)
