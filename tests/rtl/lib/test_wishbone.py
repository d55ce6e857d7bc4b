# amaranth: UnusedElaboratable=no
"""The system memory bus: the Wishbone signature, the arbiter (random masters into the
simulated system memory, and a k-induction proof) and the word reader."""

import random

import pytest
from amaranth.hdl import Array, Assert, Assume, Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.lib.wishbone import Arbiter, WishboneSignature, WordReader
from npu_sim.formal import prove
from npu_sim.streams import run_simulation, seeded_rng, stream_get
from npu_sim.sysmem import SystemMemory
from tests.support.wishbone import RefMemory, burst, host_read, idle, random_requests

# -- The signature -------------------------------------------------------------------------


def test_signature_members():
    sig = WishboneSignature(20, 128)
    assert sig.addr_width == 20 and sig.data_width == 128
    assert sig.members["sel"].shape == 16
    assert sig.members["dat_r"].flow == In and sig.members["cyc"].flow == Out
    assert sig == WishboneSignature(20, 128) and sig != WishboneSignature(20, 64)
    assert WishboneSignature().addr_width == 30


@pytest.mark.parametrize("args, error, message", [
    ((30, 48), ValueError, "Data width must be one of"),
    ((0, 32), TypeError, "Address width must be a positive integer"),
])
def test_signature_checks(args, error, message):
    with pytest.raises(error, match=message):
        WishboneSignature(*args)


def test_component_checks():
    with pytest.raises(TypeError, match="Number of masters must be a positive integer"):
        Arbiter(0)
    with pytest.raises(ValueError, match="Depth must be a positive integer"):
        WordReader(64, depth=0)
    with pytest.raises(ValueError, match="Data width must be one of"):
        WordReader(16)


# -- The arbiter in simulation ---------------------------------------------------------------


