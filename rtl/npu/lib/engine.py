"""The one engine interface: how the task manager programs, starts and hears from an engine.

Every engine (neural engine cores, planar engine, and the data processor and DMA to come) has
the same three ports (``docs/architecture.md``, "One engine interface"):

* ``writes``: register writes from the task manager's register-write port
  (:data:`WriteLayout`, absolute word addresses; the engine takes those in its window);
* ``csr``: the host's CSR bus onto the engine's register map (offsets within the map);
* ``task``: ``In(EngineSignature())``: a start beat (:data:`TaskEntry`), a one-cycle ``done``
  with an ``error`` code (0: the task ran), ``done_mem`` from the task manager, and ``abort``.

:class:`EngineControl` implements all three for an engine: its register file, the merge of
host and task-manager accesses, and the task control (start, busy, done, error, cycle counter)
with the registers every engine shares (:func:`npu_spec.engine.control_registers`). The engine's
datapath sees ``go``, ``flush`` and the register file, and reports ``finish`` with a code.
"""

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.descriptors import HEADER
from npu_spec.engine import ERROR_BITS, TASK_OFFSET, Engine
from npu_spec.regmap import RegisterMap
from npu_spec.taskman import MAX_QUEUES

from .csr import CSRSignature, RegisterFile

__all__ = [
    "ADDR_WIDTH",
    "QUEUE_WIDTH",
    "SEQ_WIDTH",
    "EngineControl",
    "EngineSignature",
    "TaskEntry",
    "WriteLayout",
    "merge_writes",
]

#: Width of task sequence numbers (task buffer tags).
SEQ_WIDTH = 8
#: Width of a queue index.
QUEUE_WIDTH = (MAX_QUEUES - 1).bit_length()
#: Width of system-memory word addresses.
ADDR_WIDTH = 32


def _width(word, name):
    return unsigned(HEADER[word][name].width)


#: A task as the task buffer holds it and the engines receive it: the descriptor's header
#: fields, plus where it came from. ``src_mem`` and ``dst_mem`` on the engine start stream are
#: the resolved locations (switch rules 2 and 4 applied); ``dst_mem`` is only the static flag:
#: whether the output also goes to system memory is given by ``done_mem`` in the cycle the
#: engine signals ``done``.
TaskEntry = data.StructLayout({
    "seq":      unsigned(SEQ_WIDTH),
    "engine":   unsigned(Engine.bits),
    "dep":      _width(1, "dep"),
    "barrier":  unsigned(1),
    "queue":    unsigned(QUEUE_WIDTH),
    "task_id":  _width(1, "task_id"),
    "network":  _width(1, "network"),
    "tse":      unsigned(1),
    "spc":      unsigned(1),
    "dpc":      unsigned(1),
    "tsr":      unsigned(1),
    "spl":      unsigned(1),
    "src_mem":  unsigned(1),
    "dst_mem":  unsigned(1),
    "irq":      unsigned(1),
    "src":      _width(2, "src"),
    "src_len":  _width(2, "src_len"),
    "dst":      _width(3, "dst"),
    "base":     unsigned(ADDR_WIDTH),
    "limit":    unsigned(ADDR_WIDTH),
    "addr":     unsigned(ADDR_WIDTH),
})

#: One register write to the blocks: word ``addr`` gets ``data``; ``seq`` tags the task whose
#: program it belongs to.
WriteLayout = data.StructLayout({
    "addr": unsigned(16),
    "data": unsigned(32),
    "seq":  unsigned(SEQ_WIDTH),
})


def merge_writes(m, bus, csr, writes, base, size, *, hold=None):
    """Drive register-file bus ``bus`` from the host's CSR port ``csr`` (offsets) and, when
    the host is not accessing it, the task manager's write stream ``writes`` (absolute word
    addresses; those outside ``[base, base + size)`` are taken and dropped).

    ``hold(addr, in_window)`` returns a signal that keeps the write at ``addr`` waiting (a
    write to a running engine's registers). The read data and the error strobe answer the
    host's access of the cycle before."""
    host = csr.r_en | csr.w_en
    w = writes.payload
    offset = Signal(17)
    m.d.comb += offset.eq(w.addr - base)
    in_window = (w.addr >= base) & (offset < size)
    held = 0 if hold is None else hold(w.addr, in_window)
    m.d.comb += writes.ready.eq(~host & ~held)
    with m.If(host):
        m.d.comb += [bus.addr.eq(csr.addr), bus.w_data.eq(csr.w_data),
                     bus.w_en.eq(csr.w_en), bus.r_en.eq(csr.r_en)]
    with m.Else():
        m.d.comb += [bus.addr.eq(offset), bus.w_data.eq(w.data),
                     bus.w_en.eq(writes.valid & in_window)]
    host_last = Signal()
    m.d.sync += host_last.eq(host)
    m.d.comb += [csr.r_data.eq(bus.r_data), csr.error.eq(bus.error & host_last)]


