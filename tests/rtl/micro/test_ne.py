# amaranth: UnusedElaboratable=no
"""The micro neural unit against the golden model's neural task (``npu_model.system``), bit for
bit: the whole buffer after the task and the error code."""

import numpy as np
import pytest

from npu.micro.ne import CACHE_DEPTH, UNSUPPORTED, MicroNeural
from npu_model.kernel_codec import encode, kernel_memory
from npu_model.system import run_neural_task
from npu_sim.micro_units import run_unit
from npu_spec import dataproc, neural
from npu_spec.config import preset
from npu_spec.neural import NeuralError

CONFIG = preset("icebreaker")
BUF = dataproc.buffer_elements(CONFIG)
KWORDS = CONFIG.kernel_kib * 256


def golden(buffer, kmem, regs):
    """``(error code, buffer)`` of the golden model's neural task."""
    return run_neural_task(CONFIG, regs, buffer, kmem)


def rtl(buffer, kmem, regs):
    """``(error code, buffer, cycles)`` of the unit, after checking that the unit built with
    its pooling mode (``pooling=True``) ends the task the same way (code and whole buffer)."""
    err, buf, cycles = run_unit(MicroNeural(), buffer, regs, kmem, limit=2_000_000)
    err_p, buf_p, _ = run_unit(MicroNeural(pooling=True), buffer, regs, kmem, limit=2_000_000)
    assert err_p == err, "the unit with its pooling mode ends with another code"
    assert np.array_equal(np.array(buf_p, np.uint16), np.array(buf, np.uint16)), \
        "the unit with its pooling mode leaves another buffer"
    return err, np.array(buf, np.uint16), cycles


def _params(rng, ocg, n, shift_max):
    """Per-channel bias, scale and shift. Most channels land the rescaled accumulator near
    +-64 (so rounding, zero point and activation decide the result: a multiplier of 2**29 to
    2**31 and the shift that divides the typical |acc|, 2**13 sqrt(n), down to it); a quarter
    take any value (mostly saturating); with ``shift_max`` every channel does, shift at most
    ``shift_max``."""
    wild = rng.random(ocg) < (1 if shift_max is not None else 0.25)
    bias = np.where(wild, rng.integers(-(1 << 20), 1 << 20, ocg),
                    rng.integers(-(1 << 12), 1 << 12, ocg))
    sign = rng.choice([-1, 1], ocg, p=[0.2, 0.8])
    scale = np.where(wild, rng.integers(-(1 << 31), 1 << 31, ocg),
                     sign * rng.integers(1 << 29, 1 << 31, ocg))
    typical = 37 + int(round(0.5 * np.log2(n)))
    shift = np.where(wild, rng.integers(0, (shift_max if shift_max is not None else 63) + 1,
                                        ocg),
                     typical + rng.integers(-2, 3, ocg))
    return bias, scale, shift


