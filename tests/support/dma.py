"""Models and helpers for the DMA engine's tests: a Wishbone memory, the buffer, the kernel
memories, random transfers and the expected results of :func:`npu_spec.dma.transfer_elements`."""

from collections import deque

from amaranth.sim import Simulator

from npu_spec.dma import (
    DMA,
    RANK,
    DmaDir,
    DmaFormat,
    element_bytes,
    extent,
    make_transfer,
    transfer_elements,
    transfer_writes,
)
from tests.support.csr import csr_write

__all__ = [
    "Buffer", "KernelSink", "Memory", "expected_chip", "expected_memory", "random_transfer",
    "run", "run_task",
]

NEVER = 1 << 60


def run(dut, testbench, processes, vcd=None):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for process in processes:
        sim.add_process(process)
    sim.add_testbench(testbench)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


class Memory:
    """A Wishbone B4 pipelined slave: a byte image with random latency and stall.

    ``latency`` is ``(lo, hi)``: a request taken in cycle ``c`` is answered in cycle
    ``c + latency`` at the earliest (in order, one answer a cycle). ``err_at`` answers the
    request of that index (counting from 0) with ``err`` (its write is not done). Answers still
    due when ``cyc`` falls are dropped. ``window`` is the byte range the master may touch.
    """

    def __init__(self, bus, image, rng, *, latency=(1, 6), stall=0.3, window=None):
        self.bus = bus
        self.image = image
        self.rng = rng
        self.latency = latency
        self.stall = stall
        self.window = window
        self.err_at = None
        self.requests = []        # (we, adr, sel, dat_w) of every taken request
        self.violations = []
        self.max_inflight = 0
        self.idle_cyc = 0         # cycles with cyc high, no request and no answer due

    @property
    def lanes(self):
        return len(self.bus.sel)

    def _take(self, we, adr, sel, dat_w):
        """Do a request; returns ``(err, dat_r)``."""
        index = len(self.requests)
        self.requests.append((we, adr, sel, dat_w))
        err = index == self.err_at
        dat_r = 0
        for j in range(self.lanes):
            b = adr * self.lanes + j
            if not sel >> j & 1:
                continue
            if self.window and not self.window[0] <= b < self.window[1]:
                self.violations.append((index, b))
                continue
            if we and not err:
                self.image[b] = dat_w >> (8 * j) & 0xFF
            dat_r |= self.image[b] << (8 * j)
        return err, dat_r

    async def process(self, ctx):
        bus = self.bus
        due = deque()             # (cycle, err, dat_r)
        presented = False
        last = 0
        cycle = 0
        ctx.set(bus.stall, self.rng.random() < self.stall)
        async for _, _, cyc, stb, we, adr, sel, dat_w, stall in ctx.tick().sample(
                bus.cyc, bus.stb, bus.we, bus.adr, bus.sel, bus.dat_w, bus.stall):
            cycle += 1
            if cyc and not stb and not due:
                self.idle_cyc += 1
            if presented:
                due.popleft()
            if not cyc:
                due.clear()
                last = cycle
            elif stb and not stall:
                ready = max(cycle - 1 + self.rng.randint(*self.latency), last + 1)
                last = ready
                due.append((ready, *self._take(we, adr, sel, dat_w)))
            self.max_inflight = max(self.max_inflight, len(due))
            presented = bool(due) and due[0][0] <= cycle
            err, dat_r = due[0][1:] if presented else (False, 0)
            ctx.set(bus.ack, presented and not err)
            ctx.set(bus.err, presented and err)
            ctx.set(bus.dat_r, dat_r)
            ctx.set(bus.stall, self.rng.random() < self.stall)


class Buffer:
    """The buffer: answers ``buf_read`` (1 to 3 cycles, in order) and takes ``buf_write``, with
    random backpressure on both."""

    def __init__(self, dut, elements, rng, *, busy=0.3):
        self.dut = dut
        self.data = [rng.randrange(1 << 16) for _ in range(elements)]
        self.rng = rng
        self.busy = busy
        self.reads = []
        self.writes = []

    def _ready(self):
        return self.rng.random() >= self.busy

    async def read_process(self, ctx):
        req, resp = self.dut.buf_read.req, self.dut.buf_read.resp
        due = deque()
        cycle = 0
        ctx.set(req.ready, self._ready())
        async for _, _, r_valid, r_ready, addr, a_valid, a_ready in ctx.tick().sample(
                req.valid, req.ready, req.payload.addr, resp.valid, resp.ready):
            cycle += 1
            if a_valid and a_ready:
                due.popleft()
            if r_valid and r_ready:
                self.reads.append(addr)
                due.append((cycle + self.rng.randint(0, 2), self.data[addr % len(self.data)]))
            head = bool(due) and due[0][0] <= cycle
            ctx.set(resp.valid, head)
            ctx.set(resp.payload.data[0], due[0][1] if head else 0)
            ctx.set(req.ready, self._ready())

    async def write_process(self, ctx):
        w = self.dut.buf_write
        ctx.set(w.ready, self._ready())
        async for _, _, valid, ready, addr, value, mask in ctx.tick().sample(
                w.valid, w.ready, w.payload.addr, w.payload.data[0], w.payload.mask):
            if valid and ready:
                self.writes.append((addr, value, mask))
                if mask & 1:
                    self.data[addr % len(self.data)] = value
            ctx.set(w.ready, self._ready())

    @property
    def processes(self):
        return [self.read_process, self.write_process]


