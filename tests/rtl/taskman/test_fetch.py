# amaranth: UnusedElaboratable=no
"""The descriptor DMA and fetch queue, on a memory with random latency and stalls: every check of
a random good or bad descriptor gives the error class of ``npu_spec.descriptors.decode``, a bus
error gives ``BUS``, a good descriptor arrives whole and is read exactly once word by word, and
a replaced fetch has no effect, even with its reads still in flight."""

import random

import pytest

from npu.taskman.fetch import Fetch
from npu_spec.descriptors import AddressError, DecodeError, Descriptor, WindowError, decode, encode
from npu_spec.engine import Engine
from npu_spec.registers import ADDRESS_WINDOWS
from npu_spec.regmap import WriteBlock
from npu_spec.taskman import BASE_TABLE_SIZE, Cause
from tests.support.csr import run

QUEUES = 2
NETWORK = (5, 9)            # network ID of each queue
CAUSE = {DecodeError: Cause.DECODE, AddressError: Cause.ADDRESS, WindowError: Cause.WINDOW}


def random_descriptor(rng, network, limit, slot_words):
    """A descriptor of ``network`` that decodes and fits ``slot_words`` and a window of
    ``limit`` words."""
    blocks = []
    room = rng.randrange(4, slot_words + 1) - 4
    while room >= 2 and rng.random() < 0.8:
        count = rng.randrange(1, min(room, 6))
        start, size = rng.choice(list(ADDRESS_WINDOWS.values()))
        blocks.append(WriteBlock(start + rng.randrange(size - count + 1), count,
                                 tuple(rng.getrandbits(32) for _ in range(count))))
        room -= 1 + count
    src_len = rng.randrange(256)
    flags = {name: rng.random() < 0.3 for name in ("tse", "spc", "dpc", "tsr", "spl",
                                                   "src_mem", "dst_mem", "irq")}
    return Descriptor(task_id=rng.getrandbits(16), network=network, engine=rng.choice(list(Engine)),
                      dep=rng.getrandbits(8), src=rng.randrange(max(1, limit - src_len)),
                      src_len=src_len, dst=rng.randrange(limit), blocks=tuple(blocks),
                      **flags)


def mutate(rng, words, slot_words, limit):
    """``words`` with one random fault (it may still decode); ``limit`` is the window's
    size."""
    words = list(words)
    kind = rng.randrange(13)
    if kind == 0:
        k = rng.randrange(len(words))
        words[k] ^= 1 << rng.randrange(32)                      # any bit
    elif kind == 1:
        words[0] ^= rng.randrange(1, 256)                       # magic
    elif kind == 2:
        k, bit = rng.choice([(0, 26), (0, 31), (2, 24), (2, 31), (3, 16), (3, 31)])
        words[k] |= 1 << bit                                    # reserved bits
    elif kind == 12:
        words[0] |= 3 << 16                                     # engine 3: no engine
    elif kind == 3:
        length = rng.choice([0, 1, 3, slot_words + 1, 255, len(words) - 1, len(words) + 1])
        words[0] = (words[0] & ~0xFF00) | (length & 0xFF) << 8  # length
    elif kind == 4:
        words[1] ^= rng.randrange(1, 256) << 16                 # network
    elif kind == 5:
        src_len = rng.randrange(256)                            # src at the window's end
        src = min(0xFFFF, max(0, limit - src_len + rng.choice((-1, 0, 1, 0x100))))
        words[2] = src_len << 16 | src
    elif kind == 6:
        words[3] = min(0xFFFF, limit + rng.choice((-1, 0, 1, 0x100)))   # dst at the end
    elif len(words) > 4:
        entries = []
        k = 4
        while k < len(words):
            entries.append(k)
            k += 1 + (words[k] >> 16)
        k = rng.choice(entries)
        if kind == 7:
            words[k] &= 0xFFFF                                  # count 0
        elif kind == 8:
            words[k] += rng.randrange(1, 4) << 16               # count past the length
        elif kind == 9:
            words[k] = (words[k] & ~0xFFFF) | rng.choice([0x0100, 0x5100, 0xFFFF, 0x30FF])
        elif kind == 10:
            words[k] = (words[k] & 0xFFFF) | rng.getrandbits(16) << 16
        else:
            words[k] = rng.getrandbits(32)
    return words


