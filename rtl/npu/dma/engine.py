"""The DMA engine (``docs/system.md``, "DMA engine"; :mod:`npu_spec.dma`).

This module only composes the sub-units:

* :class:`~npu.lib.engine.EngineControl`: the register map ``DMA``, start, done, error, the
  cycle counter (the shared engine interface); its ``entry`` holds the start beat, whose
  ``base`` and ``limit`` are the task's network window;
* :class:`~.check.TransferCheck`: :func:`npu_spec.dma.dma_error` before the first access;
* :class:`~.address.AddressGenerator`: the elements in :func:`~npu_spec.dma.transfer_elements`
  order;
* :class:`~.reader.MemoryReader`: bus reads into the buffer or a kernel memory;
* :class:`~.writer.MemoryWriter`: buffer reads into bus writes.

A task runs ``CHECK`` (the transfer registers latched at the start), then ``RUN`` until the
reader or writer has nothing outstanding and either the generator is exhausted or the bus
answered ``err``. Every sub-unit is reset by the task manager's abort and at the end of a task.
"""

from amaranth.hdl import Module, Mux, ResetInserter, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.dma import DMA, RANK, DmaDir, DmaError

from ..dataproc.ports import BufferReadSignature, KernelWriteLayout, buffer_write_layout
from ..lib.csr import CSRSignature
from ..lib.engine import EngineControl, EngineSignature, WriteLayout
from ..lib.wishbone import WishboneSignature
from .address import AddressGenerator
from .check import TransferCheck
from .layouts import BUS_ADDR_BITS, TransferLayout
from .reader import MemoryReader
from .writer import MemoryWriter

__all__ = ["DMAEngine"]

_BUS_REQUEST = ("cyc", "stb", "we", "adr", "sel", "dat_w")
_BUS_ANSWER = ("dat_r", "ack", "stall", "err")


