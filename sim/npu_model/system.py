"""Golden model of the integrated NPU: a program file in, the final system memory out.

:func:`run_program` executes a :class:`npu_spec.program.Program` functionally and bit for bit
as the RTL does (``docs/system.md``), for programs whose result does not depend on timing:

* Queues run one after the other, higher priority first (ties: lower index), each task list
  in order; a queue pushed later (``arrivals``) preempts the running one at its next switch
  point when its priority is higher (:func:`run_program`). A queue's descriptors are
  fetched from its head and decoded by :func:`npu_spec.descriptors.decode` (network,
  window, tail, slot size); a decode error retires the queue with its cause (``DECODE``,
  ``ADDRESS``, ``WINDOW``) before any register of the task is written.
* Each descriptor's register writes are applied to one register state of the whole register
  space (every map at its reset values first), then the task runs on ``H0.engine``:

  - ``DMA``: :func:`npu_spec.dma.dma_error` first (no access on an error), then the copy.
    ``MEM_TO_BUF`` ``INT8``: the byte sign-extended to the 16-bit element; ``HALF``: two bytes
    little-endian; ``BUF_TO_MEM`` writes the element's low byte (``INT8``) or its two bytes
    (``HALF``); ``MEM_TO_KMEM`` copies 32-bit little-endian words into the kernel memory of
    core ``MODE.core``. A memory byte beyond the system memory is a bus error (``BUS``): the
    elements before it are copied.
  - ``NEURAL``: every core whose bit is set in ``DATA_PROCESSOR.NE_CORES`` runs the layer of
    its registers (:func:`npu_spec.neural.layer_error` first): the input is dataset
    ``NE{i}_IN`` (zero outside its ``H`` and ``W``; an int8 input is the element's low byte),
    the kernels come from the core's kernel memory through the group table at ``KTABLE``
    (:mod:`npu_model.kernel_codec`), the accumulators from :func:`npu_model.conv.
    conv_accumulate`, the outputs from :func:`npu_model.postproc.postprocess` in the engine's
    order, written to dataset ``NE{i}_OUT`` (every output channel, row and column of the layer;
    binary16 codes, or int8 values sign-extended to 16 bits). The cores read the buffer as it
    was before the task.
  - ``PLANAR``: :func:`npu_spec.planar.task_error` first; the operands are the beats datasets
    ``PE_A``, ``PE_B``, ``PE_C`` stream (rows of ``ceil(W / L)`` beats, missing lanes 0; int8
    from the low byte), as many as :func:`npu_spec.planar.operand_beats` says; the result
    (:mod:`npu_model.planar`) leaves as :func:`npu_spec.planar.output_beats` beats (int8
    sign-extended) that dataset ``PE_OUT`` takes in raster order, writing the lanes inside its
    ``W``.

  An engine's nonzero error code retires the queue with cause ``ENGINE``.

A task the RTL could not finish (an operand dataset streaming fewer beats than the planar
engine consumes, a result dataset taking fewer than it produces) is aborted by the task
manager's watchdog: the queue is retired with cause ``TIMEOUT`` (the host must set
``WATCHDOG``; ``npu_sim.system.setup_writes`` does).
"""

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np

from npu_spec import dataproc, dma, neural
from npu_spec import planar as planar_spec
from npu_spec import taskman as taskman_spec
from npu_spec.descriptors import (
    AddressError,
    DecodeError,
    DescriptorError,
    WindowError,
    decode,
)
from npu_spec.engine import Engine
from npu_spec.kernel import GROUP_TABLE, GROUP_TABLE_WORDS, PALETTE_BITS
from npu_spec.mac import MacFormat
from npu_spec.planar import PLANAR_ENGINE, Axis, Bcast, Fmt, Mode
from npu_spec.program import TENSOR_FORMATS, Program
from npu_spec.registers import register_maps
from npu_spec.taskman import Cause

from . import planar as pl
from .conv import ConvLayer, conv_accumulate, engine_output
from .kernel_codec import EncodedGroup, KernelConfig, KernelFormatError, dense_codes
from .postproc import PostprocConfig, postprocess

__all__ = [
    "SLOT_WORDS",
    "HangError",
    "QueueStatus",
    "SystemResult",
    "TaskRecord",
    "read_tensor",
    "run_neural_task",
    "run_planar_task",
    "run_program",
    "write_tensor",
]

#: Largest descriptor the task manager takes (its slot size in ``npu.top.NPUTop``).
SLOT_WORDS = taskman_spec.SLOT_WORDS

