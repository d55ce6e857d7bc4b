"""The DMA engine: strided copies between system memory, the buffer and the kernel memories.

A DMA task copies the elements of a rank-5 index space ``(i4, i3, i2, i1, i0)`` (``i0``
innermost, ``0 <= ik < nk``) between system memory and an on-chip memory (``docs/system.md``):

* memory side: byte address ``MEM_ADDR + sum(ik * MEM_STRIDEk)``, an offset from the base of
  the task's network window (``BASE`` of the queue's base-table entry, in 32-bit words, so the
  bus byte address is ``4 * BASE + offset``);
* on-chip side: ``BUF_ADDR + sum(ik * BUF_STRIDEk)``, an element address of the buffer (16-bit
  elements) or a word address of core ``MODE.core``'s kernel memory (32-bit words).

Strides are signed (two's complement), so a transfer may transpose, slice or reverse in flight.
The element format says how one element is stored on each side (:class:`DmaFormat`).

Before the first access the engine checks the whole transfer (:func:`dma_error`): a zero size,
a bad mode, a ``HALF`` or ``WORD`` element at a memory offset that is not a multiple of its size,
any memory byte outside ``[0, 4 * LIMIT)`` of the window or any on-chip address outside its
memory ends the task with an error and no access at all. A bus error during the
transfer ends it with ``BUS`` (the elements before it were copied).
"""

import enum

from .codes import coded
from .engine import ERROR_BITS, TASK_OFFSET, control_registers
from .registers import ADDRESS_WINDOWS
from .regmap import Field, Register, RegisterMap

__all__ = [
    "BASE", "DMA", "RANK", "DmaDir", "DmaError", "DmaFormat", "dma_error", "element_bytes",
    "extent", "make_transfer", "transfer_elements", "transfer_writes",
]

#: Word address of the DMA engine's registers.
BASE = ADDRESS_WINDOWS["DMA"][0]

#: Rank of the index space.
RANK = 5

#: Width of a size field (``nk`` in ``[1, 2**SIZE_BITS - 1]``).
SIZE_BITS = 16


@coded(2)
class DmaDir(enum.IntEnum):
    """``MODE.dir``: source and destination of the copy."""
    MEM_TO_BUF = 0
    BUF_TO_MEM = 1
    #: System memory to core ``MODE.core``'s kernel memory (``fmt`` must be ``WORD``).
    MEM_TO_KMEM = 2


@coded(2)
class DmaFormat(enum.IntEnum):
    """``MODE.fmt``: how an element is stored on each side."""
    #: One byte in memory; a buffer element holds it sign-extended to 16 bits (a store writes
    #: the element's low byte).
    INT8 = 0
    #: Two bytes in memory (little-endian); a buffer element holds the 16 bits as they are.
    HALF = 1
    #: Four bytes in memory (little-endian); one kernel-memory word (``MEM_TO_KMEM`` only).
    WORD = 2


def element_bytes(fmt):
    """Bytes an element of format ``fmt`` takes in system memory."""
    return {DmaFormat.INT8: 1, DmaFormat.HALF: 2, DmaFormat.WORD: 4}[DmaFormat(fmt)]


@coded(ERROR_BITS)
class DmaError(enum.IntEnum):
    """``STATUS.error_code`` of the DMA engine."""
    NONE = 0
    #: Unknown direction or format, ``WORD`` with a buffer or ``INT8``/``HALF`` with a kernel
    #: memory, or a core index the build does not have.
    BAD_MODE = 1
    #: A size ``nk`` of 0.
    BAD_SHAPE = 2
    #: A memory byte of the transfer outside the network's window (nothing was accessed).
    WINDOW = 3
    #: An on-chip address outside the buffer or the kernel memory (nothing was accessed).
    BOUNDS = 4
    #: The system-memory bus answered with ``err`` (the transfer stopped there).
    BUS = 5
    #: A ``HALF`` or ``WORD`` element at a memory offset that is not a multiple of its size
    #: (nothing was accessed): an element never straddles two bus words.
    ALIGN = 6


