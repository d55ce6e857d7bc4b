"""The NPU top level (``docs/system.md``): composition only.

:class:`NPUInfo` is the host register file ``NPU_INFO`` (identification, the build's
configuration, a scratch register, bus-error interrupt status, the cycle counter and the task
trace). :class:`NPUTop` is the whole NPU.
"""

from amaranth.hdl import Cat, DomainRenamer, Module, Mux, ResetInserter, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.config import NPUConfig
from npu_spec.dataproc import DATA_PROCESSOR
from npu_spec.dma import DMA
from npu_spec.engine import ERROR_BITS, Engine
from npu_spec.neural import CORE_STRIDE, NEURAL_ENGINE, core_base
from npu_spec.planar import PLANAR_ENGINE
from npu_spec.registers import ADDRESS_WINDOWS, NPU_INFO, npu_info_values
from npu_spec.taskman import SLOT_WORDS

from .dataproc.dataproc import DataProcessor
from .dma.engine import DMAEngine
from .lib.csr import CSRDecoder, CSRSignature, RegisterFile
from .lib.engine import EngineSignature, WriteLayout
from .lib.gate import gated_domain
from .lib.pipe import SkidBuffer
from .lib.wishbone import Arbiter, WishboneSignature, WordReader
from .neural.cluster import CoreCluster
from .neural.engine import NeuralEngine
from .planar.engine import PlanarEngine
from .taskman.manager import TaskManager
from .trace import TraceEntry, TraceRecorder

__all__ = ["CORE_MODULE", "HOST_ADDR_BITS", "MEM_ADDR_BITS", "NPUInfo", "NPUTop", "StartRegister",
           "broadcast", "top_verilog"]

#: Width of the system-memory bus's word address.
MEM_ADDR_BITS = 30


