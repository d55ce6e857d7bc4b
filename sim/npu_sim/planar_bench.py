"""A one-stream wrapper of the planar engine for the Verilator bench (simulation only).

The engine has a configuration port and three operand streams; the Verilator harness
(:class:`npu_sim.verilator.StreamBench`) drives one input stream and reads one output stream.
This wrapper serialises everything onto ``cmd`` beats (``tag``, ``data``):

* ``tag 0``: register write, ``data[32:36]`` = word offset in ``PLANAR_ENGINE`` (a task register),
  ``data[0:32]`` = value;
* ``tag 1``: start (accepted when the engine is idle);
* ``tag 2, 3, 4``: one beat of stream A, B, C (through four-beat FIFOs).

``res`` carries the engine's output beats (``tag 0``) and, after each task, a status beat
(``tag 1``, ``data[0:8]`` = error code, ``data[8:40]`` = cycles from start to done).
"""

from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from npu.planar.engine import PlanarEngine
from npu_spec.planar import TASK_REGISTERS

__all__ = ["PlanarBench", "bench_width"]


def bench_width(lanes):
    return max(40, 16 * lanes)


class PlanarBench(wiring.Component):
    """Planar engine behind one command stream and one result stream (see module docs)."""

    def __init__(self, config, *, plane_depth=1024):
        self._engine = PlanarEngine(config, plane_depth=plane_depth)
        width = bench_width(self._engine.lanes)
        super().__init__({
            "cmd": In(stream.Signature(data.StructLayout({"tag": unsigned(3),
                                                          "data": unsigned(width)}))),
            "res": Out(stream.Signature(data.StructLayout({"tag": unsigned(1),
                                                           "data": unsigned(width)}))),
        })

    @property
    def lanes(self):
        return self._engine.lanes

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = eng = self._engine
        lanes = eng.lanes
        bw = 16 * lanes

        # Task registers, by offset.
        regs = {reg.offset: Signal(32, name=f"reg{reg.offset}") for reg in TASK_REGISTERS}
        for reg in TASK_REGISTERS:
            for f in reg.fields:
                m.d.comb += getattr(eng.cfg, f.name).eq(
                    regs[reg.offset][f.offset:f.offset + f.width])

        fifos = {}
        for k, name in enumerate(("a", "b", "c")):
            q = fifo.SyncFIFOBuffered(width=bw, depth=4)
            m.submodules[f"fifo_{name}"] = q
            port = getattr(eng, name)
            m.d.comb += [port.valid.eq(q.r_rdy), port.payload.eq(q.r_data),
                         q.r_en.eq(port.ready), q.w_data.eq(self.cmd.payload.data[:bw])]
            fifos[k + 2] = q

        tag = self.cmd.payload.data
        with m.Switch(self.cmd.payload.tag):
            with m.Case(0):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid), m.Switch(tag[32:36]):
                    for k, reg in regs.items():
                        with m.Case(k):
                            m.d.sync += reg.eq(tag[:32])
            with m.Case(1):
                m.d.comb += [self.cmd.ready.eq(~eng.busy),
                             eng.start.eq(self.cmd.valid & ~eng.busy)]
            for k, q in fifos.items():
                with m.Case(k):
                    m.d.comb += [self.cmd.ready.eq(q.w_rdy), q.w_en.eq(self.cmd.valid)]

        # Cycle counter and the status beat after each task.
        cycles = Signal(32)
        with m.If(eng.start):
            m.d.sync += cycles.eq(1)
        with m.Elif(eng.busy):
            m.d.sync += cycles.eq(cycles + 1)
        st_pending = Signal()
        st_word = Signal(40)
        with m.If(eng.done):
            m.d.sync += [st_pending.eq(1), st_word.eq(eng.error.as_value() | cycles.shift_left(8))]
        with m.If(st_pending):
            m.d.comb += [self.res.valid.eq(1), self.res.payload.tag.eq(1),
                         self.res.payload.data.eq(st_word)]
            with m.If(self.res.ready):
                m.d.sync += st_pending.eq(0)
        with m.Else():
            m.d.comb += [self.res.valid.eq(eng.out.valid),
                         self.res.payload.data.eq(eng.out.payload.as_value()),
                         eng.out.ready.eq(self.res.ready)]
        return m
