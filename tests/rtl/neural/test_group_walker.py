# amaranth: UnusedElaboratable=no
"""The group walker (npu.neural.group_walker) against npu_model.neural.output_groups."""

import numpy as np
import pytest

from npu.neural.group_walker import GroupWalker
from npu_model.neural import output_groups
from npu_spec.neural import make_layer
from tests.support.csr import run


@pytest.mark.parametrize("slots", [8, 3, 1])
def test_against_model(slots):
    dut = GroupWalker(slots)
    rng = np.random.default_rng(slots)
    layers = [make_layer(groups=int(rng.integers(1, 12)), icpg=int(rng.integers(1, 6)),
                         ocpg=int(rng.integers(1, 12))) for _ in range(25)]
    layers.append(make_layer(groups=32, icpg=1, ocpg=1))       # depthwise

    async def tb(ctx):
        for fields in layers:
            k = fields["groups"] * fields["ocpg"]
            ctx.set(dut.ocpg, fields["ocpg"])
            ctx.set(dut.icpg, fields["icpg"])
            ctx.set(dut.restart, 1)
            await ctx.tick()
            ctx.set(dut.restart, 0)
            for group in output_groups(fields, slots):
                ctx.set(dut.remaining, k - group["base"])
                ctx.set(dut.begin, 1)
                await ctx.tick()
                ctx.set(dut.begin, 0)
                assert ctx.get(dut.ocg) == group["ocg"]
                bases = []
                while ctx.get(dut.walking):
                    assert ctx.get(dut.index) == len(bases)
                    bases.append(ctx.get(dut.slot_base))
                    ctx.set(dut.step, 1)
                    await ctx.tick()
                    ctx.set(dut.step, 0)
                assert bases == group["slot_base"], fields
                assert ctx.get(dut.in_base) == group["in_base"]
                assert ctx.get(dut.in_count) == group["in_count"]

    run(dut, tb)