class KernelSink:
    """The kernel memories: take ``kmem_write`` with random backpressure."""

    def __init__(self, dut, rng, *, busy=0.3):
        self.dut = dut
        self.rng = rng
        self.busy = busy
        self.writes = []

    async def process(self, ctx):
        w = self.dut.kmem_write
        ctx.set(w.ready, self.rng.random() >= self.busy)
        async for _, _, valid, ready, core, addr, value in ctx.tick().sample(
                w.valid, w.ready, w.payload.core, w.payload.addr, w.payload.data):
            if valid and ready:
                self.writes.append((core, addr, value))
            ctx.set(w.ready, self.rng.random() >= self.busy)


async def run_task(ctx, dut, t, *, base, limit, abort_after=None):
    """Program transfer ``t`` on the host bus, start it with the window ``(base, limit)`` and
    wait for ``done``; returns ``(error, cycles from the start beat to done)``. With
    ``abort_after``, abort the task that many cycles after the start instead (returns
    ``(None, cycles)``)."""
    for addr, value in transfer_writes(t):
        assert await csr_write(ctx, dut.csr, addr - DMA.base, value) == 0
    start = dut.task.start
    ctx.set(start.payload.base, base)
    ctx.set(start.payload.limit, limit)
    ctx.set(start.valid, 1)
    assert ctx.get(start.ready)
    await ctx.tick()
    ctx.set(start.valid, 0)
    cycles = 1
    while not ctx.get(dut.task.done):
        if cycles == abort_after:
            ctx.set(dut.task.abort, 1)
            await ctx.tick()
            ctx.set(dut.task.abort, 0)
            return None, cycles
        await ctx.tick()
        cycles += 1
        assert cycles < 100_000, "the DMA engine hangs"
    return ctx.get(dut.task.error), cycles


def random_transfer(rng, *, dir, fmt, chip_words, max_elements=48, core=0):
    """A random valid transfer (rank 1 to 5, strides of either sign) and the window it needs:
    ``(t, limit_words)``; the memory offsets start at 0 or a little above."""
    rank = rng.randint(1, RANK)
    size = element_bytes(fmt)
    while True:
        sizes = [rng.randint(1, 5) for _ in range(rank)]
        total = 1
        for n in sizes:
            total *= n
        if total <= max_elements:
            break
    mem_strides = [size * rng.randint(-12, 12) for _ in range(rank)]
    buf_strides = [rng.randint(-12, 12) for _ in range(rank)]
    lo, hi = extent(0, sizes, mem_strides)
    mem_addr = -lo + size * rng.randint(0, 8)
    blo, bhi = extent(0, sizes, buf_strides)
    buf_addr = -blo + rng.randint(0, max(0, chip_words - 1 - (bhi - blo)))
    t = make_transfer(dir=dir, fmt=fmt, core=core, mem_addr=mem_addr, buf_addr=buf_addr,
                      sizes=sizes, mem_strides=mem_strides, buf_strides=buf_strides)
    limit = (mem_addr + hi - lo + size + 3) // 4 + rng.randint(0, 2)
    return t, limit


def element_value(image, byte, fmt):
    """The on-chip value of the memory element at bus byte address ``byte``."""
    raw = int.from_bytes(image[byte:byte + element_bytes(fmt)], "little")
    if fmt == DmaFormat.INT8:
        return (raw - 256 if raw & 0x80 else raw) & 0xFFFF
    return raw


def expected_chip(t, image, base, *, elements=None):
    """The on-chip writes ``(addr, value)`` a memory-to-chip transfer makes, in order."""
    pairs = list(transfer_elements(t))[:elements]
    return [(b, element_value(image, 4 * base + o, t["fmt"])) for o, b in pairs]


def expected_memory(t, image, buffer, base, *, elements=None):
    """The memory image after a buffer-to-memory transfer (its first ``elements``)."""
    image = bytearray(image)
    assert t["dir"] == DmaDir.BUF_TO_MEM
    for o, b in list(transfer_elements(t))[:elements]:
        value = buffer[b % len(buffer)]
        for j in range(element_bytes(t["fmt"])):
            image[4 * base + o + j] = value >> (8 * j) & 0xFF
    return image
