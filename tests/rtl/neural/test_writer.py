# amaranth: UnusedElaboratable=no
"""The output circuit (npu.neural.writer) against npu_model.neural.row_writes: every result's
rows in order, rows and columns outside the output left out, the output port stalling at
random."""

import numpy as np
import pytest

from npu.neural.writer import Writer
from npu_model.neural import row_writes
from npu_spec.config import NPUConfig, preset
from npu_spec.neural import engine_geometry, result_order
from tests.support.csr import run
from tests.support.neural import geometry, random_layer


@pytest.mark.parametrize("config, stall", [(preset("small"), 0.0), (preset("small"), 0.5),
                                           (NPUConfig(macs=4, acc_slots=3), 0.3),
                                           (preset("icebreaker"), 0.3)],
                         ids=["small", "small-stalls", "3slots", "icebreaker"])
def test_against_model(config, stall):
    n, slots = config.macs, config.acc_slots
    max_rows = engine_geometry(config)[0]
    dut = Writer(n, slots, max_rows)
    rng = np.random.default_rng(3 + slots)
    layers = [random_layer(rng, config, max_side=11) for _ in range(5)]

    async def tb(ctx):
        for fields in layers:
            ctx.set(dut.layer, fields)
            ctx.set(dut.geometry, geometry(fields, config))
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            # Slots end in a random order in each group.
            k = fields["groups"] * fields["ocpg"]
            orders = [list(rng.permutation(min(slots, k - base))) for base in range(0, k, slots)]
            results = [(oc, [int(v) for v in rng.integers(0, 1 << 16, n)])
                       for oc, _, _ in result_order(fields, config, orders)]
            got, taken, cycles = [], 0, 0
            while taken < len(results) and cycles < 20 * len(results) * max_rows + 100:
                cycles += 1
                oc, values = results[taken]
                ctx.set(dut.res.valid, 1)
                ctx.set(dut.res.payload, {"slot": oc % slots, "values": values})
                ready = bool(rng.random() >= stall)
                ctx.set(dut.out.ready, ready)
                _, _, rready, ovalid, o = await ctx.tick().sample(
                    dut.res.ready, dut.out.valid, dut.out.payload)
                if ovalid and ready:
                    mask = [(o.mask >> j) & 1 for j in range(n)]
                    got.append((o.oc, o.y, o.x, mask,
                                [o.values[j] for j in range(n) if mask[j]], taken))
                if rready:
                    taken += 1
            ctx.set(dut.res.valid, 0)
            # Each write carries the values of the result being written.
            expect = [(w["oc"], w["y"], w["x"], w["mask"],
                       [results[w["result"]][1][lane] for lane in w["lanes"]], w["result"])
                      for w in row_writes(fields, config, orders)]
            assert got == expect, fields
            assert ctx.get(dut.done)
            ctx.set(dut.ack, 1)
            await ctx.tick()
            ctx.set(dut.ack, 0)
            assert not ctx.get(dut.done)

    run(dut, tb)

