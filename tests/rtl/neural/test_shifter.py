# amaranth: UnusedElaboratable=no
"""The shifter (npu.neural.shifter) against npu_model.neural.lane_inputs: the rows as the
input buffer keeps them (StrideOrder), the lanes as the model reads the halo rows."""

import random

import pytest
from amaranth.sim import Simulator

from npu.neural.shifter import Shifter, StrideOrder, value_bits
from npu_model.neural import lane_inputs
from npu_spec.config import NPUConfig, preset
from npu_spec.mac import MacFormat
from npu_spec.neural import (
    MAX_KERNEL,
    NeuralError,
    engine_geometry,
    layer_error,
    make_layer,
    shift_beats,
    stride_order,
    work_unit_shapes,
)


@pytest.mark.parametrize("config", [preset("small"), preset("ice40"), preset("icebreaker"),
                                    preset("ulx3s"), NPUConfig(macs=64, acc_slots=8)],
                         ids=["small", "ice40", "icebreaker", "ulx3s", "64macs"])
def test_against_model(config):
    """Int8-only builds (``ice40``, and ``icebreaker`` with its 8-value rows) keep 8 bits
    a value. The shifter reads the rows in stride order, the model the halo rows."""
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
            order = stride_order(row_values, stride)
            # The beat's kx is taken as its rows are read; the rows come in the next cycle,
            # with another beat's kx on the port.
            for name, value in (("kx", kx), ("stride", stride), ("dilation", dilation),
                                ("log2w", log2w)):
                ctx.set(getattr(dut, name), value)
            ctx.set(dut.en, 1)
            await ctx.tick()
            ctx.set(dut.en, 0)
            ctx.set(dut.kx, rng.randint(0, 15))
            ctx.set(dut.rows, [[row[e] for e in order] for row in rows])
            lanes = ctx.get(dut.lanes)
            assert [lanes[i] for i in range(n)] == \
                lane_inputs(rows, kx, dilation, stride, log2w, n), (log2w, stride, dilation, kx)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()


@pytest.mark.parametrize("row_values, strides", [(8, None), (32, None), (32, (1, 2, 3, 4)),
                                                 (16, (2, 5))])
def test_stride_order(row_values, strides):
    """Every stride built against npu_spec.neural.stride_order, every element kept once.
    Strides not built (0, which the start check refuses, and those left out) are not
    read by any lane, so their order is not checked."""
    dut = StrideOrder(row_values, 16, strides)
    built = range(1, 8) if strides is None else strides
    rng = random.Random(row_values)

    async def tb(ctx):
        for stride in built:
            values = [rng.randrange(1 << 16) for _ in range(row_values)]
            ctx.set(dut.values, values)
            ctx.set(dut.stride, stride)
            ordered = ctx.get(dut.ordered)
            got = [ordered[p] for p in range(row_values)]
            assert got == [values[e] for e in stride_order(row_values, stride)], stride
            assert sorted(got) == sorted(values)

    sim = Simulator(dut)
    sim.add_testbench(tb)
    sim.run()


def test_stride_order_refuses_strides():
    for strides in ((), (0, 1), (8,)):
        with pytest.raises(ValueError, match="Strides must be some of 1 to 7"):
            StrideOrder(8, 8, strides)


@pytest.mark.parametrize("name", ["small", "ice40", "icebreaker", "ulx3s", "ecp5"])
def test_shift_beats_are_the_layers_that_run(name):
    """npu_spec.neural.shift_beats, what the shifter and the stride order are built for, is
    every beat of every layer that passes the HALO check (npu_spec.neural.layer_error), and
    nothing more: a layer for each (shape, stride, dilation, kernel width)."""
    config = preset(name)
    _, row_values, _ = engine_geometry(config)
    expect = {}
    for log2w in range(config.macs.bit_length()):
        for stride in range(1, 8):
            for dilation in range(1, 8):
                for kw in range(1, MAX_KERNEL + 1):
                    layer = make_layer(fmt=MacFormat.INT8, groups=1, icpg=1, ocpg=1, in_h=8,
                                       in_w=8, out_h=1, out_w=1, kh=1, kw=kw, stride=stride,
                                       dilation=dilation, log2w=log2w)
                    error = layer_error(layer, config)
                    assert error not in (NeuralError.FORMAT, NeuralError.SHAPE)
                    if error in (NeuralError.KERNEL, NeuralError.HALO):
                        continue
                    expect.setdefault((log2w, stride), set()).update(
                        kx * dilation for kx in range(kw))
    assert shift_beats(config) == expect
    assert {lw for lw, _ in expect} == set(work_unit_shapes(config))


@pytest.mark.parametrize("name", ["ulx3s", "icebreaker"])
def test_one_stage(name):
    """With ``stages=1`` the lanes answer the rows of the last cycle ``en`` was high in (with
    the ``kx`` taken at the ``en`` before); a cycle with ``en`` low changes nothing."""
    config = preset(name)
    max_rows, row_values, _ = engine_geometry(config)
    bits = value_bits(config)
    dut = Shifter(config, max_rows, row_values, bits, stages=1)
    rng = random.Random(7)
    n = config.macs

    def beat():
        log2w = rng.choice(work_unit_shapes(config))
        w = 1 << log2w
        while True:
            stride, dilation, kx = rng.randint(1, 7), rng.randint(1, 7), rng.randint(0, 15)
            if (w - 1) * stride + kx * dilation < row_values:
                break
        rows = [[rng.randrange(1 << bits) for _ in range(row_values)] for _ in range(max_rows)]
        order = stride_order(row_values, stride)
        inputs = {"rows": [[row[e] for e in order] for row in rows], "kx": kx,
                  "stride": stride, "dilation": dilation, "log2w": log2w}
        return inputs, lane_inputs(rows, kx, dilation, stride, log2w, n)

    async def tb(ctx):
        for _ in range(60):
            inputs, expect = beat()
            for name, value in inputs.items():
                if name != "rows":
                    ctx.set(getattr(dut, name), value)
            ctx.set(dut.en, 1)
            await ctx.tick()
            # The rows come a cycle after the beat's kx (the next beat's kx with them).
            other, _ = beat()
            ctx.set(dut.rows, inputs["rows"])
            ctx.set(dut.kx, other["kx"])
            await ctx.tick()
            # The next beat's inputs (its stride and shape are the layer's, so they stay).
            other, _ = beat()
            ctx.set(dut.rows, other["rows"])
            ctx.set(dut.kx, other["kx"])
            ctx.set(dut.en, 0)
            await ctx.tick()
            lanes = ctx.get(dut.lanes)
            assert [lanes[i] for i in range(n)] == expect

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
