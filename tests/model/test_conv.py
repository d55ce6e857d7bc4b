"""The golden convolution against independent references (integer einsum, float64)."""

import numpy as np
import pytest

from npu_model import fp
from npu_model.conv import ConvLayer, conv_accumulate, fc_as_conv, layer_macs


def _reference_int(layer, x, w, bias):
    """Exact int64 convolution by explicit padding and einsum (no shared code)."""
    p, s, d = layer.pad, layer.stride, layer.dilation
    xp = np.pad(x.astype(np.int64), ((0, 0), (p, p + s * layer.out_height),
                                      (p, p + s * layer.out_width)))
    out = np.zeros(layer.output_shape, np.int64)
    for k in range(layer.out_channels):
        g = k // layer.ocpg
        xs = xp[g * layer.icpg:(g + 1) * layer.icpg]
        for ky in range(layer.kh):
            for kx in range(layer.kw):
                win = xs[:, ky * d:ky * d + s * layer.out_height:s,
                         kx * d:kx * d + s * layer.out_width:s]
                out[k] += np.einsum("chw,c->hw", win, w[k, :, ky, kx].astype(np.int64))
        out[k] += bias[k]
    return out


def _reference_f64(layer, x, w, bias):
    p, s, d = layer.pad, layer.stride, layer.dilation
    xp = np.pad(x, ((0, 0), (p, p + s * layer.out_height), (p, p + s * layer.out_width)))
    out = np.zeros(layer.output_shape, np.float64)
    absout = np.zeros(layer.output_shape, np.float64)
    for k in range(layer.out_channels):
        g = k // layer.ocpg
        xs = xp[g * layer.icpg:(g + 1) * layer.icpg]
        for ky in range(layer.kh):
            for kx in range(layer.kw):
                win = xs[:, ky * d:ky * d + s * layer.out_height:s,
                         kx * d:kx * d + s * layer.out_width:s]
                out[k] += np.einsum("chw,c->hw", win, w[k, :, ky, kx])
                absout[k] += np.einsum("chw,c->hw", np.abs(win), np.abs(w[k, :, ky, kx]))
        out[k] += bias[k]
        absout[k] += abs(bias[k])
    return out, absout