class NPUInfo(wiring.Component):
    """The ``NPU_INFO`` register file: this build's constants, bus-error status, the cycle
    counter and the task trace.

    Members
    -------
    bus : In(CSRSignature(INFO_ADDR_BITS))
        Host register bus.
    irq : Out(1)
        High while any ``IRQ_STATUS`` bit is set.
    cycle : Out(32)
        The free-running cycle counter (``CYCLE``).
    trace : In(TraceEntry); trace_valid : In(1); trace_count : In(16); trace_overflow : In(1)
        The trace recorder's head and state.
    trace_pop, trace_clear : Out(1)
        The host's ``TRACE_CTRL`` commands.
    """

    def __init__(self, config):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self._config = config
        self._regfile = RegisterFile(NPU_INFO)
        super().__init__({
            "bus":            In(CSRSignature(self._regfile.addr_width)),
            "irq":            Out(1),
            "cycle":          Out(32),
            "trace":          In(TraceEntry),
            "trace_valid":    In(1),
            "trace_count":    In(16),
            "trace_overflow": In(1),
            "trace_pop":      Out(1),
            "trace_clear":    Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.regfile = regfile = self._regfile
        wiring.connect(m, wiring.flipped(self.bus), regfile.bus)
        reg = regfile.port

        m.d.sync += self.cycle.eq(self.cycle + 1)
        status, d0, d1, ctrl = (reg(name) for name in ("TRACE_STATUS", "TRACE_DATA0",
                                                       "TRACE_DATA1", "TRACE_CTRL"))
        m.d.comb += [
            reg("CYCLE").count.eq(self.cycle),
            status.count.eq(self.trace_count), status.overflow.eq(self.trace_overflow),
            d0.task_id.eq(self.trace.task_id), d0.engine.eq(self.trace.engine),
            d0.end.eq(self.trace.end), d0.error.eq(self.trace.error),
            d0.queue.eq(self.trace.queue), d0.valid.eq(self.trace_valid),
            d1.cycle.eq(self.trace.cycle),
            self.trace_pop.eq(ctrl.pop), self.trace_clear.eq(ctrl.clear),
        ]

        # Read-only fields: constants of this build.
        for reg_name, fields in npu_info_values(self._config).items():
            port = regfile.port(reg_name)
            for name, value in fields.items():
                m.d.comb += getattr(port, name).eq(value)

        # The error strobe comes a cycle after the access: remember which kind it was.
        was_read = Signal()
        was_write = Signal()
        m.d.sync += [was_read.eq(self.bus.r_en), was_write.eq(self.bus.w_en)]
        m.d.comb += [
            regfile.irq_status.bus_read_error_set.eq(self.bus.error & was_read),
            regfile.irq_status.bus_write_error_set.eq(self.bus.error & was_write),
            self.irq.eq(regfile.irq_status.bus_read_error | regfile.irq_status.bus_write_error),
        ]
        return m


#: Width of the host register bus's word address.
HOST_ADDR_BITS = 16


class StartRegister(wiring.Component):
    """A dispatch port with its start beat through a register (``NPUConfig.dispatch_regs``,
    ``docs/system.md``, "Dispatch registers").

    A beat taken on ``up`` is offered on ``down`` from the next cycle on; ``up.start.ready``
    is high only while the register is empty, so neither ``valid`` nor ``ready`` crosses it
    combinationally (a task start every other cycle at most, far more than an engine takes).
    An abort empties the register: the engine, still idle, sees only the abort. ``done``,
    ``error``, ``done_mem`` and ``abort`` pass as they are.

    Members
    -------
    up : In(EngineSignature())
        From the dispatcher (the task manager or the core cluster).
    down : Out(EngineSignature())
        To the engine.
    """

    up: In(EngineSignature())
    down: Out(EngineSignature())

    def elaborate(self, platform):
        m = Module()
        up, down = self.up, self.down
        full = Signal()
        # The beat is looked at only while ``full``: it needs no reset.
        entry = Signal.like(up.start.payload, reset_less=True)
        take = up.start.valid & ~full
        with m.If(take):
            m.d.sync += entry.eq(up.start.payload)
        with m.If(up.abort):
            m.d.sync += full.eq(0)
        with m.Elif(take):
            m.d.sync += full.eq(1)
        with m.Elif(down.start.ready):
            m.d.sync += full.eq(0)
        m.d.comb += [
            up.start.ready.eq(~full),
            down.start.valid.eq(full & ~up.abort), down.start.payload.eq(entry),
            up.done.eq(down.done), up.error.eq(down.error),
            down.done_mem.eq(up.done_mem), down.abort.eq(up.abort),
        ]
        return m


def _window(name, regmap_size, base=None):
    """A decoder window of the host bus: the map's registers, rounded up to a power of two."""
    start = ADDRESS_WINDOWS[name][0] if base is None else base
    return start, 1 << max(1, (regmap_size - 1).bit_length())


def broadcast(m, source, sinks):
    """Deliver every beat of stream ``source`` to all ``sinks`` at once: the beat moves when
    every sink is ready (a sink's ``ready`` must not depend on its ``valid``)."""
    all_ready = 1
    for sink in sinks:
        all_ready = all_ready & sink.ready
    m.d.comb += source.ready.eq(all_ready)
    for sink in sinks:
        m.d.comb += [sink.valid.eq(source.valid & all_ready), sink.payload.eq(source.payload)]


class NPUTop(wiring.Component):
    """The NPU (``docs/system.md``): the task manager, ``config.cores`` neural engine cores,
    the planar engine, the DMA engine and the data processor, behind a host register bus, an
    interrupt and one system-memory bus master.

    Parameters
    ----------
    config : NPUConfig
        At most 32 cores.
    trace_depth : int
        Entries of the task trace.
    shared : SharedModules or None
        Library of shared blocks (:class:`npu.lib.shared.SharedModules`; for Verilog and
        Verilator only, see :func:`top_verilog`): the neural engine cores are instances of one
        converted core, and the blocks pass the library on for their own repeated units.
    gate_clocks : bool
        For the system simulation only (``docs/system.md``, "Gated clocks in the system
        simulation"): the planar engine and each neural engine core run on a clock of their
        own that stops while they are idle (:func:`npu.lib.gate.gated_domain`), so that a
        Verilator model skips their logic. Same cycles and results; never for synthesis.
        Needs ``planar_boundary``.
    planar_boundary : bool or None
        Registers between the planar engine and the rest of the NPU (``docs/system.md``, "The
        planar engine's boundary registers"): they let the gated planar clock stop, and cost a
        few cycles per planar task and about two flip-flops per bit of the engine's streams.
        ``None`` (the default) means ``gate_clocks``: the system simulation has them in both
        of its builds (:class:`npu_sim.system.SystemSim` passes ``True``), synthesis and the
        board tops do not.

    Members
    -------
    bus : In(CSRSignature(HOST_ADDR_BITS))
        Host register bus (word addresses of ``docs/registers.md``).
    irq : Out(1)
        Interrupt: the task manager's or ``NPU_INFO``'s.
    mem : Out(WishboneSignature(MEM_ADDR_BITS, config.mem_width))
        System-memory master.
    """

    def __init__(self, config, *, trace_depth=64, shared=None, gate_clocks=False,
                 planar_boundary=None):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        if config.cores > 32:
            raise ValueError(f"the integrated NPU has at most 32 cores, not {config.cores}")
        self._config = config
        self._trace_depth = trace_depth
        self._shared = shared
        self._gate_clocks = bool(gate_clocks)
        self._planar_boundary = self._gate_clocks if planar_boundary is None else bool(
            planar_boundary)
        if self._gate_clocks and not self._planar_boundary:
            raise ValueError("gated clocks need the planar engine's boundary registers")
        super().__init__({
            "bus": In(CSRSignature(HOST_ADDR_BITS)),
            "irq": Out(1),
            "mem": Out(WishboneSignature(MEM_ADDR_BITS, config.mem_width)),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        m.submodules.info = info = NPUInfo(cfg)
        m.submodules.taskman = tm = TaskManager(cfg, slot_words=SLOT_WORDS)
        m.submodules.dataproc = dp = DataProcessor(cfg)
        pe = PlanarEngine(cfg, shared=self._shared)
        gate = self._gate_clocks
        m.submodules.planar = DomainRenamer("pe")(pe) if gate else pe
        m.submodules.dma = dma = DMAEngine(cfg)
        m.submodules.cluster = cluster = CoreCluster(cfg.cores)
        # Every core is built as core 0 (the writes it sees are moved into core 0's window),
        # so that one core's design can stand for all of them (``shared``).
        shared = self._shared
        cores = []
        for i in range(cfg.cores):
            holder = Module() if gate else m
            if shared is None:
                core = NeuralEngine(cfg, core=0)
                holder.submodules[f"core{i}"] = core
            else:
                core = shared.get(CORE_MODULE, lambda: NeuralEngine(cfg, core=0, shared=shared))
                core = core.instance(holder, f"core{i}")
            if gate:
                m.submodules[f"core{i}_clock"] = DomainRenamer(f"ne{i}")(holder)
            cores.append(core)

        # Host registers.
        windows = {
            "NPU_INFO": _window("NPU_INFO", NPU_INFO.size),
            "TASK_MANAGER": _window("TASK_MANAGER", tm.regmap.size),
            "PLANAR_ENGINE": _window("PLANAR_ENGINE", PLANAR_ENGINE.size),
            "DATA_PROCESSOR": _window("DATA_PROCESSOR", DATA_PROCESSOR.size),
            "DMA": _window("DMA", DMA.size),
        }
        for i in range(cfg.cores):
            windows[f"NE{i}"] = _window("NEURAL_ENGINE", NEURAL_ENGINE.size, core_base(i))
        m.submodules.decoder = decoder = CSRDecoder(windows, HOST_ADDR_BITS)
        wiring.connect(m, wiring.flipped(self.bus), decoder.bus)
        targets = {"NPU_INFO": info, "TASK_MANAGER": tm, "PLANAR_ENGINE": pe,
                   "DATA_PROCESSOR": dp, "DMA": dma}
        targets.update({f"NE{i}": core for i, core in enumerate(cores)})
        for name, block in targets.items():
            port = block.bus if name == "NPU_INFO" else block.csr
            _connect_csr(m, decoder.target(name), port)

        # Register writes from descriptors reach every block; each takes its own window.
        core_writes = [stream.Signature(WriteLayout).flip().create(path=(f"core{i}_writes",))
                       for i in range(cfg.cores)]
        broadcast(m, tm.writes, [dp.writes, pe.writes, dma.writes] + core_writes)
        for i, (w, core) in enumerate(zip(core_writes, cores)):
            offset = w.payload.addr - core_base(i)
            mine = (w.payload.addr >= core_base(i)) & (offset < CORE_STRIDE)
            m.d.comb += [
                core.writes.valid.eq(w.valid), w.ready.eq(core.writes.ready),
                core.writes.payload.eq(w.payload),
                # Another core's writes go nowhere (address 0 lies in no engine's window).
                core.writes.payload.addr.eq(Mux(mine, core_base(0) + offset, 0)),
            ]

        # Dispatch.
        wiring.connect(m, tm.ne, cluster.task)
        for i, core in enumerate(cores):
            if cfg.dispatch_regs:
                m.submodules[f"core{i}_start"] = reg = StartRegister()
                wiring.connect(m, cluster.core[i], reg.up)
                wiring.connect(m, reg.down, core.task)
            else:
                wiring.connect(m, cluster.core[i], core.task)
        m.d.comb += cluster.mask.eq(dp.ne_cores)
        if self._planar_boundary:
            boundary = _planar_boundary(m, tm.pe, pe, "pe" if gate else "sync")
        else:
            boundary = _planar_direct(m, tm.pe, pe)
        wiring.connect(m, tm.dma, dma.task)

        # Writes to a running engine's datasets wait for its task's end.
        ne_running = [_running(m, cluster.core[i], f"core{i}_running") for i in range(cfg.cores)]
        pe_running = _running(m, tm.pe, "pe_running")
        for i in range(cfg.cores):
            m.d.comb += dp.ne_busy[i].eq(ne_running[i])
        m.d.comb += dp.pe_busy.eq(pe_running)
        if gate:
            _gate_engines(m, decoder, tm, cluster, pe, pe_running, cores, ne_running,
                          boundary.activity)

        # Data: every engine's ports on the data processor.
        for i, core in enumerate(cores):
            dp.connect_core(m, core, i)
        dp.connect_planar(m, boundary, task=False)
        m.d.comb += [dp.pe_start.eq(tm.pe.start.valid & tm.pe.start.ready),
                     dp.pe_done.eq(tm.pe.done | tm.pe.abort)]
        wiring.connect(m, dma.buf_read, dp.dma_read)
        wiring.connect(m, dma.buf_write, dp.dma_write)
        wiring.connect(m, dma.kmem_write, dp.kmem_write)

        # System memory: descriptor fetch and DMA share the master.
        m.submodules.fetch_port = reader = WordReader(cfg.mem_width)
        # Descriptor addresses are 32-bit word addresses; the bus reaches 2**30 of them.
        m.d.comb += [reader.req.valid.eq(tm.mem.req.valid), tm.mem.req.ready.eq(reader.req.ready),
                     reader.req.payload.eq(tm.mem.req.payload)]
        wiring.connect(m, reader.resp, tm.mem.resp)
        m.submodules.arbiter = arbiter = Arbiter(2, MEM_ADDR_BITS, cfg.mem_width)
        wiring.connect(m, reader.bus, arbiter.masters[0])
        wiring.connect(m, dma.bus, arbiter.masters[1])
        wiring.connect(m, arbiter.bus, wiring.flipped(self.mem))

        # Trace and interrupt.
        m.submodules.trace = trace = TraceRecorder(len(Engine), self._trace_depth)
        for e, port in enumerate((tm.ne, tm.pe, tm.dma)):
            trace.watch(m, e, port)
        m.d.comb += [
            trace.cycle.eq(info.cycle), trace.pop.eq(info.trace_pop),
            trace.clear.eq(info.trace_clear),
            info.trace.eq(trace.head), info.trace_valid.eq(trace.head_valid),
            info.trace_count.eq(trace.count), info.trace_overflow.eq(trace.overflow),
            self.irq.eq(info.irq | tm.irq),
        ]
        return m


def _gate_engines(m, decoder, tm, cluster, pe, pe_running, cores, ne_running, pe_boundary):
    """The gated clocks of the planar engine (domain ``pe``) and of the cores (``ne0``, ...):
    each runs while its engine may change state (``docs/system.md``, "Gated clocks in the
    system simulation"): its task runs or is offered or aborted, a register write or a host
    access reaches it, a stream beat is offered to it or by it, a kernel memory read is
    answered; after a host write to its registers (a start by ``CTRL.start`` is not seen on the
    dispatch port) it never stops again."""
    def activity(name, window, task, running, signals, **kwargs):
        csr = decoder.target(window)
        touched = Signal(name=f"{name}_host_written")
        with m.If(csr.w_en):
            m.d.sync += touched.eq(1)
        act = Signal(name=f"{name}_activity")
        m.d.comb += act.eq(Cat(running, task.start.valid, task.abort, csr.r_en, csr.w_en,
                               touched, *signals).any())
        gated_domain(m, name, act, **kwargs)

    # The planar engine's domain has no reset (it only sees registers at its boundary,
    # ``_planar_boundary``, so none of its logic is evaluated on ``sync`` edges).
    activity("pe", "PLANAR_ENGINE", tm.pe, pe_running,
             [port.valid for port in (pe.writes, pe.a, pe.b, pe.c, pe.out)] + pe_boundary,
             power_on=True)
    for i, core in enumerate(cores):
        activity(f"ne{i}", f"NE{i}", cluster.core[i], ne_running[i],
                 [port.valid for port in (core.writes, core.row_data, core.row_req, core.out)]
                 + [core.kmem.en])


class _PlanarBoundary:
    """The data processor's view of the planar engine (``a``, ``b``, ``c``, ``out``: the
    outer ends of the boundary registers) and the signals that must run its clock."""

    def __init__(self, slices, activity):
        for name, port in slices.items():
            setattr(self, name, port)
        self.activity = activity


def _planar_boundary(m, task, pe, domain):
    """Registers between the planar engine and the rest of the NPU, in the engine's clock
    domain ``domain`` (``docs/system.md``, "The planar engine's boundary registers"): a
    :class:`~npu.lib.pipe.SkidBuffer` on each operand stream and on the result stream, and
    the task manager's ``abort`` one cycle late. Every input of the engine's datapath is then
    a register of its own domain. The engine's ``done`` reaches task port ``task`` once the
    result slice is empty (the task's output is in the data buffer); the operand slices are
    emptied at the task's end, as the data processor's readers are."""
    aborted = Signal(name="pe_abort_late")
    m.d[domain] += aborted.eq(task.abort)
    aborting = task.abort | aborted
    ended = task.done | task.abort
    slices = {}
    for name in ("a", "b", "c", "out"):
        skid = SkidBuffer(getattr(pe, name).payload.shape())
        flush = aborting if name == "out" else ended
        block = ResetInserter(flush)(skid)
        if domain != "sync":
            block = DomainRenamer(domain)(block)
        m.submodules[f"pe_{name}_slice"] = block
        slices[name] = skid
    for name in ("a", "b", "c"):
        wiring.connect(m, slices[name].o, getattr(pe, name))
    wiring.connect(m, pe.out, slices["out"].i)

    # Start and done_mem pass; abort is late; done waits for the result slice to empty.
    wiring.connect(m, task.start, pe.task.start)
    m.d.comb += [pe.task.done_mem.eq(task.done_mem), pe.task.abort.eq(aborted)]
    pending = Signal(name="pe_done_pending")
    pending_error = Signal(ERROR_BITS, name="pe_done_error")
    out = slices["out"]
    draining = out.i.valid | out.o.valid
    # (The task manager's abort already waits for a done of the same cycle: not masked here.)
    finished = (pe.task.done | pending) & ~aborted
    release = finished & ~draining
    error = Mux(pending, pending_error, pe.task.error)
    m.d.comb += [task.done.eq(release), task.error.eq(Mux(release, error, 0))]
    with m.If(aborting | release):
        m.d.sync += pending.eq(0)
    with m.Elif(pe.task.done):
        m.d.sync += [pending.eq(1), pending_error.eq(pe.task.error)]
    activity = ([slices[name].i.valid for name in ("a", "b", "c")]
                + [out.o.valid, pending, task.done, aborted])
    return _PlanarBoundary({"a": slices["a"].i, "b": slices["b"].i, "c": slices["c"].i,
                            "out": out.o}, activity)


def _planar_direct(m, task, pe):
    """The planar engine on the task port ``task`` without boundary registers (synthesis);
    its streams are its own."""
    wiring.connect(m, task, pe.task)
    return _PlanarBoundary({"a": pe.a, "b": pe.b, "c": pe.c, "out": pe.out}, [])


def _running(m, port, name):
    """High from the cycle a start is taken on dispatch port ``port`` to its ``done`` (or
    abort)."""
    busy = Signal(name=name)
    started = port.start.valid & port.start.ready
    with m.If(started):
        m.d.sync += busy.eq(1)
    with m.Elif(port.done | port.abort):
        m.d.sync += busy.eq(0)
    return busy | started


def _connect_csr(m, source, target):
    """A decoder window onto a block's CSR port (the window may be wider than the port)."""
    m.d.comb += [
        target.addr.eq(source.addr), target.w_data.eq(source.w_data),
        target.w_en.eq(source.w_en), target.r_en.eq(source.r_en),
        source.r_data.eq(target.r_data), source.error.eq(target.error),
    ]


#: Verilog module name of a neural engine core shared by all cores (``top_verilog``).
CORE_MODULE = "npu_neural_core"


def top_verilog(config, *, name="top", wrap=None):
    """Verilog of the whole NPU (or of ``wrap(NPUTop)``, a bench holding it), repeated blocks
    converted once and instantiated by name (:class:`npu.lib.shared.SharedModules`): the core
    (``config.cores`` instances) and within it the MAC unit (``config.macs``)."""
    from amaranth.back import verilog

    from .lib.shared import SharedModules
    shared = SharedModules()
    top = NPUTop(config, shared=shared)
    design = wrap(top) if wrap else top
    text = verilog.convert(design, name=name, emit_src=False)
    return text + "\n" + shared.verilog()
