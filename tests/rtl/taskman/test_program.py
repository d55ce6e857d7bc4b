# amaranth: UnusedElaboratable=no
"""The programming stage, behind a configuration queue: the register writes and the loaded task
of random descriptors against ``npu_spec.descriptors.decode``, under random backpressure, and
descriptors of dropped queues popped without writes or loads."""

import random

import pytest
from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from npu.lib.engine import SEQ_WIDTH, TaskEntry, WriteLayout
from npu.taskman.config_queue import ConfigQueue
from npu.taskman.layouts import SlotInfo, slot_word
from npu.taskman.program import Programmer
from npu_spec.descriptors import FLAGS, Descriptor, decode, encode
from npu_spec.engine import Engine
from npu_spec.registers import ADDRESS_WINDOWS
from npu_spec.regmap import WriteBlock
from tests.support.csr import run

QUEUES = 3


class ProgramHarness(wiring.Component):
    """A configuration queue feeding a programming stage."""

    def __init__(self, depth, slot_words):
        self.depth, self.slot_words = depth, slot_words
        super().__init__({
            "fill": In(stream.Signature(slot_word(slot_words), always_ready=True)),
            "commit": In(1), "info": In(SlotInfo), "full": Out(1),
            "drop": In(QUEUES), "next_seq": In(SEQ_WIDTH),
            "writes": Out(stream.Signature(WriteLayout)),
            "load": Out(stream.Signature(TaskEntry)),
            "dropped_tsr": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.queue = queue = ConfigQueue(self.depth, self.slot_words)
        m.submodules.program = program = Programmer(QUEUES, self.slot_words)
        wiring.connect(m, wiring.flipped(self.fill), queue.fill)
        wiring.connect(m, program.slot, queue.read)
        wiring.connect(m, program.writes, wiring.flipped(self.writes))
        wiring.connect(m, program.load, wiring.flipped(self.load))
        m.d.comb += [queue.commit.eq(self.commit), queue.info.eq(self.info),
                     self.full.eq(queue.full), program.drop.eq(self.drop),
                     program.next_seq.eq(self.next_seq), self.dropped_tsr.eq(program.dropped_tsr)]
        return m


def random_words(rng, slot_words):
    blocks = []
    room = rng.randrange(4, slot_words + 1) - 4
    while room >= 2 and rng.random() < 0.8:
        count = rng.randrange(1, min(room, 7))
        start, size = rng.choice(list(ADDRESS_WINDOWS.values()))
        blocks.append(WriteBlock(start + rng.randrange(size - count + 1), count,
                                 tuple(rng.getrandbits(32) for _ in range(count))))
        room -= 1 + count
    flags = {name: rng.random() < 0.3 for name in FLAGS}
    return encode(Descriptor(task_id=rng.getrandbits(16), network=rng.getrandbits(8),
                             engine=rng.choice(list(Engine)), dep=rng.getrandbits(8),
                             src=rng.getrandbits(16), src_len=rng.getrandbits(8),
                             dst=rng.getrandbits(16), blocks=tuple(blocks), **flags))


def expected_load(words, info):
    """The task entry of a descriptor: its decoded header, where it came from, and whether it
    is a switch point (TSE, TSR or SPL: a task-buffer barrier)."""
    desc = decode(words)
    entry = {name: int(getattr(desc, name)) for name in FLAGS}
    entry.update(engine=int(desc.engine), task_id=desc.task_id, network=desc.network,
                 dep=desc.dep, src=desc.src, src_len=desc.src_len, dst=desc.dst,
                 barrier=int(desc.tse or desc.tsr or desc.spl), **info)
    return entry


def expected_writes(words):
    return [(b.address + i, w) for b in decode(words).blocks for i, w in enumerate(b.words)]


@pytest.mark.parametrize("depth,slot_words,drop,seed", [
    (1, 8, None, 0), (2, 32, None, 1), (3, 16, None, 2), (2, 32, 1, 3), (1, 16, 0, 4)])
def test_program_against_decode(depth, slot_words, drop, seed):
    dut = ProgramHarness(depth, slot_words)
    rng = random.Random(seed)
    sent = []                     # (words, info) in commit order
    writes = {}                   # seq -> [(addr, data)]
    loads = []
    dropped_tsr = [0]
    stall = rng.choice((0.0, 0.3, 0.7))

    async def tb(ctx):
        if drop is not None:
            ctx.set(dut.drop, 1 << drop)
        words, position, info = None, 0, None
        seq = 0
        for cycle in range(4000):
            if words is None and len(sent) < 120:
                words, position = random_words(rng, slot_words), 0
                info = {"queue": rng.randrange(QUEUES), "addr": rng.getrandbits(32),
                        "base": rng.getrandbits(32), "limit": rng.getrandbits(32)}
            # Producer: the words into the fetch slot, then the commit.
            fill = words is not None and position < len(words) and rng.random() < 0.8
            ctx.set(dut.fill.valid, fill)
            if fill:
                ctx.set(dut.fill.payload.index, position)
                ctx.set(dut.fill.payload.data, words[position])
            commit = words is not None and position == len(words)
            ctx.set(dut.commit, commit)
            if commit:
                for name, value in info.items():
                    ctx.set(getattr(dut.info, name), value)
                ctx.set(dut.info.tsr, decode(words).tsr)
            # Consumers.
            ctx.set(dut.writes.ready, rng.random() >= stall)
            ctx.set(dut.load.ready, rng.random() >= stall)
            ctx.set(dut.next_seq, seq % (1 << SEQ_WIDTH))
            if ctx.get(dut.writes.valid) and ctx.get(dut.writes.ready):
                beat = ctx.get(dut.writes.payload)
                assert beat.seq == seq % (1 << SEQ_WIDTH)
                writes.setdefault(seq, []).append((beat.addr, beat.data))
            loaded = ctx.get(dut.load.valid) and ctx.get(dut.load.ready)
            if loaded:
                loads.append(ctx.get(dut.load.payload))
            dropped_tsr[0] += ctx.get(dut.dropped_tsr)
            full = ctx.get(dut.full)
            await ctx.tick()
            if fill:
                position += 1
            if commit and not full:
                sent.append((words, info))
                words = None
            if loaded:
                seq += 1

    run(dut, tb)
    kept = [(w, i) for w, i in sent if i["queue"] != drop]
    assert len(loads) == len(kept) > 40
    for seq, (load, (words, info)) in enumerate(zip(loads, kept)):
        expect = expected_load(words, {**info, "tsr": decode(words).tsr})
        assert {name: int(getattr(load, name)) for name in expect} == expect, f"task {seq}"
        assert writes.get(seq, []) == expected_writes(words), f"task {seq}"
    assert set(writes) <= set(range(len(loads)))
    if drop is not None:
        tsr_dropped = [w for w, i in sent if i["queue"] == drop and decode(w).tsr]
        assert dropped_tsr[0] == len(tsr_dropped) > 0
    else:
        assert dropped_tsr[0] == 0
