"""System simulation: the whole NPU with its system memory, driven like a host drives it.

:class:`SystemBench` holds :class:`npu.top.NPUTop` and a :class:`npu_sim.sysmem.SystemMemory`
(latency and random stalls inside the simulated design) behind one command stream and one
response stream, so a run needs no Python per cycle: under Verilator
(:class:`npu_sim.verilator.StreamBench`) the commands come from a file. The Amaranth simulator
runs the same bench for small cases.

Command beats (:func:`command_layout`): ``op``, ``addr`` (32 bits), ``data`` (``max(64,
mem_width)`` bits)

=========  =======================================================================================
op         meaning
=========  =======================================================================================
WRITE      host register write: word ``addr`` gets ``data[0:32]``
READ       host register read of ``addr``; answers a WORD beat
POLL       read ``addr`` until ``(word & data[0:32]) == data[32:64]`` holds for four reads in a
           row; answers a WORD beat with the bench cycle of the last read
DRAIN      POLL that also drains the trace buffer: before each read of ``addr`` it reads
           ``TRACE_DATA0``; while an entry is there it answers a TRACE beat (``TRACE_DATA0`` in
           ``data[0:32]``, ``TRACE_DATA1`` in ``data[32:64]``) and pops it. The condition
           counts only on reads that follow an empty buffer, so the trace is empty at the end
MEM_WRITE  system-memory word ``addr`` (``mem_width`` bits) gets ``data``
MEM_READ   answers ``data[0:32]`` DATA beats: memory words ``addr``, ``addr + 1``, ...
STALL      the memory stalls a cycle with probability ``data[0:8] / 256``
COUNT      answers a WORD beat with bench counter ``addr`` (:class:`Counter`)
=========  =======================================================================================

Response beats (:func:`response_layout`): ``tag`` (:class:`Tag`: DATA, WORD or TRACE) and
``data``. TRACE beats come at any time during a DRAIN; a run's expected number of answers
counts the others only (:class:`npu_sim.verilator.StreamBench`'s ``uncounted_bit``).
"""

import enum
import os

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu.top import NPUTop
from npu_spec.registers import NPU_INFO

from .sysmem import SystemMemory

__all__ = ["Counter", "SysOp", "SystemBench", "SystemCommands", "Tag", "command_layout",
           "response_layout"]


class SysOp(enum.IntEnum):
    """Command codes (see the module documentation)."""
    WRITE = 0
    READ = 1
    POLL = 2
    MEM_WRITE = 3
    MEM_READ = 4
    STALL = 5
    COUNT = 6
    DRAIN = 7


class Tag(enum.IntEnum):
    """Response beat tags."""
    DATA = 0        # a MEM_READ word
    WORD = 1        # the answer of READ, POLL, DRAIN and COUNT
    TRACE = 2       # a trace entry drained by DRAIN (not counted in a run's expected answers)


class Counter(enum.IntEnum):
    """Bench counters (``COUNT``)."""
    CYCLE = 0           # cycles since reset
    BUS_BYTES = 1       # bytes of the bus requests taken (the set ``sel`` bits)
    BUS_STALL = 2       # cycles a bus request was presented and stalled


#: Reads in a row a POLL condition must hold.
POLL_STABLE = 4


def _data_width(mem_width):
    return max(64, mem_width)


def command_layout(mem_width):
    return data.StructLayout({"op": 4, "addr": 32, "data": _data_width(mem_width)})


def response_layout(mem_width):
    return data.StructLayout({"tag": 2, "data": _data_width(mem_width)})


