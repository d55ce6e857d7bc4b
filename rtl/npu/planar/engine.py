"""The planar engine: elementwise, pooling and reduction over ``L = P * P`` lanes.

``docs/planar.md`` describes the datapath and the golden contract. This module only composes
the sub-units:

* :class:`~npu.lib.engine.EngineControl`: the register map ``PLANAR_ENGINE``, start, done,
  error, the cycle counter (the shared engine interface);
* :class:`~.convert.ToF32` (x3): the first format converter on the operand streams;
* :class:`~.control.Control`: task latch, sizes, task check, the task sequence;
* :class:`~.lane.LanePipeline`: one binary32 datapath per lane;
* :class:`~.line_buffer.LineBuffer`: input rows (pooling) or a broadcast vector;
* :class:`~.hfilter.HFilter`, :class:`~.h_ring.HRing`, :class:`~.vfilter.VFilter`,
  :class:`~.result_queue.ResultQueue`: the separable pooling filter;
* :class:`~.channel_acc.ChannelAcc`: reduction across channels;
* :class:`~.reduction.Reduction`: reduction over planes or the tensor;
* :class:`~.output.OutputStage`: the second format converter and the output stream.

Every datapath unit is reset by the engine interface's ``flush`` (a task manager's abort),
registered: the datapath is cleared in the cycle after the abort, and a task's start reaches
the control unit one cycle after ``go`` (one cycle per task).
"""

from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.planar import LINE_BUFFER_DEPTH, PLANAR_ENGINE, TASK_REGISTERS

from ..lib.csr import CSRSignature
from ..lib.engine import EngineControl, EngineSignature, WriteLayout
from .channel_acc import ChannelAcc
from .control import Control
from .convert import ToF32
from .geometry import LANE_LATENCY, Geometry
from .h_ring import HRing
from .hfilter import HFilter
from .intpath import ToInt, f32_integer
from .lane import LanePipeline
from .layouts import beat_layout
from .line_buffer import LineBuffer
from .output import OutputStage
from .reduction import Reduction
from .result_queue import ResultQueue
from .vfilter import VFilter

__all__ = ["LANE_LATENCY", "PlanarEngine"]


