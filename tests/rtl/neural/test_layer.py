# amaranth: UnusedElaboratable=no
"""Layer setup (npu.neural.layer): the start check against npu_spec.neural.layer_error, the
geometry against the specification's work unit, tiles and halo."""

import numpy as np
import pytest

from npu.neural.layer import LayerSetup
from npu_spec.config import preset
from npu_spec.neural import NeuralError, engine_geometry, layer_error, make_layer
from tests.support.csr import run
from tests.support.neural import geometry, random_layer

#: The codes the setup checks; the others come later in a layer.
START_CHECKS = (NeuralError.FORMAT, NeuralError.SHAPE, NeuralError.KERNEL)


def bad_layer(rng, config):
    """A layer with one or two random faults."""
    fields = random_layer(rng, config)
    for _ in range(int(rng.integers(1, 3))):
        fault = int(rng.integers(7))
        if fault == 0:
            fields[str(rng.choice(["groups", "icpg", "ocpg", "in_h", "in_w", "out_h", "out_w",
                                   "kh", "kw", "stride", "dilation"]))] = 0
        elif fault == 1:
            fields[str(rng.choice(["kh", "kw"]))] = int(rng.integers(17, 32))
        elif fault == 2:
            fields["log2w"] = int(rng.integers(0, 16))
        elif fault == 3:
            fields["fmt"] = int(rng.integers(4))
        elif fault == 4:
            fields["stride"] = 7
        elif fault == 5:  # many output channels (beyond a lean build's counters)
            fields["groups"], fields["ocpg"] = (int(v) for v in rng.integers(1, 4096, 2))
        else:     # a large output (beyond a lean build's work-unit counters)
            fields[str(rng.choice(["out_h", "out_w"]))] = int(rng.integers(200, 4096))
    return fields


@pytest.mark.parametrize("name, changes", [
    ("small", {}), ("ice40", {}), ("icebreaker", {}),
    ("icebreaker", dict(ne_control="full", ne_out_size=0)),
    ("small", dict(ne_control="lean", ne_out_channels=300, ne_out_size=100)),
], ids=["small", "ice40", "icebreaker", "icebreaker-full-control", "small-lean-control"])
def test_check_and_geometry(name, changes):
    """The start check equals ``layer_error``'s start checks and the geometry the
    specification's, both when ``ready`` rises: in the cycle after ``go`` in the full build
    (registered), up to 13 cycles later in the lean layer control (``groups x ocpg`` by
    shifts and adds)."""
    config = preset(name).replace(**changes)
    max_rows, _, _ = engine_geometry(config)
    dut = LayerSetup(config, max_rows)
    rng = np.random.default_rng(len(name) + len(changes))
    layers = [random_layer(rng, config) for _ in range(20)]
    layers += [bad_layer(rng, config) for _ in range(60)]
    layers.append(make_layer(fmt=0, groups=1, icpg=1, ocpg=1, in_h=1, in_w=1, out_h=1,
                             out_w=1, kh=16, kw=16, log2w=4))
    layers.append(make_layer(fmt=0, groups=4095, icpg=1, ocpg=4095, in_h=1, in_w=1, out_h=1,
                             out_w=1, kh=1, kw=1, log2w=0))
    lean = config.ne_control == "lean"
    waits = []

    async def tb(ctx):
        for fields in layers:
            ctx.set(dut.layer, fields)
            expect = layer_error(fields, config)
            ctx.set(dut.go, 1)
            assert not ctx.get(dut.ready)
            await ctx.tick()
            ctx.set(dut.go, 0)
            wait = 0
            while not ctx.get(dut.ready):
                await ctx.tick()
                wait += 1
                assert wait <= 13, fields
            waits.append(wait)
            assert ctx.get(dut.check).value == (expect if expect in START_CHECKS else 0), fields
            await ctx.tick()
            assert not ctx.get(dut.ready)
            if expect not in START_CHECKS:
                got = {k: ctx.get(getattr(dut.geometry, k)) for k in geometry(fields, config)}
                assert got == geometry(fields, config), fields

    run(dut, tb)
    assert (max(waits) == 12) if lean else (set(waits) == {0})
