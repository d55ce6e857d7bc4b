"""Building programs: tensors, kernels and tasks in, a :class:`npu_spec.program.Program` out.

:class:`ProgramBuilder` lays out one network for a configuration: it allocates system memory
(the tensors, the kernel blobs, then the descriptors) inside one memory window, allocates
buffer regions (:class:`Dataset`) and kernel-memory regions, and turns each task into a
descriptor (:func:`npu_spec.descriptors.encode`) whose register writes are runs of
consecutive registers. Every task's dependency distance (``H1.dep``) is computed from what it
reads and writes: a task depends on the latest earlier task of another engine that wrote what
it reads, read what it overwrites or wrote what it overwrites (tasks of one engine run in list
order anyway). A dependency the distance cannot express (two producers on two other engines,
neither waiting for the other) is a :class:`BuildError`.

Example (``tests/model/test_system.py``)::

    b = ProgramBuilder(config)
    x = b.input("x", x_array)                       # int8 [C, H, W] in system memory
    xb = b.load(x)                                  # a buffer dataset and the DMA task
    k = b.dma_kernels(0, b.kernels(w, bias=bias, scale=scale, shift=shift))
    y = b.conv(xb, k, pad=1, act="relu")           # NE task; returns the output dataset
    p = b.planar(a=y, mode="pool", op="max", kh=2, kw=2, sy=2, sx=2)
    b.store(p, b.output("y", p.shape))
    program = b.build()
"""

from dataclasses import dataclass

import numpy as np

from npu_spec import dataproc, neural
from npu_spec import dma as dma_spec
from npu_spec import planar as planar_spec
from npu_spec.descriptors import FLAGS, SWITCH_POINTS, Descriptor, encode
from npu_spec.engine import Engine
from npu_spec.kernel import encoding_accepted
from npu_spec.mac import MacFormat
from npu_spec.postproc import Act
from npu_spec.program import TENSOR_FORMATS, BaseEntry, Program, QueueSetup, Tensor
from npu_spec.regmap import WriteBlock

from . import fp
from .kernel_codec import encode as kernel_encode
from .kernel_codec import kernel_memory
from .system import SLOT_WORDS, write_tensor

__all__ = ["BuildError", "Dataset", "KernelBlob", "KernelPlacement", "ProgramBuilder", "Task",
           "combine", "relocate"]

#: Largest dependency distance (the width of ``H1.dep``).
MAX_DEP = 255
#: The data processor's one flow-control state, as a resource: a neural task producing a
#: flow-controlled dataset writes it, its planar consumer reads it.
FLOW_STATE = ("flow", 0, 1)


class BuildError(ValueError):
    """A program that cannot be built: out of memory, a descriptor too long, a dependency the
    distance cannot express."""


@dataclass(frozen=True)
class Dataset:
    """A ``(C, H, W)`` region of the buffer: element ``(c, y, x)`` at
    ``addr + c * cstride + y * rstride + x``; ``fmt`` is ``"int8"`` or ``"fp16"``.

    With flow control (``slots`` M > 0, :meth:`ProgramBuilder.ring`) the dataset is a ring of
    ``M`` slots of ``planes`` planes: plane ``c`` lies at ring plane ``c mod (M * planes)``.
    """
    addr: int
    shape: tuple
    fmt: str = "int8"
    cstride: int = None
    rstride: int = None
    slots: int = 0
    planes: int = 0

    def __post_init__(self):
        c, h, w = self.shape
        if self.rstride is None:
            object.__setattr__(self, "rstride", w)
        if self.cstride is None:
            object.__setattr__(self, "cstride", h * self.rstride)

    @property
    def fields(self):
        """The dataset dict of :func:`npu_spec.dataproc.make_dataset`."""
        return dataproc.make_dataset(self.addr, self.shape, cstride=self.cstride,
                                     rstride=self.rstride, slots=self.slots,
                                     planes=self.planes)

    @property
    def stored_planes(self):
        """Planes the dataset occupies in the buffer (fewer than ``C`` for a ring)."""
        c = self.shape[0]
        return min(c, self.slots * self.planes) if self.slots else c

    @property
    def span(self):
        """``(first, last + 1)`` buffer element (before wrapping)."""
        _, h, w = self.shape
        c = self.stored_planes
        return self.addr, self.addr + (c - 1) * self.cstride + (h - 1) * self.rstride + w

    def footprint(self):
        """The buffer intervals ``[("buf", lo, hi), ...]`` the dataset covers: one per
        plane (rows with gaps between planes, e.g. a band of rows of a larger tensor, are told
        apart from their neighbours), or one for a dense dataset."""
        _, h, w = self.shape
        c = self.stored_planes
        if self.cstride == h * self.rstride:
            return [("buf", *self.span)]
        last = (h - 1) * self.rstride + w
        return [("buf", self.addr + k * self.cstride, self.addr + k * self.cstride + last)
                for k in range(c)]

    def row(self):
        """The same elements as one row ``(1, 1, C * H * W)`` (a dense dataset only)."""
        c, h, w = self.shape
        if self.rstride != w or self.cstride != h * w:
            raise BuildError("only a dense dataset can be seen as one row")
        return Dataset(self.addr, (1, 1, c * h * w), self.fmt)


@dataclass(frozen=True)
class KernelBlob:
    """The encoded kernels of a layer (:func:`npu_model.kernel_codec.encode` per group of
    ``acc_slots`` output channels)."""
    groups: tuple
    fmt: int
    weight_shape: tuple
    conv_groups: int
    name: str = None

    @property
    def words(self):
        """Kernel-memory words of the blob: the group table, then the parts."""
        return len(kernel_memory(self.groups))


@dataclass(frozen=True)
class KernelPlacement:
    """A blob loaded into core ``core``'s kernel memory at words ``addr`` to ``end`` (its
    group table at ``addr``, the layer's ``KTABLE``), from tensor ``tensor``."""
    core: int
    addr: int
    end: int
    blob: KernelBlob
    tensor: Tensor
    version: int


@dataclass
class Task:
    """A task before emission: engine, register writes ``[(address, word)]``, the resources
    it reads and writes (``(space, lo, hi)`` intervals) and its flags; ``buffer`` is the
    buffer in use (the end of the highest dataset allocated) when it was added."""
    engine: int
    writes: list
    reads: list
    writes_to: list
    flags: dict
    task_id: int
    dep: int = 0
    label: str = ""
    flow_from: int = None       # a flow-control consumer: the producer task it overlaps
    flow_whole: bool = False    # ... reading every plane of the producer's output
    buffer: int = 0


