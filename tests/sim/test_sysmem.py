# amaranth: UnusedElaboratable=no
"""The simulated system memory: exact latency, byte lanes, errors, stalls and the host port."""

import random

import pytest
from amaranth.back import verilog

from npu_sim.streams import run_simulation
from npu_sim.sysmem import SystemMemory
from tests.support.wishbone import RefMemory, burst, host_read, host_write, idle, random_requests


@pytest.mark.parametrize("data_width", [32, 128])
@pytest.mark.parametrize("latency", [1, 2, 7, 20])
def test_answer_after_exact_latency(latency, data_width):
    """With no stalls, a request taken in cycle t is answered in cycle t + latency, a burst
    runs at one request a cycle, and reads see the writes before them."""
    words = 24
    rng = random.Random(latency * 1000 + data_width)
    init = [rng.getrandbits(data_width) for _ in range(words)]
    dut = SystemMemory(words, data_width, latency, init=init)
    ref = RefMemory(words, data_width, init)
    reqs = random_requests(rng, 60, words, data_width)

    async def tb(ctx):
        bus = dut.bus
        ctx.set(bus.cyc, 1)
        taken_at = []
        answered_at = []
        cycle = 0
        expected = []
        for req in reqs:
            we, adr, sel, value = req
            ctx.set(bus.stb, 1)
            ctx.set(bus.we, we)
            ctx.set(bus.adr, adr)
            ctx.set(bus.sel, sel)
            ctx.set(bus.dat_w, value)
            _, _, stall, ack, err, dat_r = await ctx.tick().sample(bus.stall, bus.ack, bus.err,
                                                                  bus.dat_r)
            assert not stall
            taken_at.append(cycle)
            expected.append(ref.answer(*req))
            if ack or err:
                answered_at.append((cycle, "err" if err else "ack", dat_r))
            cycle += 1
        ctx.set(bus.stb, 0)
        for _ in range(latency + 3):
            _, _, ack, err, dat_r = await ctx.tick().sample(bus.ack, bus.err, bus.dat_r)
            if ack or err:
                answered_at.append((cycle, "err" if err else "ack", dat_r))
            cycle += 1
        assert [c for c, _, _ in answered_at] == [t + latency for t in taken_at]
        for (_, kind, dat_r), (want, value) in zip(answered_at, expected, strict=True):
            assert kind == want
            if value is not None:
                assert dat_r == value
        for adr in range(words):
            assert await host_read(ctx, dut.host, adr) == ref.data[adr]

    run_simulation(dut, [tb])


def test_out_of_range_is_an_error_without_access():
    """A write beyond the memory answers err and does not alias onto a word inside it."""
    words, width = 16, 32
    dut = SystemMemory(words, width, 3)
    ref = RefMemory(words, width)
    reqs = [(1, words + k, 0xF, 0xDEAD0000 + k) for k in range(words)]
    reqs += [(0, words + 5, 0xF, 0), (0, 2 ** 30 - 1, 0xF, 0), (1, 3, 0x5, 0x11223344),
             (0, 3, 0xF, 0)]

    async def tb(ctx):
        await burst(ctx, dut.bus, ref, reqs, random.Random(0))
        for adr in range(words):
            assert await host_read(ctx, dut.host, adr) == ref.data[adr]
        assert ref.data[3] == 0x00220044

    run_simulation(dut, [tb])


@pytest.mark.parametrize("prob", [0, 64, 128, 255])
def test_stall_probability(prob):
    dut = SystemMemory(4, 32, 1, seed=0xACE1)
    cycles = 2000

    async def tb(ctx):
        ctx.set(dut.stall_prob, prob)
        stalls = 0
        for _ in range(cycles):
            _, _, stall = await ctx.tick().sample(dut.bus.stall)
            stalls += stall
        if prob == 0:
            assert stalls == 0
        else:
            assert abs(stalls / cycles - prob / 256) < 0.04, stalls

    run_simulation(dut, [tb])


@pytest.mark.parametrize("latency", [1, 4])
def test_random_stalls_keep_order(latency):
    """Under random stalls and gaps every request is answered once, in order."""
    words, width = 40, 64
    rng = random.Random(latency)
    init = [rng.getrandbits(width) for _ in range(words)]
    dut = SystemMemory(words, width, latency, init=init, seed=77)
    ref = RefMemory(words, width, init)

    async def tb(ctx):
        ctx.set(dut.stall_prob, 100)
        for _ in range(10):
            reqs = random_requests(rng, rng.randrange(1, 12), words, width)
            await burst(ctx, dut.bus, ref, reqs, rng, gap=0.3)
            await idle(ctx, dut.bus, rng.randrange(latency + 2))
        for adr in range(words):
            assert await host_read(ctx, dut.host, adr) == ref.data[adr]

    run_simulation(dut, [tb])


def test_host_port_loads_and_reads_back():
    words, width = 9, 256
    rng = random.Random(5)
    dut = SystemMemory(words, width, 2, init=[1, 2, 3])
    values = [rng.getrandbits(width) for _ in range(words)]

    async def tb(ctx):
        assert [await host_read(ctx, dut.host, a) for a in range(4)] == [1, 2, 3, 0]
        for adr, value in enumerate(values):
            await host_write(ctx, dut.host, adr, value)
        assert [await host_read(ctx, dut.host, a) for a in range(words)] == values
        # The bus sees what the host wrote.
        ref = RefMemory(words, width, values)
        await burst(ctx, dut.bus, ref, [(0, a, 0, 0) for a in range(words)], rng)

    run_simulation(dut, [tb])


def test_converts_to_verilog():
    """Plain gateware: the same component builds for Verilator."""
    text = verilog.convert(SystemMemory(100, 64, 5), name="sysmem")
    assert "module sysmem" in text


def test_dpi_storage_does_not_grow_with_the_memory():
    """With the words in the Verilator bench (``storage="dpi"``) the exported design of an
    8 MiB memory is as small as that of a 16-word one (an elaborated memory is exported as one
    initial value per bit: about 4 KB of build memory a word, docs/system.md)."""
    small = verilog.convert(SystemMemory(16, 32, 4, storage="dpi"), name="sysmem")
    large = verilog.convert(SystemMemory(1 << 21, 32, 4, storage="dpi"), name="sysmem")
    assert "npu_sysmem_dpi" in large
    assert abs(len(large) - len(small)) < 200


@pytest.mark.parametrize("kwargs, message", [
    ({"words": 0}, "Words must be a positive integer"),
    ({"words": 8, "latency": 0}, "Latency must be a positive integer"),
    ({"words": 8, "seed": 0}, "Seed must be an integer from 1 to 65535"),
    ({"words": 8, "data_width": 48}, "Data width must be one of"),
    ({"words": 300, "addr_width": 8}, "Words must be at most 2\\*\\*addr_width"),
    ({"words": 2, "init": [1, 2, 3]}, "Init must have at most 2 words"),
    ({"words": 8, "storage": "sram"}, "Storage must be 'gateware' or 'dpi'"),
    ({"words": 2, "init": [1], "storage": "dpi"}, "Init needs storage='gateware'"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SystemMemory(**kwargs)
