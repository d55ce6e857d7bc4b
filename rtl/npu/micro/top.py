"""The micro NPU: register file, task runner, DMA unit and engine units around one buffer and
one kernel memory (``docs/micro.md``)."""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu_spec import dataproc
from npu_spec.config import NPUConfig
from npu_spec.engine import ERROR_BITS, Engine
from npu_spec.micro import UNSUPPORTED

from ..lib.csr import CSRSignature
from .dma import MicroDMA
from .regfile import MicroRegisterFile
from .runner import MicroRunner
from .spram import ElementRAM
from .unit import unit_members

__all__ = ["MicroAbsent", "MicroNPU"]


class MicroAbsent(wiring.Component):
    """Stands for an engine the build leaves out: every task ends at once with
    :data:`npu_spec.micro.UNSUPPORTED`."""

    def __init__(self, *, kmem_read=False):
        super().__init__(unit_members(kmem_read=kmem_read))

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [self.done.eq(self.start), self.error.eq(UNSUPPORTED)]
        return m


class MicroNPU(wiring.Component):
    """The micro build of the NPU for ``config`` (the ``icebreaker`` preset's sizes).

    Parameters
    ----------
    config : NPUConfig
    neural, planar : wiring.Component, optional
        The neural unit (the ports of :func:`npu.micro.unit.unit_members` with
        ``kmem_read=True``) and the planar unit (without); a unit not given is
        :class:`MicroAbsent`, whose tasks end with ``UNSUPPORTED``. ``planar`` may be the
        neural unit itself when it was built with pooling (``MicroNeural(pooling=True)``):
        that one unit then runs the planar tasks too, started by its ``pool_start``.

    Members
    -------
    bus : In(CSRSignature(16))
        The host's register bus (``NPU_INFO`` and the task manager's queue 0 registers).
    irq : Out(1)
    mem_addr : Out(mem_addr_bits), mem_re : Out(1), mem_rdata : In(32), mem_wdata : Out(32),
    mem_we : Out(4)
        System memory (32-bit words, byte lanes; read data the cycle after ``mem_re``).
    """

    def __init__(self, config, *, neural=None, planar=None):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"Configuration must be an NPUConfig, not {config!r}")
        self._config = config
        self.regfile = MicroRegisterFile()
        self.runner = MicroRunner(config)
        self.dma = MicroDMA(config)
        self.neural = neural if neural is not None else MicroAbsent(kmem_read=True)
        self.planar = planar if planar is not None else MicroAbsent()
        self.buffer = ElementRAM(dataproc.buffer_elements(config))
        # (never read and written in one cycle: the DMA unit writes it only in a DMA task, the
        # neural unit reads it only in its own. Its read is an asynchronous port and a register,
        # which Yosys merges into the block RAM's synchronous port; "no_rw_check" lets it leave
        # a collision undefined instead of emulating the old word with flip-flops and a
        # multiplexer, which it does for a synchronous port's read-first collision.)
        self.kmem = Memory(shape=32, depth=config.kernel_kib * 256, init=[],
                           attrs={"no_rw_check": 1})
        self.mem_addr_bits = self.dma.mem_addr_bits
        super().__init__({
            "bus": In(CSRSignature(16)), "irq": Out(1),
            "mem_addr": Out(self.mem_addr_bits), "mem_re": Out(1), "mem_rdata": In(32),
            "mem_wdata": Out(32), "mem_we": Out(4),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        shared = self.planar is self.neural
        for name in ("regfile", "runner", "dma", "neural", "planar", "buffer", "kmem"):
            if not (shared and name == "planar"):
                m.submodules[name] = getattr(self, name)
        regfile, runner, dma = self.regfile, self.runner, self.dma
        # Each unit with the engines whose tasks it runs and the start it takes them by.
        ne_task = runner.engine == Engine.NEURAL
        pe_task = runner.engine == Engine.PLANAR
        dma_task = runner.engine == Engine.DMA
        if shared:
            m.d.comb += self.neural.pool_start.eq(runner.start & pe_task)
            units = [(self.neural, ne_task | pe_task, ne_task)]
        else:
            units = [(self.neural, ne_task, ne_task), (self.planar, pe_task, pe_task)]
        units.append((dma, dma_task, dma_task))

        # Host bus and register writes go to the runner and from it.
        wiring.connect(m, wiring.flipped(self.bus), runner.bus)
        m.d.comb += [self.irq.eq(runner.irq),
                     runner.ne_core0.eq(regfile.ne_core0),
                     dma.base.eq(runner.base), dma.limit.eq(runner.limit)]

        # The runner writes the register file while it reads a descriptor, the DMA unit (its
        # index counters) while it runs.
        with m.If(dma.reg_w_en):
            m.d.comb += [regfile.w_addr.eq(dma.reg_w_addr), regfile.w_data.eq(dma.reg_w_data),
                         regfile.w_en.eq(1)]
        with m.Else():
            m.d.comb += [regfile.w_addr.eq(runner.reg_w_addr),
                         regfile.w_data.eq(runner.reg_w_data), regfile.w_en.eq(runner.reg_w_en)]

        # The running unit owns the register-file read port and the buffer.
        buf = self.buffer
        done = Signal()
        error = Signal(ERROR_BITS)
        for unit, mine, starts in units:
            m.d.comb += [unit.start.eq(runner.start & starts), unit.reg_data.eq(regfile.r_data),
                         unit.buf_rdata.eq(buf.rdata)]
            with m.If(mine):
                m.d.comb += [regfile.r_addr.eq(unit.reg_addr), done.eq(unit.done),
                             error.eq(unit.error), buf.addr.eq(unit.buf_addr),
                             buf.wdata.eq(unit.buf_wdata), buf.we.eq(unit.buf_we & runner.running)]
        m.d.comb += [runner.done.eq(done & runner.running), runner.error.eq(error)]

        # Kernel memory: the DMA unit writes it, the neural unit reads it.
        k_w = self.kmem.write_port()
        k_r = self.kmem.read_port(domain="comb")
        k_data = Signal(32, reset_less=True)     # the synchronous read: see no_rw_check
        m.d.sync += k_data.eq(k_r.data)
        m.d.comb += [k_w.addr.eq(dma.kmem_waddr), k_w.data.eq(dma.kmem_wdata),
                     k_w.en.eq(dma.kmem_we), k_r.addr.eq(self.neural.kmem_addr),
                     self.neural.kmem_data.eq(k_data)]

        # System memory: the DMA unit while it runs, else the runner's descriptor reads.
        dma_owns = runner.running & dma_task
        m.d.comb += [dma.mem_rdata.eq(self.mem_rdata), runner.mem_rdata.eq(self.mem_rdata)]
        with m.If(dma_owns):
            m.d.comb += [self.mem_addr.eq(dma.mem_addr), self.mem_re.eq(dma.mem_re),
                         self.mem_wdata.eq(dma.mem_wdata), self.mem_we.eq(dma.mem_we)]
        with m.Else():
            m.d.comb += [self.mem_addr.eq(runner.mem_addr), self.mem_re.eq(runner.mem_re)]
        return m
