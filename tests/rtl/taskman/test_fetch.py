# amaranth: UnusedElaboratable=no
"""The descriptor DMA and fetch queue: every check of a random good or bad descriptor gives the
error class of ``npu_spec.descriptors.decode``, a good descriptor arrives whole and is read
exactly once word by word, and a replaced fetch has no effect."""

import random

import pytest

from npu.taskman.fetch import Fetch
from npu_spec.descriptors import AddressError, DecodeError, Descriptor, WindowError, decode, encode
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
    return Descriptor(task_id=rng.getrandbits(16), network=network, engine=rng.randrange(2),
                      dep=rng.getrandbits(8), src=rng.randrange(max(1, limit - src_len)),
                      src_len=src_len, dst=rng.randrange(limit), blocks=tuple(blocks),
                      **flags)


def mutate(rng, words, slot_words, limit):
    """``words`` with one random fault (it may still decode); ``limit`` is the window's
    size."""
    words = list(words)
    kind = rng.randrange(12)
    if kind == 0:
        k = rng.randrange(len(words))
        words[k] ^= 1 << rng.randrange(32)                      # any bit
    elif kind == 1:
        words[0] ^= rng.randrange(1, 256)                       # magic
    elif kind == 2:
        k, bit = rng.choice([(0, 25), (0, 31), (2, 24), (2, 31), (3, 16), (3, 31)])
        words[k] |= 1 << bit                                    # reserved bits
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
    time."""

    def __init__(self, slot_words, rng):
        self.dut = Fetch(QUEUES, slot_words)
        self.slot_words = slot_words
        self.rng = rng
        self.mem = {}
        self.reads = []
        self.fills = []
        self.pending = None

    async def tick(self, ctx):
        dut = self.dut
        if ctx.get(dut.mem.en):
            self.reads.append(ctx.get(dut.mem.addr))
        if ctx.get(dut.fill.valid):
            self.fills.append((ctx.get(dut.fill.payload.index), ctx.get(dut.fill.payload.data)))
        self.pending = ctx.get(dut.mem.addr) if ctx.get(dut.mem.en) else None
        await ctx.tick()
        ctx.set(dut.mem.data, self.mem.get(self.pending, 0) if self.pending is not None
                else self.rng.getrandbits(32))

    def setup(self, ctx, windows):
        for j, (base, limit) in enumerate(windows):
            ctx.set(self.dut.window[j].base, base)
            ctx.set(self.dut.window[j].limit, limit)
        for q in range(QUEUES):
            ctx.set(self.dut.control[q].network, NETWORK[q])

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
        for _ in range(self.slot_words + 20):
            if raised(ctx, dut):
                result = ("error", ctx.get(dut.exception))
                ctx.set(dut.target_valid, 0)                     # the queue is retired
                await self.tick(ctx)
                assert not ctx.get(dut.descriptor.valid)
                await self.tick(ctx)
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
                return ("descriptor", payload)
            await self.tick(ctx)
        raise AssertionError(f"fetch of 0x{address:X} did not end")


@pytest.mark.parametrize("slot_words,seed", [(8, 0), (16, 1), (32, 2), (32, 3)])
def test_fetch_checks_against_decode(slot_words, seed):
    rng = random.Random(seed)
    bench = FetchBench(slot_words, rng)
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
            kind, value = await bench.fetch(ctx, q, address, base_index, tail)
            if isinstance(expect, Descriptor):
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
                # Reads never go past the checked words.
                assert len(bench.reads) <= len(bench.fills) + 1
            name = type(expect).__name__
            outcomes[name] = outcomes.get(name, 0) + 1

    run(dut, tb)
    # Every outcome occurred.
    assert set(outcomes) == {"Descriptor", "DecodeError", "AddressError", "WindowError"}, \
        outcomes


def test_fetch_queue_replacement():
    """A fetch whose target changes, whose head moves or whose queue is retired is dropped
    without an exception or a descriptor, and the new target is fetched from its head."""
    rng = random.Random(7)
    bench = FetchBench(32, rng)
    dut = bench.dut
    windows = [(0x1000, 0x1000)] * BASE_TABLE_SIZE

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
            for _ in range(rng.randrange(1, len(a) + 6)):
                assert not raised(ctx, dut)
                await bench.tick(ctx)
            how = trial % 3
            if how == 0:
                ctx.set(dut.target, 1)                       # another target
                new, head = b, 0x1200
            elif how == 1:
                ctx.set(dut.queue[0].head, 0x1200)           # the head moved
                bench.mem.update({0x1200 + k: w for k, w in enumerate(a)})
                new, head = a, 0x1200
            else:
                ctx.set(dut.queue[0].retired, 1)             # retired: nothing more is read
                for _ in range(3):
                    await bench.tick(ctx)
                    assert not ctx.get(dut.mem.en) and not ctx.get(dut.descriptor.valid)
                    assert not raised(ctx, dut)
                ctx.set(dut.target, 1)                       # then another choice
                new, head = b, 0x1200
            assert not ctx.get(dut.descriptor.valid)
            bench.reads, bench.fills = [], []
            for _ in range(len(new) + 6):
                assert not raised(ctx, dut)
                if ctx.get(dut.descriptor.valid):
                    break
                await bench.tick(ctx)
            assert ctx.get(dut.descriptor.valid)
            assert ctx.get(dut.descriptor.payload.slot.addr) == head
            assert bench.reads == [head + k for k in range(len(new))]
            assert [w for _, w in bench.fills] == new
            ctx.set(dut.target_valid, 0)
            await bench.tick(ctx)

    run(dut, tb)
