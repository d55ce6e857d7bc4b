# amaranth: UnusedElaboratable=no
"""The DMA engine against :mod:`npu_spec.dma`: random transfers in every direction, format,
rank and bus width, the error codes, a bus error, an abort, and the throughput."""

import random

import pytest

from npu.dma.engine import DMAEngine
from npu_spec.config import NPUConfig
from npu_spec.dataproc import buffer_elements
from npu_spec.dma import (
    DmaDir,
    DmaError,
    DmaFormat,
    dma_error,
    element_bytes,
    make_transfer,
    transfer_elements,
)
from tests.support.dma import (
    NEVER,
    Buffer,
    KernelSink,
    Memory,
    expected_chip,
    expected_memory,
    random_transfer,
    run,
    run_task,
)

BASE = 24                       # the window's base, in 32-bit words


def _config(mem_width):
    return NPUConfig(mem_width=mem_width, cores=2, buffer_kib=1, kernel_kib=1)


class Bench:
    """A DMA engine with its memory, buffer and kernel memories."""

    def __init__(self, mem_width, seed, *, limit=1024, depth=32, **memory):
        self.config = _config(mem_width)
        self.dut = DMAEngine(self.config, depth=depth)
        self.rng = random.Random(seed)
        image = bytearray(self.rng.randrange(256) for _ in range(4 * (BASE + limit) + 64))
        self.memory = Memory(self.dut.bus, image, self.rng, **memory)
        self.buffer = Buffer(self.dut, buffer_elements(self.config), self.rng)
        self.kmem = KernelSink(self.dut, self.rng)

    @property
    def limits(self):
        return dict(cores=self.config.cores, buffer_elements=buffer_elements(self.config),
                    kernel_words=self.config.kernel_kib * 256)

    def accesses(self):
        return (len(self.memory.requests) + len(self.buffer.reads) + len(self.buffer.writes)
                + len(self.kmem.writes))

    def run(self, testbench):
        run(self.dut, testbench, [self.memory.process, *self.buffer.processes,
                                  self.kmem.process])

    async def transfer(self, ctx, t, limit, **kwargs):
        """Run ``t``; check what it did against the specification. Returns the cycles."""
        mem, buf, kmem = self.memory, self.buffer, self.kmem
        mem.window = (4 * BASE, 4 * (BASE + limit))
        before = {"mem": len(mem.requests), "reads": len(buf.reads),
                  "writes": len(buf.writes), "kmem": len(kmem.writes)}
        image, data = bytes(mem.image), list(buf.data)
        error, cycles = await run_task(ctx, self.dut, t, base=BASE, limit=limit, **kwargs)
        self.check(t, error, before, image, data, mem.err_at)
        return cycles

    def check(self, t, error, before, image, data, err_at):
        mem, buf, kmem = self.memory, self.buffer, self.kmem
        expect = dma_error(t, limit_bytes=4 * (mem.window[1] // 4 - BASE), **self.limits)
        assert mem.violations == []
        assert mem.idle_cyc == 0
        if expect != DmaError.NONE:
            assert error == expect
            assert (len(mem.requests), len(buf.reads), len(buf.writes),
                    len(kmem.writes)) == tuple(before.values())
            return
        done = None if err_at is None else err_at - before["mem"]
        if done is not None and done < len(list(transfer_elements(t))):
            assert error == DmaError.BUS
        else:
            assert error == DmaError.NONE
            done = None
        requests = mem.requests[before["mem"]:]
        pairs = list(transfer_elements(t))
        lanes, size = mem.lanes, element_bytes(t["fmt"])
        addresses = [((4 * BASE + o) // lanes, ((1 << size) - 1) << ((4 * BASE + o) % lanes))
                     for o, _ in pairs]
        if t["dir"] == DmaDir.BUF_TO_MEM:
            assert buf.reads[before["reads"]:] == [b for _, b in pairs][:len(buf.reads)
                                                                        - before["reads"]]
            assert all(we for we, *_ in requests)
            assert [(a, s) for _, a, s, _ in requests] == addresses[:len(requests)]
            if done is None:
                assert mem.image == expected_memory(t, image, data, BASE)
            else:
                # The writes before the error are done; the bus may carry a few more.
                assert len(requests) >= done + 1
                ref = expected_memory(t, image, data, BASE, elements=done)
                for we, adr, sel, dat_w in requests[done + 1:]:
                    for j in range(lanes):
                        if sel >> j & 1:
                            ref[adr * lanes + j] = dat_w >> (8 * j) & 0xFF
                assert mem.image == ref
            return
        assert not any(we for we, *_ in requests)
        assert [(a, s) for _, a, s, _ in requests] == addresses[:len(requests)]
        want = expected_chip(t, image, BASE, elements=done)
        if t["dir"] == DmaDir.MEM_TO_BUF:
            assert buf.writes[before["writes"]:] == [(b, v, 1) for b, v in want]
        else:
            assert kmem.writes[before["kmem"]:] == [(t["core"], b, v) for b, v in want]


KINDS = [(DmaDir.MEM_TO_BUF, DmaFormat.INT8), (DmaDir.MEM_TO_BUF, DmaFormat.HALF),
         (DmaDir.BUF_TO_MEM, DmaFormat.INT8), (DmaDir.BUF_TO_MEM, DmaFormat.HALF),
         (DmaDir.MEM_TO_KMEM, DmaFormat.WORD)]


@pytest.mark.parametrize("latency", [(1, 6), (4, 40)])
@pytest.mark.parametrize("mem_width", [32, 64, 128, 256])
def test_random_transfers(mem_width, latency):
    bench = Bench(mem_width, seed=mem_width + latency[1], latency=latency,
                  depth=16 if latency[1] > 10 else 32)
    rng = random.Random(mem_width + latency[1] + 1)

    async def tb(ctx):
        for _ in range(3):
            for dir, fmt in KINDS:
                chip = bench.limits["kernel_words" if dir == DmaDir.MEM_TO_KMEM
                                    else "buffer_elements"]
                t, limit = random_transfer(rng, dir=dir, fmt=fmt, chip_words=chip,
                                           core=rng.randint(0, 1))
                await bench.transfer(ctx, t, limit)

    bench.run(tb)
    assert bench.memory.max_inflight > 1


def _error_cases():
    """``(transfer, limit)`` pairs, one a rule of :func:`dma_error`, and the code."""
    def t(dir=DmaDir.MEM_TO_BUF, fmt=DmaFormat.HALF, mem_addr=8, buf_addr=4, sizes=(4, 3),
          mem_strides=(2, 8), buf_strides=(1, 4), core=0):
        return make_transfer(dir=dir, fmt=fmt, mem_addr=mem_addr, buf_addr=buf_addr,
                             sizes=sizes, mem_strides=mem_strides, buf_strides=buf_strides,
                             core=core)
    kmem = dict(dir=DmaDir.MEM_TO_KMEM, fmt=DmaFormat.WORD, mem_strides=(4, 16))
    return [
        (t(dir=3), 16, DmaError.BAD_MODE),
        (t(fmt=3), 16, DmaError.BAD_MODE),
        (t(fmt=DmaFormat.WORD), 16, DmaError.BAD_MODE),
        (t(dir=DmaDir.MEM_TO_KMEM, fmt=DmaFormat.INT8), 16, DmaError.BAD_MODE),
        (t(**kmem, core=2), 16, DmaError.BAD_MODE),
        (t(sizes=(4, 3, 1, 0)), 16, DmaError.BAD_SHAPE),
        (t(mem_addr=9), 16, DmaError.ALIGN),
        (t(mem_strides=(2, 7)), 16, DmaError.ALIGN),
        (t(**kmem, mem_addr=2), 16, DmaError.ALIGN),
        (t(mem_strides=(2, 3), sizes=(4, 1)), 16, DmaError.NONE),    # an unused stride
        (t(), 7, DmaError.WINDOW),                  # last byte 8 + 6 + 16 + 1 = 31 > 27
        (t(), 8, DmaError.NONE),
        (t(mem_strides=(2, -8)), 16, DmaError.WINDOW),
        (t(mem_addr=16, mem_strides=(2, -8)), 16, DmaError.NONE),
        (t(buf_strides=(1, -4)), 16, DmaError.BOUNDS),
        (t(buf_addr=512 - 11), 16, DmaError.BOUNDS),
        (t(buf_addr=512 - 12), 16, DmaError.NONE),
        (t(dir=DmaDir.BUF_TO_MEM, buf_addr=600), 16, DmaError.BOUNDS),
        (t(**kmem, buf_addr=256 - 11), 16, DmaError.BOUNDS),
        (t(**kmem, buf_addr=256 - 12, core=1), 16, DmaError.NONE),
        (t(sizes=(2, 2, 2, 2, 2), mem_strides=(2, 4, 8, 16, 1 << 30)), 16, DmaError.WINDOW),
        (t(sizes=(65535, 1, 1, 1, 3), mem_strides=(2, 0, 0, 0, -(1 << 31))), 1 << 31,
         DmaError.WINDOW),
    ]


def test_errors_end_the_task_without_access():
    bench = Bench(64, seed=5, stall=0.0)
    cases = _error_cases()

    async def tb(ctx):
        for t, limit, code in cases:
            assert dma_error(t, limit_bytes=4 * limit, **bench.limits) == code
            before = bench.accesses()
            await bench.transfer(ctx, t, limit)
            if code != DmaError.NONE:
                assert bench.accesses() == before

    bench.run(tb)


@pytest.mark.parametrize("dir, fmt", [(DmaDir.MEM_TO_BUF, DmaFormat.INT8),
                                      (DmaDir.BUF_TO_MEM, DmaFormat.HALF),
                                      (DmaDir.MEM_TO_KMEM, DmaFormat.WORD)])
def test_bus_error(dir, fmt):
    bench = Bench(32, seed=int(dir) * 3 + int(fmt))
    size = element_bytes(fmt)
    t = make_transfer(dir=dir, fmt=fmt, mem_addr=4, buf_addr=10, sizes=[8, 5],
                      mem_strides=[size, 8 * size], buf_strides=[1, 8])

    async def tb(ctx):
        first = len(bench.memory.requests)
        bench.memory.err_at = first + 17
        await bench.transfer(ctx, t, limit=64)
        bench.memory.err_at = None
        assert not ctx.get(bench.dut.bus.cyc)
        await bench.transfer(ctx, t, limit=64)          # the next task runs

    bench.run(tb)


@pytest.mark.parametrize("dir, fmt", [(DmaDir.MEM_TO_BUF, DmaFormat.HALF),
                                      (DmaDir.BUF_TO_MEM, DmaFormat.INT8)])
@pytest.mark.parametrize("answers", [True, False])
def test_abort_then_transfer(dir, fmt, answers):
    bench = Bench(64, seed=7, latency=(1, 8) if answers else (NEVER, NEVER))
    size = element_bytes(fmt)
    t = make_transfer(dir=dir, fmt=fmt, mem_addr=0, buf_addr=0, sizes=[40],
                      mem_strides=[size], buf_strides=[1])

    async def tb(ctx):
        await run_task(ctx, bench.dut, t, base=BASE, limit=64, abort_after=25)
        await ctx.tick()
        assert not ctx.get(bench.dut.bus.cyc)
        assert not ctx.get(bench.dut.buf_write.valid)
        assert not ctx.get(bench.dut.buf_read.req.valid)
        assert bench.memory.requests
        bench.memory.latency = (1, 8)
        await bench.transfer(ctx, t, limit=64)

    bench.run(tb)


@pytest.mark.parametrize("dir, depth, bound", [
    (DmaDir.MEM_TO_BUF, 32, 256 + 40),
    (DmaDir.MEM_TO_BUF, 16, 256 * 26 // 16 + 40),
    (DmaDir.BUF_TO_MEM, 32, 256 + 40),
])
def test_throughput(dir, depth, bound):
    """A contiguous 256-element transfer at latency 20, no stall: one element a cycle when the
    depth covers the round trip."""
    bench = Bench(32, seed=3, depth=depth, latency=(20, 20), stall=0.0)
    bench.buffer.busy = 0.0
    bench.kmem.busy = 0.0
    t = make_transfer(dir=dir, fmt=DmaFormat.INT8, mem_addr=0, buf_addr=0,
                      sizes=[256], mem_strides=[1], buf_strides=[1])
    cycles = []

    async def tb(ctx):
        cycles.append(await bench.transfer(ctx, t, limit=64))

    bench.run(tb)
    print(f"DMA {dir.name} depth {depth}: 256 elements at latency 20 in {cycles[0]} cycles")
    assert cycles[0] <= bound
