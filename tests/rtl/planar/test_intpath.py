# amaranth: UnusedElaboratable=no
"""The integer build's units against the golden model: the integer lane against
:func:`npu_model.planar.lane_op` on the values the build takes, the add/max/min/compare pipe,
the constant check against :func:`npu_spec.planar.f32_small_integer`, the format converters."""

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, signed
from amaranth.sim import Simulator

from npu.lib.fp32 import MacOp
from npu.planar.intpath import IntAddPipe, ToInt, f32_integer, to_int8
from npu.planar.lane import INT_LANE_LATENCY, IntLane
from npu_model import planar as pl
from npu_spec.formats import F32_ONE
from npu_spec.planar import (
    ELT_ARITY,
    INT8_CONST_LIMIT,
    INT8_ELT_OPS,
    INT8_WORD,
    EltOp,
    f32_small_integer,
)
from tests.rtl.planar.test_control import CONSTANTS
from tests.support.planar import f32_classes, run


def run_comb(dut, tb):
    sim = Simulator(dut)
    sim.add_testbench(tb)
    sim.run()


def f32(values):
    return np.asarray(values, np.float32).view(np.uint32)


def run_pipe(dut, inputs, latency, rng, setup=()):
    """Present ``inputs`` (a list of ``[(port, value), ...]``) with ``en`` high at random;
    the results ``latency`` en-cycles later."""
    got = []

    async def tb(ctx):
        for port, value in setup:
            ctx.set(port, value)
        taken = 0
        while len(got) < len(inputs):
            en = rng.random() < 0.7
            if en and taken < len(inputs):
                for port, value in inputs[taken]:
                    ctx.set(port, value)
            ctx.set(dut.en, en)
            await ctx.tick()
            if en:
                taken += 1
                if taken >= latency:
                    got.append(ctx.get(dut.result))

    run(dut, tb)
    return got


@pytest.mark.parametrize("op", list(INT8_ELT_OPS) + [EltOp.MUL])
def test_int_lane(op):
    """Every operation of the integer build on int8 A and B (B also a constant of the allowed
    range, as a scalar broadcast gives), gain-bias with SCALE 0 and 1 and integer biases, MUL
    by 1 (pooling results): the integer equals the golden binary32 value."""
    rng = np.random.default_rng(int(op) + 40)
    n = 80
    a = rng.integers(-128, 128, n)
    b = np.where(rng.random(n) < 0.7, rng.integers(-128, 128, n),
                 rng.integers(-INT8_CONST_LIMIT + 1, INT8_CONST_LIMIT, n))
    a[:4], b[:4] = [-128, 127, 0, -128], [127, -128, 0, -128]
    scale = F32_ONE if op != EltOp.GAIN_BIAS or rng.random() < 0.5 else 0
    bias = int(rng.integers(-INT8_CONST_LIMIT + 1, INT8_CONST_LIMIT))
    dut = IntLane(INT8_WORD)
    got = run_pipe(dut, [[(dut.a, int(x)), (dut.b, int(y)), (dut.c, 0)] for x, y in zip(a, b)],
                   INT_LANE_LATENCY, rng,
                   setup=[(dut.op, op.value), (dut.scale, int(scale != 0)), (dut.bias, bias)])
    if op == EltOp.MUL:
        b = np.ones(n)
    bits = pl.lane_op(op, f32(a), f32(b) if ELT_ARITY[op] >= 2 else None,
                      scale=scale, bias=int(f32(bias)))
    expected = np.asarray(bits, np.uint32).view(np.float32)
    assert np.array_equal(np.asarray(got, np.float64), expected.astype(np.float64)), op


@pytest.mark.parametrize("width", [INT8_WORD, 26])
def test_int_add_pipe(width):
    """Add, max, min, compare of signed integers (compare: +1 if b > a, -1 if b < a, 0)."""
    rng = np.random.default_rng(width)
    n = 200
    lo = 1 << (width - 2)
    a, b = rng.integers(-lo, lo, n), rng.integers(-lo, lo, n)
    b[::7] = a[::7]
    ops = rng.integers(0, len(MacOp), n)
    dut = IntAddPipe(width)
    got = run_pipe(dut, [[(dut.a, int(x)), (dut.b, int(y)), (dut.op, int(o))]
                         for x, y, o in zip(a, b, ops)], IntAddPipe.LATENCY, rng)
    expected = [{MacOp.MAC: x + y, MacOp.MAX: max(x, y), MacOp.MIN: min(x, y),
                 MacOp.CMP: int(np.sign(y - x))}[MacOp(int(o))] for x, y, o in zip(a, b, ops)]
    assert got == expected


def test_int_add_pipe_rejects_bad_width():
    with pytest.raises(ValueError, match="width must be an integer of at least 2, not 1"):
        IntAddPipe(1)


def test_f32_integer_matches_spec():
    """The constant check and conversion equal :func:`f32_small_integer` on every class of
    binary32 pattern, integers at and beyond the limit, fractions of integers."""
    rng = np.random.default_rng(3)
    ints = rng.integers(-2 * INT8_CONST_LIMIT, 2 * INT8_CONST_LIMIT, 200)
    edge = np.array([INT8_CONST_LIMIT - 1, INT8_CONST_LIMIT, -INT8_CONST_LIMIT + 1,
                     -INT8_CONST_LIMIT, 0.5, 2.5, -1.5, 16383.5, 1e-3])
    values = np.concatenate([f32_classes(rng, 200), f32(ints), f32(edge),
                             np.array(CONSTANTS, np.uint32)])
    m = Module()
    bits = Signal(32)
    value, ok = f32_integer(m, bits, INT8_WORD, "x")

    async def tb(ctx):
        for v in values:
            ctx.set(bits, int(v))
            await ctx.delay(1e-9)
            exp = f32_small_integer(int(v))
            assert ctx.get(ok) == (exp is not None), hex(v)
            if exp is not None:
                assert ctx.get(value) == exp, hex(v)

    run_comb(m, tb)


def test_converters():
    """First converter: the low byte, sign-extended (the high byte ignored); second: saturate
    to int8 as a 16-bit element."""
    m = Module()
    m.submodules.conv = conv = ToInt(2, INT8_WORD)
    x = Signal(signed(INT8_WORD))
    y = to_int8(m, x, "y")
    raws = [0x0000, 0x007F, 0x0080, 0xAB80, 0x12FF, 0xFF01]

    async def tb(ctx):
        for raw in raws:
            ctx.set(conv.i.payload.data[0], raw)
            ctx.set(conv.i.payload.data[1], raw ^ 0xFF00)
            await ctx.delay(1e-9)
            low = raw & 0xFF
            assert ctx.get(conv.o.payload[0]) == ctx.get(conv.o.payload[1]) == (
                low - 256 if low & 0x80 else low)
        for v in (-32768, -129, -128, -1, 0, 127, 128, 300, 32767):
            ctx.set(x, v)
            await ctx.delay(1e-9)
            assert ctx.get(y) == max(-128, min(127, v))

    run_comb(m, tb)
