# amaranth: UnusedElaboratable=no
"""The shifter (npu.neural.shifter) against npu_model.neural.lane_inputs."""

import random

import pytest
from amaranth.sim import Simulator

from npu.neural.shifter import Shifter, value_bits
from npu_model.neural import lane_inputs
from npu_spec.config import NPUConfig, preset
from npu_spec.neural import engine_geometry, work_unit_shapes


@pytest.mark.parametrize("config", [preset("small"), preset("ice40"), preset("icebreaker"),
                                    NPUConfig(macs=64, acc_slots=8)],
                         ids=["small", "ice40", "icebreaker", "64macs"])
def test_against_model(config):
    """Int8-only builds (``ice40``, and ``icebreaker`` with its 8-value rows) keep 8 bits
    a value."""
    max_rows, row_values, _ = engine_geometry(config)
    bits = value_bits(config)
    assert bits == (16 if config.has_float else 8)
    dut = Shifter(config, max_rows, row_values, bits)
    rng = random.Random(config.macs)
    n = config.macs

    async def tb(ctx):
        for _ in range(150):
            log2w = rng.choice(work_unit_shapes(config))
            w = 1 << log2w
            while True:     # a beat whose inputs lie inside the halo row
                stride, dilation, kx = rng.randint(1, 7), rng.randint(1, 7), rng.randint(0, 15)
                if (w - 1) * stride + kx * dilation < row_values:
                    break
            rows = [[rng.randrange(1 << bits) for _ in range(row_values)]
                    for _ in range(max_rows)]
            ctx.set(dut.rows, rows)
            for name, value in (("kx", kx), ("stride", stride), ("dilation", dilation),
                                ("log2w", log2w)):
                ctx.set(getattr(dut, name), value)
            lanes = ctx.get(dut.lanes)
            assert [lanes[i] for i in range(n)] == \
                lane_inputs(rows, kx, dilation, stride, log2w, n), (log2w, stride, dilation, kx)

    sim = Simulator(dut)       # combinational: no clock
    sim.add_testbench(tb)
    sim.run()
