# amaranth: UnusedElaboratable=no
"""The H ring: the filters' and the channel accumulator's writes and reads."""

import numpy as np

from npu.planar.geometry import Geometry
from npu.planar.h_ring import HRing
from npu_spec.config import NPUConfig
from tests.support.planar import run


def test_h_ring():
    g = Geometry.of(NPUConfig(planar_lanes=1, planar_pool_beats=2), 16)   # HD 16, FL 2
    HD, FL = g.h_depth, g.filter_lanes
    dut = HRing(g)
    rng = np.random.default_rng(1)
    words = {}

    async def write(ctx, port, word, values):
        ctx.set(port.valid, 1)
        ctx.set(port.word, word)
        for i, v in enumerate(values):
            ctx.set(dut.data[i], int(v))
        await ctx.tick()
        ctx.set(port.valid, 0)

    async def read(ctx, port, addr, acc_mode):
        ctx.set(dut.acc_mode, acc_mode)
        ctx.set(port.en, 1)
        ctx.set(port.addr, addr)
        await ctx.tick()
        ctx.set(port.en, 0)
        return [ctx.get(dut.read_data[i]) for i in range(FL)]

    async def tb(ctx):
        # The filter's word index counts from the start of the task: word n is n mod HD.
        for n in range(40):
            values = rng.integers(0, 1 << 32, FL, dtype=np.uint64)
            if n % 3:
                await write(ctx, dut.filter_write, n, values)
            else:
                await write(ctx, dut.acc_write, n % HD, values)
            words[n % HD] = values.tolist()
        # Both writers at once: the accumulator's word is written.
        ctx.set(dut.filter_write.valid, 1)
        ctx.set(dut.filter_write.word, 3)
        await write(ctx, dut.acc_write, 5, [7, 8])
        ctx.set(dut.filter_write.valid, 0)
        words[5] = [7, 8]
        for addr in rng.permutation(HD):
            assert await read(ctx, dut.filter_read, int(addr), 0) == words[addr]
            assert await read(ctx, dut.acc_read, int(addr), 1) == words[addr]
        # The accumulator's read port is ignored outside its mode, and the data holds while a
        # read is disabled.
        ctx.set(dut.acc_read.en, 1)
        ctx.set(dut.acc_read.addr, 9)
        ctx.set(dut.acc_mode, 0)
        ctx.set(dut.filter_read.en, 0)
        before = [ctx.get(dut.read_data[i]) for i in range(FL)]
        await ctx.tick()
        assert [ctx.get(dut.read_data[i]) for i in range(FL)] == before

    run(dut, tb)