def _stride_fields(prefix, doc):
    return [Register(f"{prefix}_STRIDE{k}", doc=f"{doc} stride of index `i{k}`.", fields=[
        Field("stride", 32, doc="Signed (two's complement)."),
    ]) for k in range(RANK)]


DMA = RegisterMap("DMA", base=BASE, doc=(
    "The DMA engine (`docs/system.md`): copies the elements of a rank-5 index space between "
    "system memory (offsets from the task's network window) and the buffer or a core's kernel "
    "memory. The whole transfer is checked before the first access; an out-of-window or "
    "out-of-bounds transfer ends with an error and touches nothing."
), registers=control_registers(DmaError, counter_doc="Cycles from start to done of the last "
                               "(or running) transfer.") + [
    Register("MODE", offset=TASK_OFFSET, doc="Direction, element format, kernel memory.",
             fields=[
        Field("dir", DmaDir.bits, enum=DmaDir, doc="0 memory to buffer, 1 buffer to memory, "
              "2 memory to kernel memory."),
        Field("fmt", DmaFormat.bits, offset=4, enum=DmaFormat, doc="0 int8, 1 half (16 bits), "
              "2 word (32 bits, kernel memory only)."),
        Field("core", 6, offset=8, doc="Core whose kernel memory `MEM_TO_KMEM` fills."),
    ]),
    Register("MEM_ADDR", doc="First memory byte.", fields=[
        Field("addr", 32, doc="Byte offset from the base of the network's window."),
    ]),
    Register("BUF_ADDR", doc="First on-chip address.", fields=[
        Field("addr", 24, doc="Buffer element address, or kernel-memory word address."),
    ]),
    Register("SIZE0", doc="Sizes of `i0` and `i1`.", fields=[
        Field("n0", SIZE_BITS, doc="Elements along `i0` (innermost)."),
        Field("n1", SIZE_BITS, offset=16, doc="Elements along `i1`."),
    ]),
    Register("SIZE1", doc="Sizes of `i2` and `i3`.", fields=[
        Field("n2", SIZE_BITS, doc="Elements along `i2`."),
        Field("n3", SIZE_BITS, offset=16, doc="Elements along `i3`."),
    ]),
    Register("SIZE2", doc="Size of `i4`.", fields=[
        Field("n4", SIZE_BITS, doc="Elements along `i4` (outermost)."),
    ]),
] + _stride_fields("MEM", "Memory byte") + _stride_fields("BUF", "On-chip address"))

#: The fields of a transfer.
TRANSFER_FIELDS = ("dir", "fmt", "core", "mem_addr", "buf_addr", "sizes", "mem_strides",
                   "buf_strides")


def make_transfer(*, dir, fmt, mem_addr, buf_addr, sizes, mem_strides, buf_strides, core=0):
    """A transfer dict. ``sizes``, ``mem_strides`` and ``buf_strides`` list ``n0, n1, ...``
    (innermost first; up to :data:`RANK` entries, missing ones are 1 and 0)."""
    sizes, mem_strides, buf_strides = list(sizes), list(mem_strides), list(buf_strides)
    for name, seq in (("sizes", sizes), ("mem_strides", mem_strides),
                      ("buf_strides", buf_strides)):
        if len(seq) > RANK:
            raise ValueError(f"{name} has {len(seq)} entries; a transfer has rank {RANK}")
    sizes += [1] * (RANK - len(sizes))
    mem_strides += [0] * (RANK - len(mem_strides))
    buf_strides += [0] * (RANK - len(buf_strides))
    return {"dir": int(dir), "fmt": int(fmt), "core": int(core), "mem_addr": int(mem_addr),
            "buf_addr": int(buf_addr), "sizes": tuple(int(n) for n in sizes),
            "mem_strides": tuple(int(s) for s in mem_strides),
            "buf_strides": tuple(int(s) for s in buf_strides)}


