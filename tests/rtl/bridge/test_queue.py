# amaranth: UnusedElaboratable=no
"""The bridge's receive queue (``npu.bridge.queue``): cycle by cycle against a plain model of a
queue of ``depth`` bytes, with random traffic on both sides, and its parameter check."""

import collections
import random

import pytest

from npu.bridge.queue import ByteQueue
from npu_sim.streams import run_simulation


@pytest.mark.parametrize("depth,p_write,p_read", [
    (16, 0.5, 0.5), (16, 0.9, 0.1), (16, 0.1, 0.9), (2, 0.7, 0.4), (4, 1.0, 1.0)])
def test_queue_against_a_model(depth, p_write, p_read):
    rng = random.Random(f"{depth}:{p_write}:{p_read}")
    dut = ByteQueue(depth)
    model = collections.deque()            # (byte, cycle it was written)
    counts = {"in": 0, "out": 0, "full": 0}

    async def tb(ctx):
        for cycle in range(1500):
            valid, byte, ready = rng.random() < p_write, rng.getrandbits(8), rng.random() < p_read
            ctx.set(dut.w.valid, valid)
            ctx.set(dut.w.payload, byte)
            ctx.set(dut.r.ready, ready)
            # The queue takes a byte exactly while it holds fewer than ``depth``.
            accept = len(model) < depth
            assert ctx.get(dut.w.ready) == accept
            counts["full"] += not accept
            if ctx.get(dut.r.valid):
                assert model, "a byte out of an empty queue"
                assert ctx.get(dut.r.payload) == model[0][0]
                if ready:
                    model.popleft()
                    counts["out"] += 1
            elif model:
                # The oldest byte is at the head two cycles after it was written.
                assert cycle - model[0][1] <= 1
            if valid and accept:
                model.append((byte, cycle))
                counts["in"] += 1
            await ctx.tick()

    run_simulation(dut, [tb])
    assert counts["in"] > 100 and counts["out"] > 100
    if p_write > p_read:
        assert counts["full"] > 10


def test_queue_keeps_a_byte_until_taken_and_drains():
    dut = ByteQueue(4)
    sent = [0x00, 0xFF, 0x55, 0xAA]

    async def tb(ctx):
        for byte in sent:
            ctx.set(dut.w.valid, 1)
            ctx.set(dut.w.payload, byte)
            await ctx.tick()
        ctx.set(dut.w.valid, 0)
        assert not ctx.get(dut.w.ready)           # four bytes held: full
        for _ in range(5):                        # nothing taken: the head stays
            await ctx.tick()
            assert ctx.get(dut.r.valid) and ctx.get(dut.r.payload) == sent[0]
        got = []
        ctx.set(dut.r.ready, 1)
        for _ in range(8):
            if ctx.get(dut.r.valid):
                got.append(ctx.get(dut.r.payload))
            await ctx.tick()
        assert got == sent
        assert not ctx.get(dut.r.valid) and ctx.get(dut.w.ready)

    run_simulation(dut, [tb])


@pytest.mark.parametrize("depth", [0, 1, 3, 12, "16"])
def test_bad_depths_are_rejected(depth):
    with pytest.raises(ValueError, match="depth must be a power of two of at least 2"):
        ByteQueue(depth)