class DMAEngine(wiring.Component):
    """The DMA engine.

    Parameters
    ----------
    config : NPUConfig
        ``mem_width`` (the bus), ``cores``, ``buffer_kib`` and ``kernel_kib`` (the checks).
    depth : int
        Elements outstanding at most (bus reads in flight plus elements read and not yet
        written on chip; buffer reads plus bus writes not yet acknowledged). One element a
        cycle needs ``depth`` above the bus latency plus about 5 cycles.

    Members
    -------
    writes : In(stream.Signature(WriteLayout))
        Register writes from the task manager (absolute word addresses).
    csr : In(CSRSignature)
        The host's access to ``DMA`` (offsets).
    task : In(EngineSignature())
        Start (``base`` and ``limit``: the window), done, error (a
        :class:`~npu_spec.dma.DmaError`), abort.
    bus : Out(WishboneSignature(30, mem_width))
        The system-memory bus (Wishbone B4 pipelined master).
    buf_read : Out(BufferReadSignature(1))
        Buffer reads (``BUF_TO_MEM``).
    buf_write : Out(stream.Signature(buffer_write_layout(1)))
        Buffer writes (``MEM_TO_BUF``).
    kmem_write : Out(stream.Signature(KernelWriteLayout))
        Kernel-memory writes (``MEM_TO_KMEM``).
    """

    def __init__(self, config, *, depth=32):
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self._config = config
        self._depth = depth
        self._control = EngineControl(DMA, read_path=config.csr_read)
        super().__init__({
            "writes":     In(stream.Signature(WriteLayout)),
            "csr":        In(CSRSignature(self._control.csr.addr.shape().width)),
            "task":       In(EngineSignature()),
            "bus":        Out(WishboneSignature(BUS_ADDR_BITS, config.mem_width)),
            "buf_read":   Out(BufferReadSignature(1)),
            "buf_write":  Out(stream.Signature(buffer_write_layout(1))),
            "kmem_write": Out(stream.Signature(KernelWriteLayout)),
        })

    @property
    def config(self):
        return self._config

    @property
    def depth(self):
        return self._depth

    @property
    def base(self):
        """Word address of the engine's registers on the register-write port."""
        return self._control.base

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine_control = ctl = self._control
        for name in ("writes", "csr", "task"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(ctl, name))

        # The sub-units, cleared by an abort and at the end of every task.
        finish = Signal()
        code = Signal.like(ctl.code)
        units = {
            "check": TransferCheck(self._config),
            "address": AddressGenerator(),
            "reader": MemoryReader(self._config.mem_width, self._depth),
            "writer": MemoryWriter(self._config.mem_width, self._depth),
        }
        for name, unit in units.items():
            m.submodules[name] = ResetInserter(ctl.flush | finish)(unit)
        check, gen, reader, writer = units.values()

        # The transfer registers, latched at the start (no reset: the sub-units look at them
        # only while a task runs); the window from the start beat.
        t = Signal(TransferLayout, reset_less=True)
        regs = ctl.regs
        with m.If(ctl.go):
            m.d.sync += [
                t.dir.eq(regs.mode.dir), t.fmt.eq(regs.mode.fmt), t.core.eq(regs.mode.core),
                t.mem_addr.eq(regs.mem_addr.addr), t.buf_addr.eq(regs.buf_addr.addr),
                t.sizes[0].eq(regs.size0.n0), t.sizes[1].eq(regs.size0.n1),
                t.sizes[2].eq(regs.size1.n2), t.sizes[3].eq(regs.size1.n3),
                t.sizes[4].eq(regs.size2.n4),
            ]
            for k in range(RANK):
                m.d.sync += [
                    t.mem_strides[k].eq(regs.port(f"MEM_STRIDE{k}").stride),
                    t.buf_strides[k].eq(regs.port(f"BUF_STRIDE{k}").stride),
                ]
        to_mem = t.dir == DmaDir.BUF_TO_MEM
        m.d.comb += [
            check.transfer.eq(t), check.limit.eq(ctl.entry.limit),
            gen.transfer.eq(t), gen.base.eq(ctl.entry.base),
            reader.fmt.eq(t.fmt), writer.fmt.eq(t.fmt),
        ]

        # Task sequence: check, then run until nothing is outstanding.
        unit_error = reader.error | writer.error
        unit_idle = reader.idle & writer.idle
        # No gating by the abort: an abort in the cycle of a done (possible when the task
        # manager sees ``done`` through a register) ends the task all the same.
        m.d.comb += [ctl.finish.eq(finish), ctl.code.eq(code)]
        checking = Signal()
        m.d.sync += checking.eq(ctl.go)
        m.d.comb += check.start.eq(checking)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(ctl.go):
                    m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(check.done):
                    with m.If(check.code != DmaError.NONE):
                        m.d.comb += [finish.eq(1), code.eq(check.code)]
                        m.next = "IDLE"
                    with m.Else():
                        m.d.comb += gen.start.eq(1)
                        m.next = "RUN"
                with m.If(ctl.flush):
                    m.next = "IDLE"
            with m.State("RUN"):
                with m.If(unit_idle & (unit_error | ~gen.busy)):
                    m.d.comb += [finish.eq(1),
                                 code.eq(Mux(unit_error, DmaError.BUS, DmaError.NONE))]
                    m.next = "IDLE"
                with m.If(ctl.flush):
                    m.next = "IDLE"

        # The elements to the reader or the writer, and the bus to the one that runs.
        for unit in (reader, writer):
            m.d.comb += unit.elements.payload.eq(gen.elements.payload)
        with m.If(to_mem):
            self._route(m, gen, writer, reader)
        with m.Else():
            self._route(m, gen, reader, writer)

        # The on-chip side. Buffer reads answered after an abort are dropped before the writer.
        self._buffer_reads(m, writer, ctl.flush)
        out = reader.out
        kmem = t.dir == DmaDir.MEM_TO_KMEM
        m.d.comb += [
            self.buf_write.payload.addr.eq(out.payload.chip),
            self.buf_write.payload.data[0].eq(out.payload.data[:16]),
            self.buf_write.payload.mask.eq(1),
            self.kmem_write.payload.core.eq(t.core),
            self.kmem_write.payload.addr.eq(out.payload.chip),
            self.kmem_write.payload.data.eq(out.payload.data),
        ]
        with m.If(kmem):
            m.d.comb += [self.kmem_write.valid.eq(out.valid), out.ready.eq(self.kmem_write.ready)]
        with m.Else():
            m.d.comb += [self.buf_write.valid.eq(out.valid), out.ready.eq(self.buf_write.ready)]
        return m

    def _buffer_reads(self, m, writer, flush):
        """Connect the writer's buffer reads; after ``flush`` drop the answers still due."""
        req, resp = self.buf_read.req, self.buf_read.resp
        due = Signal(range(2 * self._depth + 1))       # stale answers and new requests
        stale = Signal(range(2 * self._depth + 1))
        requested = req.valid & req.ready
        answered = resp.valid & resp.ready
        m.d.sync += due.eq(due + requested - answered)
        m.d.comb += [req.valid.eq(writer.buf_read.req.valid),
                     req.payload.eq(writer.buf_read.req.payload),
                     writer.buf_read.req.ready.eq(req.ready),
                     writer.buf_read.resp.payload.eq(resp.payload)]
        with m.If(stale != 0):
            m.d.comb += resp.ready.eq(1)
        with m.Else():
            m.d.comb += [writer.buf_read.resp.valid.eq(resp.valid),
                         resp.ready.eq(writer.buf_read.resp.ready)]
        with m.If(flush):
            m.d.sync += stale.eq(due + requested - answered)
        with m.Elif(answered & (stale != 0)):
            m.d.sync += stale.eq(stale - 1)

    def _route(self, m, gen, unit, other):
        """Give the generator's elements and the bus to ``unit``; ``other`` sees neither."""
        m.d.comb += [unit.elements.valid.eq(gen.elements.valid),
                     gen.elements.ready.eq(unit.elements.ready)]
        m.d.comb += [getattr(self.bus, name).eq(getattr(unit.bus, name)) for name in _BUS_REQUEST]
        m.d.comb += [getattr(unit.bus, name).eq(getattr(self.bus, name)) for name in _BUS_ANSWER]
        m.d.comb += other.bus.stall.eq(1)
