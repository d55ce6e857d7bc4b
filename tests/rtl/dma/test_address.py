# amaranth: UnusedElaboratable=no
"""The address generator against :func:`npu_spec.dma.transfer_elements`, with backpressure."""

import random

import pytest
from amaranth.sim import Simulator

from npu.dma.address import AddressGenerator
from npu_spec.dma import RANK, DmaDir, DmaFormat, make_transfer, transfer_elements


@pytest.mark.parametrize("seed", range(4))
def test_elements_in_order(seed):
    dut = AddressGenerator()
    rng = random.Random(seed)
    base = rng.randint(0, (1 << 32) - 1)
    cases = []
    for _ in range(12):
        rank = rng.randint(1, RANK)
        sizes = [rng.randint(1, 4) for _ in range(rank)]
        mem = [rng.randint(-1000, 1000) for _ in range(rank)]
        buf = [rng.randint(-300, 300) for _ in range(rank)]
        cases.append(make_transfer(dir=DmaDir.MEM_TO_BUF, fmt=DmaFormat.INT8,
                                   mem_addr=rng.randint(5000, 10000),
                                   buf_addr=rng.randint(2000, 4000), sizes=sizes,
                                   mem_strides=mem, buf_strides=buf))

    async def tb(ctx):
        for t in cases:
            for name in ("mem_addr", "buf_addr"):
                ctx.set(getattr(dut.transfer, name), t[name])
            for k in range(RANK):
                ctx.set(dut.transfer.sizes[k], t["sizes"][k])
                ctx.set(dut.transfer.mem_strides[k], t["mem_strides"][k])
                ctx.set(dut.transfer.buf_strides[k], t["buf_strides"][k])
            ctx.set(dut.base, base)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            got = []
            while ctx.get(dut.busy):
                ready = rng.random() < 0.6
                ctx.set(dut.elements.ready, ready)
                assert ctx.get(dut.elements.valid)
                if ready:
                    got.append((ctx.get(dut.elements.payload.byte),
                                ctx.get(dut.elements.payload.chip)))
                await ctx.tick()
            ctx.set(dut.elements.ready, 0)
            assert not ctx.get(dut.elements.valid)
            assert got == [(4 * base + o, b) for o, b in transfer_elements(t)]

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