def _no_barrier(ds, flags, role):
    """A switch point (a barrier: it starts after every older task and no younger one starts
    before it ends) cannot be a side of a ring smaller than its tensor: the producer would wait
    for slots its consumer can only free once the producer has ended."""
    barrier = sorted(f for f in SWITCH_POINTS if flags.get(f))
    if barrier and ds.stored_planes < ds.shape[0]:
        raise BuildError(f"the {role} of a flow-controlled ring smaller than its tensor cannot "
                         f"be a switch point ({', '.join(barrier)})")


def _overlap(a, b):
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _conflict(task, other):
    """``task`` reads what ``other`` writes, or writes what ``other`` reads or writes."""
    return (any(_overlap(r, w) for r in task.reads for w in other.writes_to)
            or any(_overlap(w, r) for w in task.writes_to for r in other.reads)
            or any(_overlap(w, v) for w in task.writes_to for v in other.writes_to))


def _on_chip(space):
    """Whether resource space ``space`` is NPU state (buffer, kernel memory, flow control)
    rather than system memory."""
    return space != "mem"


def _reaching_writer(writes, lo, hi):
    """The oldest task among the writes ``[(task, lo, hi)]`` (in task order) whose data a
    read of ``[lo, hi)`` may see (the newest writes first; a part that no write covers: -1,
    state from before the first task); None if nothing is read."""
    if lo >= hi:
        return None
    open_parts = [(lo, hi)]
    oldest = None
    for task, wlo, whi in reversed(writes):
        rest = []
        for a, b in open_parts:
            if whi <= a or b <= wlo:
                rest.append((a, b))
                continue
            oldest = task
            if a < wlo:
                rest.append((a, wlo))
            if whi < b:
                rest.append((whi, b))
        open_parts = rest
        if not open_parts:
            return oldest
    return -1


def _merge_reach(a, b):
    """Per engine the newer of two :meth:`ProgramBuilder._closure` results."""
    out = dict(a)
    for e, i in b.items():
        out[e] = max(out.get(e, -1), i)
    return out


def _blocks(writes):
    """Register writes in address order, consecutive ones merged into :class:`WriteBlock`
    runs (a task's writes only program registers; the start comes from the task manager, so
    their order does not matter)."""
    blocks = []
    for address, word in sorted(writes, key=lambda w: w[0]):
        if blocks and blocks[-1].address + blocks[-1].count == address:
            last = blocks.pop()
            blocks.append(WriteBlock(last.address, last.count + 1, last.words + (word,)))
        else:
            blocks.append(WriteBlock(address, 1, (int(word),)))
    return tuple(blocks)


def _f32(value):
    """Binary32 bits of a float, or an int taken as bits."""
    if isinstance(value, (int, np.integer)):
        return int(value) & 0xFFFF_FFFF
    return int(fp.f32_bits(np.float32(value)))


def _planar_summary(task):
    """``mode op`` of a planar task, by name (for messages)."""
    mode = planar_spec.Mode(task["mode"])
    ops = {planar_spec.Mode.ELTWISE: planar_spec.EltOp, planar_spec.Mode.POOL: planar_spec.PoolOp,
           planar_spec.Mode.REDUCE: planar_spec.RedOp}[mode]
    return f"{mode.name.lower()} {ops(task['op']).name.lower()}"