_CAUSES = {DecodeError: Cause.DECODE, AddressError: Cause.ADDRESS, WindowError: Cause.WINDOW}


class HangError(RuntimeError):
    """The program would never finish on the RTL (a stream the engine waits for forever)."""


@dataclass
class QueueStatus:
    """A queue's state after the run: tasks completed, and whether and why it was retired
    (``cause`` a :class:`npu_spec.taskman.Cause`; for ``ENGINE`` the engine and its error
    code; ``address`` the word address of the descriptor that raised it)."""
    index: int
    completed: int = 0
    retired: bool = False
    cause: Cause = Cause.NONE
    engine: int = None
    code: int = 0
    address: int = None


@dataclass
class TaskRecord:
    """One task that ran: its queue, ID, engine and error code (0: it ran)."""
    queue: int
    task_id: int
    engine: int
    code: int
    address: int


@dataclass
class SystemResult:
    """What :func:`run_program` leaves: the system memory (``bytes``), the queues' status (in
    index order), the tasks in execution order, the on-chip state (buffer, kernel
    memories, registers) for inspection, and the task switches ``[(queue left, its task ID
    after which it switched, queue taken)]``."""
    memory: bytes
    queues: list
    tasks: list
    buffer: np.ndarray
    kernel_memories: list
    registers: dict = field(default_factory=dict)
    switches: list = field(default_factory=list)

    def queue(self, index):
        for q in self.queues:
            if q.index == index:
                return q
        raise KeyError(f"no queue {index}")


# --------------------------------------------------------------------------------------------
# tensors in system memory


def _tensor_offsets(tensor):
    offsets = np.zeros((), np.int64) + tensor.addr
    for n, s in zip(tensor.shape, tensor.strides):
        offsets = offsets[..., None] + np.arange(n, dtype=np.int64) * s
    return offsets


def read_tensor(memory, tensor):
    """The elements of ``tensor`` (:class:`npu_spec.program.Tensor`) in ``memory`` (bytes or
    a uint8 array): ``np.int8`` for int8, ``np.uint16`` binary16 codes for fp16."""
    mem = np.frombuffer(bytes(memory), np.uint8) if not isinstance(memory, np.ndarray) \
        else memory
    offsets = _tensor_offsets(tensor)
    if tensor.format == "int8":
        return mem[offsets].view(np.int8)
    return (mem[offsets].astype(np.uint16) | (mem[offsets + 1].astype(np.uint16) << 8))


def write_tensor(memory, tensor, values):
    """Store ``values`` (int8 values or binary16 codes) as ``tensor`` into ``memory`` (a
    writable uint8 array)."""
    offsets = _tensor_offsets(tensor)
    values = np.broadcast_to(np.asarray(values), tensor.shape)
    if values.dtype.kind == "f":
        raise TypeError("fp16 tensors are given as uint16 binary16 codes, not floats")
    codes = values.astype(np.int64) & 0xFFFF
    memory[offsets] = (codes & 0xFF).astype(np.uint8)
    if TENSOR_FORMATS[tensor.format] == 2:
        memory[offsets + 1] = (codes >> 8).astype(np.uint8)


# --------------------------------------------------------------------------------------------
# register state


def _reset_registers(config):
    """Reset values of every register of the NPU (each core's neural-engine registers and
    dataset blocks included)."""
    regs = {}
    for regmap in register_maps():
        for reg in regmap.registers:
            regs[regmap.base + reg.offset] = reg.reset
    ne = neural.NEURAL_ENGINE
    for core in range(config.cores):
        for reg in ne.registers:
            regs[neural.core_base(core) + reg.offset] = reg.reset
        for port in ("IN", "OUT"):
            base = dataproc.ne_port_base(core, port)
            for k, name in enumerate(dataproc.DATASET_REGISTERS):
                regs[base + k] = dataproc.DATA_PROCESSOR[f"NE0_IN_{name}"].reset
    return regs


def _fields(regs, base, registers):
    """Field values (plain ints) of ``registers`` of a block at word ``base``."""
    out = {}
    for reg in registers:
        word = regs.get(base + reg.offset, 0)
        out.update({k: int(v) for k, v in reg.unpack(word, strict=False).items()})
    return out


