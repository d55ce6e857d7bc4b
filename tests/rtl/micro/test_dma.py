# amaranth: UnusedElaboratable=no
"""The micro DMA unit (``npu.micro.dma``) against the golden system model's DMA engine
(``npu_model.system.run_program`` on a one-task program), bit for bit: the error code, the
system memory, the buffer and the kernel memory, on random shapes, signed strides, formats and
directions, and on each error code of ``npu_spec.dma.DmaError``."""

import dataclasses
import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from npu.micro.dma import MicroDMA
from npu_model.system import run_program
from npu_sim.micro_units import start_and_wait
from npu_spec import dma
from npu_spec.config import preset
from npu_spec.descriptors import Descriptor, encode
from npu_spec.dma import RANK, DmaDir, DmaError, DmaFormat, make_transfer, transfer_writes
from npu_spec.engine import Engine
from npu_spec.program import BaseEntry, Program, QueueSetup
from npu_spec.regmap import WriteBlock
from npu_spec.taskman import address_bits

from .harness import DMAHarness

#: A small build (4 KiB of system memory, a 2 KiB buffer) so that a case simulates quickly.
SMALL = dataclasses.replace(preset("icebreaker"), mem_kib=4, buffer_kib=2)

#: Where the data lies in system memory (bytes; the descriptors are below it).
DATA = 512


def _descriptor(task_id, writes):
    writes = sorted(writes)
    first = writes[0][0]
    assert [a for a, _ in writes] == list(range(first, first + len(writes)))
    return encode(Descriptor(task_id=task_id, engine=Engine.DMA,
                             blocks=(WriteBlock(first, len(writes), tuple(v for _, v in writes)),)))


def _golden(config, image, base, limit, transfers):
    """Run the transfers as one queue on the golden model; its result."""
    words = []
    for k, t in enumerate(transfers):
        words += _descriptor(k, transfer_writes(t))
    head = base
    memory = bytearray(image)
    assert 4 * (head + len(words)) <= DATA
    for k, w in enumerate(words):
        memory[4 * (head + k):4 * (head + k + 1)] = w.to_bytes(4, "little")
    program = Program(config, base_table=(BaseEntry(base, limit),),
                      queues=(QueueSetup(0, head=head, tasks=len(transfers)),),
                      memory=bytes(memory))
    return run_program(program), bytes(memory)


def _rtl(config, memory, buffer, kernel, base, limit, t):
    """Run transfer ``t`` on the micro DMA with the memories given; (code, memory bytes,
    buffer, kernel memory, cycles)."""
    registers = [0] * 256
    for address, value in transfer_writes(t):
        registers[address - dma.BASE] = value
    words = np.frombuffer(memory, "<u4")
    dut = DMAHarness(MicroDMA(config), memory=[int(w) for w in words],
                     buffer=[int(v) for v in buffer], kernel=[int(w) for w in kernel],
                     registers=registers)
    out = {}

    async def tb(ctx):
        ctx.set(dut.base, base)
        ctx.set(dut.limit, limit)
        out["cycles"] = await start_and_wait(ctx, dut.start, dut.done, 200_000)
        out["code"] = ctx.get(dut.error)
        await ctx.tick()
        assert not ctx.get(dut.done)
        out["memory"] = b"".join(ctx.get(dut.sysmem.data[k]).to_bytes(4, "little")
                                 for k in range(dut.sysmem.depth))
        out["buffer"] = [ctx.get(dut.buffer.data[k]) for k in range(dut.buffer.depth)]
        out["kernel"] = [ctx.get(dut.kmem.data[k]) for k in range(dut.kmem.depth)]

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    return out