def build(rng, *, icpg, k, kh, kw, out_h, out_w, stride=1, dilation=1, pad=0, act=0,
          zero_point=0, lo=-128, hi=127, in_h=None, in_w=None, slots=0, planes=0, ktable=7,
          shift_max=None, corrupt=None, fields=None):
    """A random task: ``(buffer, kernel memory, registers)``; ``fields`` overrides layer
    fields after the geometry has set them."""
    need_h = (out_h - 1) * stride + (kh - 1) * dilation + 1 - pad
    need_w = (out_w - 1) * stride + (kw - 1) * dilation + 1 - pad
    in_h = max(1, need_h) if in_h is None else in_h
    in_w = max(1, need_w) if in_w is None else in_w
    log2w = neural.best_log2w(CONFIG, out_w, kw, stride, dilation)
    weights = rng.integers(-128, 128, (k, icpg, kh, kw)).astype(np.int8)
    weights[rng.random(weights.shape) < 0.2] = 0
    groups = []
    for base in range(0, k, 8):
        ocg = min(8, k - base)
        bias, scale, shift = _params(rng, ocg, icpg * kh * kw, shift_max)
        groups.append(encode(weights[base:base + ocg], coef_fp16=False, sparse=False,
                             palette_bits=0, bias=bias, scale=scale, shift=shift))
    words = kernel_memory(groups, base=ktable)
    kmem = np.zeros(KWORDS, np.uint32)
    kmem[(ktable + np.arange(len(words))) % KWORDS] = words    # addresses wrap
    if corrupt:
        corrupt(kmem, ktable)
    layer = neural.make_layer(fmt=0, log2w=log2w, groups=1, icpg=icpg, ocpg=k, in_h=in_h,
                              in_w=in_w, out_h=out_h, out_w=out_w, kh=kh, kw=kw,
                              stride=stride, dilation=dilation, pad=pad, addr=ktable,
                              act=act, zero_point=zero_point & 0xFF, lo=lo & 0xFF,
                              hi=hi & 0xFF)
    layer.update(fields or {})
    regs = dict(neural.layer_writes(layer))
    rs = in_w + int(rng.integers(0, 3))
    ds_in = dataproc.make_dataset(int(rng.integers(0, BUF)), (icpg, in_h, in_w), rstride=rs,
                                  cstride=rs * in_h + int(rng.integers(0, 5)))
    ds_out = dataproc.make_dataset(int(rng.integers(0, BUF)), (k, out_h, out_w), slots=slots,
                                   planes=planes)
    regs.update(dataproc.dataset_writes(dataproc.ne_port_base(0, "IN"), ds_in))
    regs.update(dataproc.dataset_writes(dataproc.ne_port_base(0, "OUT"), ds_out))
    buffer = rng.integers(0, 1 << 16, BUF).astype(np.uint16)
    return buffer, kmem, regs


def check(seed, expect=None, **kw):
    rng = np.random.default_rng(seed)
    task = build(rng, **kw)
    code, want = golden(*task)
    if expect is not None:
        assert code == expect
    err, got, _ = rtl(*task)
    assert err == code
    bad = np.nonzero(got != want)[0]
    assert not bad.size, f"{bad.size} elements differ, first at {bad[0]}"
    return code


CONVS = {
    "3x3_pad1_relu": dict(icpg=3, k=10, kh=3, kw=3, out_h=4, out_w=5, pad=1, act=1),
    "1x1_zp": dict(icpg=13, k=8, kh=1, kw=1, out_h=2, out_w=3, zero_point=-5),
    "2x2_s2_clamp": dict(icpg=2, k=5, kh=2, kw=2, out_h=3, out_w=3, stride=2, act=2,
                         lo=-20, hi=50),
    "dilation2_pad": dict(icpg=2, k=3, kh=2, kw=2, out_h=3, out_w=4, dilation=2, pad=1),
    "kernel_1x3_shift0": dict(icpg=1, k=9, kh=1, kw=3, out_h=2, out_w=3, shift_max=1),
    "input_short": dict(icpg=2, k=4, kh=3, kw=3, out_h=4, out_w=4, pad=1, in_h=2, in_w=3,
                        act=1, zero_point=3),
    "ring_output": dict(icpg=2, k=11, kh=1, kw=1, out_h=2, out_w=2, slots=2, planes=3),
    "gemm_2x2": dict(icpg=16, k=10, kh=2, kw=2, out_h=1, out_w=1),
    "gemm_1x1_batch": dict(icpg=20, k=3, kh=1, kw=1, out_h=1, out_w=2),
    "kernel_memory_wraps": dict(icpg=3, k=12, kh=2, kw=2, out_h=2, out_w=2, ktable=1010),
}


@pytest.mark.parametrize("name", CONVS)
def test_conv(name):
    assert check(list(CONVS).index(name), expect=0, **CONVS[name]) == 0


