# amaranth: UnusedElaboratable=no
"""The kernel DMA (npu.neural.kernel_dma) against npu_model.neural.kernel_stream: the group
table read from the kernel memory, each header once, each body once per work unit, with the
extractor stalling at random."""

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib.memory import Memory

from npu.neural.kernel_dma import KernelDMA
from npu_model.kernel_codec import kernel_memory
from npu_model.neural import kernel_stream, tiles
from npu_spec.config import NPUConfig, preset
from tests.support.csr import run
from tests.support.neural import random_groups, random_layer


class Bench(Elaboratable):
    """The DMA on a kernel memory holding ``words``."""

    def __init__(self, slots, words, queue_depth=8):
        self.dma = KernelDMA(slots, queue_depth=queue_depth)
        self.words = words

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma = dma = self.dma
        m.submodules.kmem = kmem = Memory(shape=32, depth=len(self.words), init=self.words)
        port = kmem.read_port()
        m.d.comb += [port.addr.eq(dma.kmem.addr), port.en.eq(dma.kmem.en),
                     dma.kmem.data.eq(port.data)]
        return m


@pytest.mark.parametrize("config, stall, depth", [
    (preset("small"), 0.0, 8), (preset("small"), 0.5, 8), (NPUConfig(macs=4, acc_slots=3), 0.3, 8),
    (preset("small"), 0.3, 3), (preset("small"), 0.0, 2)],
    ids=["small", "small-stalls", "3slots", "queue3-stalls", "queue2"])
def test_against_model(config, stall, depth):
    rng = np.random.default_rng(int(stall * 10) + config.acc_slots)
    layers = []
    image = [int(w) for w in rng.integers(0, 1 << 32, 7)]     # words below the table
    for _ in range(6):
        fields = random_layer(rng, config, max_side=12)
        groups = random_groups(rng, fields, config)
        fields["addr"] = len(image)
        image += kernel_memory(groups, base=len(image))
        layers.append((fields, groups))
    bench = Bench(config.acc_slots, image, depth)
    dma = bench.dma
    pyrng = np.random.default_rng(99)

    async def tb(ctx):
        for fields, groups in layers:
            tiles_y, tiles_x = tiles(fields, config.macs)
            ctx.set(dma.table, fields["addr"])
            ctx.set(dma.out_channels, fields["groups"] * fields["ocpg"])
            ctx.set(dma.tiles_y, tiles_y)
            ctx.set(dma.tiles_x, tiles_x)
            ctx.set(dma.start, 1)
            await ctx.tick()
            ctx.set(dma.start, 0)
            expect = kernel_stream(fields, config, groups)
            got = []
            idle = 0
            while len(got) < len(expect) and idle < 200:
                ready = {part: bool(pyrng.random() >= stall) for part in ("header", "body")}
                for part, r in ready.items():
                    ctx.set(getattr(dma, part).ready, r)
                _, _, hv, hp, bv, bp = await ctx.tick().sample(
                    dma.header.valid, dma.header.payload, dma.body.valid, dma.body.payload)
                assert not (hv and bv)
                idle += 1
                for part, valid, payload in (("header", hv, hp), ("body", bv, bp)):
                    if valid and ready[part]:
                        got.append((part, payload.data, payload.last))
                        idle = 0
            assert got == expect, fields
            for _ in range(10):     # nothing more
                await ctx.tick()
                assert not ctx.get(dma.header.valid) and not ctx.get(dma.body.valid)

    run(bench, tb)