def _random_transfer(rng, config, limit_bytes):
    direction = rng.choice(list(DmaDir))
    fmt = DmaFormat.WORD if direction == DmaDir.MEM_TO_KMEM else \
        rng.choice([DmaFormat.INT8, DmaFormat.HALF])
    size = dma.element_bytes(fmt)
    rank = rng.randint(1, RANK)
    sizes = [rng.randint(1, 4) for _ in range(rank)]
    while np.prod(sizes) > 48:
        sizes[rng.randrange(rank)] = 1
    mem_strides = [size * rng.randint(-40, 40) for _ in range(rank)]
    onchip = config.kernel_kib * 256 if direction == DmaDir.MEM_TO_KMEM else \
        config.buffer_kib * 512
    buf_strides = [rng.randint(-30, 30) for _ in range(rank)]
    lo, hi = dma.extent(0, sizes, mem_strides)
    mem_addr = size * rng.randint(max(0, -lo) // size + DATA // size,
                                  max(0, (limit_bytes - hi) // size - 1))
    blo, bhi = dma.extent(0, sizes, buf_strides)
    buf_addr = rng.randint(max(0, -blo), max(0, onchip - 1 - bhi))
    return make_transfer(dir=direction, fmt=fmt, mem_addr=mem_addr, buf_addr=buf_addr,
                         sizes=sizes, mem_strides=mem_strides, buf_strides=buf_strides)


def _check(config, transfer, *, seed, base=0, limit=None, fill=None):
    """The golden model and the micro DMA agree on ``transfer`` after ``fill`` (a transfer
    that puts data in the buffer first, or None); the error code."""
    rng = np.random.default_rng(seed)
    mem_bytes = config.mem_kib * 1024
    limit = mem_bytes // 4 - base if limit is None else limit
    image = bytearray(rng.integers(0, 256, mem_bytes, dtype=np.uint8).tobytes())
    image[:DATA] = bytes(DATA)
    before, _ = _golden(config, image, base, limit, [fill] if fill else [])
    after, memory = _golden(config, image, base, limit, ([fill] if fill else []) + [transfer])
    record = after.tasks[-1]
    assert record.engine == Engine.DMA
    # The micro unit starts from the program's memory and the buffer the fill left (the fill
    # writes only the buffer).
    got = _rtl(config, memory, before.buffer, before.kernel_memories[0], base, limit,
               transfer)
    assert got["code"] == record.code
    assert got["memory"] == after.memory
    assert got["buffer"] == [int(v) for v in after.buffer]
    assert got["kernel"] == [int(w) for w in after.kernel_memories[0]]
    return record.code


def _fill(config, rng):
    """A transfer writing random halves from memory into the start of the buffer."""
    n = config.buffer_kib * 512
    return make_transfer(dir=DmaDir.MEM_TO_BUF, fmt=DmaFormat.HALF, mem_addr=DATA,
                         buf_addr=0, sizes=[min(n, 256)], mem_strides=[2], buf_strides=[1])


@pytest.mark.parametrize("seed", range(6))
def test_random_transfers_equal_golden(seed):
    rng = random.Random(seed)
    config = SMALL
    for _ in range(3):
        t = _random_transfer(rng, config, config.mem_kib * 1024)
        fill = _fill(config, rng) if t["dir"] == DmaDir.BUF_TO_MEM else None
        assert _check(config, t, seed=seed, fill=fill) == DmaError.NONE


def _errors():
    ok = dict(dir=DmaDir.MEM_TO_BUF, fmt=DmaFormat.INT8, mem_addr=DATA + 4, buf_addr=8,
              sizes=[3, 2], mem_strides=[1, 8], buf_strides=[1, 3])
    return {
        "bad direction": (dict(ok, dir=3), DmaError.BAD_MODE),
        "bad format": (dict(ok, fmt=3), DmaError.BAD_MODE),
        "word into the buffer": (dict(ok, fmt=DmaFormat.WORD), DmaError.BAD_MODE),
        "int8 into the kernel memory": (dict(ok, dir=DmaDir.MEM_TO_KMEM), DmaError.BAD_MODE),
        "a core the build lacks": (dict(ok, dir=DmaDir.MEM_TO_KMEM, fmt=DmaFormat.WORD,
                                        core=1), DmaError.BAD_MODE),
        "size 0": (dict(ok, sizes=[3, 2, 1, 0]), DmaError.BAD_SHAPE),
        "half at an odd address": (dict(ok, fmt=DmaFormat.HALF, mem_addr=DATA + 1),
                                   DmaError.ALIGN),
        "word stride not a multiple of 4": (dict(ok, dir=DmaDir.MEM_TO_KMEM,
                                                 fmt=DmaFormat.WORD, mem_strides=[4, 6]),
                                            DmaError.ALIGN),
        "odd stride of size 1 is fine": (dict(ok, fmt=DmaFormat.HALF, sizes=[1, 2],
                                              mem_strides=[3, 8]), DmaError.NONE),
        "past the window": (dict(ok, mem_addr=1000, sizes=[3, 40], mem_strides=[1, 64]),
                            DmaError.WINDOW),
        "before the window": (dict(ok, mem_addr=1, mem_strides=[-1, 8]), DmaError.WINDOW),
        "window beats bounds": (dict(ok, mem_addr=1000, buf_addr=0, sizes=[3, 40],
                                     mem_strides=[1, 64], buf_strides=[-1, 1]),
                                DmaError.WINDOW),
        "bounds, below 0": (dict(ok, buf_addr=0, buf_strides=[1, -1]), DmaError.BOUNDS),
        "bounds, past the buffer": (dict(ok, buf_addr=1020, buf_strides=[1, 3]),
                                    DmaError.BOUNDS),
        "bounds, past the kernel memory": (dict(ok, dir=DmaDir.MEM_TO_KMEM, fmt=DmaFormat.WORD,
                                                buf_addr=1023, mem_strides=[4, 16]),
                                           DmaError.BOUNDS),
        "negative strides": (dict(ok, mem_addr=DATA + 100, buf_addr=200, sizes=[4, 3, 2],
                                  mem_strides=[-1, -7, 30], buf_strides=[-2, 9, -50]),
                             DmaError.NONE),
        "stride 0 writes the last element": (dict(ok, buf_strides=[0, 0]), DmaError.NONE),
        # Pointers far outside (the unit keeps the low bits and a flag).
        "a memory address far past the window": (dict(ok, mem_addr=1 << 24), DmaError.WINDOW),
        "a memory stride of 2**17 bytes": (dict(ok, mem_strides=[1, 1 << 17]),
                                           DmaError.WINDOW),
        "a memory stride of -2**31 bytes": (dict(ok, mem_strides=[1, -(1 << 31)]),
                                            DmaError.WINDOW),
        "an on-chip address far past the buffer": (dict(ok, buf_addr=1 << 20),
                                                   DmaError.BOUNDS),
        "an on-chip stride of 2**14": (dict(ok, buf_strides=[1, 1 << 14]), DmaError.BOUNDS),
        "an on-chip stride of -2**31": (dict(ok, buf_strides=[1, -(1 << 31)]),
                                        DmaError.BOUNDS),
    }


@pytest.mark.parametrize("case", list(_errors()))
def test_checks_equal_golden(case):
    fields, want = _errors()[case]
    config = SMALL
    t = make_transfer(**fields)
    base, limit = 0, 256   # a 1 KiB window
    assert _check(config, t, seed=1, base=base, limit=limit) == want


def test_bus_error_copies_the_elements_before_it():
    """A window larger than the memory: the elements up to the memory's end are copied, then
    BUS."""
    config = SMALL
    mem_bytes = config.mem_kib * 1024
    t = make_transfer(dir=DmaDir.BUF_TO_MEM, fmt=DmaFormat.HALF, mem_addr=mem_bytes - 64,
                      buf_addr=0, sizes=[8, 8], mem_strides=[2, 16], buf_strides=[1, 8])
    fill = _fill(config, random.Random(0))
    limit = (1 << address_bits(config)) - 1     # the widest window the program may give
    assert 4 * limit > mem_bytes
    assert _check(config, t, seed=2, limit=limit, fill=fill) == DmaError.BUS


def test_window_base_is_added():
    config = SMALL
    t = make_transfer(dir=DmaDir.MEM_TO_KMEM, fmt=DmaFormat.WORD, mem_addr=DATA, buf_addr=3,
                      sizes=[5, 2], mem_strides=[4, 40], buf_strides=[1, 100])
    assert _check(config, t, seed=3, base=17, limit=600) == DmaError.NONE


def test_full_icebreaker_sizes():
    """The icebreaker preset's own memories (64 KiB, 16K buffer elements)."""
    config = preset("icebreaker")
    t = make_transfer(dir=DmaDir.MEM_TO_BUF, fmt=DmaFormat.INT8, mem_addr=60000,
                      buf_addr=16380, sizes=[2, 2], mem_strides=[1, 5000], buf_strides=[1, 2])
    assert _check(config, t, seed=4) == DmaError.NONE