class SharedMemory(wiring.Component):
    """``n`` masters through an :class:`Arbiter` into a :class:`SystemMemory`."""

    def __init__(self, n, words, data_width, latency, init=(), seed=1):
        self.arbiter = Arbiter(n, data_width=data_width)
        self.mem = SystemMemory(words, data_width, latency, init=init, seed=seed)
        super().__init__({
            "masters": In(WishboneSignature(data_width=data_width)).array(n),
            "stall_prob": In(8),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.arbiter = self.arbiter
        m.submodules.mem = self.mem
        for port, inner in zip(self.masters, self.arbiter.masters, strict=True):
            wiring.connect(m, wiring.flipped(port), inner)
        wiring.connect(m, self.arbiter.bus, self.mem.bus)
        m.d.comb += self.mem.stall_prob.eq(self.stall_prob)
        return m


@pytest.mark.parametrize("seed", range(8))
def test_random_masters_share_memory(seed):
    """Three masters run random bursts of reads and writes (some out of range) through the
    arbiter into a memory of random latency and stall rate: every request is answered once, in
    order, every read returns what the reference holds, and the memory ends as the reference."""
    rng = random.Random(seed)
    n, words = 3, 29
    data_width = rng.choice([32, 64])
    latency = rng.randint(1, 20)
    stall_prob = rng.choice([0, 40, 128, 200])
    init = [rng.getrandbits(data_width) for _ in range(words)]
    dut = SharedMemory(n, words, data_width, latency, init, seed=seed + 1)
    ref = RefMemory(words, data_width, init)
    answered = [0] * n
    finished = []

    def master(i):
        mrng = seeded_rng(seed, f"master{i}")

        async def tb(ctx):
            port = dut.masters[i]
            for _ in range(10):
                await idle(ctx, port, mrng.randrange(6))
                reqs = random_requests(mrng, mrng.randint(1, 10), words, data_width)
                await burst(ctx, port, ref, reqs, mrng, gap=mrng.choice([0.0, 0.3]),
                            timeout=5000)
                answered[i] += len(reqs)
            await idle(ctx, port, latency + 5)      # nothing arrives afterwards
            finished.append(i)
        return tb

    async def readback(ctx):
        ctx.set(dut.stall_prob, stall_prob)
        while len(finished) < n:
            await ctx.tick()
        for adr in range(words):
            assert await host_read(ctx, dut.mem.host, adr) == ref.data[adr], adr

    run_simulation(dut, [readback] + [master(i) for i in range(n)])
    assert len(finished) == n and sum(answered) > 0


def test_priority_and_held_grant():
    """Two masters asking in the same cycle: master 0 first. While master 1 holds the bus,
    master 0 raising cyc does not take it away; it is granted right after master 1 lets go."""
    dut = SharedMemory(2, 8, 32, 2)
    ref = RefMemory(8, 32)
    m0, m1 = dut.masters
    log = []

    async def tb(ctx):
        # Both ask at once.
        for port in (m0, m1):
            ctx.set(port.cyc, 1)
            ctx.set(port.stb, 1)
            ctx.set(port.adr, 1)
        for cycle in range(12):
            _, _, s0, s1, a0, a1 = await ctx.tick().sample(m0.stall, m1.stall, m0.ack, m1.ack)
            if not s0 and ctx.get(m0.stb):
                log.append((cycle, "take0"))
                ctx.set(m0.stb, 0)
            if not s1 and ctx.get(m1.stb):
                log.append((cycle, "take1"))
                ctx.set(m1.stb, 0)
            if a0:
                log.append((cycle, "ack0"))
                ctx.set(m0.cyc, 0)
            if a1:
                log.append((cycle, "ack1"))
                ctx.set(m1.cyc, 0)
        assert [e for _, e in log] == ["take0", "ack0", "take1", "ack1"], log
        # Master 1 holds the bus; master 0 asks in the middle of its burst.
        await idle(ctx, m0, 2)
        ctx.set(m1.cyc, 1)
        await ctx.tick().repeat(2)
        ctx.set(m0.cyc, 1)
        ctx.set(m0.stb, 1)
        await burst(ctx, m1, ref, [(0, a, 0xF, 0) for a in range(5)], random.Random(1))
        ctx.set(m0.stb, 1)
        _, _, s0 = await ctx.tick().sample(m0.stall)
        assert s0, "granted in the cycle master 1 dropped cyc"
        _, _, s0 = await ctx.tick().sample(m0.stall)
        assert not s0, "not granted after master 1 let go"

    run_simulation(dut, [tb])


# -- The word reader -------------------------------------------------------------------------


class ReaderMemory(wiring.Component):
    """``n`` word readers through an :class:`Arbiter` into a :class:`SystemMemory`."""

    def __init__(self, n, words, data_width, latency, depth, init=(), seed=1):
        self.readers = [WordReader(data_width, depth) for _ in range(n)]
        self.arbiter = Arbiter(n, data_width=data_width)
        self.mem = SystemMemory(words, data_width, latency, init=init, seed=seed)
        super().__init__({"stall_prob": In(8)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.arbiter = self.arbiter
        m.submodules.mem = self.mem
        for i, reader in enumerate(self.readers):
            m.submodules[f"reader{i}"] = reader
            wiring.connect(m, reader.bus, self.arbiter.masters[i])
        wiring.connect(m, self.arbiter.bus, self.mem.bus)
        m.d.comb += self.mem.stall_prob.eq(self.stall_prob)
        return m


def word32(init, words, data_width, addr):
    """The answer to a read of the 32-bit word ``addr``: ``(data, err)``."""
    lanes = data_width // 32
    if addr // lanes >= words:
        return 0, 1
    return init[addr // lanes] >> (32 * (addr % lanes)) & 0xFFFF_FFFF, 0


def run_readers(seed, n, data_width, depth, *, count=80):
    rng = random.Random(seed)
    words = 13
    lanes = data_width // 32
    latency = rng.randint(1, 20)
    init = [rng.getrandbits(data_width) for _ in range(words)]
    dut = ReaderMemory(n, words, data_width, latency, depth, init, seed=seed + 1)
    stall_prob = rng.choice([0, 60, 160])
    addrs = [[rng.choice([rng.randrange(words * lanes + 8), 2 ** 30 - 1]) if rng.random() < 0.1
              else rng.randrange(words * lanes) for _ in range(count)] for _ in range(n)]
    done = []
    testbenches = []
    for i, reader in enumerate(dut.readers):
        srng = seeded_rng(seed, f"reader{i}")

        async def producer(ctx, reader=reader, i=i, srng=srng):
            ctx.set(dut.stall_prob, stall_prob)
            for addr in addrs[i]:
                while srng.random() < 0.3:
                    await ctx.tick()
                ctx.set(reader.req.valid, 1)
                ctx.set(reader.req.payload, addr)
                await ctx.tick().until(reader.req.ready)
                ctx.set(reader.req.valid, 0)

        async def consumer(ctx, reader=reader, i=i, srng=srng):
            for k, addr in enumerate(addrs[i]):
                got = await stream_get(ctx, reader.resp, srng, stall=0.5)
                want = word32(init, words, data_width, addr)
                assert (got & 0xFFFF_FFFF, got >> 32) == want, (i, k, hex(addr))
            done.append(i)

        testbenches += [producer, consumer]

    async def monitor(ctx):
        """At most ``depth`` reads in flight per reader, and ``cyc`` low once all is done."""
        flight = [0] * n
        for _ in range(60 * count * n):
            if len(done) == n:
                break
            for i, reader in enumerate(dut.readers):
                bus = reader.bus
                cyc, stb, stall, ack, err = (ctx.get(s) for s in (bus.cyc, bus.stb, bus.stall,
                                                                   bus.ack, bus.err))
                assert not stb or cyc
                flight[i] += (cyc & stb & ~stall & 1) - (ack | err)
                assert 0 <= flight[i] <= depth, flight
            await ctx.tick()
        assert len(done) == n, f"readers {sorted(done)} of {n} done: stuck"
        assert flight == [0] * n
        await ctx.tick()
        assert not any(ctx.get(reader.bus.cyc) for reader in dut.readers)

    run_simulation(dut, testbenches + [monitor])
    assert sorted(done) == list(range(n))


@pytest.mark.parametrize("data_width", [32, 64, 128, 256])
@pytest.mark.parametrize("depth", [1, 3, 16])
def test_word_reader(data_width, depth):
    """One reader: every 32-bit word read in order from its lane, err beyond the memory."""
    run_readers(depth * 7 + data_width, 1, data_width, depth)


@pytest.mark.parametrize("seed", range(3))
def test_word_readers_share_memory(seed):
    """Two readers through the arbiter: each gets its own answers."""
    run_readers(seed, 2, 64, 4)


def test_word_reader_full_throughput():
    """With no stalls and room for the latency (the bus latency and the request register), a
    burst reads one word a cycle."""
    latency, count = 5, 24
    dut = ReaderMemory(1, 32, 128, latency, latency + 3, init=[k << 32 for k in range(32)])
    reader = dut.readers[0]

    async def tb(ctx):
        ctx.set(reader.req.valid, 1)
        ctx.set(reader.resp.ready, 1)
        got = []
        cycles = 0
        sent = 0
        while len(got) < count:
            ctx.set(reader.req.payload, 4 * sent + 1)
            ctx.set(reader.req.valid, sent < count)
            _, _, ready, valid, payload = await ctx.tick().sample(
                reader.req.ready, reader.resp.valid, reader.resp.payload)
            sent += ready & (sent < count)
            if valid:
                got.append(payload.data)
            cycles += 1
        assert got == list(range(count))
        assert cycles <= count + latency + 5, cycles

    run_simulation(dut, [tb])


# -- The arbiter's proof ---------------------------------------------------------------------


class PreemptingArbiter(Arbiter):
    """A broken arbiter that gives the bus to a lower-indexed master at once, even in the middle
    of another master's bus cycle (the proof must catch it)."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        for i in reversed(range(self.n)):
            with m.If(self.masters[i].cyc):
                m.d.sync += [self.granted.eq(1), self.owner.eq(i)]
        return m


class ArbiterProof(wiring.Component):
    """Every request a master sees taken is taken on the bus in the same cycle, with that
    master's address, data and lanes, and every request taken on the bus is one master's;
    every bus answer reaches exactly one master, one with requests outstanding, and no master
    sees an answer the bus did not give. The grant is kept while the granted master's ``cyc``
    stays high, and goes to the lowest-indexed master asking when the bus is free.

    Masters and the slave are free inputs. Assumed: a master keeps ``cyc`` high while it has
    requests outstanding and has fewer than 7 when it presents one; the slave answers only
    outstanding requests, never with ``ack`` and ``err`` together."""

    def __init__(self, n, arbiter=Arbiter):
        sig = WishboneSignature(3, 32)
        self.n = n
        self.dut = arbiter(n, 3, 32)
        super().__init__({"masters": In(sig).array(n), "bus": Out(sig)})

    def elaborate(self, platform):
        m = Module()
        n = self.n
        m.submodules.dut = dut = self.dut
        for port, inner in zip(self.masters, dut.masters, strict=True):
            wiring.connect(m, wiring.flipped(port), inner)
        wiring.connect(m, dut.bus, wiring.flipped(self.bus))
        bus = self.bus

        def taken(p):
            return p.cyc & p.stb & ~p.stall

        # Outstanding requests: of each master as it sees them, and on the bus.
        outstanding = [Signal(3, name=f"outstanding{i}") for i in range(n)]
        bus_outstanding = Signal(3)
        for p, out in zip(self.masters, outstanding, strict=True):
            m.d.sync += out.eq(out + taken(p) - (p.ack | p.err))
            m.d.comb += [Assume(~out.any() | p.cyc), Assume(~p.stb | (out < 6))]
        m.d.sync += bus_outstanding.eq(bus_outstanding + taken(bus) - (bus.ack | bus.err))
        m.d.comb += [Assume(~(bus.ack & bus.err)),
                     Assume(~(bus.ack | bus.err) | bus_outstanding.any())]

        any_taken = 0
        any_answer = 0
        for i, p in enumerate(self.masters):
            mine = dut.granted & (dut.owner == i)
            any_taken = any_taken | taken(p)
            any_answer = any_answer | p.ack | p.err
            with m.If(taken(p)):
                m.d.comb += [Assert(mine), Assert(taken(bus)), Assert(bus.adr == p.adr),
                             Assert(bus.we == p.we), Assert(bus.sel == p.sel),
                             Assert(bus.dat_w == p.dat_w)]
            with m.If(p.ack | p.err):
                m.d.comb += [Assert(mine), Assert(outstanding[i].any()), Assert(p.ack == bus.ack),
                             Assert(p.err == bus.err), Assert(p.dat_r == bus.dat_r)]
            with m.If(~mine):
                m.d.comb += [Assert(p.stall), Assert(~p.ack), Assert(~p.err)]
            with m.Else():
                m.d.comb += Assert(p.stall == bus.stall)
            # Only the granted master has requests outstanding.
            with m.If(outstanding[i].any()):
                m.d.comb += Assert(mine)
        m.d.comb += [Assert(taken(bus) == any_taken), Assert((bus.ack | bus.err) == any_answer),
                     Assert(bus_outstanding == sum(outstanding)[:3])]

        # The grant: kept while cyc stays high; when free, to the lowest-indexed master asking.
        past_valid = Signal()
        past_held = Signal()
        past_owner = Signal.like(dut.owner)
        past_cyc = Signal(n)
        m.d.sync += [past_valid.eq(1), past_owner.eq(dut.owner),
                     past_held.eq(dut.granted & Array(p.cyc for p in self.masters)[dut.owner]),
                     past_cyc.eq(Cat(p.cyc for p in self.masters))]
        with m.If(past_valid):
            with m.If(past_held):
                m.d.comb += [Assert(dut.granted), Assert(dut.owner == past_owner)]
            with m.Else():
                m.d.comb += Assert(dut.granted == past_cyc.any())
                for i in range(n):
                    with m.If(past_cyc[i] & ~past_cyc[:i].any() if i else past_cyc[0]):
                        m.d.comb += Assert(dut.owner == i)
        return m


@pytest.mark.formal
def test_arbiter_proof():
    result = prove(ArbiterProof(3), "wishbone_arbiter", mode="prove", depth=3)
    assert result.passed, f"{result.status}\n{result.log[-3000:]}"


@pytest.mark.formal
def test_arbiter_proof_catches_preemption():
    result = prove(ArbiterProof(2, PreemptingArbiter), "wishbone_arbiter_broken", mode="bmc",
                   depth=6)
    assert not result.passed and result.status == "FAIL"