@pytest.mark.parametrize("seed", range(8))
def test_random_conv(seed):
    """Random geometry: kernels 1..3 a side, strides and dilations 1..2, padding, channel
    counts that are not multiples of 8, every activation; the golden code (0, or ``HALO``
    where the work unit's halo row does not fit) and buffer."""
    rng = np.random.default_rng(100 + seed)
    kh, kw = (int(v) for v in rng.integers(1, 4, 2))
    geometry = dict(icpg=int(rng.integers(1, 7)), k=int(rng.integers(1, 13)), kh=kh, kw=kw,
                    out_h=int(rng.integers(1, 4)), out_w=int(rng.integers(1, 5)),
                    stride=int(rng.integers(1, 3)), dilation=int(rng.integers(1, 3)),
                    pad=int(rng.integers(0, max(kh, kw))), act=int(rng.integers(0, 3)),
                    zero_point=int(rng.integers(-20, 21)), lo=int(rng.integers(-128, 0)),
                    hi=int(rng.integers(0, 128)))
    assert check(1000 + seed, **geometry) in (0, NeuralError.HALO)


def _short_body(kmem, table):
    kmem[table + 4 + 3] -= 1                  # group 1's body one word short


def _wrong_nnz(kmem, table):
    header = kmem[table + 4]                  # group 1's header address
    kmem[header + 2] += 1 << 16               # channel 0's nnz one too many


def _reserved(kmem, table):
    header = kmem[table]
    kmem[header + 3 + 2] |= 1 << 8            # group 0, channel 1: reserved byte


BASE = dict(icpg=2, k=10, kh=1, kw=1, out_h=2, out_w=2)


@pytest.mark.parametrize("case, expect", [
    (dict(fmt=1), NeuralError.FORMAT),
    (dict(out_w=0), NeuralError.SHAPE),
    (dict(ocpg=1025), NeuralError.SHAPE),
    (dict(out_h=256), NeuralError.SHAPE),
    (dict(ocpg=1025), NeuralError.SHAPE),
    (dict(kh=17), NeuralError.KERNEL),
    (dict(log2w=1), NeuralError.KERNEL),
    (dict(kw=3, stride=2), NeuralError.HALO),
    (dict(geometry=dict(kh=2, icpg=65)), NeuralError.BUFFER),
    (dict(sparse=1), NeuralError.EXTRACT),
    (dict(palette=4), NeuralError.EXTRACT),
    (dict(act=3), NeuralError.POSTPROC),
    (dict(out_fp16=1), NeuralError.POSTPROC),
    (dict(geometry=dict(corrupt=_short_body)), NeuralError.EXTRACT),
    (dict(geometry=dict(corrupt=_wrong_nnz)), NeuralError.EXTRACT),
    (dict(geometry=dict(corrupt=_reserved)), NeuralError.EXTRACT),
])
def test_error(case, expect):
    """Register values the golden model rejects: the same code, the same buffer (the groups
    before a rejected kernel group written, nothing else)."""
    geometry = dict(BASE, **case.pop("geometry", {}))
    assert check(len(str(case)), expect=expect, **geometry, fields=case) == expect


def test_grouped_unsupported():
    """A grouped convolution (which the golden model runs) ends with UNSUPPORTED, nothing
    written."""
    task = build(np.random.default_rng(1), **BASE, fields=dict(groups=2, ocpg=5))
    err, got, _ = rtl(*task)
    assert err == UNSUPPORTED
    assert np.array_equal(got, task[0])


def test_weight_cache_full():
    """A kernel of exactly ``CACHE_DEPTH`` input elements (32 x 4 x 4; 4 channels, so the body
    fits the 4 KiB kernel memory): every row of the weight cache used, the same numbers as the
    golden model."""
    assert 32 * 4 * 4 == CACHE_DEPTH
    assert check(7, expect=0, icpg=32, k=4, kh=4, kw=4, out_h=1, out_w=2) == 0


def test_weight_cache_overflow_unsupported():
    """More input elements than the weight cache holds (26 x 4 x 5 = 520, which the golden model
    runs): UNSUPPORTED, nothing written."""
    task = build(np.random.default_rng(2), icpg=26, k=4, kh=4, kw=5, out_h=1, out_w=1)
    assert golden(*task)[0] == 0
    err, got, _ = rtl(*task)
    assert err == UNSUPPORTED
    assert np.array_equal(got, task[0])