class SystemBench(wiring.Component):
    """The NPU and its system memory behind a command and a response stream.

    Parameters
    ----------
    config : NPUConfig
    latency : int
        System-memory latency in cycles (at least 1).
    mem_words : int or None
        System-memory size in ``mem_width`` words (default ``config.mem_kib``).
    shared : SharedModules or None
        Library of shared blocks of the NPU (``npu.lib.shared``; Verilator only).
    gate_clocks : bool
        The NPU's engines on gated clocks (``NPUTop(gate_clocks=True)``; Verilator only).
        Both builds have the planar engine's boundary registers (``planar_boundary``).
    storage : str
        The system memory's storage (:class:`~npu_sim.sysmem.SystemMemory`): ``"gateware"``
        or ``"dpi"`` (kept by the Verilator bench; Verilator only).

    Members
    -------
    cmd : In(stream.Signature(command_layout(mem_width)))
    res : Out(stream.Signature(response_layout(mem_width)))
    active : Out(1)
        The task manager is busy (counted by the Verilator harness).
    """

    def __init__(self, config, *, latency=1, mem_words=None, shared=None, gate_clocks=False,
                 storage="gateware"):
        self.config = config
        self.shared = shared
        self.gate_clocks = gate_clocks
        self.storage = storage
        self.latency = latency
        self.mem_words = mem_words or config.mem_kib * 1024 * 8 // config.mem_width
        width = config.mem_width
        super().__init__({
            "cmd": In(stream.Signature(command_layout(width))),
            "res": Out(stream.Signature(response_layout(width))),
            "active": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        # The planar engine's boundary registers in both builds, so that gated and
        # free-running runs take the same cycles (board tops and synthesis have none).
        m.submodules.npu = npu = NPUTop(cfg, shared=self.shared, gate_clocks=self.gate_clocks,
                                        planar_boundary=True)
        m.submodules.memory = mem = SystemMemory(self.mem_words, cfg.mem_width, self.latency,
                                                 storage=self.storage)
        wiring.connect(m, npu.mem, mem.bus)
        host = npu.bus
        cmd = self.cmd.payload

        # Counters.
        cycle = Signal(32)
        bus_bytes = Signal(32)
        bus_stall = Signal(32)
        m.d.sync += cycle.eq(cycle + 1)
        bus = npu.mem
        with m.If(bus.cyc & bus.stb & ~bus.stall):
            m.d.sync += bus_bytes.eq(bus_bytes + sum(bus.sel[k] for k in range(len(bus.sel))))
        with m.If(bus.cyc & bus.stb & bus.stall):
            m.d.sync += bus_stall.eq(bus_stall + 1)
        m.d.comb += self.active.eq(0)

        # The single answer register: one WORD or DATA beat at a time.
        out = Signal(response_layout(cfg.mem_width))
        out_valid = Signal()
        m.d.comb += [self.res.valid.eq(out_valid), self.res.payload.eq(out)]
        with m.If(self.res.ready):
            m.d.sync += out_valid.eq(0)
        free = ~out_valid | self.res.ready

        stall_prob = Signal(8)
        m.d.comb += mem.stall_prob.eq(stall_prob)
        m.d.comb += [host.addr.eq(cmd.addr), host.w_data.eq(cmd.data[:32]),
                     mem.host.addr.eq(cmd.addr), mem.host.w_data.eq(cmd.data)]
        left = Signal(32)           # MEM_READ words still to read
        stable = Signal(range(POLL_STABLE + 1))
        word = Signal(32)
        with m.FSM():
            with m.State("COMMAND"):
                with m.If(self.cmd.valid):
                    with m.Switch(cmd.op):
                        with m.Case(SysOp.WRITE):
                            m.d.comb += [host.w_en.eq(1), self.cmd.ready.eq(1)]
                        with m.Case(SysOp.READ):
                            with m.If(free):
                                m.d.comb += [host.r_en.eq(1), self.cmd.ready.eq(1)]
                                m.next = "READ"
                        with m.Case(SysOp.POLL):
                            m.d.comb += host.r_en.eq(1)
                            m.d.sync += stable.eq(0)
                            m.next = "POLL"
                        with m.Case(SysOp.DRAIN):
                            m.d.comb += [host.addr.eq(NPU_INFO["TRACE_DATA0"].offset),
                                         host.r_en.eq(1)]
                            m.d.sync += stable.eq(0)
                            m.next = "DRAIN_HEAD"
                        with m.Case(SysOp.MEM_WRITE):
                            m.d.comb += [mem.host.w_en.eq(1), self.cmd.ready.eq(1)]
                        with m.Case(SysOp.MEM_READ):
                            m.d.sync += [left.eq(cmd.data[:32]), word.eq(cmd.addr)]
                            m.d.comb += self.cmd.ready.eq(1)
                            m.next = "MEM_READ"
                        with m.Case(SysOp.STALL):
                            m.d.sync += stall_prob.eq(cmd.data[:8])
                            m.d.comb += self.cmd.ready.eq(1)
                        with m.Case(SysOp.COUNT):
                            with m.If(free):
                                m.d.comb += self.cmd.ready.eq(1)
                                m.d.sync += [out_valid.eq(1), out.tag.eq(Tag.WORD)]
                                with m.Switch(cmd.addr):
                                    with m.Case(Counter.CYCLE):
                                        m.d.sync += out.data.eq(cycle)
                                    with m.Case(Counter.BUS_BYTES):
                                        m.d.sync += out.data.eq(bus_bytes)
                                    with m.Case(Counter.BUS_STALL):
                                        m.d.sync += out.data.eq(bus_stall)
                                    with m.Default():
                                        m.d.sync += out.data.eq(0)
                        with m.Default():
                            m.d.comb += self.cmd.ready.eq(1)
            with m.State("READ"):
                m.d.sync += [out_valid.eq(1), out.tag.eq(Tag.WORD), out.data.eq(host.r_data)]
                m.next = "COMMAND"
            with m.State("POLL"):
                # host.r_data answers the read of the cycle before; read again meanwhile.
                hold = (host.r_data & cmd.data[:32]) == cmd.data[32:64]
                with m.If(hold & (stable == POLL_STABLE - 1)):
                    with m.If(free):
                        m.d.comb += self.cmd.ready.eq(1)
                        m.d.sync += [out_valid.eq(1), out.tag.eq(Tag.WORD), out.data.eq(cycle)]
                        m.next = "COMMAND"
                    with m.Else():
                        m.d.comb += host.r_en.eq(1)
                with m.Else():
                    m.d.comb += host.r_en.eq(1)
                    m.d.sync += stable.eq(hold * (stable + 1))
            self._drain_states(m, host, cmd, stable, free, out, out_valid, cycle)
            with m.State("MEM_READ"):
                # One word in flight at a time: read, then send.
                with m.If(left == 0):
                    m.next = "COMMAND"
                with m.Elif(free):
                    m.d.comb += [mem.host.addr.eq(word), mem.host.r_en.eq(1)]
                    m.next = "MEM_DATA"
            with m.State("MEM_DATA"):
                m.d.comb += mem.host.addr.eq(word)
                m.d.sync += [out_valid.eq(1), out.tag.eq(Tag.DATA), out.data.eq(mem.host.r_data),
                             word.eq(word + 1), left.eq(left - 1)]
                m.next = "MEM_READ"
        return m

    def _drain_states(self, m, host, cmd, stable, free, out, out_valid, cycle):
        """The states of DRAIN: read ``TRACE_DATA0``; an entry is answered and popped, else
        the polled register is read and counts towards the condition."""
        d0 = NPU_INFO["TRACE_DATA0"]
        entry = Signal(64)

        def read(addr):
            m.d.comb += [host.addr.eq(addr), host.r_en.eq(1)]

        with m.State("DRAIN_HEAD"):
            # host.r_data is TRACE_DATA0.
            with m.If(host.r_data[d0["valid"].offset]):
                m.d.sync += entry[:32].eq(host.r_data)
                read(NPU_INFO["TRACE_DATA1"].offset)
                m.next = "DRAIN_CYCLE"
            with m.Else():
                read(cmd.addr)
                m.next = "DRAIN_POLL"
        with m.State("DRAIN_CYCLE"):
            m.d.sync += entry[32:].eq(host.r_data)
            m.next = "DRAIN_SEND"
        with m.State("DRAIN_SEND"):
            with m.If(free):
                m.d.sync += [out_valid.eq(1), out.tag.eq(Tag.TRACE), out.data.eq(entry)]
                ctrl = NPU_INFO["TRACE_CTRL"]
                m.d.comb += [host.addr.eq(ctrl.offset), host.w_data.eq(ctrl.pack(pop=1)),
                             host.w_en.eq(1)]
                m.next = "DRAIN_POPPED"
        with m.State("DRAIN_POPPED"):
            # The pop takes effect a cycle after the write: read the next head a cycle later.
            m.next = "DRAIN_NEXT"
        with m.State("DRAIN_NEXT"):
            read(d0.offset)
            m.next = "DRAIN_HEAD"
        with m.State("DRAIN_POLL"):
            # host.r_data is the polled register, read right after an empty trace.
            hold = (host.r_data & cmd.data[:32]) == cmd.data[32:64]
            with m.If(hold & (stable == POLL_STABLE - 1)):
                with m.If(free):
                    m.d.comb += self.cmd.ready.eq(1)
                    m.d.sync += [out_valid.eq(1), out.tag.eq(Tag.WORD), out.data.eq(cycle)]
                    m.next = "COMMAND"
                with m.Else():
                    read(cmd.addr)
            with m.Else():
                m.d.sync += stable.eq(hold * (stable + 1))
                read(d0.offset)
                m.next = "DRAIN_HEAD"


class SystemCommands:
    """Command beats for a :class:`SystemBench`, and the parsing of its answers.

    Each method appends a command and returns ``self``; :meth:`parse` turns the response
    words of a run into one record per answering command, in order: ``("read", word)``,
    ``("poll", cycle)``, ``("count", value)``, ``("mem", [words])``, and a record
    ``("trace", None, (data0, data1))`` for each trace entry a DRAIN answered, where it came.
    """

    def __init__(self, mem_width):
        self.mem_width = mem_width
        self._layout = command_layout(mem_width)
        self._dw = _data_width(mem_width)
        self.beats = []
        self._answers = []

    def _cmd(self, op, addr=0, value=0):
        self.beats.append(self._layout.const({"op": op, "addr": addr, "data": value}).as_bits())
        return self

    def write(self, addr, value):
        return self._cmd(SysOp.WRITE, addr, value & 0xFFFF_FFFF)

    def writes(self, pairs):
        for addr, value in pairs:
            self.write(addr, value)
        return self

    def read(self, addr, label=None):
        self._answers.append(("read", 1, label))
        return self._cmd(SysOp.READ, addr)

    def poll(self, addr, mask, value, label=None):
        self._answers.append(("poll", 1, label))
        return self._cmd(SysOp.POLL, addr, (mask & 0xFFFF_FFFF) | (value & 0xFFFF_FFFF) << 32)

    def drain(self, addr, mask, value, label=None):
        """POLL that drains the trace buffer meanwhile (TRACE beats, see :meth:`parse`)."""
        self._answers.append(("poll", 1, label))
        return self._cmd(SysOp.DRAIN, addr, (mask & 0xFFFF_FFFF) | (value & 0xFFFF_FFFF) << 32)

    def mem_write(self, word, value):
        return self._cmd(SysOp.MEM_WRITE, word, value)

    def mem_read(self, word, count, label=None):
        self._answers.append(("mem", count, label))
        return self._cmd(SysOp.MEM_READ, word, count)

    def stall(self, probability):
        return self._cmd(SysOp.STALL, 0, min(255, int(round(probability * 256))))

    def count(self, counter, label=None):
        self._answers.append(("count", 1, label))
        return self._cmd(SysOp.COUNT, int(counter))

    @property
    def expected(self):
        """Answer beats of the commands, TRACE beats not counted."""
        return sum(n for _, n, _ in self._answers)

    def parse(self, responses):
        """Records ``(kind, label, value)`` in command order."""
        layout = response_layout(self.mem_width)
        tag, shift = layout["tag"], layout["data"].offset
        tag_mask = (1 << tag.width) - 1
        records = []
        answers = iter(self._answers)

        def take():
            """The next answer that needs beats, ``[kind, n, label, words]``; answers of no
            beats (a MEM_READ of 0 words) are complete at once."""
            for kind, n, label in answers:
                if n:
                    return (kind, n, label, [])
                records.append((kind, label, []))
            return None

        pending = take()
        for r in responses:
            r = int(r)
            value = r >> shift
            if (r >> tag.offset) & tag_mask == Tag.TRACE:
                records.append(("trace", None, (value & 0xFFFF_FFFF, value >> 32 & 0xFFFF_FFFF)))
                continue
            if pending is None:
                raise RuntimeError(f"the bench answered more than {self.expected} beats")
            kind, n, label, words = pending
            words.append(value)
            if len(words) == n:
                records.append((kind, label, words if kind == "mem" else words[0]))
                pending = take()
        if pending is not None:
            answered = sum(1 for r in records if r[0] != "trace")
            raise RuntimeError(f"the bench answered {answered} of {len(self._answers)} "
                               f"commands")
        return records


def gate_clocks_default():
    """Whether :func:`rtl_run` builds the NPU with gated engine clocks unless told: the
    environment variable ``NPU_SIM_GATE`` (``1`` or ``0``), else yes (the gated build answers
    exactly as the free-running one, ``tests/system/test_gating.py``, and runs about twice as
    fast)."""
    value = os.environ.get("NPU_SIM_GATE", "1")
    if value not in ("0", "1"):
        raise ValueError(f"NPU_SIM_GATE must be 0 or 1, not {value!r}")
    return value == "1"


def profile_default():
    """Whether :func:`rtl_run` builds its Verilator binary with a profile
    (:data:`npu_sim.verilator.PGO_FLAGS`, trained on :func:`training_runs`): the environment
    variable ``NPU_SIM_PGO`` (``1`` or ``0``), else no. A build with the profile takes two
    compiles of the model instead of one and a training run; a warm run is not affected."""
    value = os.environ.get("NPU_SIM_PGO", "0")
    if value not in ("0", "1"):
        raise ValueError(f"NPU_SIM_PGO must be 0 or 1, not {value!r}")
    return value == "1"


#: The random programs (:func:`npu_sim.programs.random_program`, 6 layers) whose runs train a
#: profile-guided system simulation build: every engine, generic shapes, none of the benchmarks.
TRAINING_SEEDS = (1, 2, 3)


def training_runs(config):
    """``[(command words, expected answers)]`` of the training runs of a profile-guided build
    for ``config``."""
    from .programs import random_program
    runs = []
    for seed in TRAINING_SEEDS:
        cmds, _ = host_commands(random_program(config, 6, seed))
        runs.append((cmds.beats, cmds.expected))
    return runs


#: Default watchdog of a system run: a task running longer is aborted (``TIMEOUT``).
WATCHDOG = 1 << 20


def setup_writes(program, *, watchdog=WATCHDOG, late=()):
    """Host register writes that load a program's queues (``docs/program.md``): the task
    manager stopped, the watchdog, the base-address table, every queue's control, head, tail
    and push (except the queues in ``late``), the interrupts enabled; the start
    (``CTRL.enable``) is left to the caller."""
    from npu_spec.taskman import task_manager_map
    tm = task_manager_map(program.config.task_queues)
    w = []

    def put(name, **fields):
        w.append((tm.base + tm[name].offset, tm[name].pack(**fields)))

    put("CTRL", enable=0)
    put("WATCHDOG", cycles=watchdog)
    for j, entry in enumerate(program.base_table):
        put(f"BASE{j}", address=entry.base)
        put(f"LIMIT{j}", words=entry.limit)
    put("IRQ_ENABLE", error=1, task_done=1)
    for q in program.queues:
        i = q.index
        put(f"Q{i}_CTRL", priority=q.priority, network=q.network, base_index=q.base_index)
        put(f"Q{i}_TAIL", address=q.tail)
        put(f"Q{i}_HEAD", address=q.head)
        if q.tasks and i not in late:
            put(f"Q{i}_PUSH", count=q.tasks)
    return w


def _le_words(image, width):
    """Little-endian ``width``-bit words of a byte string (zero-padded)."""
    step = width // 8
    if len(image) % step:
        image = image + bytes(step - len(image) % step)
    return [int.from_bytes(image[k:k + step], "little") for k in range(0, len(image), step)]


def host_commands(program, *, stall=0.0, dump_bytes=None, trace_depth=64, watchdog=WATCHDOG,
                  late=None):
    """The commands of one run of ``program``: load memory, set up the queues, start, wait
    until the task manager is idle while draining the trace buffer (DRAIN: no entry is lost to
    a full buffer however many tasks run), read what is left of the trace, the status and the
    memory back.

    ``late`` (``{queue: n}``) pushes a queue's tasks only once ``TASKS_RUN`` has reached
    ``n`` (a network arriving while another runs: a task switch).

    Returns ``(commands, dump_words)``.
    """
    from npu_spec.taskman import COUNTERS, task_manager_map

    cfg = program.config
    tm = task_manager_map(cfg.task_queues)
    cmds = SystemCommands(cfg.mem_width)
    cmds.stall(stall)
    for k, word in enumerate(_le_words(program.memory, cfg.mem_width)):
        if word:
            cmds.mem_write(k, word)
    late = dict(late or {})
    cmds.writes(setup_writes(program, watchdog=watchdog, late=late))
    cmds.read(NPU_INFO["CYCLE"].offset, "start")
    ctrl = tm["CTRL"]
    cmds.write(tm.base + ctrl.offset, ctrl.pack(enable=1))
    for i, n in sorted(late.items(), key=lambda item: item[1]):
        cmds.drain(tm.base + tm["TASKS_RUN"].offset, 0xFFFF_FFFF, n, ("late", i))
        push = tm[f"Q{i}_PUSH"]
        cmds.write(tm.base + push.offset, push.pack(count=program.queue(i).tasks))
    status = tm["STATUS"]
    idle = status["idle"]
    cmds.drain(tm.base + status.offset, idle.mask, idle.mask, "idle")
    cmds.count(Counter.CYCLE, "end")
    info = NPU_INFO
    pop = info["TRACE_CTRL"].pack(pop=1)
    for k in range(trace_depth):
        cmds.read(info["TRACE_DATA0"].offset, ("trace0", k))
        cmds.read(info["TRACE_DATA1"].offset, ("trace1", k))
        cmds.write(info["TRACE_CTRL"].offset, pop)
        # The pop takes effect a cycle after the write (a write-only field): one read between.
        cmds.read(info["TRACE_STATUS"].offset, ("trace_status", k))
    cmds.read(info["TRACE_STATUS"].offset, "trace_status")
    for name in ("EXC_STATUS", "EXC_ADDR", "IRQ_STATUS") + tuple(n for n, _ in COUNTERS):
        cmds.read(tm.base + tm[name].offset, name)
    for q in program.queues:
        cmds.read(tm.base + tm[f"Q{q.index}_STATUS"].offset, ("queue", q.index))
    cmds.count(Counter.BUS_BYTES, "bus_bytes")
    cmds.count(Counter.BUS_STALL, "bus_stall")
    step = cfg.mem_width // 8
    dump = dump_bytes if dump_bytes is not None else len(program.memory)
    words = -(-dump // step)
    cmds.mem_read(0, words, "memory")
    return cmds, words


def rtl_run(program, *, backend="verilator", latency=1, stall=0.0, seed=0, dump_bytes=None,
            progress=None, max_cycles=None, vcd=None, watchdog=WATCHDOG, late=None,
            gate_clocks=None, profile=None):
    """Run ``program`` on the RTL system simulation; returns a dict: ``memory`` (bytes, the
    first ``dump_bytes``), ``trace`` (``[(task_id, engine, end, error, queue, cycle)]``),
    ``registers`` (status and counters by name), ``queues`` (``{index: Qi_STATUS}``),
    ``cycles`` (start to idle), ``bus_bytes``, ``bus_stall``, ``sim_cycles``, ``wall``,
    ``trace_overflow`` (the trace buffer dropped an entry: ``trace`` is incomplete).

    ``gate_clocks`` (Verilator only) builds the NPU with its engines on gated clocks
    (``NPUTop``); ``None`` takes :func:`gate_clocks_default`. ``profile`` (Verilator only)
    builds the binary with a profile (:func:`training_runs`); ``None`` takes
    :func:`profile_default`. Under Verilator the system
    memory is kept by the C++ bench (``storage="dpi"``), so its size costs nothing to build;
    the Amaranth backend elaborates it."""
    import time

    from npu.lib.shared import SharedModules

    cfg = program.config
    say = progress or (lambda msg: None)
    cmds, words = host_commands(program, stall=stall, dump_bytes=dump_bytes, watchdog=watchdog,
                                late=late)
    t0 = time.perf_counter()
    stats = {}
    if backend == "verilator":
        from .sysmem import DPI_CPP, DPI_VERILOG
        from .verilator import StreamBench
        shared = SharedModules()
        gate = gate_clocks_default() if gate_clocks is None else bool(gate_clocks)
        pgo = profile_default() if profile is None else bool(profile)
        bench = SystemBench(cfg, latency=latency, shared=shared, gate_clocks=gate,
                            storage="dpi")
        tag = response_layout(cfg.mem_width)["tag"]
        sb = StreamBench(bench, in_name="cmd", out_name="res", progress=say,
                         key=("system", cfg, latency, "dpi") + (("gated",) if gate else ()),
                         extra_verilog=lambda: shared.verilog() + DPI_VERILOG,
                         extra_cpp=DPI_CPP,
                         uncounted_bit=tag.offset + Tag.TRACE.bit_length() - 1,
                         training=(lambda: training_runs(cfg)) if pgo else None)
        responses, stats = sb.run(cmds.beats, cmds.expected, seed=seed,
                                  max_cycles=max_cycles or 50_000_000)
    elif backend == "amaranth":
        from .streams import run_simulation, stream_get, stream_put
        bench = SystemBench(cfg, latency=latency)
        responses = []
        limit = max_cycles or 2_000_000

        async def producer(ctx):
            for beat in cmds.beats:
                await stream_put(ctx, bench.cmd, beat)

        tag = response_layout(cfg.mem_width)["tag"]

        async def consumer(ctx):
            counted = 0
            while counted < cmds.expected:
                beat = await stream_get(ctx, bench.res)
                responses.append(beat)
                counted += (int(beat) >> tag.offset) & ((1 << tag.width) - 1) != Tag.TRACE

        async def watchdog(ctx):
            for _ in range(limit):
                await ctx.tick()
            raise RuntimeError(f"the system bench did not finish in {limit} cycles")

        run_simulation(bench, [producer, consumer], vcd=vcd, background=[watchdog])
    else:
        raise ValueError(f"backend must be 'verilator' or 'amaranth', not {backend!r}")
    wall = time.perf_counter() - t0
    records = cmds.parse(responses)
    regs = {}
    trace0, trace1 = {}, {}
    queues = {}
    memory = b""
    drained = []
    for kind, label, value in records:
        if kind == "trace":
            drained.append(value)
        elif isinstance(label, tuple) and label[0] == "trace0":
            trace0[label[1]] = value
        elif isinstance(label, tuple) and label[0] == "trace1":
            trace1[label[1]] = value
        elif isinstance(label, tuple) and label[0] == "queue":
            queues[label[1]] = value
        elif label == "memory":
            step = cfg.mem_width // 8
            memory = b"".join(w.to_bytes(step, "little") for w in value)
        else:
            regs[label] = value
    trace = []
    d0 = NPU_INFO["TRACE_DATA0"]
    for word0, word1 in drained + [(trace0[k], trace1[k]) for k in sorted(trace0)]:
        f = d0.unpack(word0)
        if f["valid"]:
            trace.append((f["task_id"], f["engine"], f["end"], f["error"], f["queue"], word1))
    overflow = NPU_INFO["TRACE_STATUS"].unpack(regs["trace_status"])["overflow"]
    return {"memory": memory[:dump_bytes] if dump_bytes is not None else memory,
            "trace": trace, "registers": regs, "queues": queues,
            "cycles": (regs["end"] - regs["start"]) & 0xFFFF_FFFF,
            "bus_bytes": regs["bus_bytes"], "bus_stall": regs["bus_stall"],
            "sim_cycles": stats.get("cycles"), "wall": wall, "words": words,
            "trace_overflow": bool(overflow)}


def _busy(trace, engine):
    """Cycles engine ``engine`` was busy: the sum over its tasks of end minus start."""
    total = 0
    start = None
    for task_id, e, end, _, _, cycle in trace:
        if e != engine:
            continue
        if not end:
            start = cycle
        elif start is not None:
            total += (cycle - start) & 0xFFFF_FFFF
            start = None
    return total


def compare(program, golden, rtl):
    """The comparison of an RTL run (:func:`rtl_run`) with the golden system model's result
    (:func:`npu_model.system.run_program`): a summary dict with ``match`` (final memory and
    every queue's status equal), the figures and the differences found."""
    from npu_spec.engine import Engine
    from npu_spec.taskman import task_manager_map

    tm = task_manager_map(program.config.task_queues)
    n = len(rtl["memory"])
    gold = golden.memory[:n]
    gold = gold + bytes(n - len(gold))
    mem_diff = ([] if rtl["memory"] == gold
                else [k for k in range(n) if rtl["memory"][k] != gold[k]])
    queues_ok = True
    queue_rows = []
    for q in program.queues:
        word = rtl["queues"][q.index]
        st = tm[f"Q{q.index}_STATUS"].unpack(word)
        g = golden.queue(q.index)
        ok = bool(st["retired"]) == bool(g.retired) and (g.retired or st["count"] == 0)
        queues_ok &= ok
        queue_rows.append({"queue": q.index, "rtl_retired": bool(st["retired"]),
                           "rtl_count": st["count"], "golden_retired": bool(g.retired),
                           "golden_completed": g.completed, "match": ok})
    exc = tm["EXC_STATUS"].unpack(rtl["registers"]["EXC_STATUS"], strict=False)
    errors = [q for q in golden.queues if q.retired]
    if errors:
        last = errors[-1]
        exc_ok = int(exc["cause"]) == int(last.cause)
    else:
        exc_ok = int(exc["cause"]) == 0
    trace = rtl["trace"]
    ends = [c for (_, _, end, _, _, c) in trace if end]
    cycles = ((max(ends) - rtl["registers"]["start"]) & 0xFFFF_FFFF) if ends else rtl["cycles"]
    regs = rtl["registers"]
    return {
        "match": not mem_diff and queues_ok and exc_ok,
        "memory_match": not mem_diff,
        "memory_bytes_compared": n,
        "first_differences": mem_diff[:8],
        "queues": queue_rows,
        "exception_match": exc_ok,
        "cycles": cycles,
        "ne_busy_cycles": _busy(trace, Engine.NEURAL),
        "pe_busy_cycles": _busy(trace, Engine.PLANAR),
        "dma_busy_cycles": _busy(trace, Engine.DMA),
        "dma_bytes": rtl["bus_bytes"],
        "bus_stall_cycles": rtl["bus_stall"],
        "stall_fetch": regs.get("STALL_FETCH", 0),
        "stall_dep": regs.get("STALL_DEP", 0),
        "stall_write": regs.get("STALL_WRITE", 0),
        "tasks": regs.get("TASKS_RUN", 0),
        "error_code": int(exc["cause"]),
        "trace_entries": len(trace),
    }