def raised(ctx, dut):
    """Whether the fetch raises an exception in this cycle."""
    return Cause(ctx.get(dut.exception.cause).value) != Cause.NONE


class FetchBench:
    """Fetch with a memory, two queues and a base-address table; runs one descriptor at a
    time.

    The memory takes a request unless it stalls (probability ``stall``), reads the word when it
    takes the request, and answers in order after a latency drawn from ``latency``; a ready
    answer is also held back with probability ``stall``. Reads of ``bus_errors`` are answered
    with ``err``.
    """

    def __init__(self, slot_words, rng, latency=(1, 1), stall=0.0):
        self.dut = Fetch(QUEUES, slot_words)
        self.slot_words = slot_words
        self.rng = rng
        self.latency = latency
        self.stall = stall
        self.mem = {}
        self.bus_errors = set()
        self.reads = []
        self.fills = []
        self.inflight = []          # [cycle the answer may come, address, word, err]
        self.answering = False
        self.cycle = 0

    def drive(self, ctx):
        """The memory's outputs for this cycle."""
        dut = self.dut
        if not self.answering and self.inflight and self.inflight[0][0] <= self.cycle:
            self.answering = self.rng.random() >= self.stall
        ctx.set(dut.mem.resp.valid, self.answering)
        if self.answering:
            ctx.set(dut.mem.resp.payload.data, self.inflight[0][2])
            ctx.set(dut.mem.resp.payload.err, self.inflight[0][3])
        else:
            ctx.set(dut.mem.resp.payload.data, self.rng.getrandbits(32))
            ctx.set(dut.mem.resp.payload.err, self.rng.getrandbits(1))
        ctx.set(dut.mem.req.ready, self.rng.random() >= self.stall)

    async def tick(self, ctx):
        dut = self.dut
        if ctx.get(dut.mem.req.valid) and ctx.get(dut.mem.req.ready):
            address = ctx.get(dut.mem.req.payload)
            self.reads.append(address)
            self.inflight.append([self.cycle + self.rng.randint(*self.latency), address,
                                  self.mem.get(address, self.rng.getrandbits(32)),
                                  address in self.bus_errors])
        if self.answering and ctx.get(dut.mem.resp.ready):
            self.inflight.pop(0)
            self.answering = False
        if ctx.get(dut.fill.valid):
            self.fills.append((ctx.get(dut.fill.payload.index), ctx.get(dut.fill.payload.data)))
        await ctx.tick()
        self.cycle += 1
        self.drive(ctx)

    def setup(self, ctx, windows):
        for j, (base, limit) in enumerate(windows):
            ctx.set(self.dut.window[j].base, base)
            ctx.set(self.dut.window[j].limit, limit)
        for q in range(QUEUES):
            ctx.set(self.dut.control[q].network, NETWORK[q])
        self.drive(ctx)

    async def quiesce(self, ctx):
        """Wait until no read is in flight."""
        for _ in range(200):
            if not ctx.get(self.dut.in_flight):
                return
            assert not ctx.get(self.dut.fill.valid) and not raised(ctx, self.dut)
            await self.tick(ctx)
        raise AssertionError("reads still in flight")

    async def fetch(self, ctx, q, address, base_index, tail):
        """Fetch the descriptor at ``address`` for queue ``q``; returns ``("error", event)`` or
        ``("descriptor", payload)``."""
        dut = self.dut
        ctx.set(dut.control[q].base_index, base_index)
        ctx.set(dut.control[q].tail, tail)
        ctx.set(dut.queue[q].head, address)
        ctx.set(dut.queue[q].retired, 0)
        ctx.set(dut.target, q)
        ctx.set(dut.target_valid, 1)
        self.reads, self.fills = [], []
        for _ in range(40 * (self.slot_words + 20)):
            if raised(ctx, dut):
                result = ("error", ctx.get(dut.exception))
                ctx.set(dut.target_valid, 0)                     # the queue is retired
                await self.tick(ctx)
                assert not ctx.get(dut.descriptor.valid)
                await self.tick(ctx)
                await self.quiesce(ctx)
                return result
            if ctx.get(dut.descriptor.valid):
                payload = ctx.get(dut.descriptor.payload)
                # It waits, unchanged, until committed.
                for _ in range(self.rng.randrange(4)):
                    await self.tick(ctx)
                    assert ctx.get(dut.descriptor.valid)
                    assert ctx.get(dut.descriptor.payload) == payload
                ctx.set(dut.descriptor.ready, 1)
                await self.tick(ctx)
                ctx.set(dut.descriptor.ready, 0)
                ctx.set(dut.target_valid, 0)
                assert not ctx.get(dut.descriptor.valid)
                await self.tick(ctx)
                assert not ctx.get(dut.in_flight)
                return ("descriptor", payload)
            await self.tick(ctx)
        raise AssertionError(f"fetch of 0x{address:X} did not end")