class PlanarEngine(wiring.Component):
    """The planar engine.

    Parameters
    ----------
    config : NPUConfig
        ``planar_lanes`` (P) must be a power of two; the engine has ``L = P * P`` lanes and
        pooling filters of ``planar_pool_beats * L`` lanes.
    plane_depth : int
        Elements of the line buffer (a pooling plane's rows or a broadcast vector must fit).
    shared : SharedModules or None
        Library of shared blocks (``npu.lib.shared``; Verilog output only): the lanes and the
        filters' and reduction tree's adders are instances of one converted block each.

    Members
    -------
    writes : In(stream.Signature(WriteLayout))
        Register writes from the task manager (absolute word addresses).
    csr : In(CSRSignature)
        The host's access to ``PLANAR_ENGINE`` (offsets).
    task : In(EngineSignature())
        Start, done, error (a :class:`PlanarError`), abort.
    a, b, c : In(stream.Signature(beat_layout(L)))
        Source operands A, B (or a broadcast vector), C.
    out : Out(stream.Signature(beat_layout(L)))
        Results.
    """

    def __init__(self, config, *, plane_depth=LINE_BUFFER_DEPTH, shared=None):
        self._geometry = Geometry.of(config, plane_depth)
        self._config = config
        self._shared = shared
        self._control = EngineControl(PLANAR_ENGINE)
        beat = beat_layout(self._geometry.lanes)
        super().__init__({
            "writes": In(stream.Signature(WriteLayout)),
            "csr":    In(CSRSignature(self._control.csr.addr.shape().width)),
            "task":   In(EngineSignature()),
            "a":      In(stream.Signature(beat)),
            "b":      In(stream.Signature(beat)),
            "c":      In(stream.Signature(beat)),
            "out":    Out(stream.Signature(beat)),
        })

    @property
    def config(self):
        return self._config

    @property
    def geometry(self):
        return self._geometry

    @property
    def lanes(self):
        return self._geometry.lanes

    @property
    def plane_depth(self):
        return self._geometry.plane_depth

    @property
    def base(self):
        """Word address of the engine's registers on the register-write port."""
        return self._control.base

    def elaborate(self, platform):
        m = Module()
        g = self._geometry
        L = g.lanes
        m.submodules.engine_control = ctl = self._control
        for name in ("writes", "csr", "task"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(ctl, name))
        # The abort reaches the datapath's resets from a flip-flop (`flush`, a cycle after the
        # task manager's abort): no logic before the reset's wide fan-out. A task's start
        # reaches the control unit a cycle late (`go`), so that a task starting in the cycle
        # after an abort is not cleared by it. In the cycle of `flush` the aborted task's
        # outputs are held back (no result, no operand taken, no done).
        flush = Signal()
        go = Signal()
        m.d.sync += [flush.eq(ctl.flush), go.eq(ctl.go)]

        seq = Control(g, has_fp16=self._config.has_fp16)
        word = g.word if g.integer else None
        convs = {name: ToInt(L, g.word) if g.integer else ToF32(L) for name in ("a", "b", "c")}
        shared = self._shared
        lanes = LanePipeline(L, shared=shared, word=word,
                             share=self._config.planar_fp_share)
        lbuf = LineBuffer(g)
        hf = HFilter(g, shared=shared)
        ring = HRing(g)
        vf = VFilter(g, shared=shared)
        queue = ResultQueue(g)
        acc = ChannelAcc(g)
        red = Reduction(L, shared=shared, word=word, share=self._config.planar_fp_share)
        outs = OutputStage(L, word=word)
        units = {"control": seq, **{f"convert_{n}": u for n, u in convs.items()},
                 "lane_pipeline": lanes, "line_buffer": lbuf, "hfilter": hf, "h_ring": ring,
                 "vfilter": vf, "result_queue": queue, "channel_acc": acc, "reduction": red,
                 "output": outs}
        for name, unit in units.items():
            m.submodules[name] = ResetInserter(flush)(unit)
        # The units with shared blocks inside take the flush on a port too (an inserter does
        # not reach into an instance).
        for unit in (lanes, hf, vf, red):
            m.d.comb += unit.flush.eq(flush)

        # Task start and end, the task registers.
        m.d.comb += [seq.go.eq(go), ctl.finish.eq(seq.finish & ~flush), ctl.code.eq(seq.code)]
        m.d.comb += [getattr(seq.task_regs, f.name).eq(getattr(ctl.regs.port(reg.name), f.name))
                     for reg in TASK_REGISTERS for f in reg.fields]
        for unit in (hf, vf, queue, acc, red, outs):
            m.d.comb += unit.task.eq(seq.task)
        for unit in (hf, vf, queue, acc, red):
            m.d.comb += unit.sizes.eq(seq.sizes)
        for unit in (hf, vf, acc, red):
            m.d.comb += unit.clear.eq(seq.clear)
        # The lane pipeline advances on `lane_en`; the beats move on its `step` (every
        # `planar_fp_share` advancing cycles).
        m.d.comb += lanes.en.eq(outs.lane_en)
        for unit in (queue, acc, red):
            m.d.comb += unit.en.eq(lanes.step)

        # Operand streams through the first format converter to the control unit (none is
        # taken in the cycle of the flush).
        for name, conv in convs.items():
            port = getattr(self, name)
            m.d.comb += [conv.i.valid.eq(port.valid), conv.i.payload.eq(port.payload),
                         port.ready.eq(conv.i.ready & ~flush)]
            wiring.connect(m, conv.o, getattr(seq, name))
            m.d.comb += conv.fmt.eq(seq.task.in_fmt)

        # Control unit: the lane pipeline's input, the loader, the pooling units' state.
        if g.integer:   # the constants as integers (the task check has checked them)
            bias, _ = f32_integer(m, seq.task.bias, g.word, "bias")
            scalar, _ = f32_integer(m, seq.task.scalar, g.word, "scalar")
            m.d.comb += [lanes.scale.eq(seq.task.scale != 0), lanes.bias.eq(bias),
                         lanes.scalar.eq(scalar)]
        else:
            m.d.comb += [lanes.scale.eq(seq.task.scale), lanes.bias.eq(seq.task.bias),
                         lanes.scalar.eq(seq.task.scalar)]
        m.d.comb += [
            lanes.i.eq(seq.lane_in),
            seq.lane_en.eq(lanes.step), seq.lane_idle.eq(outs.idle),
            lbuf.load_start.eq(seq.load_start), lbuf.load_shape.eq(seq.load_shape),
            seq.load_done.eq(lbuf.load_done), seq.all_loaded.eq(lbuf.all_loaded),
            lbuf.read.eq(seq.read), seq.step_read.eq(hf.read),
            hf.start.eq(seq.walk_start), vf.start.eq(seq.walk_start),
            seq.h_busy.eq(hf.busy), seq.v_busy.eq(vf.busy), seq.queue_busy.eq(queue.busy),
            seq.queue_beat.eq(queue.beat), seq.drain_beat.eq(acc.beat),
            seq.accumulating.eq(acc.accumulating), seq.acc_done.eq(acc.done),
            acc.drain_start.eq(seq.drain_start), acc.drain.eq(seq.drain),
            acc.beat_mask.eq(seq.beat_mask), seq.group_done.eq(red.done),
        ]
        wiring.connect(m, seq.load, lbuf.load)
        m.d.comb += [lanes.vector[i].eq(lbuf.data[i]) for i in range(L)]

        # Pooling: line buffer -> horizontal filter -> H ring -> vertical filter -> queue.
        m.d.comb += [
            hf.loaded.eq(lbuf.loaded), lbuf.keep.eq(hf.keep), hf.data.eq(lbuf.data),
            hf.ring_keep.eq(vf.keep), vf.count.eq(hf.count),
            ring.filter_write.eq(hf.write), ring.data.eq(hf.fold),
            ring.filter_read.eq(vf.ring_read), vf.ring_data.eq(ring.read_data),
            queue.push.eq(vf.result), vf.room.eq(queue.room),
        ]

        # Reduction across channels: the accumulator borrows the H filter's pipes and the ring.
        m.d.comb += [
            hf.borrowed.eq(acc.active), hf.borrow.eq(acc.fold), ring.acc_mode.eq(acc.active),
            ring.acc_write.eq(acc.ring_write), ring.acc_read.eq(acc.ring_read),
            acc.ring_data.eq(ring.read_data), acc.lane.eq(lanes.o),
        ]

        # Results: the reduction's and the lane pipeline's, to the output stream.
        m.d.comb += [
            red.lane.eq(lanes.o), red.busy.eq(seq.busy),
            outs.lane.eq(lanes.o), outs.entering.eq(seq.lane_in.valid & lanes.step),
            outs.accumulating.eq(acc.accumulating), outs.hazard.eq(acc.hazard),
        ]
        wiring.connect(m, red.result, outs.tree)
        m.d.comb += [self.out.valid.eq(outs.out.valid & ~flush),
                     self.out.payload.eq(outs.out.payload), outs.out.ready.eq(self.out.ready)]
        return m
