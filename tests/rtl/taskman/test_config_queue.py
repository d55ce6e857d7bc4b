# amaranth: UnusedElaboratable=no
"""The configuration queue: committed descriptors come out in commit order with their words and
info, a commit is refused when full, and filling the fetch slot never touches committed
slots."""

import random
from collections import deque

import pytest

from npu.taskman.config_queue import ConfigQueue
from tests.support.csr import run


@pytest.mark.parametrize("depth,slot_words,seed", [(1, 8, 0), (2, 32, 1), (3, 16, 2),
                                                   (5, 8, 3)])
def test_config_queue_fifo(depth, slot_words, seed):
    dut = ConfigQueue(depth, slot_words)
    rng = random.Random(seed)
    committed = deque()          # (info, words) in commit order
    fetch_slot = {}              # words written into the fetch slot since the last commit
    checked = {"pops": 0, "refused": 0}

    async def tb(ctx):
        reading = None           # (index) requested last cycle from the oldest slot
        for cycle in range(3000):
            # Fill side: a word of the descriptor being fetched (words may be rewritten, as
            # after a replacement), or a commit.
            fill = rng.random() < 0.5
            index = rng.randrange(slot_words)
            word = rng.getrandbits(32)
            ctx.set(dut.fill.valid, fill)
            ctx.set(dut.fill.payload.index, index)
            ctx.set(dut.fill.payload.data, word)
            commit = rng.random() < 0.2
            info = {"queue": rng.randrange(32), "addr": rng.getrandbits(32),
                    "base": rng.getrandbits(32), "tsr": rng.randrange(2)}
            ctx.set(dut.commit, commit)
            for name, value in info.items():
                ctx.set(getattr(dut.info, name), value)
            # Read side: a random word of the oldest slot, and sometimes a pop.
            read_index = rng.randrange(slot_words)
            pop = rng.random() < 0.15
            ctx.set(dut.read.index, read_index)
            ctx.set(dut.read.pop, pop)

            full = len(committed) == depth
            assert ctx.get(dut.full) == full
            assert ctx.get(dut.read.valid) == bool(committed)
            if committed:
                oldest_info, oldest_words = committed[0]
                got = ctx.get(dut.read.info)
                assert {n: getattr(got, n) for n in oldest_info} == oldest_info
                if reading in oldest_words:
                    assert ctx.get(dut.read.data) == oldest_words[reading], f"cycle {cycle}"
            await ctx.tick()
            # Reference: the fill lands in the fetch slot; a pop releases the oldest committed
            # descriptor; a commit (refused when full) moves the fetch slot into the queue.
            reading = read_index if committed and not pop else None
            if fill:
                fetch_slot[index] = word
            if pop and committed:
                committed.popleft()
                checked["pops"] += 1
            if commit and full:
                checked["refused"] += 1
            elif commit:
                committed.append((info, dict(fetch_slot)))
                fetch_slot.clear()

    run(dut, tb)
    assert checked["pops"] > 50 and checked["refused"] > 5, checked