def _dataset(regs, base):
    """The dataset programmed in the block at word ``base``."""
    dp = dataproc.DATA_PROCESSOR
    names = [dp[f"NE0_IN_{name}"] for name in dataproc.DATASET_REGISTERS]
    words = [regs.get(base + k, 0) for k in range(len(names))]
    f = [reg.unpack(w, strict=False) for reg, w in zip(names, words)]
    return {"addr": f[0]["addr"], "width": f[1]["width"], "height": f[1]["height"],
            "channels": f[2]["channels"], "slots": f[2]["slots"], "planes": f[2]["planes"],
            "cstride": f[3]["stride"], "rstride": f[4]["stride"]}


def _ring_planes(ds, planes):
    """Planes ``planes`` (an array) of dataset ``ds`` as they lie in the buffer: plane ``c``
    at ring plane ``c mod (slots * planes)`` with flow control, else at ``c``."""
    if ds.get("slots"):
        return planes % (ds["slots"] * max(1, ds["planes"]))
    return planes


def _s32(value):
    return value - (1 << 32) if value >> 31 else value


def _transfer(regs):
    d = _fields(regs, dma.BASE, [r for r in dma.DMA.registers if r.offset >= dma.TASK_OFFSET
                                 if not r.name.startswith(("MEM_STRIDE", "BUF_STRIDE"))])
    ms = [_s32(regs.get(dma.DMA.address(f"MEM_STRIDE{k}"), 0)) for k in range(dma.RANK)]
    bs = [_s32(regs.get(dma.DMA.address(f"BUF_STRIDE{k}"), 0)) for k in range(dma.RANK)]
    return dma.make_transfer(dir=d["dir"], fmt=d["fmt"], core=d["core"],
                             mem_addr=regs.get(dma.DMA.address("MEM_ADDR"), 0),
                             buf_addr=d["addr"],
                             sizes=[d["n0"], d["n1"], d["n2"], d["n3"], d["n4"]],
                             mem_strides=ms, buf_strides=bs)


# --------------------------------------------------------------------------------------------
# the machine