def _u32(value):
    return value & 0xFFFF_FFFF


def transfer_writes(t):
    """Register writes ``[(word address, value), ...]`` that program transfer ``t`` (without
    the start)."""
    n = t["sizes"]
    values = {
        "MODE": DMA["MODE"].pack(strict=False, dir=t["dir"], fmt=t["fmt"], core=t["core"]),
        "MEM_ADDR": _u32(t["mem_addr"]),
        "BUF_ADDR": DMA["BUF_ADDR"].pack(addr=t["buf_addr"]),
        "SIZE0": DMA["SIZE0"].pack(n0=n[0], n1=n[1]),
        "SIZE1": DMA["SIZE1"].pack(n2=n[2], n3=n[3]),
        "SIZE2": DMA["SIZE2"].pack(n4=n[4]),
    }
    for k in range(RANK):
        values[f"MEM_STRIDE{k}"] = _u32(t["mem_strides"][k])
        values[f"BUF_STRIDE{k}"] = _u32(t["buf_strides"][k])
    return [(DMA.base + DMA[name].offset, value) for name, value in values.items()]


def extent(start, sizes, strides):
    """``(lowest, highest)`` address reached by ``start + sum(ik * sk)`` over the index space
    (sizes at least 1)."""
    lo = hi = start
    for n, s in zip(sizes, strides):
        step = (n - 1) * s
        if step < 0:
            lo += step
        else:
            hi += step
    return lo, hi


def dma_error(t, *, cores, buffer_elements, kernel_words, limit_bytes):
    """The error code the DMA engine gives transfer ``t`` before its first access
    (:class:`DmaError`; ``NONE`` when it may run).

    ``limit_bytes`` is the size of the network's window (``4 * LIMIT``). Checks in this order:
    mode, shape, alignment, window (the memory side), bounds (the on-chip side). A memory
    element is aligned when its offset is a multiple of its size (the window's base is a 32-bit
    word and a bus word is at least one, so an aligned element lies in one bus word), and inside
    the window when all of its bytes are.
    """
    try:
        direction, fmt = DmaDir(t["dir"]), DmaFormat(t["fmt"])
    except ValueError:
        return DmaError.BAD_MODE
    kmem = direction == DmaDir.MEM_TO_KMEM
    if (fmt == DmaFormat.WORD) != kmem or (kmem and not 0 <= t["core"] < cores):
        return DmaError.BAD_MODE
    if any(n == 0 for n in t["sizes"]):
        return DmaError.BAD_SHAPE
    size = element_bytes(fmt)
    if t["mem_addr"] % size or any(n > 1 and s % size
                                   for n, s in zip(t["sizes"], t["mem_strides"])):
        return DmaError.ALIGN
    lo, hi = extent(t["mem_addr"], t["sizes"], t["mem_strides"])
    if lo < 0 or hi + size > limit_bytes:
        return DmaError.WINDOW
    lo, hi = extent(t["buf_addr"], t["sizes"], t["buf_strides"])
    if lo < 0 or hi >= (kernel_words if kmem else buffer_elements):
        return DmaError.BOUNDS
    return DmaError.NONE


def transfer_elements(t):
    """The element pairs ``(memory byte offset, on-chip address)`` of transfer ``t``, in the
    order the engine accesses them (``i0`` fastest)."""
    n, ms, bs = t["sizes"], t["mem_strides"], t["buf_strides"]
    for i4 in range(n[4]):
        for i3 in range(n[3]):
            for i2 in range(n[2]):
                for i1 in range(n[1]):
                    mem = t["mem_addr"] + i4 * ms[4] + i3 * ms[3] + i2 * ms[2] + i1 * ms[1]
                    buf = t["buf_addr"] + i4 * bs[4] + i3 * bs[3] + i2 * bs[2] + i1 * bs[1]
                    for i0 in range(n[0]):
                        yield mem + i0 * ms[0], buf + i0 * bs[0]
