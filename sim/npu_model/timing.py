"""Analytic timing model of the integrated NPU: estimated cycles of a program, per task.

The golden system model (:mod:`npu_model.system`) says what a program computes, not how long
it takes. :func:`estimate` reads the same program (descriptors, register writes, kernel
memories) and gives every task an estimated start and end cycle, from the task's registers
and the configuration, so that a configuration too large to simulate (``ane``) still has
cycle figures. ``docs/compiler.md``, "The timing model", states the rules and their measured
error against the RTL.

Per task (:func:`task_cycles`):

* **Neural engine** (per core, ``docs/neural_engine.md``, "The loop nest"): for every
  output-channel group a header (``HEADER_PER_CHANNEL`` cycles per channel) and, per work unit,
  the slowest of the MAC commands (the group's nonzero coefficients, one command a cycle, at
  most one per slot every ``SLOT_INTERLOCK`` cycles, ``fp_share`` cycles each in a float
  format on a shared-float build), the loader (input channels x kernel rows x work-unit rows,
  one row a cycle, ``row_values / E`` cycles on narrow buffer banks), the post-processor
  (``macs / post_lanes`` cycles a result) and the writer (a row a cycle), plus
  ``UNIT_OVERHEAD``; zero skipping slows the commands (``SPARSE_STALL``). The cores of a
  task share the buffer's read and write ports: the task takes at least every core's row
  loads, and every core's row writes, together.
* **Planar engine** (``docs/planar.md``, "Throughput and latency"): elementwise, one beat a
  cycle over all operand streams together (they share the buffer's read port), a broadcast
  vector one cycle an element; pooling, per input row the slowest of loading, the horizontal
  and the vertical filter and the output; reduction, a beat a cycle plus a fixed cost per
  group (more with a post function). ``planar_fp_share`` cycles a beat on shared lane units.
* **DMA** (``docs/system.md``, "DMA engine"): one element a cycle whatever the bus width,
  plus the check and the memory's round trip.

Between tasks (:func:`estimate`; ``docs/task_manager.md``): descriptors are fetched one word
a cycle, programmed in list order one register word a cycle, a task's writes wait until its
engine's previous task has ended; a task starts once programmed, its engine idle and its
dependency (``dep``) completed; switch-point tasks are barriers. A planar task reading a
flow-controlled ring runs beside its neural producer and ends after it.
"""

from dataclasses import dataclass, field

import numpy as np

from npu_spec import dataproc, neural
from npu_spec import planar as planar_spec
from npu_spec.descriptors import DescriptorError, decode
from npu_spec.dma import DmaDir
from npu_spec.engine import Engine
from npu_spec.kernel import GROUP_TABLE, GROUP_TABLE_WORDS
from npu_spec.mac import MacFormat
from npu_spec.planar import PLANAR_ENGINE, Axis, Bcast, Mode

from .kernel_codec import KernelConfig, KernelFormatError, parse_header
from .system import SLOT_WORDS, _apply_writes, _dataset, _fields, _Machine, _transfer

__all__ = ["Estimate", "TaskTime", "dense_macs", "estimate", "neural_core_cycles", "task_cycles",
           "trace_error"]

#: Cycles between two MAC commands of one accumulator slot (the array's read-after-write
#: interlock, ``docs/mac.md``).
SLOT_INTERLOCK = 4
#: Cycles per work unit beyond its MAC commands (extractor start, bank switch).
UNIT_OVERHEAD = 8
#: Cycles of a group's header per output channel, and the drain of the issue pipeline.
HEADER_PER_CHANNEL = 3
GROUP_OVERHEAD = 12
#: Cycles of a neural task from start to its first work unit, and from its last to done.
NE_TASK_OVERHEAD = 54
#: Zero skipping: sparse kernels bring commands of one slot closer than the interlock allows;
#: a group with a fraction ``z`` of zero coefficients takes ``1 / (1 - SPARSE_STALL z**2)``
#: times its commands (fitted to ``docs/neural_engine.md``, "Figures": 0.566 of the dense
#: cycles at 50% zeros, 0.351 at 75%, on 16 MACs).
SPARSE_STALL = 0.5
#: Planar engine: cycles from start to the first result (setup, check, pipeline).
PE_FILL = 16
#: Planar pooling: fill and drain, and the sizes' cycles (``15 + owb_bits``).
POOL_OVERHEAD = 55
#: Planar reduction: cycles per group after the tree (``3 log2 L + 50``, L lanes) and per task.
REDUCE_GROUP = 24
REDUCE_TASK = 20
#: Planar reduction with a post function (``recip``, ``sqrt``, ``rsqrt``): cycles more per
#: group, the serial post-processor's digit recurrence (27 cycles), rounding and hand-off
#: (fitted with ``recip`` on ``small``: 76 cycles a group on the RTL, where the rule without
#: it gives 37; ``docs/compiler.md``, "int8", ``Div`` of two activations, has the command;
#: ``tests/compiler/test_int8_slope_const.py::test_reciprocal_task_rtl_cycles_and_estimate``
#: holds it within 5%).
REDUCE_POST = 39
#: DMA: the check before the first request and the cycles after the last answer; more for a
#: kernel-memory transfer.
DMA_OVERHEAD = 12
KMEM_OVERHEAD = 14
#: Task manager: cycles from a task's last register write to its start, and between a task's
#: end and the programming of the next task of its engine.
PROGRAM_OVERHEAD = 4
#: Cycles from the host's start to the first descriptor request, and from the last task's end
#: to ``STATUS.idle`` as the host sees it.
START_OVERHEAD = 30
END_OVERHEAD = 20