class _Regions:
    """First-fit allocator of ``[0, size)``; regions can be released."""

    def __init__(self, size, what, unit):
        self.size, self.what, self.unit = size, what, unit
        self.used = []      # sorted (start, end)
        self.reserved = 0   # the space below belongs to another program

    def alloc(self, n, align=1, at=None):
        if at is not None:
            start = at
        else:
            start = self.reserved
            for lo, hi in self.used:
                start = -(-start // align) * align
                if start + n <= lo:
                    break
                start = max(start, hi)
            start = -(-start // align) * align
        if start + n > self.size:
            raise BuildError(f"{self.what} is full: {n} {self.unit} more are needed at "
                             f"{start}, the {self.what} has {self.size}")
        self.used = sorted(self.used + [(start, start + n)])
        return start

    def release(self, start):
        self.used = [r for r in self.used if r[0] != start]

    @property
    def high(self):
        return max((hi for _, hi in self.used), default=0)


class ProgramBuilder:
    """Builds a :class:`npu_spec.program.Program` for ``config`` (one queue, one network).

    Parameters
    ----------
    config : NPUConfig
    queue, priority, network : int
        The queue the tasks go to, its priority and the network ID.
    base : int
        Word address of the network's memory window in system memory (its base-table entry
        0); the window reaches to the end of the memory.
    slot_words : int
        The task manager's slot size: the longest descriptor allowed.
    buffer_from, kernel_from : int
        First buffer element and first kernel-memory word the program may use (the space
        below is left to another network that shares the NPU; see :func:`combine`).
    """

    def __init__(self, config, *, queue=0, priority=0, network=0, base=0,
                 slot_words=SLOT_WORDS, buffer_from=0, kernel_from=0):
        self.config = config
        self.queue, self.priority, self.network = queue, priority, network
        self.base = base
        self.slot_words = slot_words
        self.mem_size = config.mem_kib * 1024
        if not 0 <= 4 * base < self.mem_size:
            raise BuildError(f"the window base {base} (words) lies outside the "
                             f"{self.mem_size}-byte memory")
        self.memory = np.zeros(self.mem_size, np.uint8)
        self._mem = _Regions(self.mem_size - 4 * base, "system memory window", "bytes")
        self._buf = _Regions(dataproc.buffer_elements(config), "buffer", "elements")
        self._kmem = [_Regions(config.kernel_kib * 256, f"kernel memory of core {i}", "words")
                      for i in range(config.cores)]
        self._buf.reserved = buffer_from
        for regions in self._kmem:
            regions.reserved = kernel_from
        self._kversion = [dict() for _ in range(config.cores)]
        self._kimages = {}      # (id(blob), word) -> (blob, image tensor), share_image
        self.tensors = []
        self.tasks = []
        self._reach = []        # per task: {engine: newest task it or its engine waited for}
        self._last = {}         # engine -> index of its newest task

    # ---- system memory ---------------------------------------------------------------

    def _alloc_mem(self, nbytes, align=4):
        try:
            return 4 * self.base + self._mem.alloc(nbytes, align)
        except BuildError:
            need = 4 * self.base + self._mem.high + nbytes
            raise BuildError(f"the program needs at least {need} bytes "
                             f"({-(-need // 1024)} KiB) of system memory; the configuration "
                             f"has mem_kib={self.config.mem_kib}") from None

    def tensor(self, name, shape, fmt="int8", role="scratch", values=None):
        """A dense tensor in system memory (``values`` stored into the image)."""
        if fmt not in TENSOR_FORMATS:
            raise BuildError(f"format must be one of {', '.join(TENSOR_FORMATS)}, not {fmt!r}")
        shape = tuple(int(n) for n in shape)
        nbytes = TENSOR_FORMATS[fmt] * int(np.prod(shape))
        t = Tensor(name, role, self._alloc_mem(nbytes), fmt, shape)
        if any(other.name == name for other in self.tensors):
            raise BuildError(f"two tensors are named {name!r}")
        self.tensors.append(t)
        if values is not None:
            write_tensor(self.memory, t, values)
        return t

    @staticmethod
    def _fmt_of(array, fmt):
        if fmt is not None:
            return fmt
        array = np.asarray(array)
        if array.dtype == np.int8:
            return "int8"
        if array.dtype in (np.uint16, np.float16):
            return "fp16"
        raise BuildError(f"give fmt= for an array of {array.dtype} (int8 values or uint16 "
                         f"binary16 codes)")

    @staticmethod
    def _codes(array):
        array = np.asarray(array)
        return array.view(np.uint16) if array.dtype == np.float16 else array

    def input(self, name, array, fmt=None):
        """An input tensor holding ``array`` (``np.int8``, or binary16 as ``np.uint16`` codes
        or ``np.float16``)."""
        fmt = self._fmt_of(array, fmt)
        return self.tensor(name, np.shape(array), fmt, "input", self._codes(array))

    def constant(self, name, array, fmt=None):
        """A constant tensor holding ``array``."""
        fmt = self._fmt_of(array, fmt)
        return self.tensor(name, np.shape(array), fmt, "constant", self._codes(array))

    def output(self, name, shape, fmt="int8"):
        """An output tensor (zero in the initial image)."""
        return self.tensor(name, shape, fmt, "output")

    # ---- buffer and kernel memory ----------------------------------------------------

    def buffer(self, shape, fmt="int8", addr=None):
        """A dense dataset of ``shape`` ``(C, H, W)`` in the buffer (first fit, or at
        element ``addr``)."""
        c, h, w = (int(n) for n in shape)
        return Dataset(self._buf.alloc(c * h * w, at=addr), (c, h, w), fmt)

    def ring(self, shape, slots, fmt="int8", addr=None):
        """A flow-controlled dataset of ``shape`` ``(C, H, W)`` (``docs/system.md``, "Flow
        control"): a ring of ``slots`` slots of one output-channel group (``acc_slots``
        planes) each, so ``min(C, slots * acc_slots)`` planes of buffer. A neural task
        writes it (:meth:`conv` with ``dst``) while the next planar task reads it as operand
        ``A``."""
        c, h, w = (int(n) for n in shape)
        planes = self.config.acc_slots
        if not 1 <= slots < 1 << dataproc.FLOW_BITS:
            raise BuildError(f"slots must be 1 to {(1 << dataproc.FLOW_BITS) - 1}, not {slots}")
        stored = min(c, slots * planes)
        return Dataset(self._buf.alloc(stored * h * w, at=addr), (c, h, w), fmt,
                       slots=int(slots), planes=planes)

    def release(self, ds):
        """Free the buffer region of ``ds`` for later datasets (later tasks that overwrite it
        wait for the tasks that read it: the dependencies follow)."""
        self._buf.release(ds.addr)

    def kernels(self, weights, *, bias=0, scale=0, shift=0, fmt="int8", groups=1,
                sparse=False, palette_bits=0, name=None):
        """Encode a layer's kernels (``weights`` ``[K, C / groups, KH, KW]``: int8 values, or
        binary16 codes for ``fmt`` ``fp16`` / ``i8f16``) with per-channel ``bias``, ``scale``,
        ``shift`` (:func:`npu_model.kernel_codec.encode`, one group of ``acc_slots`` output
        channels at a time); :meth:`dma_kernels` places it. An encoding the build's kernel
        extractor does not decode (``npu_spec.kernel.encoding_accepted``) is a
        :class:`BuildError`."""
        fmt = MacFormat[fmt.upper()] if isinstance(fmt, str) else MacFormat(fmt)
        extract = self.config.kernel_extract
        if not encoding_accepted(extract, coef_fp16=fmt.coef_fp16, sparse=sparse,
                                 palette=palette_bits):
            raise BuildError(f"the {extract!r} kernel extractor of this build does not decode "
                             f"{fmt.name} kernels with sparse={sparse}, "
                             f"palette_bits={palette_bits}")
        weights = np.asarray(weights)
        k = weights.shape[0]
        bias, scale, shift = (np.broadcast_to(np.asarray(v, np.int64), (k,))
                              for v in (bias, scale, shift))
        slots = self.config.acc_slots
        encoded = []
        for base in range(0, k, slots):
            sl = slice(base, min(k, base + slots))
            encoded.append(kernel_encode(weights[sl], coef_fp16=fmt.coef_fp16, sparse=sparse,
                                         palette_bits=palette_bits, bias=bias[sl],
                                         scale=scale[sl], shift=shift[sl]))
        return KernelBlob(tuple(encoded), int(fmt), weights.shape, groups, name)

    # ---- tasks -----------------------------------------------------------------------

    def _task(self, engine, writes, reads, writes_to, flags, label, flow_from=None,
              flow_whole=False):
        unknown = set(flags) - set(FLAGS)
        if unknown:
            raise BuildError(f"unknown task flags {', '.join(sorted(unknown))}; flags: "
                             f"{', '.join(FLAGS)}")
        task = Task(int(engine), list(writes), list(reads), list(writes_to), dict(flags),
                    len(self.tasks), label=label, flow_from=flow_from, flow_whole=flow_whole,
                    buffer=self._buf.high)
        task.dep = self._dependency(task)
        prev = self._last.get(task.engine)
        reach = dict(self._reach[prev]) if prev is not None else {}
        if task.dep:
            t = task.task_id - task.dep
            reach[self.tasks[t].engine] = max(reach.get(self.tasks[t].engine, -1), t)
        reach = self._flow_reach(task, reach)
        self.tasks.append(task)
        self._reach.append(reach)
        self._last[task.engine] = task.task_id
        return task

    def _dependency(self, task):
        """The distance to the latest earlier task of another engine that ``task`` must wait
        for; :class:`BuildError` if one distance cannot cover every such task.

        A conflicting task already complete when this engine's previous task completes needs
        no wait (the engine runs its tasks in order): what is certainly complete is kept per
        engine as the newest such task (:meth:`_closure`), so the backward search stops
        below it, and the distance points at the newest conflicting task that is not
        complete. When every conflicting task is complete, the distance still points at the
        newest one if it is within reach (a wait that costs nothing), else it is 0."""
        n = len(self.tasks)
        own = self._last.get(task.engine)
        cov = self._closure(own) if own is not None else {}
        others = set(self._last) - {task.engine}

        def floor():
            return min((cov.get(e, -1) for e in others), default=n)

        newest, producer, needed = None, None, []
        j, stop = n - 1, floor()
        while j >= 0 and (j > stop or (newest is None and n - j <= MAX_DEP)):
            other = self.tasks[j]
            if (other.engine != task.engine and j != task.flow_from
                    and _conflict(task, other)):
                newest = j if newest is None else newest
                if j > cov.get(other.engine, -1) and producer is None:
                    producer = j
                    cov = _merge_reach(cov, self._closure(j))
                    stop = floor()
                elif j > cov.get(other.engine, -1):
                    needed.append(j)
            j -= 1
        if producer is None:
            return n - newest if newest is not None and n - newest <= MAX_DEP else 0
        missing = [k for k in needed if k > cov.get(self.tasks[k].engine, -1)]
        if missing and self.tasks[producer].dep == 0 and producer - missing[0] <= MAX_DEP:
            # The newest producer waits for nothing: let it wait for the older one (it runs a
            # little later than it could), so that waiting for it covers both.
            self.tasks[producer].dep = producer - missing[0]
            for k in range(producer, n):
                if self.tasks[k].engine == self.tasks[producer].engine:
                    self._reach[k] = self._reach_of(k)
            cov = _merge_reach(cov, self._closure(producer))
            missing = [k for k in needed if k > cov.get(self.tasks[k].engine, -1)]
        if missing:
            raise BuildError(f"task {n} ({task.label}) depends on tasks {producer} and "
                             f"{missing[0]} of two other engines; one dependency distance "
                             f"cannot wait for both (add a task between them)")
        if n - producer > MAX_DEP:
            raise BuildError(f"task {n} ({task.label}) depends on task {producer}, "
                             f"{n - producer} positions earlier; the distance is at most "
                             f"{MAX_DEP}")
        return n - producer

    def _flow_reach(self, task, reach):
        """``reach`` with the producer of a flow-control consumer ``task`` that reads every
        plane of the ring: the producer's last unit is complete only when its task has ended
        (``docs/system.md``, "Flow control"), so the consumer ends after it."""
        if task.flow_from is not None and task.flow_whole:
            f = self.tasks[task.flow_from].engine
            reach[f] = max(reach.get(f, -1), task.flow_from)
        return reach

    def _reach_of(self, i):
        """``{engine: newest task of that engine}`` that task ``i`` or an earlier task of its
        engine waits for directly (its dependency distance)."""
        task = self.tasks[i]
        prev = next((k for k in range(i - 1, -1, -1) if self.tasks[k].engine == task.engine),
                    None)
        reach = dict(self._reach[prev]) if prev is not None else {}
        if task.dep:
            t = i - task.dep
            f = self.tasks[t].engine
            reach[f] = max(reach.get(f, -1), t)
        return self._flow_reach(task, reach)

    def _closure(self, j):
        """Tasks certainly complete when task ``j`` has completed, per engine the newest one
        (every older task of that engine is complete too): ``j``, the earlier tasks of its
        engine, and (transitively) what they waited for."""
        m = {self.tasks[j].engine: j}
        changed = True
        while changed:
            changed = False
            for idx in list(m.values()):
                for f, t in self._reach[idx].items():
                    if t > m.get(f, -1):
                        m[f] = t
                        changed = True
        return m

    def _dma(self, transfer, reads, writes_to, flags, label):
        writes = dma_spec.transfer_writes(transfer)
        return self._task(Engine.DMA, writes, reads, writes_to, flags, label)

    def dma_load(self, tensor, ds, **flags):
        """A DMA task copying ``tensor`` (``(C, H, W)``, or any shape of the same size when
        ``ds`` is one row) into dataset ``ds``."""
        c, h, w = ds.shape
        if int(np.prod(tensor.shape)) != c * h * w or tensor.format != ds.fmt:
            raise BuildError(f"tensor {tensor.name!r} {tensor.shape} {tensor.format} does not "
                             f"fit dataset {ds.shape} {ds.fmt}")
        t = self._transfer(dma_spec.DmaDir.MEM_TO_BUF, tensor, ds)
        return self._dma(t, [self._mem_span(tensor)], ds.footprint(), flags,
                         f"load {tensor.name}")

    def dma_store(self, ds, tensor, **flags):
        """A DMA task copying dataset ``ds`` into ``tensor``."""
        c, h, w = ds.shape
        if int(np.prod(tensor.shape)) != c * h * w or tensor.format != ds.fmt:
            raise BuildError(f"dataset {ds.shape} {ds.fmt} does not fit tensor "
                             f"{tensor.name!r} {tensor.shape} {tensor.format}")
        t = self._transfer(dma_spec.DmaDir.BUF_TO_MEM, tensor, ds)
        return self._dma(t, ds.footprint(), [self._mem_span(tensor)], flags,
                         f"store {tensor.name}")

    def dma(self, transfer, **flags):
        """A DMA task of any transfer (:func:`npu_spec.dma.make_transfer`; ``mem_addr`` is an
        offset in the window). Its accesses are not analysed: it is taken to read and write
        all of system memory, the buffer and the kernel memory of its core."""
        everything = [("mem", 0, self.mem_size), ("buf", 0, self._buf.size),
                      (f"kmem{transfer['core']}", 0, self._kmem[0].size)]
        return self._dma(transfer, everything, everything, flags, "dma")

    def _mem_span(self, tensor):
        lo, hi = tensor.extent
        return ("mem", lo, hi)

    def _transfer(self, direction, tensor, ds):
        c, h, w = ds.shape
        size = TENSOR_FORMATS[tensor.format]
        fmt = dma_spec.DmaFormat.INT8 if size == 1 else dma_spec.DmaFormat.HALF
        return dma_spec.make_transfer(
            dir=direction, fmt=fmt, mem_addr=tensor.addr - 4 * self.base, buf_addr=ds.addr,
            sizes=[w, h, c], mem_strides=[size, size * w, size * w * h],
            buf_strides=[1, ds.rstride, ds.cstride])

    def load_rows(self, tensor, r0, r1, ds, **flags):
        """A DMA task copying rows ``r0 .. r1 - 1`` of every plane of ``tensor`` (``(C, H,
        W)`` in memory) into dataset ``ds`` (``(C, r1 - r0, W)``, any strides): a band of a
        tiled layer."""
        return self._rows(dma_spec.DmaDir.MEM_TO_BUF, tensor, r0, r1, ds, flags)

    def store_rows(self, ds, tensor, r0, **flags):
        """A DMA task copying dataset ``ds`` (``(C, n, W)``) into rows ``r0 .. r0 + n - 1`` of
        every plane of ``tensor``."""
        return self._rows(dma_spec.DmaDir.BUF_TO_MEM, tensor, r0, r0 + ds.shape[1], ds, flags)

    def _rows(self, direction, tensor, r0, r1, ds, flags):
        c, h, w = tensor.shape
        if ds.shape != (c, r1 - r0, w) or tensor.format != ds.fmt or not 0 <= r0 < r1 <= h:
            raise BuildError(f"rows {r0}..{r1 - 1} of tensor {tensor.name!r} {tensor.shape} do "
                             f"not fit dataset {ds.shape} {ds.fmt}")
        size = TENSOR_FORMATS[tensor.format]
        first = tensor.addr + size * w * r0
        t = dma_spec.make_transfer(
            dir=direction, fmt=dma_spec.DmaFormat.INT8 if size == 1 else dma_spec.DmaFormat.HALF,
            mem_addr=first - 4 * self.base, buf_addr=ds.addr, sizes=[w, r1 - r0, c],
            mem_strides=[size, size * w, size * w * h], buf_strides=[1, ds.rstride, ds.cstride])
        mem = [("mem", first + size * w * h * k, first + size * w * h * k + size * w * (r1 - r0))
               for k in range(c)]
        if direction == dma_spec.DmaDir.MEM_TO_BUF:
            return self._dma(t, mem, ds.footprint(), flags, f"load rows of {tensor.name}")
        return self._dma(t, ds.footprint(), mem, flags, f"store rows of {tensor.name}")

    def load(self, tensor, addr=None, **flags):
        """A dataset for ``tensor`` (``(C, H, W)``) and the DMA task that fills it."""
        shape = tensor.shape if len(tensor.shape) == 3 else (1, 1, int(np.prod(tensor.shape)))
        ds = self.buffer(shape, tensor.format, addr)
        self.dma_load(tensor, ds, **flags)
        return ds

    def store(self, ds, tensor, **flags):
        """The DMA task that copies ``ds`` into ``tensor``; returns ``tensor``."""
        self.dma_store(ds, tensor, **flags)
        return tensor

    def dma_kernels(self, core, blob, addr=None, *, share_image=False, **flags):
        """A DMA task copying ``blob`` into core ``core``'s kernel memory (first fit, or at
        word ``addr``); returns the :class:`KernelPlacement`. The image's group table is
        relocated to the placement. With ``share_image`` a blob loaded again to the same
        place reads the image in system memory made the first time (a layer run in many
        bands), instead of a new copy."""
        regions = self._kmem[core]
        n = blob.words
        try:
            start = regions.alloc(n, at=addr)
        except BuildError:
            regions.used = []       # reuse the kernel memory from its start
            start = regions.alloc(n, at=addr)
        shared = self._kimages.get((id(blob), start)) if share_image else None
        if shared is not None and shared[0] is blob:
            src = shared[1]
        else:
            src = self._kernel_image(core, blob, start)
            if share_image:
                self._kimages[(id(blob), start)] = (blob, src)
        t = dma_spec.make_transfer(dir=dma_spec.DmaDir.MEM_TO_KMEM, fmt=dma_spec.DmaFormat.WORD,
                                   core=core, mem_addr=src.addr - 4 * self.base, buf_addr=start,
                                   sizes=[n], mem_strides=[4], buf_strides=[1])
        self._dma(t, [self._mem_span(src)], [(f"kmem{core}", start, start + n)], flags,
                  f"kernels {src.name} -> core {core}")
        version = self._kversion[core]
        for key in list(version):
            if key[0] < start + n and start < key[1]:
                del version[key]
        version[(start, start + n)] = len(self.tasks)
        return KernelPlacement(core, start, start + n, blob, src, len(self.tasks))

    def _kernel_image(self, core, blob, start):
        """A constant tensor holding ``blob``'s kernel-memory image for word ``start``."""
        image = np.asarray(kernel_memory(blob.groups, base=start), "<u4").view(np.uint8)
        count = sum(t.name.startswith("kernels") for t in self.tensors)
        src = Tensor(f"kernels{count}" if blob.name is None else f"{blob.name}@{core}:{start}",
                     "constant", self._alloc_mem(len(image)), "int8", (len(image),))
        if any(t.name == src.name for t in self.tensors):
            raise BuildError(f"two tensors are named {src.name!r}")
        self.memory[src.addr:src.addr + len(image)] = image
        self.tensors.append(src)
        return src

    def resident(self, placement):
        """Whether ``placement``'s kernels are still in kernel memory (no later
        :meth:`dma_kernels` overwrote them), so a task can use them without loading again."""
        return (self._kversion[placement.core].get((placement.addr, placement.end))
                == placement.version)

    def conv(self, src, kernels, dst=None, *, stride=1, pad=0, dilation=1, log2w=None,
             act="none", out_fp16=None, zero_point=0, lo=None, hi=None, alpha=0,
             stochastic=False, seed=1, slots=0, **flags):
        """A neural engine task: the convolution of dataset ``src`` with the kernels placed by
        :meth:`dma_kernels` (``kernels``, a :class:`KernelPlacement`, or a list of them on
        different cores: each core computes the output channels of its blob, in list order,
        from the same input, in one task), into ``dst`` (a new dataset if None); returns
        ``dst``.

        The post-processor: ``act`` (a :class:`npu_spec.postproc.Act` name), ``out_fp16``
        (default: binary16 out for a float layer), ``zero_point``, ``lo`` / ``hi`` (int8
        values for an int8 layer, floats or binary32 bits otherwise), ``alpha``, ``stochastic``
        and ``seed``.

        ``slots`` M > 0 (with ``dst`` None): the output is a flow-controlled ring of M slots
        (:meth:`ring`) that the next planar task reads while this one runs."""
        cfg = self.config
        placements = list(kernels) if isinstance(kernels, (list, tuple)) else [kernels]
        cores = [p.core for p in placements]
        if len(set(cores)) != len(cores):
            raise BuildError(f"one placement per core, not cores {cores}")
        for placement in placements:
            if (self._kversion[placement.core].get((placement.addr, placement.end))
                    != placement.version):
                raise BuildError(f"the kernels at word {placement.addr} of core "
                                 f"{placement.core} were overwritten before this layer")
        blobs = [p.blob for p in placements]
        fmt = MacFormat(blobs[0].fmt)
        _, icpg, kh, kw = blobs[0].weight_shape
        groups = blobs[0].conv_groups
        if any(b.fmt != blobs[0].fmt or b.weight_shape[1:] != (icpg, kh, kw)
               or b.conv_groups != groups for b in blobs):
            raise BuildError("the cores' kernels must share format, shape and groups")
        if len(blobs) > 1 and groups != 1:
            raise BuildError("a grouped layer runs on one core")
        k = sum(b.weight_shape[0] for b in blobs)
        c, h, w = src.shape
        if c != groups * icpg:
            raise BuildError(f"the input has {c} channels, the kernels need {groups * icpg}")
        oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
        ow = (w + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
        if out_fp16 is None:
            out_fp16 = fmt.is_float
        if dst is None and slots:
            dst = self.ring((k, oh, ow), slots, "fp16" if out_fp16 else "int8")
        elif dst is None:
            dst = self.buffer((k, oh, ow), "fp16" if out_fp16 else "int8")
        if dst.slots and (cores != [0] or groups != 1 or dst.shape != (k, oh, ow)):
            raise BuildError("a flow-controlled output needs a layer on core 0 alone, without "
                             "convolution groups, writing the whole dataset")
        if log2w is None:
            log2w = neural.best_log2w(cfg, ow, kw, stride, dilation)
        act = Act[act.upper()] if isinstance(act, str) else Act(act)
        if fmt.is_float:
            lo = _f32(-np.inf if lo is None else lo)
            hi = _f32(np.inf if hi is None else hi)
        else:
            lo = (-128 if lo is None else int(lo)) & 0xFF
            hi = (127 if hi is None else int(hi)) & 0xFF
        writes = []
        reads = src.footprint()
        first = 0
        for placement, blob in zip(placements, blobs):
            kj = blob.weight_shape[0]
            layer = neural.make_layer(
                fmt=fmt, log2w=log2w, sparse=blob.groups[0].config.sparse,
                palette=blob.groups[0].config.palette, groups=groups, icpg=icpg,
                ocpg=kj // groups, in_h=h, in_w=w, out_h=oh, out_w=ow, kh=kh, kw=kw,
                stride=stride, dilation=dilation, pad=pad, addr=placement.addr,
                out_fp16=int(out_fp16), stochastic=int(stochastic), act=act,
                zero_point=int(zero_point) & 0xFF, lo=lo, hi=hi, alpha=_f32(alpha), seed=seed)
            out = Dataset(dst.addr + first * dst.cstride, (kj, oh, ow), dst.fmt,
                          cstride=dst.cstride, rstride=dst.rstride, slots=dst.slots,
                          planes=dst.planes)
            core = placement.core
            writes += neural.layer_writes(layer, core)
            writes += dataproc.dataset_writes(dataproc.ne_port_base(core, "IN"), src.fields)
            writes += dataproc.dataset_writes(dataproc.ne_port_base(core, "OUT"), out.fields)
            reads.append((f"kmem{core}", placement.addr, placement.end))
            first += kj
        writes.append((dataproc.NE_CORES, sum(1 << i for i in cores)))
        # The flow-control state is one: a producer waits for the previous consumer.
        flow = [FLOW_STATE] if dst.slots else []
        if dst.slots:
            _no_barrier(dst, flags, "producer")
        self._task(Engine.NEURAL, writes, reads, dst.footprint() + flow, flags,
                   f"conv core{'s' if len(cores) > 1 else ''} "
                   f"{', '.join(str(i) for i in cores)}")
        return dst

    def planar(self, a, b=None, c=None, out=None, *, flags=None, **fields):
        """A planar engine task: the register fields ``fields``
        (:func:`npu_spec.planar.make_task`; ``channels``, ``height``, ``width`` default to
        ``a``'s shape, ``in_fmt`` / ``out_fmt`` to ``a``'s format) on datasets ``a``, ``b``,
        ``c``, into ``out`` (a new dataset of the result shape if None); returns ``out``.
        ``scale``, ``bias`` and ``scalar`` may be floats. A task the build's planar engine
        refuses whatever the data (a format it lacks, ``PlanarError.BAD_FORMAT``; an operation
        outside the integer build's, ``UNSUPPORTED``, :func:`npu_spec.planar.int8_supported`)
        is a :class:`BuildError`."""
        ch, hh, ww = a.shape
        fmt_code = {"int8": planar_spec.Fmt.INT8, "fp16": planar_spec.Fmt.FP16}
        fields = dict(fields)
        fields.setdefault("channels", ch)
        fields.setdefault("height", hh)
        fields.setdefault("width", ww)
        fields.setdefault("in_fmt", fmt_code[a.fmt])
        for name in ("scale", "bias", "scalar"):
            if name in fields:
                fields[name] = _f32(fields[name])
        task = planar_spec.make_task(**fields)
        if "out_fmt" not in fields:
            task["out_fmt"] = task["in_fmt"]
        refused = planar_spec.task_error(task, self.config)
        if refused in (planar_spec.PlanarError.BAD_FORMAT, planar_spec.PlanarError.UNSUPPORTED):
            what = ("binary16" if refused == planar_spec.PlanarError.BAD_FORMAT else
                    f"this task (planar_impl={self.config.planar_impl!r})")
            raise BuildError(f"the planar engine of this build does not compute {what}: "
                             f"{refused.name} for {_planar_summary(task)}")
        out_fmt = "fp16" if task["out_fmt"] == planar_spec.Fmt.FP16 else "int8"
        if out is None:
            shape = planar_spec.output_shape(task)
            if len(shape) == 2:
                shape = (shape[0], 1, 1)
            out = self.buffer(shape, out_fmt)
        lanes = self.config.planar_lanes ** 2
        counts = planar_spec.operand_beats(task, lanes)
        writes = self._planar_writes(task)
        reads = []
        for port, ds, n in (("A", a, counts["a"]), ("B", b, counts["b"]),
                            ("C", c, counts["c"])):
            if n:
                if ds is None:
                    raise BuildError(f"the task needs operand {port}")
                writes += dataproc.dataset_writes(dataproc.pe_port_base(port), ds.fields)
                reads += ds.footprint()
        writes += dataproc.dataset_writes(dataproc.pe_port_base("OUT"), out.fields)
        flow_from = None
        if any(ds is not None and ds.slots for ds in (b, c, out)):
            raise BuildError("only operand A may be flow-controlled")
        if a.slots:
            flow_from = self._flow_producer(a)
            reads.append(FLOW_STATE)
            _no_barrier(a, flags or {}, "consumer")
        self._task(Engine.PLANAR, writes, reads, out.footprint(), flags or {},
                   f"planar {planar_spec.Mode(task['mode']).name.lower()}", flow_from,
                   flow_whole=bool(a.slots) and task["channels"] >= a.shape[0])
        return out

    def _flow_producer(self, ds):
        """The neural task a flow-controlled operand ``ds`` streams from: the latest task
        that wrote it must be a neural task with no other flow-controlled consumer yet."""
        for j in range(len(self.tasks) - 1, -1, -1):
            t = self.tasks[j]
            if any(_overlap(w, r) for w in t.writes_to for r in ds.footprint()):
                if t.engine != Engine.NEURAL or FLOW_STATE not in t.writes_to:
                    break
                if any(u.flow_from == j for u in self.tasks):
                    raise BuildError("a flow-controlled dataset is read by one planar task")
                if j != len(self.tasks) - 1:
                    raise BuildError("the consumer of a flow-controlled dataset must be the "
                                     "task right after its producer")
                return j
        raise BuildError("a flow-controlled operand needs the neural task writing it")

    @staticmethod
    def _planar_writes(task):
        """The planar registers the task needs (the others keep their values): ``MODE``,
        ``SHAPE0``, ``SHAPE1``; ``WINDOW`` for pooling; the constants the operation reads."""
        mode, op = task["mode"], task["op"]
        needed = {"MODE", "SHAPE0", "SHAPE1"}
        if mode == planar_spec.Mode.POOL:
            needed.add("WINDOW")
        if mode == planar_spec.Mode.REDUCE or (mode == planar_spec.Mode.ELTWISE
                                              and op == planar_spec.EltOp.GAIN_BIAS):
            needed.add("SCALE")
        if mode == planar_spec.Mode.ELTWISE and op == planar_spec.EltOp.GAIN_BIAS:
            needed.add("BIAS")
        if task["bcast"] == planar_spec.Bcast.SCALAR:
            needed.add("SCALAR")
        base = planar_spec.PLANAR_ENGINE.base
        names = {base + reg.offset: reg.name for reg in planar_spec.TASK_REGISTERS}
        return [(addr, word) for addr, word in planar_spec.task_writes(task)
                if names[addr] in needed]

    # convenience layers

    def relu(self, ds, out=None, **flags):
        """ReLU on the planar engine."""
        return self.planar(ds, out=out, flags=flags, mode="eltwise", op="relu")

    def max_pool(self, ds, k=2, stride=None, pad=0, out=None, **flags):
        """Max pooling ``k x k``, stride ``stride`` (default ``k``)."""
        s = k if stride is None else stride
        return self.planar(ds, out=out, flags=flags, mode="pool", op="max", kh=k, kw=k, sy=s,
                           sx=s, py=pad, px=pad)

    def add(self, a, b, out=None, **flags):
        """Elementwise ``a + b`` on the planar engine."""
        return self.planar(a, b, out=out, flags=flags, mode="eltwise", op="add")

    def conv_relu_pool(self, src, weights, *, core=0, pool=2, **conv_args):
        """A conv (int8, ``weights`` with ``bias``/``scale``/``shift`` in ``conv_args``), a
        planar ReLU and a ``pool x pool`` max pooling; returns the pooled dataset (the
        intermediate datasets are released). With ``slots`` M > 0 in ``conv_args`` the conv
        writes a flow-controlled ring of M slots that the ReLU reads while the conv runs."""
        kw = {k: conv_args.pop(k) for k in ("bias", "scale", "shift", "fmt", "sparse",
                                            "palette_bits") if k in conv_args}
        placement = self.dma_kernels(core, self.kernels(weights, **kw))
        y = self.conv(src, placement, **conv_args)
        r = self.relu(y)
        self.release(y)
        p = self.max_pool(r, pool)
        self.release(r)
        return p

    # ---- task switching ----------------------------------------------------------------

    def safe_points(self):
        """The tasks after which another network may take the NPU: the indices ``i`` such
        that no task after ``i`` reads on-chip state (buffer, kernel memory, flow control)
        that task ``i`` or an earlier task wrote, and neither ``i`` nor ``i + 1`` is a side of
        a flow-controlled ring. What crosses such a boundary is in system memory only, which
        the other network does not touch (its own window). An on-chip read that no earlier
        task wrote counts as state from before the first task."""
        n = len(self.tasks)
        cover = np.zeros(n + 1, np.int64)       # difference array over boundaries 0..n-1
        written = {}                            # on-chip space -> [(task, lo, hi)]
        for j, task in enumerate(self.tasks):
            for space, lo, hi in task.reads:
                if not _on_chip(space):
                    continue
                first = _reaching_writer(written.get(space, ()), lo, hi)
                if first is not None and max(first, 0) < j:
                    cover[max(first, 0)] += 1
                    cover[j] -= 1
            for space, lo, hi in task.writes_to:
                if _on_chip(space):
                    written.setdefault(space, []).append((j, lo, hi))
        live = np.cumsum(cover)[:n]
        flow = [FLOW_STATE in t.reads or FLOW_STATE in t.writes_to for t in self.tasks]
        return [i for i in range(n - 1)
                if not live[i] and not flow[i] and not flow[i + 1]]

    def place_switch_points(self):
        """Mark every safe point (:meth:`safe_points`) for task switching, as the compiler
        does (``docs/compiler.md``, "Task-switch flags"): the task before it gets ``TSE`` and
        ``TSR`` (a switch request seen when it completes switches queues right after it), the
        task after it ``SPL`` (the resumed list clears its queue's ``TQSP``). ``DPC`` and
        ``SPC`` stay clear: nothing on chip is live across the boundary, so no output has to
        be saved and no input re-read. Returns the safe points."""
        points = self.safe_points()
        for i in points:
            self.tasks[i].flags.update(tse=True, tsr=True)
            self.tasks[i + 1].flags["spl"] = True
        return points

    # ---- emission --------------------------------------------------------------------

    def build(self, name=""):
        """The :class:`npu_spec.program.Program`: the descriptors placed after the data."""
        descs = []
        for i, task in enumerate(self.tasks):
            desc = Descriptor(task_id=i, network=self.network, engine=task.engine, dep=task.dep,
                              blocks=_blocks(task.writes), **task.flags)
            if desc.length > self.slot_words:
                raise BuildError(f"task {i} ({task.label}) needs a {desc.length}-word "
                                 f"descriptor; the task manager's slot holds "
                                 f"{self.slot_words}")
            descs.append(encode(desc))
        total = sum(len(d) for d in descs)
        start = self._alloc_mem(4 * max(1, total)) // 4
        words = np.asarray([w for d in descs for w in d], "<u4").view(np.uint8)
        self.memory[4 * start:4 * start + len(words)] = words
        end = max(4 * self.base + self._mem.high, 4 * (start + total))
        window = BaseEntry(self.base, self.mem_size // 4 - self.base)
        queue = QueueSetup(self.queue, self.priority, self.network, 0, start, start + total,
                           len(descs))
        return Program(self.config, (window,), (queue,), tuple(self.tensors),
                       self.memory[:end].tobytes(), {"name": name} if name else {})


def combine(programs):
    """One program running ``programs`` (built for one configuration, each with its own
    queue, network and memory window, e.g. ``ProgramBuilder(config, queue=1, network=1,
    base=...)``) side by side: their memory images overlaid, their windows in one base-address
    table, their queues together; tensor names get the prefix ``q<queue>/``. The programs
    must not share system memory; to share the NPU safely across a task switch they also need
    their own buffer and kernel-memory space (``buffer_from``, ``kernel_from``)."""
    programs = list(programs)
    if not programs:
        raise BuildError("combine needs at least one program")
    config = programs[0].config
    size = max(len(p.memory) for p in programs)
    image = np.zeros(size, np.uint8)
    owner = np.full(size, -1, np.int64)
    table, queues, tensors = [], [], []
    for n, p in enumerate(programs):
        if p.config != config:
            raise BuildError("the programs were built for different configurations")
        mem = np.frombuffer(p.memory, np.uint8)
        used = np.nonzero(mem)[0]
        clash = used[(owner[used] >= 0)]
        if clash.size:
            raise BuildError(f"programs {owner[clash[0]]} and {n} both use memory byte "
                             f"{int(clash[0])}")
        image[used] = mem[used]
        owner[used] = n
        for q in p.queues:
            entry = p.base_table[q.base_index]
            table.append(entry)
            queues.append(QueueSetup(q.index, q.priority, q.network, len(table) - 1, q.head,
                                     q.tail, q.tasks))
        tensors += [Tensor(f"q{p.queues[0].index}/{t.name}", t.role, t.addr, t.format, t.shape,
                           t.strides) for t in p.tensors]
    return Program(config, tuple(table), tuple(queues), tuple(tensors), image.tobytes())


def relocate(program, base, *, queue=None, priority=None):
    """``program`` moved to byte address ``base`` of system memory (a multiple of 4): its
    memory image, tensors, queue heads and tails and base-address table move by ``base``
    bytes (the addresses inside its descriptors are offsets from its window's base, so they
    stay), and each window ends where the image ends, so the network cannot reach the memory
    of a program placed after it. ``queue`` and ``priority`` (one-queue programs) give its
    queue another index and priority. With :func:`combine` this runs several compiled
    programs side by side (``npu run A.npu B.npu``)."""
    import dataclasses
    if base % 4 or base < 0:
        raise BuildError(f"a program moves by a non-negative multiple of 4 bytes, not {base}")
    if (queue is not None or priority is not None) and len(program.queues) != 1:
        raise BuildError("only a one-queue program can be given another queue or priority")
    end = base + len(program.memory)
    if end > program.memory_bytes:
        raise BuildError(f"the program's {len(program.memory)} bytes placed at byte {base} "
                         f"need {end} bytes of system memory; the configuration has "
                         f"{program.memory_bytes} (mem_kib {program.config.mem_kib})")
    words = base // 4
    last = -(-len(program.memory) // 4)
    table = tuple(BaseEntry(e.base + words, max(1, last - e.base)) for e in program.base_table)
    queues = tuple(QueueSetup(q.index if queue is None else queue,
                              q.priority if priority is None else priority, q.network,
                              q.base_index, q.head + words, q.tail + words if q.tail else 0,
                              q.tasks)
                   for q in program.queues)
    tensors = tuple(dataclasses.replace(t, addr=t.addr + base) for t in program.tensors)
    meta = dict(program.metadata)
    if "compiler" in meta:
        meta["compiler"] = dict(meta["compiler"])
        for key in ("inputs", "outputs"):
            meta["compiler"][key] = [dict(e, addr=e["addr"] + base) if "addr" in e else e
                                     for e in meta["compiler"].get(key, [])]
    return Program(program.config, table, queues, tensors, bytes(base) + program.memory, meta)
