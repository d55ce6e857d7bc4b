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
        fault = int(rng.integers(6))
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
        else:     # many output channels (beyond a lean build's counters)
            fields["groups"], fields["ocpg"] = (int(v) for v in rng.integers(1, 4096, 2))
    return fields


@pytest.mark.parametrize("name", ["small", "ice40", "icebreaker"])
def test_check_and_geometry(name):
    config = preset(name)
    max_rows, _, _ = engine_geometry(config)
    dut = LayerSetup(config, max_rows)
    rng = np.random.default_rng(len(name))
    layers = [random_layer(rng, config) for _ in range(20)]
    layers += [bad_layer(rng, config) for _ in range(60)]
    layers.append(make_layer(fmt=0, groups=1, icpg=1, ocpg=1, in_h=1, in_w=1, out_h=1,
                             out_w=1, kh=16, kw=16, log2w=4))

    async def tb(ctx):
        for fields in layers:
            ctx.set(dut.layer, fields)
            expect = layer_error(fields, config)
            assert ctx.get(dut.check).value == (expect if expect in START_CHECKS else 0), fields
            ctx.set(dut.go, 1)
            await ctx.tick()
            ctx.set(dut.go, 0)
            if expect not in START_CHECKS:
                got = {k: ctx.get(getattr(dut.geometry, k)) for k in geometry(fields, config)}
                assert got == geometry(fields, config), fields

    run(dut, tb)