@pytest.mark.parametrize("slot_words,seed,latency,stall", [
    (8, 0, (1, 1), 0.0), (16, 1, (1, 4), 0.3), (32, 2, (1, 1), 0.0), (32, 3, (2, 9), 0.5)])
def test_fetch_checks_against_decode(slot_words, seed, latency, stall):
    rng = random.Random(seed)
    bench = FetchBench(slot_words, rng, latency, stall)
    dut = bench.dut
    windows = [(0x1000 * (j + 1), rng.choice((0x40, 0x400, 0x1000)))
               for j in range(BASE_TABLE_SIZE)]
    outcomes = {}

    async def tb(ctx):
        bench.setup(ctx, windows)
        for trial in range(250):
            q = rng.randrange(QUEUES)
            base_index = rng.randrange(BASE_TABLE_SIZE)
            base, limit = windows[base_index]
            desc = random_descriptor(rng, NETWORK[q], limit, slot_words)
            words = encode(desc)
            if rng.random() < 0.6:
                words = mutate(rng, words, slot_words, limit)
            # Placed in the window, or (rarely) across or outside its edges.
            offset = rng.randrange(max(1, limit - len(words)))
            if rng.random() < 0.1:
                offset = rng.choice((-1, -len(words), limit - len(words) + 1, limit))
            address = base + offset
            bench.mem = {address + k: w for k, w in enumerate(words)}
            for k in range(len(words), 260):                       # whatever follows
                bench.mem[address + k] = rng.getrandbits(32)
            tail = rng.choice((0, 0, address + len(words), address + len(words) - 1,
                               address + 300))
            try:
                expect = decode([bench.mem[address + k] for k in range(260)],
                                network=NETWORK[q], window=(base, limit), address=address,
                                tail=tail, max_length=slot_words)
            except (DecodeError, AddressError, WindowError) as error:
                expect = error
            # A bus error on word 0, or on any word of a good descriptor, gives BUS.
            bench.bus_errors = set()
            if rng.random() < 0.1:
                k = rng.randrange(expect.length) if isinstance(expect, Descriptor) else 0
                bench.bus_errors = {address + k}
                expect = "bus"
            kind, value = await bench.fetch(ctx, q, address, base_index, tail)
            if expect == "bus":
                assert kind == "error", f"trial {trial}: {value}"
                assert (Cause(value.cause.value), value.queue, value.addr) == \
                    (Cause.BUS, q, address), f"trial {trial}"
                assert [w for k, w in bench.fills] == words[:len(bench.fills)]
            elif isinstance(expect, Descriptor):
                assert kind == "descriptor", f"trial {trial}: {value}"
                length = expect.length
                assert (value.slot.queue, value.slot.addr, value.slot.base,
                        value.slot.tsr, value.length) == (q, address, base, expect.tsr, length)
                # Read once each, in order, and written into the slot.
                assert bench.reads == [address + k for k in range(length)]
                assert bench.fills == [(k, bench.mem[address + k]) for k in range(length)]
            else:
                assert kind == "error", f"trial {trial}: {expect!r}"
                assert (Cause(value.cause.value), value.queue, value.addr) == \
                    (CAUSE[type(expect)], q, address), f"trial {trial}: {expect!r}"
            if kind == "error":
                # Reads stay in the slot, in order, at most word 0 before the length is known.
                assert bench.reads == [address + k for k in range(len(bench.reads))]
                assert 1 <= len(bench.reads) <= slot_words
            name = "BusError" if expect == "bus" else type(expect).__name__
            outcomes[name] = outcomes.get(name, 0) + 1

    run(dut, tb)
    # Every outcome occurred.
    assert set(outcomes) == {"Descriptor", "DecodeError", "AddressError", "WindowError",
                             "BusError"}, outcomes


