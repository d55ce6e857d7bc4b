# amaranth: UnusedElaboratable=no
"""The banked buffer against a Python model: random unaligned runs on several read and write
ports at once, with random stalls on every stream."""

import pytest

from npu.dataproc.arbiter import RoundRobin
from npu.dataproc.buffer import Buffer
from npu_sim.streams import run_simulation, seeded_rng, stream_get, stream_put


def _pack(values):
    return sum((v & 0xFFFF) << (16 * j) for j, v in enumerate(values))


def _unpack(word, lanes):
    return [(word >> (16 * j)) & 0xFFFF for j in range(lanes)]


def run_buffer(elements, width, read_lanes, write_lanes, *, runs=40, stall=0.3, seed=0):
    """Random runs on every port; a monitor applies each cycle's taken write to the model and
    records what each taken read must return (a read sees a write taken in the same cycle)."""
    dut = Buffer(elements, width, read_lanes, write_lanes)
    model = [0] * elements
    expected = [[] for _ in read_lanes]
    got = [[] for _ in read_lanes]
    writes_done = [0]

    def write_beat(rng, lanes):
        addr = rng.randrange(1 << 12)
        values = [rng.randrange(1 << 16) for _ in range(lanes)]
        mask = rng.randrange(1 << lanes)
        return addr, values, mask

    def writer(k):
        async def tb(ctx):
            rng = seeded_rng(seed, f"w{k}")
            port = dut.write_port(k)
            lanes = write_lanes[k]
            for _ in range(runs):
                addr, values, mask = write_beat(rng, lanes)
                word = addr | (_pack(values) << 24) | (mask << (24 + 16 * lanes))
                await stream_put(ctx, port, word, rng, stall)
            writes_done[0] += 1
        return tb

    def requester(k):
        async def tb(ctx):
            rng = seeded_rng(seed, f"r{k}")
            for _ in range(runs):
                await stream_put(ctx, dut.read_port(k).req, rng.randrange(1 << 12), rng, stall)
        return tb

    def receiver(k):
        async def tb(ctx):
            rng = seeded_rng(seed, f"resp{k}")
            # Long refusals now and then, so responses back up into the queue.
            for i in range(runs):
                if i % 9 == 4:
                    await ctx.tick().repeat(12)
                word = await stream_get(ctx, dut.read_port(k).resp, rng, stall)
                got[k].append(_unpack(word, read_lanes[k]))
        return tb

    async def monitor(ctx):
        signals = []
        for k in range(len(write_lanes)):
            p = dut.write_port(k)
            signals += [p.valid, p.ready, p.payload]
        for k in range(len(read_lanes)):
            p = dut.read_port(k).req
            signals += [p.valid, p.ready, p.payload]
        async for _, _, *values in ctx.tick().sample(*signals):
            nw = 3 * len(write_lanes)
            for k in range(len(write_lanes)):
                valid, ready, payload = values[3 * k:3 * k + 3]
                if valid and ready:
                    for j in range(write_lanes[k]):
                        if (payload.mask >> j) & 1:
                            model[(payload.addr + j) % elements] = int(payload.data[j])
            for k in range(len(read_lanes)):
                valid, ready, payload = values[nw + 3 * k:nw + 3 * k + 3]
                if valid and ready:
                    a = payload.addr
                    expected[k].append([model[(a + j) % elements]
                                        for j in range(read_lanes[k])])

    tbs = ([writer(k) for k in range(len(write_lanes))]
           + [requester(k) for k in range(len(read_lanes))]
           + [receiver(k) for k in range(len(read_lanes))])
    run_simulation(dut, tbs, background=[monitor])
    for k in range(len(read_lanes)):
        assert got[k] == expected[k], k
    assert any(v for run in expected[0] for v in run)


@pytest.mark.parametrize("elements, width, read_lanes, write_lanes", [
    (64, 8, (8, 1, 5), (8, 1, 3)),
    (48, 8, (3, 8), (8, 2, 1)),          # not a power of two: addresses wrap by a modulo
    (32, 1, (1, 1), (1,)),
    (256, 16, (16, 4, 16, 16), (16, 16)),
])
def test_random_runs(elements, width, read_lanes, write_lanes):
    run_buffer(elements, width, read_lanes, write_lanes, seed=elements)


def test_full_throughput_without_stalls():
    """A lone reader kept ready is served every cycle: latency 2, one run a cycle."""
    dut = Buffer(64, 8, (8,), (8,))
    times = {}

    async def tb(ctx):
        req, resp = dut.read0.req, dut.read0.resp
        ctx.set(resp.ready, 1)
        ctx.set(req.valid, 1)
        cycle = 0
        sent = 0
        while len(times.setdefault("resp", [])) < 20:
            ctx.set(req.payload.addr, sent)
            _, _, taken, rvalid = await ctx.tick().sample(req.ready, resp.valid)
            if taken:
                times.setdefault("req", []).append(cycle)
                sent += 1
            if rvalid:
                times["resp"].append(cycle)
            cycle += 1

    run_simulation(dut, [tb])
    assert times["req"][:20] == list(range(20))
    assert times["resp"] == list(range(2, 22))


def test_round_robin_is_fair():
    dut = RoundRobin(3)
    grants = []

    async def tb(ctx):
        for requests in [0b111] * 6 + [0b101] * 4 + [0b010, 0, 0b100]:
            ctx.set(dut.requests, requests)
            _, _, grant = await ctx.tick().sample(dut.grant)
            grants.append(grant)

    run_simulation(dut, [tb])
    assert grants == [1, 2, 4, 1, 2, 4, 1, 4, 1, 4, 2, 0, 4]


def test_bad_arguments():
    with pytest.raises(ValueError, match="power of two"):
        Buffer(48, 6, (1,), (1,))
    with pytest.raises(ValueError, match="multiple"):
        Buffer(20, 8, (1,), (1,))
    with pytest.raises(ValueError, match="lanes"):
        Buffer(64, 8, (9,), (1,))
