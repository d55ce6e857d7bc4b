# amaranth: UnusedElaboratable=no
"""The transfer check against :func:`npu_spec.dma.dma_error`, on transfers of every kind,
including extreme sizes and strides."""

import random

from amaranth.sim import Simulator

from npu.dma.check import LATENCY, TransferCheck
from npu_spec.config import NPUConfig
from npu_spec.dataproc import buffer_elements
from npu_spec.dma import RANK, DmaDir, DmaError, dma_error, make_transfer

CONFIG = NPUConfig(cores=3, buffer_kib=2, kernel_kib=1)
LIMITS = dict(cores=3, buffer_elements=buffer_elements(CONFIG), kernel_words=256)


def _transfer(rng):
    """A transfer near the edges of the rules, or with extreme fields."""
    rank = rng.randint(1, RANK)
    wide = rng.random() < 0.3
    sizes = [rng.choice([0, 1, 2, 3, 65535]) if wide else rng.randint(1, 6)
             for _ in range(rank)]
    if not wide and rng.random() < 0.05:
        sizes[rng.randrange(rank)] = 0

    def stride():
        if wide:
            return rng.choice([-(1 << 31), (1 << 31) - 1, rng.randint(-(1 << 31), (1 << 31) - 1)])
        return rng.choice([1, 2, 4]) * rng.randint(-10, 10) + (rng.random() < 0.1)

    t = make_transfer(dir=rng.choice([0, 1, 2, 2, 3]), fmt=rng.choice([0, 1, 2, 2, 3]),
                      core=rng.choice([0, 1, 2, 3, 63]), mem_addr=rng.randint(0, 400),
                      buf_addr=rng.randint(0, 600), sizes=sizes,
                      mem_strides=[stride() for _ in range(rank)],
                      buf_strides=[stride() for _ in range(rank)])
    if t["dir"] == DmaDir.MEM_TO_KMEM and rng.random() < 0.7:
        t["fmt"] = 2
    if wide and rng.random() < 0.5:
        t["mem_addr"] = rng.randint(0, (1 << 32) - 1)
    return t, rng.choice([rng.randint(0, 300), rng.randint(0, (1 << 32) - 1)])


def test_check_matches_the_specification():
    dut = TransferCheck(CONFIG)
    rng = random.Random(11)
    cases = [_transfer(rng) for _ in range(600)]
    seen = set()

    async def tb(ctx):
        for t, limit in cases:
            for name in ("dir", "fmt", "core", "mem_addr", "buf_addr"):
                ctx.set(getattr(dut.transfer, name), t[name])
            for k in range(RANK):
                ctx.set(dut.transfer.sizes[k], t["sizes"][k])
                ctx.set(dut.transfer.mem_strides[k], t["mem_strides"][k])
                ctx.set(dut.transfer.buf_strides[k], t["buf_strides"][k])
            ctx.set(dut.limit, limit)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            for _ in range(LATENCY - 1):
                assert not ctx.get(dut.done)
                await ctx.tick()
            assert ctx.get(dut.done)
            expect = dma_error(t, limit_bytes=4 * limit, **LIMITS)
            seen.add(expect)
            assert ctx.get(dut.code) == expect, (t, limit)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert seen == set(DmaError) - {DmaError.BUS}
