# amaranth: UnusedElaboratable=no
"""The loader (npu.neural.loader) against npu_model.neural.row_requests: every row request in
order, every answer written to the buffer row its tag names, a bank marked full only once all
its answers are in, with a data source that stalls and answers late."""

import numpy as np
import pytest

from npu.neural.loader import Loader
from npu.neural.shifter import value_bits
from npu_model.neural import output_groups, row_requests, tiles
from npu_spec.config import preset
from npu_spec.neural import engine_geometry
from tests.support.csr import run
from tests.support.neural import geometry, random_layer


def answer(c, y, x, row_values):
    """What the test's data source holds at channel c, row y, columns x..: any function will
    do, as long as it tells requests apart."""
    return [(c * 7919 + y * 131 + (x + k) * 3) & 0xFFFF for k in range(row_values)]


@pytest.mark.parametrize("name", ["small", "icebreaker"])
@pytest.mark.parametrize("stall", [0.0, 0.4])
def test_against_model(stall, name):
    """``icebreaker``: 8-value rows, 128 rows a bank, 8 bits kept of each value."""
    config = preset(name)
    max_rows, row_values, buffer_rows = engine_geometry(config)
    bits = value_bits(config)
    dut = Loader(config.macs, config.acc_slots, max_rows, row_values, buffer_rows, bits)
    rng = np.random.default_rng(int(stall * 10))
    layers = [random_layer(rng, config, max_side=8) for _ in range(5)]

    async def tb(ctx):
        for fields in layers:
            ctx.set(dut.layer, fields)
            ctx.set(dut.geometry, geometry(fields, config))
            ctx.set(dut.full, 0)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            expect = row_requests(fields, config, buffer_rows)
            # Rows per work unit.
            h = geometry(fields, config)["unit_h"]
            units = [g["in_count"] * fields["kh"] * h
                     for g in output_groups(fields, config.acc_slots)
                     for _ in range(int(np.prod(tiles(fields, config.macs))))]
            requests, writes, pending = [], [], []
            full, fills, answered_at_fill = 0, [], []
            release_at = {}
            cycle = 0
            while len(fills) < len(units) and cycle < 20 * len(expect) + 200:
                cycle += 1
                ready = bool(rng.random() >= stall)
                ctx.set(dut.row_req.ready, ready)
                # Answers leave in order, each at least one cycle after its request.
                due = pending and pending[0][0] <= cycle and rng.random() >= stall
                if due:
                    _, tag, values = pending.pop(0)
                    ctx.set(dut.row_data.payload, {"tag": tag, "values": values})
                ctx.set(dut.row_data.valid, bool(due))
                # The sequencer frees a full bank after a while.
                for bank, at in list(release_at.items()):
                    if at <= cycle:
                        full &= ~(1 << bank)
                        del release_at[bank]
                ctx.set(dut.full, full)
                _, _, rv, rp, w_en, w_row, w_addr, w_values, fill = await ctx.tick().sample(
                    dut.row_req.valid, dut.row_req.payload, dut.buffer.en, dut.buffer.row,
                    dut.buffer.addr, dut.buffer.values, dut.fill)
                if rv and ready:
                    req = {"c": rp.c, "y": rp.y, "x": rp.x, "row": rp.tag.row,
                           "addr": rp.tag.addr}
                    requests.append(req)
                    pending.append((cycle + int(rng.integers(1, 4)), rp.tag,
                                    answer(rp.c, rp.y, rp.x, row_values)))
                if w_en:
                    writes.append((w_row, w_addr, [w_values[k] for k in range(row_values)]))
                if fill:
                    assert not full & fill, "a full bank filled again"
                    full |= fill
                    fills.append(fill)
                    answered_at_fill.append(len(writes))
                    release_at[fill.bit_length() - 1] = cycle + int(rng.integers(1, 30))
            assert requests == expect, fields
            assert writes == [(r["row"], r["addr"],
                               [v & ((1 << bits) - 1)
                                for v in answer(r["c"], r["y"], r["x"], row_values)])
                              for r in expect]
            # A fill per work unit, banks alternating, each once the unit's answers were all
            # written.
            assert fills == [1 << (k % 2) for k in range(len(units))]
            assert answered_at_fill == list(np.cumsum(units))

    run(dut, tb)


def test_drops_answers_while_idle():
    """An answer to a request of an aborted layer, arriving after the engine was cleared, is
    neither written nor counted."""
    config = preset("small")
    max_rows, row_values, buffer_rows = engine_geometry(config)
    dut = Loader(config.macs, config.acc_slots, max_rows, row_values, buffer_rows)
    rng = np.random.default_rng(1)
    fields = random_layer(rng, config, max_side=4)

    async def tb(ctx):
        ctx.set(dut.row_data.valid, 1)
        ctx.set(dut.row_data.payload, {"tag": {"row": 0, "addr": 5}, "values": [7] * row_values})
        assert not ctx.get(dut.buffer.en)
        await ctx.tick()
        ctx.set(dut.row_data.valid, 0)
        # The next layer's first work unit fills its bank once its own answers are in.
        ctx.set(dut.layer, fields)
        ctx.set(dut.geometry, geometry(fields, config))
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        ctx.set(dut.row_req.ready, 1)
        pending, requests, answers = [], 0, 0
        for _ in range(500):
            if pending:
                ctx.set(dut.row_data.payload, {"tag": pending.pop(0), "values": [0] * row_values})
                ctx.set(dut.row_data.valid, 1)
            else:
                ctx.set(dut.row_data.valid, 0)
            _, _, rv, tag, w_en, fill = await ctx.tick().sample(
                dut.row_req.valid, dut.row_req.payload.tag, dut.buffer.en, dut.fill)
            answers += w_en
            if rv:
                pending.append(tag)
                requests += 1
            if fill:
                break
        assert fill == 1 and not pending and answers == requests

    run(dut, tb)