class EngineSignature(wiring.Signature):
    """Dispatch interface to one engine, from the task manager's side.

    Members
    -------
    start : Out(stream.Signature(TaskEntry))
        Start a task (its program was sent on the register-write port, tagged ``seq``).
    done : In(1)
        One-cycle strobe: the running task ended; its output is in the data buffer.
    error : In(ERROR_BITS)
        Valid with ``done``: the engine's error code, 0 when the task ran.
    done_mem : Out(1)
        Combinational, valid in the cycle the task manager takes ``done`` (the cycle of
        ``done``, or the next one with ``NPUConfig.dispatch_regs``): the output must also be
        written to system memory (static DST_MEM, or rule 2: DPC while GTSP is set).
    abort : Out(1)
        One-cycle strobe: the watchdog aborted the running task; the engine drops it, clears
        its datapath and gives no ``done``.
    """

    def __init__(self):
        super().__init__({
            "start":    Out(stream.Signature(TaskEntry)),
            "done":     In(1),
            "error":    In(ERROR_BITS),
            "done_mem": Out(1),
            "abort":    Out(1),
        })


class EngineControl(wiring.Component):
    """Register file and task control of one engine.

    Parameters
    ----------
    regmap : RegisterMap
        The engine's register map; it begins with the shared control block (``CTRL``,
        ``STATUS``, ``CYCLES``) and its task registers start at ``TASK_OFFSET``.
    base : int or None
        Word address of this instance's registers on the register-write port (default the
        map's base; a second neural engine core sits further up).
    read_path : str
        The register file's read path (:class:`~npu.lib.csr.RegisterFile`; the
        configuration's ``csr_read``).

    Members
    -------
    csr : In(CSRSignature)
        Host access to the map (offsets). A host access wins over a register write in the same
        cycle, which waits.
    writes : In(stream.Signature(WriteLayout))
        Register writes from the task manager; writes outside ``[base, base + size)`` are
        taken and dropped; a write inside waits while a task runs and in the cycle one starts
        (the task manager programs an engine's next task while it runs another).
    task : In(EngineSignature())
        Start, done, error, done_mem, abort.
    go : Out(1)
        Combinational: a task starts in this cycle (a start beat or ``CTRL.start`` while not
        busy). The datapath samples its task registers now.
    entry : Out(TaskEntry)
        The start beat of the running task (zero when started by ``CTRL.start``).
    finish : In(1)
        The datapath ends the task in this cycle (drives ``task.done``).
    code : In(ERROR_BITS)
        With ``finish``: the error code (0: the task ran).
    flush : Out(1)
        One-cycle strobe: the task manager aborted the running task; clear the datapath.
    busy : Out(1)
        From the cycle after ``go`` to the cycle of ``finish`` (inclusive), or until ``flush``.

    ``STATUS.busy``, ``STATUS.error``, ``STATUS.error_code`` and ``CYCLES.count`` are driven
    here: the error status holds until the next start; ``CYCLES`` counts the busy cycles of the
    last (or running) task, from start to done.
    """

    def __init__(self, regmap, *, base=None, read_path="logic"):
        if not isinstance(regmap, RegisterMap):
            raise TypeError(f"regmap must be a RegisterMap, not {regmap!r}")
        for name in ("CTRL", "STATUS", "CYCLES"):
            if name not in regmap or regmap[name].offset >= TASK_OFFSET:
                raise ValueError(f"register map {regmap.name} has no control register {name} "
                                 f"below offset 0x{TASK_OFFSET:X}")
        self._regmap = regmap
        self._base = regmap.base if base is None else base
        self._regfile = RegisterFile(regmap, read_path=read_path)
        super().__init__({
            "csr":    In(CSRSignature(self._regfile.addr_width)),
            "writes": In(stream.Signature(WriteLayout)),
            "task":   In(EngineSignature()),
            "go":     Out(1),
            "entry":  Out(TaskEntry),
            "finish": In(1),
            "code":   In(ERROR_BITS),
            "flush":  Out(1),
            "busy":   Out(1),
        })

    @property
    def regmap(self):
        return self._regmap

    @property
    def base(self):
        return self._base

    @property
    def regs(self):
        """The register file: ``control.regs.port("NAME").field`` is a field's value."""
        return self._regfile

    def elaborate(self, platform):
        m = Module()
        m.submodules.regfile = regs = self._regfile

        # The host's accesses and the task manager's writes; a write to the engine's own
        # registers waits while a task runs (and in the cycle it starts): the next task's
        # program never changes the running task's registers.
        merge_writes(m, regs.bus, self.csr, self.writes, self._base, self._regmap.size,
                     hold=lambda addr, in_window: (self.busy | self.go) & in_window)

        # Task control.
        start = self.task.start
        m.d.comb += [
            start.ready.eq(~self.busy),
            self.go.eq(~self.busy & (start.valid | regs.ctrl.start)),
            self.flush.eq(self.busy & self.task.abort),
            self.task.done.eq(self.finish),
            self.task.error.eq(Mux(self.finish, self.code, 0)),
        ]
        with m.If(self.go):
            m.d.sync += [self.busy.eq(1), self.entry.eq(Mux(start.valid, start.payload, 0))]
        with m.Elif(self.finish | self.flush):
            m.d.sync += self.busy.eq(0)

        # Status and the cycle counter.
        error = Signal()
        error_code = Signal(ERROR_BITS)
        cycles = Signal(32)
        with m.If(self.go):
            m.d.sync += [error.eq(0), error_code.eq(0), cycles.eq(0)]
        with m.Elif(self.busy):
            m.d.sync += cycles.eq(cycles + 1)
        with m.If(self.finish & (self.code != 0)):
            m.d.sync += [error.eq(1), error_code.eq(self.code)]
        m.d.comb += [
            regs.status.busy.eq(self.busy),
            regs.status.error.eq(error),
            regs.status.error_code.eq(error_code),
            regs.cycles.count.eq(cycles),
        ]
        return m
