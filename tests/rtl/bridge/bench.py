"""Benches of the bridge tests: the frame engine (or the whole UART bridge) with system memory
(:class:`npu_sim.sysmem.SystemMemory`) and the NPU's ``NPU_INFO`` registers behind it."""

from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring

from npu.bridge import BridgeCore, UARTBridge
from npu.top import NPUInfo
from npu_sim.sysmem import SystemMemory
from npu_spec.config import PRESETS

CONFIG = PRESETS["small"]


class Bench(Elaboratable):
    """``dut`` (a :class:`BridgeCore` or :class:`UARTBridge`) with ``words`` words of system
    memory (the bridge may map fewer or more bytes than exist) and ``NPU_INFO`` at host
    register 0."""

    def __init__(self, dut, *, words, mem_width=32, latency=1, init=()):
        self.dut = dut
        self.memory = SystemMemory(words, mem_width, latency, init=init)
        self.info = NPUInfo(CONFIG)
        self.mem_width = mem_width

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        m.submodules.memory = self.memory
        m.submodules.info = info = self.info
        wiring.connect(m, self.dut.mem, self.memory.bus)
        csr = self.dut.csr
        bits = len(info.bus.addr)
        mine = (csr.addr >> bits) == 0
        m.d.comb += [
            info.bus.addr.eq(csr.addr), info.bus.w_data.eq(csr.w_data),
            info.bus.w_en.eq(csr.w_en & mine), info.bus.r_en.eq(csr.r_en & mine),
            csr.r_data.eq(info.bus.r_data),
        ]
        return m


def core_bench(mem_bytes, *, words=None, mem_width=32, latency=1, timeout=64, init=()):
    core = BridgeCore(mem_bytes=mem_bytes, mem_width=mem_width, timeout=timeout)
    words = words if words is not None else mem_bytes * 8 // mem_width
    return Bench(core, words=words, mem_width=mem_width, latency=latency, init=init)


def uart_bench(mem_bytes, *, clk_freq, baud, timeout_bits=40, words=None, mem_width=32,
               init=(), rx_depth=16):
    dut = UARTBridge(clk_freq=clk_freq, baud=baud, mem_bytes=mem_bytes, mem_width=mem_width,
                     timeout_bits=timeout_bits, rx_depth=rx_depth)
    words = words if words is not None else mem_bytes * 8 // mem_width
    return Bench(dut, words=words, mem_width=mem_width, init=init)


async def read_memory(ctx, memory, words):
    """The words of a :class:`SystemMemory` through its host port, as bytes."""
    out = []
    step = memory.data_width // 8
    for k in range(words):
        ctx.set(memory.host.addr, k)
        ctx.set(memory.host.r_en, 1)
        await ctx.tick()
        ctx.set(memory.host.r_en, 0)
        out.append(ctx.get(memory.host.r_data))
    return b"".join(w.to_bytes(step, "little") for w in out)


def image_words(image, mem_width):
    """A byte image as ``mem_width``-bit words (for ``SystemMemory(init=...)``)."""
    step = mem_width // 8
    return [int.from_bytes(image[k:k + step], "little") for k in range(0, len(image), step)]


ERROR = "framing error"


async def put_byte(ctx, stream, byte, rng, stall):
    while stall and rng.random() < stall:
        await ctx.tick()
    ctx.set(stream.valid, 1)
    ctx.set(stream.payload, byte)
    await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


def run_core(bench, script, *, seed=0, stall=0.0, stall_prob=0):
    """Run ``script`` on a :func:`core_bench`: ``bytes`` are sent on ``rx`` (random gaps with
    probability ``stall``), an ``int`` is that many idle cycles, :data:`ERROR` pulses
    ``rx_error``. Returns ``(answer bytes, memory bytes)``; the answer is taken with random
    backpressure and the run ends once the bridge is idle."""
    from npu_sim.streams import run_simulation, seeded_rng
    core = bench.dut
    answer = bytearray()
    memory = []
    rng_in = seeded_rng(seed, "rx")
    rng_out = seeded_rng(seed, "tx")

    async def producer(ctx):
        ctx.set(bench.memory.stall_prob, stall_prob)
        for item in script:
            if isinstance(item, int):
                await ctx.tick().repeat(item)
            elif item == ERROR:
                ctx.set(core.rx_error, 1)
                await ctx.tick()
                ctx.set(core.rx_error, 0)
            else:
                for b in item:
                    await put_byte(ctx, core.rx, b, rng_in, stall)
        await ctx.tick().repeat(4)
        while ctx.get(core.busy):
            await ctx.tick()
        await ctx.tick().repeat(4)
        memory.append(await read_memory(ctx, bench.memory, bench.memory.words))

    async def consumer(ctx):
        # Plain ticks only: the run ends while this testbench waits.
        while True:
            ctx.set(core.tx.ready, not (stall and rng_out.random() < stall))
            _, _, valid, ready, byte = await ctx.tick().sample(core.tx.valid, core.tx.ready,
                                                               core.tx.payload)
            if valid and ready:
                answer.append(byte)

    run_simulation(bench, [producer], background=[consumer])
    return bytes(answer), memory[0]


def run_uart(bench, script, *, cycles_per_bit=None, bad_stop=()):
    """Run ``script`` on a :func:`uart_bench` at the bit level with the host's line model:
    ``bytes`` are sent on ``rx`` back to back (at ``cycles_per_bit``, default the bridge's
    divisor), an ``int`` is that many bit times of idle line. The answer is sampled from ``tx``
    at the same rate. Returns ``(answer bytes, memory bytes)``."""
    from npu_sim.streams import run_simulation
    from npu_sim.uart_host import uart_receive, uart_send
    dut = bench.dut
    cpb = cycles_per_bit or dut.divisor
    answer = bytearray()
    memory = []

    async def host(ctx):
        ctx.set(dut.rx, 1)
        await ctx.tick().repeat(4)
        for item in script:
            if isinstance(item, int):
                await ctx.tick().repeat(max(1, round(item * cpb)))
            else:
                await uart_send(ctx, dut.rx, item, cpb, bad_stop=bad_stop)
        # Let the last answer leave (the receiver below is behind by at most a byte).
        await ctx.tick().repeat(round(12 * cpb))
        while ctx.get(dut.busy) or ctx.get(dut.tx) == 0:
            await ctx.tick()
        await ctx.tick().repeat(round(12 * cpb))
        memory.append(await read_memory(ctx, bench.memory, bench.memory.words))

    async def receiver(ctx):
        while True:
            answer.extend(await uart_receive(ctx, dut.tx, 1, cpb, timeout=1 << 40))

    run_simulation(bench, [host], background=[receiver])
    return bytes(answer), memory[0]