class _Machine:
    """The state a program runs on: system memory, buffer, kernel memories, registers."""

    def __init__(self, program):
        cfg = program.config
        self.config = cfg
        self.program = program
        self.mem = np.zeros(program.memory_bytes, np.uint8)
        self.mem[:len(program.memory)] = np.frombuffer(program.memory, np.uint8)
        self.buf = np.zeros(dataproc.buffer_elements(cfg), np.uint16)
        self.kernel_words = cfg.kernel_kib * 256
        self.kmem = [np.zeros(self.kernel_words, np.uint32) for _ in range(cfg.cores)]
        self.regs = _reset_registers(cfg)
        self.window = (0, 0)
        # Flow control: what the last neural task with a flow-controlled output dataset
        # wrote (its values [K, OH, OW] and its dataset), until a planar task reads it.
        self.flow = None

    # -- memory words --------------------------------------------------------------------

    def words(self, address, count):
        """``count`` 32-bit words from word ``address`` (words beyond memory read as 0)."""
        lo = max(0, min(4 * address, self.mem.size))
        hi = max(lo, min(4 * (address + count), self.mem.size))
        raw = self.mem[lo:hi].tobytes()
        raw += bytes(4 * count - len(raw))
        return [int(w) for w in np.frombuffer(raw, "<u4")]

    # -- DMA -----------------------------------------------------------------------------

    def run_dma(self):
        t = _transfer(self.regs)
        base, limit = self.window
        err = dma.dma_error(t, cores=self.config.cores, buffer_elements=self.buf.size,
                            kernel_words=self.kernel_words, limit_bytes=4 * limit)
        if err:
            return int(err)
        sizes, ms, bs = t["sizes"], t["mem_strides"], t["buf_strides"]
        mem = np.zeros((), np.int64) + 4 * base + t["mem_addr"]
        onchip = np.zeros((), np.int64) + t["buf_addr"]
        for k in reversed(range(dma.RANK)):
            steps = np.arange(sizes[k], dtype=np.int64)
            mem = mem[..., None] + steps * ms[k]
            onchip = onchip[..., None] + steps * bs[k]
        mem, onchip = mem.ravel(), onchip.ravel()
        nbytes = dma.element_bytes(t["fmt"])
        bad = np.nonzero(mem + nbytes > self.mem.size)[0]
        code = dma.DmaError.NONE
        if len(bad):
            mem, onchip = mem[:bad[0]], onchip[:bad[0]]
            code = dma.DmaError.BUS
        byte = [self.mem[mem + k].astype(np.uint32) for k in range(nbytes)] \
            if t["dir"] != dma.DmaDir.BUF_TO_MEM else None
        if t["dir"] == dma.DmaDir.MEM_TO_BUF:
            if t["fmt"] == dma.DmaFormat.INT8:
                values = byte[0].astype(np.uint8).view(np.int8).astype(np.int16).view(np.uint16)
            else:
                values = (byte[0] | (byte[1] << 8)).astype(np.uint16)
            _store(self.buf, onchip, values)
        elif t["dir"] == dma.DmaDir.MEM_TO_KMEM:
            words = byte[0] | (byte[1] << 8) | (byte[2] << 16) | (byte[3] << 24)
            _store(self.kmem[t["core"]], onchip, words.astype(np.uint32))
        else:
            values = self.buf[onchip]
            _store(self.mem, mem, (values & 0xFF).astype(np.uint8))
            if nbytes == 2:
                _store(self.mem, mem + 1, (values >> 8).astype(np.uint8))
        return int(code)

    # -- neural engine -------------------------------------------------------------------

    def run_neural(self):
        mask = self.regs.get(dataproc.NE_CORES, 1)
        cores = [i for i in range(self.config.cores) if mask >> i & 1]
        results = [self._core(core) for core in cores]
        code = 0
        for core, (writes, err) in zip(cores, results):
            for ds, out in writes:
                if core != 0:
                    ds = dict(ds, slots=0)      # flow control is core 0's only
                elif ds["slots"]:
                    self.flow = (out, ds)
                self._write_dataset(ds, out)
            code = code or err
        return code

    def _core(self, core):
        """``(writes, error)`` of core ``core``'s layer: the ``(dataset, [K, OH, OW] values)``
        it writes and its error code. After an error the output-channel groups before the
        failing one have written their results; the rest of the dataset is left as it was."""
        cfg = self.config
        layer = _fields(self.regs, neural.core_base(core), neural.LAYER_REGISTERS)
        err = int(neural.layer_error(layer, cfg))
        limit = None
        if err in (neural.NeuralError.BUFFER, neural.NeuralError.EXTRACT):
            limit = _first_bad_group(layer, cfg)
        elif err:
            return [], err
        groups, kernel_err = self._kernel_groups(core, layer, limit)
        err = err or kernel_err
        if not groups:
            return [], err
        out = self._conv(core, layer, groups)
        return [(_dataset(self.regs, dataproc.ne_port_base(core, "OUT")), out)], err

    def _kernel_groups(self, core, layer, limit=None):
        """The :class:`_Group` of each output-channel group read through the group table, up
        to the first the extractor rejects (and below group ``limit``); ``(groups, error
        code)``."""
        cfg = self.config
        fmt = MacFormat(layer["fmt"])
        kmem = self.kmem[core]
        size = kmem.size
        k = layer["groups"] * layer["ocpg"]
        slots = cfg.acc_slots
        groups = []
        for g, base in enumerate(range(0, k, slots)):
            if limit is not None and g >= limit:
                break
            ocg = min(slots, k - base)
            table = (layer["addr"] + GROUP_TABLE_WORDS * g) & 0xFFFF
            entry = {name: int(kmem[(table + j) % size]) & 0xFFFF
                     for j, name in enumerate(GROUP_TABLE)}
            parts = {}
            for part in ("header", "body"):
                addr = (entry[f"{part}_addr"] + np.arange(entry[f"{part}_words"])) % size
                parts[part] = kmem[addr].astype("<u4").tobytes()
            kc = KernelConfig(fmt.coef_fp16, bool(layer["sparse"]), layer["palette"],
                              layer["icpg"], layer["kh"], layer["kw"], ocg)
            try:
                params, dense = dense_codes(parts["header"], parts["body"], kc, slots=slots,
                                            fp16=cfg.has_float, int8=cfg.has_int8,
                                            extract=cfg.kernel_extract)
            except KernelFormatError:
                return groups, int(neural.NeuralError.EXTRACT)
            weights = (dense & 0xFFFF).astype(np.uint16) if fmt.coef_fp16 else \
                (dense & 0xFF).astype(np.uint8).view(np.int8)
            groups.append(_Group(EncodedGroup(parts["header"], parts["body"], kc, weights,
                                              params.palette, params.nnz), params))
        return groups, 0

    def _conv_input(self, core, layer):
        """The input the core's row requests read, as ``[C, Hn, Wn]`` values, ``Hn`` and ``Wn``
        the rows and columns from 0 its outputs need (zeros outside the dataset's H, W)."""
        ds = _dataset(self.regs, dataproc.ne_port_base(core, "IN"))
        s, d, p = layer["stride"], layer["dilation"], layer["pad"]
        hn = max(1, (layer["out_h"] - 1) * s + (layer["kh"] - 1) * d + 1 - p)
        wn = max(1, (layer["out_w"] - 1) * s + (layer["kw"] - 1) * d + 1 - p)
        c = layer["groups"] * layer["icpg"]
        values = np.zeros((c, hn, wn), np.uint16)
        h, w = min(hn, ds["height"]), min(wn, ds["width"])
        if h and w:
            addr = (ds["addr"] + np.arange(c)[:, None, None] * ds["cstride"]
                    + np.arange(h)[None, :, None] * ds["rstride"]
                    + np.arange(w)[None, None, :]) % self.buf.size
            values[:, :h, :w] = self.buf[addr]
        return values

    def _conv(self, core, layer, groups):
        cfg = self.config
        fmt = MacFormat(layer["fmt"])
        inputs = self._conv_input(core, layer)
        c, hn, wn = inputs.shape
        k = sum(g.enc.config.ocg for g in groups)
        full_k = layer["groups"] * layer["ocpg"]
        conv = ConvLayer(c, hn, wn, full_k, layer["kh"], layer["kw"], stride=layer["stride"],
                         pad=layer["pad"], dilation=layer["dilation"], groups=layer["groups"],
                         fmt=fmt.name.lower())
        weights = np.zeros(conv.weight_shape, np.uint16 if fmt.coef_fp16 else np.int8)
        bias = np.zeros(full_k, np.uint32)
        scale = np.zeros(full_k, np.uint32)
        shift = np.zeros(full_k, np.int64)
        for g, group in enumerate(groups):
            sl = slice(g * cfg.acc_slots, g * cfg.acc_slots + group.enc.config.ocg)
            weights[sl] = group.enc.weights
            bias[sl], scale[sl], shift[sl] = (group.params.bias, group.params.scale,
                                              group.params.shift)
        if fmt.data_fp16:
            data = inputs
        else:
            data = (inputs & 0xFF).astype(np.uint8).view(np.int8)
        post = PostprocConfig(out_fp16=bool(layer["out_fp16"]), act=layer["act"],
                              zero_point=_s8(layer["zero_point"]), lo=layer["lo"],
                              hi=layer["hi"], alpha=layer["alpha"],
                              stochastic=bool(layer["stochastic"]), seed=layer["seed"])
        oh, ow = layer["out_h"], layer["out_w"]
        if post.stochastic and post.out_fp16 and fmt.is_float:
            # Stochastic rounding depends on the order of the result beats: the engine's.
            fields = dict(layer)
            if k < full_k:
                raise NotImplementedError("stochastic rounding with a rejected kernel group")
            out, _ = engine_output(conv, cfg, fields, data, weights, bias, scale, shift, post,
                                   [g.enc for g in groups])
            return _fit(out, oh, ow)
        acc = conv_accumulate(conv, data, weights, bias)
        acc = _fit(acc, oh, ow)
        # Without stochastic rounding the lanes are independent: every channel in one call,
        # each lane with its channel's parameters.
        lanes = (k, oh * ow)
        vals, _ = postprocess(acc[:k].reshape(-1), fmt,
                              np.broadcast_to(scale[:k, None], lanes).reshape(-1),
                              np.broadcast_to(shift[:k, None], lanes).reshape(-1), post,
                              np.ones(k * oh * ow, np.uint32), cfg.formats)
        return np.asarray(vals, np.uint16).reshape(k, oh, ow)

    def _write_dataset(self, ds, values):
        """Write ``values`` ``[K, OH, OW]`` to dataset ``ds`` (each element at its address)."""
        k, h, w = values.shape
        addr = (ds["addr"] + _ring_planes(ds, np.arange(k))[:, None, None] * ds["cstride"]
                + np.arange(h)[None, :, None] * ds["rstride"]
                + np.arange(w)[None, None, :]) % self.buf.size
        _store(self.buf, addr.ravel(), values.ravel().astype(np.uint16))

    # -- planar engine -------------------------------------------------------------------

    def run_planar(self):
        cfg = self.config
        task = _fields(self.regs, PLANAR_ENGINE.base, planar_spec.TASK_REGISTERS)
        err = planar_spec.task_error(task, cfg)
        if err:
            return int(err)
        lanes = cfg.planar_lanes ** 2
        counts = planar_spec.operand_beats(task, lanes)
        c, h, w = task["channels"], task["height"], task["width"]
        fmt_in = Fmt(task["in_fmt"])
        ops = {}
        for port, name in (("A", "a"), ("B", "b"), ("C", "c")):
            n = counts[name]
            if not n:
                continue
            beats = self._stream(port, n, lanes)
            if name == "b" and task["bcast"] >= Bcast.CHANNEL:
                rows = beats.reshape(1, -1)[:, :planar_spec.vector_length(task)]
                values = rows.reshape(-1)
            else:
                values = beats.reshape(c * h, -1)[:, :w].reshape(c, h, w)
            ops[name] = values if fmt_in == Fmt.FP16 else \
                (values & 0xFF).astype(np.uint8).view(np.int8)
        result = _planar_result(task, ops, lanes)
        self._take_beats(_result_beats(task, result, lanes))
        return 0

    def _stream(self, port, n, lanes):
        """The first ``n`` beats ``[n, lanes]`` that dataset ``PE_{port}`` streams."""
        ds = _dataset(self.regs, dataproc.pe_port_base(port))
        c, h, w = ds["channels"], ds["height"], ds["width"]
        wb = -(-w // lanes)
        have = c * h * wb
        if have < n:
            raise HangError(f"dataset PE_{port} streams {have} beats, the planar engine "
                            f"consumes {n}: the task would never finish")
        rows = -(-n // wb)
        row = np.arange(rows)
        if port != "A":
            ds = dict(ds, slots=0)              # flow control is operand A's only
        addr = (ds["addr"] + _ring_planes(ds, row // h)[:, None] * ds["cstride"]
                + (row % h)[:, None] * ds["rstride"] + np.arange(wb * lanes)[None, :])
        values = self.buf[addr % self.buf.size]
        if ds["slots"]:
            values = self._flow_values(ds, row, values, lanes)
        values[:, w:] = 0
        return values.reshape(-1, lanes)[:n]

    def _flow_values(self, ds, row, values, lanes):
        """Rows ``row`` of a flow-controlled operand: what the producer wrote (the ring
        slots are reused while the stream runs, so the buffer at the end does not hold them);
        a unit the producer never writes is waited for forever."""
        if self.flow is None:
            raise HangError("a flow-controlled operand without a producer: the planar task "
                            "would wait forever")
        out, _ = self.flow
        self.flow = None
        k, oh, ow = out.shape
        h = ds["height"]
        planes = max(1, ds["planes"])
        need = int(row[-1] // h) // planes + 1
        if need > -(-k // planes):
            raise HangError(f"a flow-controlled operand reads unit {need - 1}, the producer "
                            f"writes {-(-k // planes)}: the planar task would wait forever")
        values = values.copy()
        c, y = row // h, row % h
        cols = min(ow, values.shape[1])
        inside = (c < k) & (y < oh)
        values[inside, :cols] = out[c[inside], y[inside], :cols]
        return values

    def _take_beats(self, beats):
        """Dataset ``PE_OUT`` takes result ``beats`` ``[n, lanes]``."""
        ds = _dataset(self.regs, dataproc.pe_port_base("OUT"))
        n, lanes = beats.shape
        c, h, w = ds["channels"], ds["height"], ds["width"]
        wb = -(-w // lanes)
        if c * h * wb < n:
            raise HangError(f"dataset PE_OUT takes {c * h * wb} beats, the planar engine "
                            f"produces {n}: the task would never finish")
        k = np.arange(n)
        row, beat = k // wb, k % wb
        x = beat[:, None] * lanes + np.arange(lanes)[None, :]
        addr = (ds["addr"] + (row // h)[:, None] * ds["cstride"]
                + (row % h)[:, None] * ds["rstride"] + x)
        inside = x < w
        _store(self.buf, addr[inside] % self.buf.size, beats[inside])


class _Group(NamedTuple):
    """An output-channel group as the core decodes it: the blob and its header's values."""
    enc: EncodedGroup
    params: object


def _first_bad_group(layer, config):
    """Index of the first output-channel group the core refuses before decoding its header
    (``BUFFER``: its input rows exceed the input buffer; ``EXTRACT``: a bad palette width)."""
    _, _, buffer_rows = neural.engine_geometry(config)
    if layer["palette"] not in PALETTE_BITS:
        return 0
    k, slots = layer["groups"] * layer["ocpg"], config.acc_slots
    for g, base in enumerate(range(0, k, slots)):
        last = min(k, base + slots) - 1
        spanned = last // layer["ocpg"] - base // layer["ocpg"] + 1
        if spanned * layer["icpg"] * layer["kh"] > buffer_rows:
            return g
    return None


def _s8(value):
    return value - 256 if value & 0x80 else value


def _fit(values, oh, ow):
    """``values`` cut or zero-padded to ``oh`` rows and ``ow`` columns."""
    out = np.zeros(values.shape[:-2] + (oh, ow), values.dtype)
    h, w = min(oh, values.shape[-2]), min(ow, values.shape[-1])
    out[..., :h, :w] = values[..., :h, :w]
    return out


def _store(target, index, values):
    """``target[index] = values`` where the last write to an index wins."""
    index = np.asarray(index, np.int64).ravel()
    values = np.asarray(values).ravel()
    if index.size == 0:
        return
    _, last = np.unique(index[::-1], return_index=True)
    keep = index.size - 1 - last
    target[index[keep]] = values[keep]


def _planar_result(task, ops, lanes):
    """The golden planar result (``np.int8`` or binary16 codes) of ``task``."""
    fmt = {"in_fmt": task["in_fmt"], "out_fmt": task["out_fmt"]}
    mode = task["mode"]
    if mode == Mode.ELTWISE:
        return pl.eltwise(task["op"], ops["a"], ops.get("b"), ops.get("c"),
                          scale=task["scale"], bias=task["bias"], bcast=task["bcast"],
                          scalar=task["scalar"], **fmt)
    if mode == Mode.POOL:
        return pl.pool(ops["a"], task["op"], task["kh"], task["kw"], task["sy"], task["sx"],
                       task["py"], task["px"], **fmt)
    return pl.reduce(ops["a"], task["op"], lanes=lanes, pre=task["pre"],
                     axis=Axis(task["axis"]).name.lower(), scale=task["scale"],
                     post=task["post"], **fmt)


def _result_beats(task, result, lanes):
    """The result beats ``[n, lanes]`` (16-bit elements, int8 sign-extended) of ``result``."""
    values = np.asarray(result)
    values = values.astype(np.int16).view(np.uint16) if values.dtype == np.int8 else \
        values.astype(np.uint16)
    if task["mode"] == Mode.REDUCE and task["axis"] != Axis.CHANNEL:
        beats = np.zeros((values.size, lanes), np.uint16)
        beats[:, 0] = values.ravel()
        return beats
    shape = planar_spec.output_shape(task)
    w = shape[-1]
    rows = values.reshape(-1, w)
    wb = -(-w // lanes)
    padded = np.zeros((rows.shape[0], wb * lanes), np.uint16)
    padded[:, :w] = rows
    return padded.reshape(-1, lanes)


# --------------------------------------------------------------------------------------------
# the task manager


def _apply_writes(regs, blocks):
    for block in blocks:
        for i, word in enumerate(block.words):
            regs[block.address + i] = int(word)


class _QueueRun:
    """One queue's list, run a descriptor at a time (:meth:`step`)."""

    def __init__(self, machine, q, slot_words):
        self.machine, self.q, self.slot_words = machine, q, slot_words
        self.status = QueueStatus(q.index)
        self.entry = machine.program.base_table[q.base_index]
        self.address = q.head
        self.left = q.tasks

    @property
    def active(self):
        return self.left > 0 and not self.status.retired

    def step(self, tasks):
        """Fetch, program and run the next task: its descriptor, or None when the queue was
        retired instead (a decode error, an engine error, a hang)."""
        machine, q, status = self.machine, self.q, self.status
        entry, address = self.entry, self.address
        machine.window = (entry.base, entry.limit)
        self.left -= 1
        try:
            desc = decode(machine.words(address, self.slot_words), network=q.network,
                          window=(entry.base, entry.limit), address=address, tail=q.tail,
                          max_length=self.slot_words)
        except DescriptorError as e:
            status.retired, status.address = True, address
            status.cause = next(c for cls, c in _CAUSES.items() if isinstance(e, cls))
            return None
        _apply_writes(machine.regs, desc.blocks)
        engine = Engine(desc.engine)
        run = {Engine.NEURAL: machine.run_neural, Engine.PLANAR: machine.run_planar,
               Engine.DMA: machine.run_dma}[engine]
        try:
            code = run()
        except HangError:
            # The engine waits forever; the task manager's watchdog aborts the task.
            tasks.append(TaskRecord(q.index, desc.task_id, int(engine), None, address))
            status.retired, status.cause, status.address = True, Cause.TIMEOUT, address
            status.engine = int(engine)
            return None
        tasks.append(TaskRecord(q.index, desc.task_id, int(engine), code, address))
        if code:
            status.retired, status.cause, status.address = True, Cause.ENGINE, address
            status.engine, status.code = int(engine), code
            return None
        status.completed += 1
        self.address += desc.length
        return desc


def run_program(program, *, slot_words=SLOT_WORDS, arrivals=None):
    """Run ``program`` (:class:`npu_spec.program.Program`); returns a :class:`SystemResult`.

    ``slot_words`` is the task manager's slot size, the longest descriptor it accepts.

    ``arrivals`` (``{queue: n}``) pushes a queue's tasks only once ``n`` tasks have
    completed (the host's late push, ``npu_sim.system.host_commands(late=...)``); the other
    queues are there from the start. The queue of highest priority with work runs (ties: the
    lower index) and keeps the NPU until its list ends or the task-switch rules hand it over
    (seed 000, ``docs/task_manager.md``): a task with ``TSE`` completing while a queue of
    higher priority waits sets GTSP; a task with ``TSR`` completing while GTSP is set
    switches to the arbiter's choice. A queue that arrives after ``n`` completions is seen
    from the completion of the next task on (the earliest switch the RTL can make; the RTL
    may switch at a later switch point, with the same results). The switches are listed in
    :attr:`SystemResult.switches`.
    """
    if not isinstance(program, Program):
        raise TypeError(f"program must be a Program, not {program!r}")
    arrivals = dict(arrivals or {})
    machine = _Machine(program)
    tasks, switches = [], []
    runs = {q.index: _QueueRun(machine, q, slot_words) for q in program.queues}
    rank = {q.index: (-q.priority, q.index) for q in program.queues}
    prio = {q.index: q.priority for q in program.queues}
    done, current, gtsp = 0, None, False
    while any(r.active for r in runs.values()):
        present = [i for i, r in runs.items() if r.active and arrivals.get(i, 0) <= done]
        if not present:
            # Nothing left to complete before the late queues arrive: they arrive now.
            present = [i for i, r in runs.items() if r.active]
            done = max(done, min(arrivals.get(i, 0) for i in present))
        if current not in present:
            current, gtsp = min(present, key=rank.get), False
        desc = runs[current].step(tasks)
        if desc is None:
            continue
        done += 1
        if desc.tse and any(prio[i] > prio[current] for i in present):
            gtsp = True                                                         # rule 1
        if gtsp and desc.tsr:                                                   # rule 3
            gtsp = False
            waiting = [i for i, r in runs.items()
                       if r.active and arrivals.get(i, 0) <= done]
            nxt = min(waiting, key=rank.get)
            switches.append((current, desc.task_id, nxt))
            current = nxt
    return SystemResult(memory=machine.mem.tobytes(),
                        queues=[runs[i].status for i in sorted(runs)], tasks=tasks,
                        buffer=machine.buf, kernel_memories=machine.kmem,
                        registers=machine.regs, switches=switches)



# --------------------------------------------------------------------------------------------
# one engine task on its own


def _task_machine(config, regs, buffer):
    """A machine with no system memory, the registers at reset updated with ``regs`` and
    ``buffer`` as its buffer."""
    mach = _Machine(SimpleNamespace(config=config, memory=b"", memory_bytes=0))
    mach.buf[:] = buffer
    mach.regs.update(regs)
    return mach


def run_neural_task(config, regs, buffer, kernel_memory):
    """One neural task, as a program's ``NEURAL`` task runs it: ``(error code, buffer)``.

    ``regs`` are register words ``{word address: value}`` written over the reset values,
    ``buffer`` the buffer's elements before the task, ``kernel_memory`` core 0's kernel-memory
    words (every core's, if a list of arrays)."""
    mach = _task_machine(config, regs, buffer)
    memories = kernel_memory if isinstance(kernel_memory, list) else [kernel_memory]
    for core, words in enumerate(memories):
        mach.kmem[core][:] = words
    code = mach.run_neural()
    return code, mach.buf


def run_planar_task(config, regs, buffer, flow=None):
    """One planar task, as a program's ``PLANAR`` task runs it: ``(error code, buffer)``.

    ``flow`` is what the neural task before it left on a flow-controlled output dataset
    (``(values [K, OH, OW], dataset)``), for a flow-controlled operand ``A``. Raises
    :class:`HangError` where the RTL would wait forever."""
    mach = _task_machine(config, regs, buffer)
    mach.flow = flow
    code = mach.run_planar()
    return code, mach.buf