@dataclass
class TaskTime:
    """One task's estimate: queue, task ID, engine name, ``start`` and ``end`` cycles (from the
    host's start), and for a neural task the dense MACs it computes (``macs``)."""
    queue: int
    task_id: int
    engine: str
    start: int
    end: int
    macs: int = 0

    @property
    def cycles(self):
        return self.end - self.start


@dataclass
class Estimate:
    """What :func:`estimate` gives: ``cycles`` (host start to idle) and ``tasks``
    (:class:`TaskTime`, in list order)."""
    cycles: int
    tasks: list = field(default_factory=list)

    def trace(self):
        """The tasks as ``(task ID, engine, start, end, error, queue)``, the form of the RTL
        trace the runtime reads (``npu_runtime.runtime.RunResult.tasks``)."""
        return [(t.task_id, t.engine, t.start, t.end, 0, t.queue) for t in self.tasks]


# --------------------------------------------------------------------------------------------
# one task


def _ceil(a, b):
    return -(-a // b)


def _group_nnz(machine, core, layer):
    """Per output-channel group of the layer, the nonzero coefficients of each channel (from
    the group headers in the core's kernel memory); a dense count where a header is
    unreadable."""
    cfg = machine.config
    fmt = MacFormat(layer["fmt"])
    kmem = machine.kmem[core]
    size = kmem.size
    k = layer["groups"] * layer["ocpg"]
    taps = layer["icpg"] * layer["kh"] * layer["kw"]
    out = []
    for g, base in enumerate(range(0, k, cfg.acc_slots)):
        ocg = min(cfg.acc_slots, k - base)
        table = (layer["addr"] + GROUP_TABLE_WORDS * g) & 0xFFFF
        entry = {name: int(kmem[(table + j) % size]) & 0xFFFF
                 for j, name in enumerate(GROUP_TABLE)}
        addr = (entry["header_addr"] + np.arange(entry["header_words"])) % size
        kc = KernelConfig(fmt.coef_fp16, bool(layer["sparse"]), layer["palette"],
                          layer["icpg"], layer["kh"], layer["kw"], ocg)
        try:
            params = parse_header(kmem[addr].astype("<u4").tobytes(), kc,
                                  slots=cfg.acc_slots, fp16=cfg.has_float, int8=cfg.has_int8)
            nnz = [int(n) for n in params.nnz]
        except (KernelFormatError, ValueError):
            nnz = [taps] * ocg
        out.append(nnz)
    return out


def neural_core_cycles(config, layer, groups_nnz):
    """``(cycles, rows, writes)`` of one core's layer: its estimated cycles, the input rows it
    loads and the output rows it writes (the cores of a task share the buffer's read port
    and its write port, a run a cycle each)."""
    macs = config.macs
    w, h = neural.work_unit(macs, layer["log2w"])
    _, row_values, _ = neural.engine_geometry(config)
    banks = dataproc.buffer_banks(config, row_values)
    row_cost = max(1, row_values // banks)
    units = _ceil(layer["out_h"], h) * _ceil(layer["out_w"], w)
    post = macs // neural.post_lanes(config)
    fmt = MacFormat(layer["fmt"])
    command = config.fp_share if fmt.is_float else 1
    taps = layer["icpg"] * layer["kh"] * layer["kw"]
    cycles, rows, writes = NE_TASK_OVERHEAD, 0, 0
    for g, nnz in enumerate(groups_nnz):
        base = g * config.acc_slots
        spanned = (base + len(nnz) - 1) // layer["ocpg"] - base // layer["ocpg"] + 1
        loads = spanned * layer["icpg"] * layer["kh"] * h
        if g == 0:
            cycles += loads * row_cost       # the first unit's rows: nothing to overlap with
        beats = sum(max(1, n) for n in nnz)
        zeros = 1 - sum(nnz) / max(1, taps * len(nnz))
        mac = command * max(beats / (1 - SPARSE_STALL * zeros ** 2),
                            SLOT_INTERLOCK * max(nnz))
        unit = max(mac, loads * row_cost, post * len(nnz), h * len(nnz)) + UNIT_OVERHEAD
        cycles += HEADER_PER_CHANNEL * len(nnz) + GROUP_OVERHEAD + int(units * unit)
        rows += units * loads * row_cost
        writes += units * h * len(nnz) * max(1, macs // banks)
    return cycles, rows, writes


def dense_macs(layer):
    """Dense multiply-adds of a layer: ``K x OH x OW x icpg x kh x kw``."""
    return (layer["groups"] * layer["ocpg"] * layer["out_h"] * layer["out_w"]
            * layer["icpg"] * layer["kh"] * layer["kw"])


def _planar_cycles(config, task):
    lanes = config.planar_lanes ** 2
    share = config.planar_fp_share
    beats = planar_spec.operand_beats(task, lanes)
    out = planar_spec.output_beats(task, lanes)
    c, h, w = task["channels"], task["height"], task["width"]
    mode = task["mode"]
    if mode == Mode.ELTWISE:
        vector = planar_spec.vector_length(task) if task["bcast"] >= Bcast.CHANNEL else 0
        streams = beats["a"] + (0 if vector else beats["b"]) + beats["c"]
        return PE_FILL + vector + max(streams, share * beats["a"], out)
    if mode == Mode.POOL:
        oh, ow = planar_spec.pool_output_size(task)
        fl = config.planar_pool_beats * lanes
        kh, kw, sy = task["kh"], task["kw"], max(1, task["sy"])
        per_row = max(_ceil(w, lanes) * share, kw * _ceil(ow, fl), kh * _ceil(ow, fl) / sy,
                      share * _ceil(ow, lanes) / sy)
        return POOL_OVERHEAD + int(c * h * per_row)
    if task["axis"] == Axis.CHANNEL:
        return REDUCE_TASK + 25 + share * beats["a"] * (c + 1) // max(1, c)
    groups = c if task["axis"] != Axis.TENSOR else 1
    tree = 3 * max(1, lanes.bit_length() - 1)
    post = REDUCE_POST if task["post"] else 0
    return REDUCE_TASK + share * beats["a"] + groups * (REDUCE_GROUP + tree + post)


def _dma_cycles(config, transfer, latency):
    n = 1
    for s in transfer["sizes"]:
        n *= s
    extra = KMEM_OVERHEAD if transfer["dir"] == DmaDir.MEM_TO_KMEM else 0
    return DMA_OVERHEAD + extra + latency + n


def task_cycles(machine, engine, latency=4):
    """Estimated cycles of the task whose registers ``machine`` (a golden
    :class:`npu_model.system._Machine`) holds, on ``engine``; ``(cycles, dense MACs, info)``,
    ``info`` what the schedule needs (a neural task's flow-controlled output, a planar task's
    flow-controlled operand, the rows a neural task loads)."""
    cfg, regs = machine.config, machine.regs
    if engine == Engine.DMA:
        return _dma_cycles(cfg, _transfer(regs), latency), 0, {}
    if engine == Engine.PLANAR:
        task = _fields(regs, PLANAR_ENGINE.base, planar_spec.TASK_REGISTERS)
        if planar_spec.task_error(task, cfg):
            return PE_FILL, 0, {}
        a = _dataset(regs, dataproc.pe_port_base("A"))
        return _planar_cycles(cfg, task), 0, {"ring_in": bool(a["slots"]),
                                              "channels": task["channels"]}
    mask = regs.get(dataproc.NE_CORES, 1)
    cores = [i for i in range(cfg.cores) if mask >> i & 1] or [0]
    worst, rows, writes, total = 0, 0, 0, 0
    info = {}
    for core in cores:
        layer = _fields(regs, neural.core_base(core), neural.LAYER_REGISTERS)
        if neural.layer_error(layer, cfg):
            continue
        cycles, loaded, written = neural_core_cycles(cfg, layer,
                                                     _group_nnz(machine, core, layer))
        worst, rows, writes = max(worst, cycles), rows + loaded, writes + written
        total += dense_macs(layer)
        if core == 0:
            out = _dataset(regs, dataproc.ne_port_base(0, "OUT"))
            if out["slots"]:
                info = {"ring_out": out["slots"] * max(1, out["planes"]),
                        "channels": layer["groups"] * layer["ocpg"]}
    return max(worst, max(rows, writes) + NE_TASK_OVERHEAD), total, info


# --------------------------------------------------------------------------------------------
# the schedule


def _write_words(desc):
    return sum(b.count for b in desc.blocks)


def _barrier(desc):
    return desc.tse or desc.tsr or desc.spl


class _Timeline:
    """The list schedule of one queue's tasks (programming order, engines, dependencies)."""

    def __init__(self, start):
        self.fetched = start
        self.programmed = start
        self.engine_free = {e: start for e in Engine}
        self.ends = []          # end cycle of every task so far, in list order
        self.all_done = start   # latest end so far (barriers wait for it)
        self.barrier_end = start

    def place(self, desc, cycles, info, prev):
        engine = Engine(desc.engine)
        self.fetched += desc.length
        begin = max(self.fetched, self.programmed, self.engine_free[engine])
        self.programmed = begin + _write_words(desc) + PROGRAM_OVERHEAD
        start = max(self.programmed, self.engine_free[engine], self.barrier_end)
        if desc.dep and desc.dep <= len(self.ends):
            start = max(start, self.ends[-desc.dep] + 1)
        if _barrier(desc):
            start = max(start, self.all_done + 1)
        end = start + cycles
        if info.get("ring_in") and prev is not None and prev.get("ring_out"):
            # The consumer of a flow-controlled ring: beside its producer, ending after it
            # with the planes of the producer's last unit still to read.
            last = min(1.0, prev["ring_out"] / max(1, prev["channels"]))
            end = max(end, self.ends[-1] + int(cycles * last) + 1)
        self.engine_free[engine] = end + 1
        self.ends.append(end)
        self.all_done = max(self.all_done, end)
        if _barrier(desc):
            self.barrier_end = end + 1
        return start, end


def estimate(program, *, latency=4, slot_words=SLOT_WORDS):
    """Estimated cycles of ``program`` (:class:`npu_spec.program.Program`) on its
    configuration with system memory of ``latency`` cycles: an :class:`Estimate`.

    Queues run one after another, higher priority first (ties: the lower index), as the
    golden model runs them without late arrivals. Kernel memories are filled from the
    program's memory image by its ``MEM_TO_KMEM`` transfers (the neural tasks' nonzero
    coefficients come from the group headers); nothing else is computed."""
    machine = _Machine(program)
    tasks = []
    now = START_OVERHEAD
    for q in sorted(program.queues, key=lambda q: (-q.priority, q.index)):
        entry = program.base_table[q.base_index]
        machine.window = (entry.base, entry.limit)
        line = _Timeline(now + latency)
        address, prev = q.head, None
        for _ in range(q.tasks):
            try:
                desc = decode(machine.words(address, slot_words), network=q.network,
                              window=(entry.base, entry.limit), address=address, tail=q.tail,
                              max_length=slot_words)
            except DescriptorError:
                break
            _apply_writes(machine.regs, desc.blocks)
            engine = Engine(desc.engine)
            if engine == Engine.DMA and _transfer(machine.regs)["dir"] == DmaDir.MEM_TO_KMEM:
                machine.run_dma()
            cycles, macs, info = task_cycles(machine, engine, latency)
            start, end = line.place(desc, cycles, info, prev)
            tasks.append(TaskTime(q.index, desc.task_id, engine.name, start, end, macs))
            prev = info
            address += desc.length
        now = max([now] + [t.end for t in tasks])
    return Estimate(now + END_OVERHEAD, tasks)


def trace_error(est, tasks, cycles):
    """How far :class:`Estimate` ``est`` is from an RTL run: ``tasks`` the trace's ``(task ID,
    engine, start, end, ...)`` and ``cycles`` its total. Returns ``{"total": relative error of
    the cycles, engine name: (relative error of the engine's summed task cycles, the largest
    relative error of one of its tasks of at least ``MIN_TASK`` cycles, tasks)}``; a task's
    cycles are its end less its start, waits for a flow-controlled producer included."""
    rtl = {(t[0], t[1]): t[3] - t[2] for t in tasks}
    out = {"total": est.cycles / cycles - 1}
    for engine in ("NEURAL", "PLANAR", "DMA"):
        pairs = [(t.cycles, rtl[(t.task_id, t.engine)]) for t in est.tasks
                 if t.engine == engine and (t.task_id, t.engine) in rtl]
        if not pairs:
            continue
        got, want = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        worst = max((abs(a / b - 1) for a, b in pairs if b >= MIN_TASK), default=0.0)
        out[engine] = (got / want - 1, worst, len(pairs))
    return out


#: Tasks shorter than this many cycles are left out of :func:`trace_error`'s largest error
#: (a few cycles of fixed cost are a large fraction of them).
MIN_TASK = 200
