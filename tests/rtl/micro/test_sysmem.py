# amaranth: UnusedElaboratable=no
"""The micro build's board system memory (``npu.micro.sysmem``): the micro top's port always
served, the bridge's Wishbone requests in the cycles it leaves free, against a plain model of
the memory, with random traffic on both ports."""

import random

import pytest
from amaranth.sim import Simulator

from npu.micro.sysmem import MicroSystemMemory

WORDS = 64


def _apply(model, addr, lanes, data):
    word = model[addr]
    for k in range(4):
        if lanes >> k & 1:
            word = (word & ~(0xFF << 8 * k)) | (data & (0xFF << 8 * k))
    model[addr] = word


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("words", [WORDS, 48])
def test_both_ports_against_a_model(seed, words):
    # 64 words: "inside" is a test of the high address bits; 48: a comparison.
    rng = random.Random(seed)
    init = [rng.getrandbits(32) for _ in range(words)]
    dut = MicroSystemMemory(words, init=init)
    model = list(init)
    counts = {"micro": 0, "bridge": 0, "stalled": 0, "err": 0}

    async def tb(ctx):
        bus = dut.bus
        pending = None           # the bridge's request not yet taken
        for _ in range(600):
            # The micro top: idle, a read or a write (its busy spells leave gaps).
            op = rng.choice(["idle", "idle", "read", "write"])
            addr, lanes, data = rng.randrange(words), rng.randrange(1, 16), rng.getrandbits(32)
            ctx.set(dut.addr, addr)
            ctx.set(dut.re, op == "read")
            ctx.set(dut.we, lanes if op == "write" else 0)
            ctx.set(dut.wdata, data)
            # The bridge: a new request when none is waiting.
            if pending is None and rng.random() < 0.6:
                far = rng.random() < 0.1         # far beyond the end: a high address bit
                pending = (rng.getrandbits(29) | 1 << rng.randrange(6, 29) if far
                           else rng.randrange(words + 4), rng.random() < 0.5, rng.randrange(16),
                           rng.getrandbits(32))
            ctx.set(bus.cyc, pending is not None)
            ctx.set(bus.stb, pending is not None)
            if pending is not None:
                b_addr, b_write, b_sel, b_data = pending
                ctx.set(bus.adr, b_addr)
                ctx.set(bus.we, b_write)
                ctx.set(bus.sel, b_sel)
                ctx.set(bus.dat_w, b_data)
            stall = ctx.get(bus.stall)
            assert stall == (pending is not None and op != "idle")
            # The model: this cycle's accesses, in the order the memory takes them.
            expect_micro = model[addr] if op == "read" else None
            if op == "write":
                _apply(model, addr, lanes, data)
            taken = None
            if pending is not None and not stall:
                b_addr, b_write, b_sel, b_data = pending
                if b_addr >= words:
                    taken = ("err", None)
                elif b_write:
                    _apply(model, b_addr, b_sel, b_data)
                    taken = ("write", None)
                else:
                    taken = ("read", model[b_addr])
                pending = None
            counts["stalled"] += bool(stall)
            await ctx.tick()
            # The answers of the cycle just ended.
            if expect_micro is not None:
                assert ctx.get(dut.rdata) == expect_micro
                counts["micro"] += 1
            if taken is not None:
                kind, value = taken
                assert ctx.get(bus.err) == (kind == "err")
                assert ctx.get(bus.ack) == (kind != "err")
                if kind == "read":
                    assert ctx.get(bus.dat_r) == value
                counts["bridge"] += kind != "err"
                counts["err"] += kind == "err"
            else:
                assert not ctx.get(bus.ack) and not ctx.get(bus.err)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    assert counts["micro"] > 50 and counts["bridge"] > 50 and counts["stalled"] > 20
    assert counts["err"] > 0
