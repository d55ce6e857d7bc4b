"""The data processor: the buffer, its datasets and the engines' and the DMA's ports on it,
and the kernel memories (``docs/system.md``, "The buffer").

::

    writes / csr -> register file (DATA_PROCESSOR: datasets, NE_CORES)
                         | datasets
    NE core i: row_req/row_data <-> NEInPort  --read-->  +--------+
               out               -> NEOutPort --write--> |        |
    PE a, b, c                   <- PEReader  <--read--  | Buffer |
    PE out                       -> PEWriter  --write--> |        |
    DMA dma_read / dma_write     <---------------------> +--------+
    DMA kmem_write -> KernelMemories -> NE core i: kmem

The data processor is not an engine: it has no start or done of its own. Its registers are
written by the task manager (``writes``, absolute word addresses) and the host (``csr``,
offsets); a host access wins over a register write in the same cycle, which waits. The planar
engine's task start and done (``pe_start``, ``pe_done``) start and stop its operand readers.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.config import NPUConfig
from npu_spec.dataproc import (
    BASE,
    CORE_STRIDE,
    DATA_PROCESSOR,
    NE_CORES,
    PE_PORTS,
    buffer_banks,
    buffer_elements,
    ne_port_base,
    pe_port_base,
)
from npu_spec.neural import engine_geometry
from npu_spec.registers import ADDRESS_WINDOWS
from npu_spec.regmap import Register, RegisterMap

from ..lib.csr import CSRSignature, RegisterFile
from ..lib.engine import WriteLayout, merge_writes
from ..neural.layouts import (
    KernelReadSignature,
    row_data_layout,
    row_request_layout,
    row_tag_layout,
    row_write_layout,
)
from ..planar.layouts import beat_layout
from .buffer import Buffer
from .flow import COUNT_BITS, FlowControl
from .kmem import KernelMemories
from .ne_port import NEInPort, NEOutPort
from .pe_port import PEReader, PEWriter
from .ports import BufferReadSignature, DatasetLayout, KernelWriteLayout, buffer_write_layout

__all__ = ["DataProcessor", "NECoreSignature", "register_map"]


def register_map(cores):
    """``DATA_PROCESSOR`` with the dataset blocks of ``cores`` cores (the spec's map shows
    core 0; core ``i``'s block is ``CORE_STRIDE * i`` words further)."""
    core0 = [reg for reg in DATA_PROCESSOR.registers if reg.name.startswith("NE0_")]
    others = [reg for reg in DATA_PROCESSOR.registers if not reg.name.startswith("NE0_")]
    registers = [Register(reg.name.replace("NE0_", f"NE{i}_", 1), reg.fields,
                          offset=reg.offset + CORE_STRIDE * i, doc=reg.doc)
                 for i in range(cores) for reg in core0]
    return RegisterMap(DATA_PROCESSOR.name, registers + others, base=DATA_PROCESSOR.base,
                       doc=DATA_PROCESSOR.doc)


class NECoreSignature(wiring.Signature):
    """A neural engine core's data ports, from the core's side (as ``NeuralEngine`` has them).

    Members
    -------
    row_req : Out(stream.Signature(row_request_layout(tag)))
    row_data : In(stream.Signature(row_data_layout(row_values, tag)))
    out : Out(stream.Signature(row_write_layout(macs)))
    kmem : Out(KernelReadSignature())
    """

    def __init__(self, row_values, tag, macs):
        super().__init__({
            "row_req":  Out(stream.Signature(row_request_layout(tag))),
            "row_data": In(stream.Signature(row_data_layout(row_values, tag))),
            "out":      Out(stream.Signature(row_write_layout(macs))),
            "kmem":     Out(KernelReadSignature()),
        })


class DataProcessor(wiring.Component):
    """The data processor of a build.

    Parameters
    ----------
    config : NPUConfig
    row_values, buffer_rows : int or None
        The neural engine cores' input geometry (as given to ``NeuralEngine``; defaults
        ``npu_spec.neural.engine_geometry``): the row answers' width and the row tag.
    depth : int
        Runs each buffer read port may have in flight.

    Members
    -------
    writes : In(stream.Signature(WriteLayout))
        Register writes from the task manager (absolute word addresses; those outside the map
        are taken and dropped).
    csr : In(CSRSignature(12))
        The host's access to ``DATA_PROCESSOR`` (offsets).
    ne_cores : Out(32)
        ``NE_CORES.mask``: the cores a neural engine task starts.
    ne : In(NECoreSignature(row_values, tag, macs)).array(cores)
        Core ``i``'s data ports (connect with :meth:`connect_core`).
    pe_a, pe_b, pe_c : Out(stream.Signature(beat_layout(L)))
        The planar engine's operand streams (datasets ``PE_A``, ``PE_B``, ``PE_C``).
    pe_out : In(stream.Signature(beat_layout(L)))
        The planar engine's result stream (dataset ``PE_OUT``).
    pe_start, pe_done : In(1)
        One-cycle pulses: the planar engine starts a task (the operand readers and the result
        writer sample their datasets), and ends it (the readers drop what is left).
    dma_read : In(BufferReadSignature(1))
    dma_write : In(stream.Signature(buffer_write_layout(1)))
        The DMA's element reads and writes.
    kmem_write : In(stream.Signature(KernelWriteLayout))
        The DMA's kernel-memory word writes.
    ne_busy : In(cores); pe_busy : In(1)
        The cores and the planar engine run a task (from the cycle the start is taken to the
        cycle of ``done``): writes to their datasets wait meanwhile.
    """

    def __init__(self, config, *, row_values=None, buffer_rows=None, depth=4):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self._config = config
        max_rows, self.row_values, buffer_rows = engine_geometry(config, row_values,
                                                                 buffer_rows)
        self.tag_layout = row_tag_layout(max_rows, buffer_rows)
        self.lanes = config.planar_lanes ** 2
        self.elements = buffer_elements(config)
        self.width = buffer_banks(config, self.row_values)
        self._depth = depth
        self._regmap = register_map(config.cores)
        self._window = ADDRESS_WINDOWS["DATA_PROCESSOR"]
        beat = stream.Signature(beat_layout(self.lanes))
        super().__init__({
            "writes":     In(stream.Signature(WriteLayout)),
            "csr":        In(CSRSignature((self._window[1] - 1).bit_length())),
            "ne_cores":   Out(32),
            "ne_busy":    In(config.cores),
            "pe_busy":    In(1),
            "ne":         In(NECoreSignature(self.row_values, self.tag_layout,
                                             config.macs)).array(config.cores),
            "pe_a":       Out(beat),
            "pe_b":       Out(beat),
            "pe_c":       Out(beat),
            "pe_out":     In(beat),
            "pe_start":   In(1),
            "pe_done":    In(1),
            "dma_read":   In(BufferReadSignature(1)),
            "dma_write":  In(stream.Signature(buffer_write_layout(1))),
            "kmem_write": In(stream.Signature(KernelWriteLayout)),
        })

    @property
    def config(self):
        return self._config

    @property
    def regmap(self):
        """The register map of this build (:func:`register_map`)."""
        return self._regmap

    @property
    def base(self):
        """Word address of the registers on the register-write port."""
        return BASE

    def connect_core(self, m, engine, i):
        """Wire ``NeuralEngine`` ``engine``'s data ports to core ``i``'s ports in module
        ``m``."""
        for name in ("row_req", "row_data", "out", "kmem"):
            wiring.connect(m, getattr(engine, name), getattr(self.ne[i], name))

    def connect_planar(self, m, engine, *, task=True):
        """Wire ``PlanarEngine`` ``engine``'s streams in module ``m``; with ``task``, also
        ``pe_start`` and ``pe_done`` from its task port (a start beat taken, ``done``)."""
        for name in ("a", "b", "c"):
            wiring.connect(m, getattr(self, f"pe_{name}"), getattr(engine, name))
        wiring.connect(m, engine.out, self.pe_out)
        if task:
            start = engine.task.start
            m.d.comb += [self.pe_start.eq(start.valid & start.ready),
                         self.pe_done.eq(engine.task.done)]

    def _registers(self, m):
        """The register file, on the host's bus or else the task manager's writes."""
        m.submodules.regfile = regs = RegisterFile(self._regmap,
                                                   addr_width=len(self.csr.addr),
                                                   read_path=self._config.csr_read)
        # A write to the datasets of a running engine (or the core mask while a core runs)
        # waits until its task ends: the next task's program never changes a running task's.
        def hold(addr, in_map):
            held = self.ne_busy.any() & (addr == NE_CORES)
            for i in range(self._config.cores):
                lo = ne_port_base(i, "IN")
                held = held | (self.ne_busy[i] & (addr >= lo) & (addr < lo + CORE_STRIDE))
            lo = pe_port_base("A")
            return held | (self.pe_busy & (addr >= lo) & (addr < lo + 8 * len(PE_PORTS)))

        merge_writes(m, regs.bus, self.csr, self.writes, BASE, self._regmap.size, hold=hold)
        m.d.comb += self.ne_cores.eq(regs.port("NE_CORES").mask)
        return regs

    @staticmethod
    def _dataset(m, regs, prefix, flow=False):
        ds = Signal(DatasetLayout, name=prefix.lower())
        m.d.comb += [
            ds.addr.eq(regs.port(f"{prefix}_BASE").addr),
            ds.width.eq(regs.port(f"{prefix}_SHAPE0").width),
            ds.height.eq(regs.port(f"{prefix}_SHAPE0").height),
            ds.channels.eq(regs.port(f"{prefix}_SHAPE1").channels),
            ds.cstride.eq(regs.port(f"{prefix}_CSTRIDE").stride),
            ds.rstride.eq(regs.port(f"{prefix}_RSTRIDE").stride),
        ]
        if flow:
            m.d.comb += [ds.slots.eq(regs.port(f"{prefix}_SHAPE1").slots),
                         ds.planes.eq(regs.port(f"{prefix}_SHAPE1").planes)]
        return ds

    def _flow(self, m, ne_out):
        """The flow control between core 0's output dataset and the planar engine's operand
        ``A`` (``docs/system.md``, "Flow control"): started when core 0 starts a task whose
        output dataset has ``slots`` set; unit ``u`` of the producer is unit ``u`` of the
        consumer (window 1, stride 1, no padding); the unit counts are open-ended."""
        m.submodules.flow = flow = FlowControl()
        busy = self.ne_busy[0]
        was_busy = Signal()
        m.d.sync += was_busy.eq(busy)
        start = Signal()
        m.d.comb += start.eq(busy & ~was_busy & (ne_out.dataset.slots != 0))
        top = (1 << COUNT_BITS) - 1
        m.d.comb += [
            flow.start.eq(start),
            flow.params.rows.eq(top), flow.params.units.eq(top),
            flow.params.slots.eq(ne_out.dataset.slots),
            flow.params.kernel.eq(1), flow.params.stride.eq(1), flow.params.pad.eq(0),
            ne_out.flow_start.eq(start), ne_out.finish.eq(~busy),
            ne_out.may_produce.eq(flow.may_produce), flow.produce.eq(ne_out.produce),
        ]
        return flow

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        cores, L, n = cfg.cores, self.lanes, self.elements
        regs = self._registers(m)

        # The buffer's ports: reads NE IN of every core, PE A, B, C, DMA; writes NE OUT of
        # every core, PE OUT, DMA.
        # A core's rows wider than the banks are read and written a run of the banks at a time.
        in_lanes, out_lanes = min(self.row_values, self.width), min(cfg.macs, self.width)
        m.submodules.buffer = buf = Buffer(
            n, self.width, [in_lanes] * cores + [L] * 3 + [1],
            [out_lanes] * cores + [L, 1], depth=self._depth)
        for i in range(cores):
            ne_in = NEInPort(self.row_values, self.tag_layout, n, lanes=in_lanes,
                             depth=self._depth)
            ne_out = NEOutPort(cfg.macs, out_lanes, n)
            m.submodules[f"ne{i}_in"] = ne_in
            m.submodules[f"ne{i}_out"] = ne_out
            m.d.comb += [ne_in.dataset.eq(self._dataset(m, regs, f"NE{i}_IN")),
                         ne_out.dataset.eq(self._dataset(m, regs, f"NE{i}_OUT",
                                                         flow=i == 0))]
            core = self.ne[i]
            wiring.connect(m, wiring.flipped(core.row_req), ne_in.row_req)
            wiring.connect(m, ne_in.row_data, wiring.flipped(core.row_data))
            wiring.connect(m, wiring.flipped(core.out), ne_out.out)
            wiring.connect(m, ne_in.buf, buf.read_port(i))
            wiring.connect(m, ne_out.buf, buf.write_port(i))
            if i == 0:
                flow = self._flow(m, ne_out)

        # The planar engine's operand readers and result writer.
        for k, name in enumerate(PE_PORTS[:3]):
            reader = PEReader(L, n, depth=self._depth)
            m.submodules[f"pe_{name.lower()}"] = reader
            m.d.comb += [reader.dataset.eq(self._dataset(m, regs, f"PE_{name}",
                                                         flow=name == "A")),
                         reader.start.eq(self.pe_start), reader.stop.eq(self.pe_done)]
            if name == "A":
                m.d.comb += [reader.may_consume.eq(flow.may_consume),
                             flow.consume.eq(reader.consume)]
            wiring.connect(m, reader.buf, buf.read_port(cores + k))
            wiring.connect(m, reader.out, wiring.flipped(getattr(self, f"pe_{name.lower()}")))
        m.submodules.pe_writer = writer = PEWriter(L, n)
        m.d.comb += [writer.dataset.eq(self._dataset(m, regs, "PE_OUT")),
                     writer.start.eq(self.pe_start)]
        wiring.connect(m, wiring.flipped(self.pe_out), writer.beats)
        wiring.connect(m, writer.buf, buf.write_port(cores))

        # The DMA's ports.
        wiring.connect(m, wiring.flipped(self.dma_read), buf.read_port(cores + 3))
        wiring.connect(m, wiring.flipped(self.dma_write), buf.write_port(cores + 1))

        # Kernel memories.
        m.submodules.kmem = kmem = KernelMemories(cfg)
        wiring.connect(m, wiring.flipped(self.kmem_write), kmem.write)
        for i in range(cores):
            wiring.connect(m, wiring.flipped(self.ne[i].kmem), kmem.read[i])
        return m