SHAPES = [
    dict(channels=3, height=7, width=6, out_channels=4, kh=3, kw=3, pad=1),
    dict(channels=4, height=9, width=9, out_channels=6, kh=3, kw=3, stride=2, pad=1),
    dict(channels=8, height=6, width=5, out_channels=8, kh=3, kw=3, pad=1, groups=8),
    dict(channels=6, height=8, width=7, out_channels=9, kh=3, kw=2, pad=2, dilation=2, groups=3),
    dict(channels=5, height=1, width=3, out_channels=7, kh=1, kw=1),
    dict(channels=2, height=5, width=5, out_channels=3, kh=5, kw=5, pad=2),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_int8_equals_integer_reference(shape):
    layer = ConvLayer(**shape, fmt="int8")
    rng = np.random.default_rng(layer.channels * 7 + layer.kh)
    x = rng.integers(-128, 128, (layer.channels, layer.height, layer.width)).astype(np.int8)
    w = rng.integers(-128, 128, layer.weight_shape).astype(np.int8)
    w[rng.random(w.shape) < 0.3] = 0
    bias = rng.integers(-(1 << 20), 1 << 20, layer.out_channels)
    got = conv_accumulate(layer, x, w, bias).view(np.int32)
    assert np.array_equal(got, _reference_int(layer, x, w, bias))


def test_int8_wraps_like_int32():
    layer = ConvLayer(1, 1, 1, 1, 1, 1, fmt="int8")
    got = conv_accumulate(layer, np.full((1, 1, 1), -128, np.int8),
                          np.full((1, 1, 1, 1), -128, np.int8), [0x7FFF_FFFF])
    assert got.view(np.int32)[0, 0, 0] == np.int32(-(1 << 31) + 16384 - 1)


@pytest.mark.parametrize("fmt", ["fp16", "f16i8", "i8f16"])
@pytest.mark.parametrize("shape", SHAPES[:4])
def test_float_within_sequential_bound(shape, fmt):
    """binary32 sequential accumulation: |error| <= n * 2**-24 * (|bias| + sum |products|)
    (each of the n additions rounds once with relative error at most 2**-24; products of
    binary16 / int8 operands are exact in binary32)."""
    layer = ConvLayer(**shape, fmt=fmt)
    rng = np.random.default_rng(3)
    if layer.data_fp16:
        x = rng.standard_normal((layer.channels, layer.height, layer.width)).astype(np.float16)
        xc, xv = x.view(np.uint16), x.astype(np.float64)
    else:
        xi = rng.integers(-128, 128, (layer.channels, layer.height, layer.width)).astype(np.int8)
        xc, xv = xi, xi.astype(np.float64)
    if layer.coef_fp16:
        w = (rng.standard_normal(layer.weight_shape) * 0.3).astype(np.float16)
        wc, wv = w.view(np.uint16), w.astype(np.float64)
    else:
        wi = rng.integers(-128, 128, layer.weight_shape).astype(np.int8)
        wc, wv = wi, wi.astype(np.float64)
    b = rng.standard_normal(layer.out_channels).astype(np.float32)
    got = fp.f32_value(conv_accumulate(layer, xc, wc, fp.f32_bits(b))).astype(np.float64)
    ref, mag = _reference_f64(layer, xv, wv, b.astype(np.float64))
    n = layer.icpg * layer.kh * layer.kw + 1
    assert np.all(np.abs(got - ref) <= n * 2.0 ** -24 * mag + 1e-300)
    assert np.abs(got - ref).max() > 0 or layer.channels < 3   # rounding really happens


def test_zero_weights_are_skipped_exactly():
    """inf * 0 would be NaN and -0 + +0 would be +0: a zero weight adds nothing at all."""
    layer = ConvLayer(2, 1, 1, 1, 1, 1, fmt="fp16")
    x = np.array([0x7C00, 0x3C00], np.uint16).reshape(2, 1, 1)          # +inf, 1.0
    w = np.array([0x8000, 0x0000], np.uint16).reshape(1, 2, 1, 1)       # -0, +0
    neg_zero_bias = [0x8000_0000]
    assert conv_accumulate(layer, x, w, neg_zero_bias)[0, 0, 0] == 0x8000_0000


def test_all_zero_kernel_yields_bias_and_canonical_nan():
    layer = ConvLayer(1, 2, 2, 2, 1, 1, fmt="fp16")
    x = np.full((1, 2, 2), 0x3C00, np.uint16)
    w = np.zeros((2, 1, 1, 1), np.uint16)
    out = conv_accumulate(layer, x, w, [0x3F80_0000, 0x7FA0_0001])
    assert np.all(out[0] == 0x3F80_0000)
    assert np.all(out[1] == fp.F32_QNAN)


def test_fc_mappings_agree():
    rng = np.random.default_rng(5)
    cin, cout, batch = 12, 7, 3
    W = rng.integers(-128, 128, (cout, cin)).astype(np.int8)
    X = rng.integers(-128, 128, (batch, cin)).astype(np.int8)
    bias = np.zeros(cout, np.int64)
    lb = fc_as_conv(cin, cout, batch, "int8", "batch")
    a = conv_accumulate(lb, X.T.reshape(cin, 1, batch), W.reshape(cout, cin, 1, 1), bias)
    lw = fc_as_conv(cin, cout, batch, "int8", "weights")
    b = conv_accumulate(lw, W.T.reshape(cin, 1, cout), X.reshape(batch, cin, 1, 1),
                        np.zeros(batch, np.int64))
    ref = X.astype(np.int64) @ W.T.astype(np.int64)
    assert np.array_equal(a.view(np.int32)[:, 0, :].T, ref)
    assert np.array_equal(b.view(np.int32)[:, 0, :], ref)
    assert layer_macs(lb) == layer_macs(lw) == cin * cout * batch


def test_bad_layers_rejected():
    with pytest.raises(ValueError, match="groups"):
        ConvLayer(3, 4, 4, 4, 3, 3, groups=2)
    with pytest.raises(ValueError, match="does not fit"):
        ConvLayer(1, 2, 2, 1, 3, 3)
    with pytest.raises(ValueError, match="format"):
        ConvLayer(1, 2, 2, 1, 1, 1, fmt="int4")


def _reference_sequential_f32(layer, xv, wv, wzero, bias):
    """The accumulation contract stated with numpy float32 scalars (the host FPU, round to
    nearest even, no shared code with the model): per output, from the bias, in the order
    (ic, ky, kx), ``acc = float32(acc + float32(x * w))``, zero weights skipped; every NaN is
    the canonical NaN."""
    p, s, d = layer.pad, layer.stride, layer.dilation
    xp = np.pad(xv, ((0, 0), (p, p + s * layer.out_height), (p, p + s * layer.out_width)))
    out = np.zeros(layer.output_shape, np.uint32)
    with np.errstate(all="ignore"):
        for k in range(layer.out_channels):
            g = k // layer.ocpg
            for oy in range(layer.out_height):
                for ox in range(layer.out_width):
                    acc = bias[k]
                    for ic in range(layer.icpg):
                        for ky in range(layer.kh):
                            for kx in range(layer.kw):
                                if wzero[k, ic, ky, kx]:
                                    continue
                                x = xp[g * layer.icpg + ic, oy * s + ky * d, ox * s + kx * d]
                                acc = np.float32(acc + np.float32(x * wv[k, ic, ky, kx]))
                    out[k, oy, ox] = fp.F32_QNAN if np.isnan(acc) else \
                        np.float32(acc).view(np.uint32)
    return out


def _corner_f16(rng, shape):
    """binary16 codes with zeros of both signs, subnormals, the largest finite value,
    infinities and NaNs among ordinary values."""
    codes = np.asarray(rng.standard_normal(shape).astype(np.float16).view(np.uint16),
                       np.int64)
    u = rng.random(shape)
    sign = rng.integers(0, 2, shape) << 15
    codes = np.select([u < 0.05, u < 0.15, u < 0.2, u < 0.203, u < 0.206],
                      [sign, sign | rng.integers(1, 0x400, shape), sign | 0x7BFF,
                       sign | 0x7C00, 0x7E01], codes)
    return codes.astype(np.uint16)


@pytest.mark.parametrize("fmt", ["fp16", "f16i8", "i8f16"])
@pytest.mark.parametrize("shape", SHAPES)
def test_float_bit_exact_with_sequential_float32(shape, fmt):
    """Bit for bit equal to the scalar float32 reference, on inputs with every special class
    (signed zeros, subnormals, 65504, infinities, NaN) and zero weights of both signs."""
    layer = ConvLayer(**shape, fmt=fmt)
    rng = np.random.default_rng(21)
    xshape = (layer.channels, layer.height, layer.width)
    if layer.data_fp16:
        xc = _corner_f16(rng, xshape)
        xv = xc.view(np.float16).astype(np.float32)
    else:
        xc = rng.integers(-128, 128, xshape).astype(np.int8)
        xv = xc.astype(np.float32)
    if layer.coef_fp16:
        wc = (rng.standard_normal(layer.weight_shape) * 0.3).astype(np.float16).view(np.uint16)
        wc = wc.copy()
        wc[rng.random(wc.shape) < 0.2] = 0x8000                           # -0 is skipped too
        wc[rng.random(wc.shape) < 0.1] = 0
        wv = wc.view(np.float16).astype(np.float32)
        wzero = (wc & 0x7FFF) == 0
    else:
        wc = rng.integers(-128, 128, layer.weight_shape).astype(np.int8)
        wc[rng.random(wc.shape) < 0.2] = 0
        wv = wc.astype(np.float32)
        wzero = wc == 0
    wc[-1] = 0x8000 if layer.coef_fp16 else 0                       # an all-zero kernel
    wzero[-1] = True
    bias = rng.standard_normal(layer.out_channels).astype(np.float32)
    bias[0] = -0.0
    got = conv_accumulate(layer, xc, wc, fp.f32_bits(bias))
    want = _reference_sequential_f32(layer, xv, wv, wzero, bias)
    assert np.array_equal(got, want), np.argwhere(got != want)[:5]
    finite = np.isfinite(fp.f32_value(got))
    assert np.count_nonzero(finite) > got.size // 2
    assert np.count_nonzero(finite & (got != fp.f32_bits(bias)[:, None, None])) > got.size // 2
