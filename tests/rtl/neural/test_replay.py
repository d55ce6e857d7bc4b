# amaranth: UnusedElaboratable=no
"""The parameter replayer (npu.neural.replay) against npu_model.neural.replay_beats: each
group's parameters once per work unit, a group's table written only once the replayer has
left the group that used it, the post-processor stalling at random."""

import numpy as np
import pytest

from npu.neural.replay import ParamReplay
from npu_model import kernel_codec as kc
from npu_model.neural import replay_beats
from npu_spec.config import NPUConfig, preset
from tests.support.csr import run
from tests.support.neural import geometry, random_groups, random_layer


@pytest.mark.parametrize("config, stall", [(preset("small"), 0.0), (preset("small"), 0.6),
                                           (NPUConfig(macs=4, acc_slots=3), 0.3)],
                         ids=["small", "small-stalls", "3slots"])
def test_against_model(config, stall):
    dut = ParamReplay(config.macs, config.acc_slots)
    rng = np.random.default_rng(7 + config.acc_slots)
    layers = []
    for _ in range(4):
        fields = random_layer(rng, config, max_side=7)
        layers.append((fields, random_groups(rng, fields, config)))

    async def tb(ctx):
        for fields, groups in layers:
            ctx.set(dut.geometry, geometry(fields, config))
            ctx.set(dut.headers, 0)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            expect = replay_beats(fields, config, groups)
            # The sequencer's side: header g's parameters go to table g % 2, once the
            # replayer is on group g - 1 or later.
            stores = [[(g % 2, slot, int(p.scale[slot]), int(p.shift[slot]))
                       for slot in range(len(p.scale))]
                      for g, p in enumerate(kc.parse_header(e.header, e.config) for e in groups)]
            headers, got, cycles = 0, [], 0
            while len(got) < len(expect) and cycles < 50 * len(expect) + 100:
                cycles += 1
                store = None
                if headers < len(stores) and ctx.get(dut.group) + 1 >= headers:
                    store = stores[headers].pop(0)
                    ctx.set(dut.store, {"en": 1, "bank": store[0], "slot": store[1],
                                        "scale": store[2], "shift": store[3]})
                else:
                    ctx.set(dut.store.en, 0)
                ready = bool(rng.random() >= stall)
                ctx.set(dut.params.ready, ready)
                _, _, valid, p = await ctx.tick().sample(dut.params.valid, dut.params.payload)
                if store is not None and not stores[headers]:
                    headers += 1
                    ctx.set(dut.headers, headers)
                if valid and ready:
                    assert p.bias == 0
                    got.append((p.slot, p.scale, p.shift, p.group_last))
            assert got == expect, fields

    run(dut, tb)