@pytest.mark.parametrize("latency,stall,seed", [((1, 1), 0.0, 7), ((2, 8), 0.3, 8),
                                                ((4, 12), 0.0, 9)])
def test_fetch_queue_replacement(latency, stall, seed):
    """A fetch whose target changes, whose head moves or whose queue is retired is dropped
    without an exception or a descriptor, and the new target is fetched from its head; the
    dropped fetch's reads still in flight are discarded, so the new descriptor has exactly its
    own words (the memory is rewritten at the drop: an old word would show)."""
    rng = random.Random(seed)
    bench = FetchBench(32, rng, latency, stall)
    dut = bench.dut
    windows = [(0x1000, 0x1000)] * BASE_TABLE_SIZE
    dropped_in_flight = []

    async def tb(ctx):
        bench.setup(ctx, windows)
        a = encode(random_descriptor(rng, NETWORK[0], 0x1000, 32))
        b = encode(random_descriptor(rng, NETWORK[1], 0x1000, 32))
        for trial in range(40):
            bench.mem = {0x1100 + k: w for k, w in enumerate(a)}
            bench.mem.update({0x1200 + k: w for k, w in enumerate(b)})
            for q, head in ((0, 0x1100), (1, 0x1200)):
                ctx.set(dut.queue[q].head, head)
                ctx.set(dut.queue[q].retired, 0)
                ctx.set(dut.control[q].base_index, 0)
                ctx.set(dut.control[q].tail, 0)
            ctx.set(dut.target, 0)
            ctx.set(dut.target_valid, 1)
            # Part of A's fetch, or all of it and some waiting.
            for _ in range(rng.randrange(1, 2 * len(a) + 6)):
                assert not raised(ctx, dut)
                await bench.tick(ctx)
            dropped_in_flight.append(ctx.get(dut.in_flight))
            how = trial % 4
            if how == 0:
                ctx.set(dut.target, 1)                       # another target
                new, head = b, 0x1200
            elif how == 1:
                ctx.set(dut.queue[0].head, 0x1200)           # the head moved
                bench.mem.update({0x1200 + k: w for k, w in enumerate(a)})
                new, head = a, 0x1200
            elif how == 2:
                ctx.set(dut.queue[0].retired, 1)             # retired: nothing more is read
                for _ in range(3):
                    await bench.tick(ctx)
                    assert not ctx.get(dut.fill.valid) and not ctx.get(dut.descriptor.valid)
                    assert not raised(ctx, dut)
                ctx.set(dut.target, 1)                       # then another choice
                new, head = b, 0x1200
            else:
                ctx.set(dut.target_valid, 0)                 # no target for a cycle, then
                await bench.tick(ctx)                        # the same head, rewritten
                assert not ctx.get(dut.fill.valid) and not ctx.get(dut.descriptor.valid)
                ctx.set(dut.target_valid, 1)
                new = encode(random_descriptor(rng, NETWORK[0], 0x1000, 32))
                bench.mem.update({0x1100 + k: w for k, w in enumerate(new)})
                head = 0x1100
            assert not ctx.get(dut.descriptor.valid)
            bench.reads, bench.fills = [], []
            for _ in range(40 * len(new) + 20):
                assert not raised(ctx, dut)
                if ctx.get(dut.descriptor.valid):
                    break
                await bench.tick(ctx)
            assert ctx.get(dut.descriptor.valid)
            assert ctx.get(dut.descriptor.payload.slot.addr) == head
            # At most one request of the dropped fetch (offered before the drop, taken after)
            # precedes the new fetch's reads.
            assert bench.reads[-len(new):] == [head + k for k in range(len(new))]
            assert len(bench.reads) <= len(new) + 1
            assert bench.fills == list(enumerate(new))
            ctx.set(dut.target_valid, 0)
            await bench.tick(ctx)
            await bench.quiesce(ctx)

    run(dut, tb)
    # Some fetches were dropped with several reads in flight.
    if latency[1] > 1:
        assert max(dropped_in_flight) >= 2, dropped_in_flight
