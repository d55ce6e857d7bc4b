"""int8 quantization (``npu_compiler.quant``): the post-processor parameters, the scales, and
the golden model's integer conv + post-processor against float64 references."""

from fractions import Fraction

import numpy as np
import pytest

from npu_compiler.quant import (
    QMAX,
    Calibrator,
    activation_scale,
    bias_int32,
    dequantize,
    golden_conv,
    quantize,
    quantize_conv,
    quantize_weights,
    requantize_params,
    weight_scales,
)
from npu_model.builder import ProgramBuilder
from npu_model.conv import ConvLayer, conv_accumulate
from npu_spec.config import PRESETS

# --------------------------------------------------------------------------------------------
# requantization factor -> (multiplier, shift)


def test_requantize_params_precision():
    rng = np.random.default_rng(1)
    factors = np.concatenate([2.0 ** rng.uniform(-70, 30, 400), [1.0, 0.5, 2.0 ** -33,
                                                                  2.0 ** -34, 2 ** 31 - 1.0,
                                                                  0.99999999999, 1e-20]])
    mult, shift = requantize_params(factors)
    for f, m, s in zip(factors, mult.tolist(), shift.tolist()):
        assert 0 <= s <= 63 and 0 <= m <= 2 ** 31 - 1
        # The nearest multiple of 2**-s ...
        assert abs(Fraction(m, 2 ** s) - Fraction(f)) <= Fraction(1, 2 ** (s + 1))
        # ... with the most bits the fields allow: 31 unless the shift is at its limit.
        if s < 63:
            assert m >= 2 ** 30 or (m == round(f) and s == 0)
            assert round(f * 2 ** (s + 1)) > 2 ** 31 - 1  # one more shift would overflow
    assert requantize_params(0.25) == (2 ** 30, 32)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), 2.0 ** 31])
def test_requantize_params_rejects(bad):
    with pytest.raises(ValueError):
        requantize_params(bad)


# --------------------------------------------------------------------------------------------
# scales


def test_weight_scales_per_channel():
    rng = np.random.default_rng(2)
    w = rng.normal(size=(5, 3, 3, 3)) * np.array([1, 10, 0.01, 0, 3])[:, None, None, None]
    q, s = quantize_weights(w)
    assert q.dtype == np.int8 and np.abs(q).max() <= QMAX
    assert np.array_equal(s, weight_scales(w))
    for k in (0, 1, 2, 4):
        assert np.abs(q[k]).max() == QMAX
        assert np.abs(dequantize(q[k], s[k]) - w[k]).max() <= s[k] / 2 * (1 + 1e-12)
    assert s[3] == 1.0 and not q[3].any()


def test_activation_scale_methods():
    rng = np.random.default_rng(3)
    x = [rng.normal(size=(4, 8)), rng.normal(size=100) * 2]
    s = activation_scale(x)
    assert s * QMAX == pytest.approx(max(np.abs(v).max() for v in x))
    p = activation_scale(x, "percentile", 99.0)
    assert p < s
    assert p * QMAX == pytest.approx(np.percentile(np.abs(np.concatenate(
        [v.ravel() for v in x])), 99.0))
    assert activation_scale(np.zeros(5)) == 1.0
    for args in ((x, "minmax"), (x, "percentile", 0), ([np.array([np.inf])],)):
        with pytest.raises(ValueError):
            activation_scale(*args)


def test_quantize_rounds_half_even_and_saturates():
    assert quantize([0.5, 1.5, 2.5, -2.5, 1000, -1000], 1.0).tolist() == [0, 2, 2, -2, 127,
                                                                          -128]
    with pytest.raises(ValueError):
        quantize([1.0], 0.0)


def test_bias_overflow_is_an_error():
    assert bias_int32([3.0, -3.0], 0.5, [2.0, 4.0]).tolist() == [3, -2]
    with pytest.raises(ValueError, match="channel 1"):
        bias_int32([1.0, 1e9], 1e-3, [1e-3, 1e-3])


def test_activations():
    w = np.ones((2, 1, 1, 1))
    assert quantize_conv(w, None, 1, 6 / 127, "relu6").conv_args()["lo"] == 0
    q = quantize_conv(w, None, 1, 6 / 127, "relu6")
    assert (q.act, q.lo, q.hi) == ("clamp", 0, 127)
    q = quantize_conv(w, None, 1, 0.1, ("clip", -1.0, 2.0))
    assert (q.act, q.lo, q.hi) == ("clamp", -10, 20)
    assert quantize_conv(w, None, 1, 0.1, "relu").act == "relu"
    assert quantize_conv(w, None, 1, 0.1).act == "none"
    for bad in ("gelu", ("clip", 2.0, 1.0)):
        with pytest.raises(ValueError):
            quantize_conv(w, None, 1, 0.1, bad)


def test_builder_accepts_the_parameters():
    """The register values fit the kernel header fields (bias, scale, shift)."""
    rng = np.random.default_rng(4)
    q = quantize_conv(rng.normal(size=(20, 3, 3, 3)), rng.normal(size=20) * 5, 1 / 64,
                      0.2, "relu")
    pb = ProgramBuilder(PRESETS["small"])
    blob = pb.kernels(q.weights, **q.kernel_args())
    assert blob.weight_shape == (20, 3, 3, 3)


# --------------------------------------------------------------------------------------------
# the integer pipeline against float64


def float_conv(x, w, b, stride, pad, dilation, groups):
    """float64 reference convolution, ``x`` [N, C, H, W], ``w`` [K, C/g, KH, KW]."""
    n, c, h, wd = x.shape
    k, icpg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, k, oh, ow))
    ocpg = k // groups
    for o in range(k):
        g = o // ocpg
        for i in range(icpg):
            for ky in range(kh):
                for kx in range(kw):
                    win = xp[:, g * icpg + i, ky * dilation:ky * dilation + stride * oh:stride,
                             kx * dilation:kx * dilation + stride * ow:stride]
                    out[:, o] += w[o, i, ky, kx] * win
        out[:, o] += b[o]
    return out


def apply_act(y, q):
    """The activation of ``q`` in output units, saturated to int8 first."""
    y = np.clip(y, -128, 127)
    if q.act == "relu":
        return np.maximum(y, 0)
    if q.act == "clamp":
        return np.clip(y, q.lo, q.hi)
    return y


LAYERS = [  # (C, H, W, K, KH, KW, stride, pad, dilation, groups)
    (3, 9, 8, 5, 3, 3, 1, 1, 1, 1),
    (4, 11, 7, 6, 3, 3, 2, 1, 1, 2),
    (6, 8, 8, 6, 3, 3, 1, 2, 2, 6),
    (16, 5, 6, 10, 1, 1, 1, 0, 1, 1),
    (2, 12, 5, 3, 5, 3, 3, 2, 1, 1),
    (64, 1, 1, 10, 1, 1, 1, 0, 1, 1),
]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shape", LAYERS)
@pytest.mark.parametrize("activation", [None, "relu", ("clip", -0.5, 1.5)])
def test_integer_pipeline_against_float64(shape, seed, activation):
    c, h, w, k, kh, kw, stride, pad, dil, groups = shape
    rng = np.random.default_rng(seed * 1000 + sum(shape))
    weights = rng.normal(size=(k, c // groups, kh, kw)) * rng.uniform(0.05, 2, (k, 1, 1, 1))
    bias = rng.normal(size=k) * rng.uniform(0.01, 3)
    x = rng.normal(size=(3, c, h, w)) * rng.uniform(0.1, 10)
    y = float_conv(x, weights, bias, stride, pad, dil, groups)
    s_in = activation_scale(x)
    s_out = activation_scale(y) * rng.uniform(0.5, 1.5)  # sometimes saturating
    q = quantize_conv(weights, bias, s_in, s_out, activation)
    xq = quantize(x, s_in)
    out = golden_conv(q, xq, stride, pad, dil, groups).astype(np.float64)
    f = q.factor[None, :, None, None]
    delta = np.abs(q.scale / 2.0 ** q.shift - q.factor)[None, :, None, None]

    # (a) Same int8 operands: the only errors are the bias rounding (half an accumulator
    # unit), the multiplier (|acc| * |M / 2**s - factor|) and the final rounding (half an
    # output unit). Activation and saturation are 1-Lipschitz.
    wq = q.weights.astype(np.float64)
    acc = float_conv(xq.astype(np.float64), wq, q.bias.astype(np.float64), stride, pad, dil,
                     groups)
    exact = float_conv(xq.astype(np.float64), wq, bias / (s_in * q.w_scales), stride, pad,
                       dil, groups) * f
    bound_a = 0.5 + np.abs(acc) * delta + f / 2
    err_a = np.abs(out - apply_act(exact, q))
    assert (err_a <= bound_a + 1e-9).all(), err_a.max()
    free = apply_act(exact, q) == exact  # outputs no clamp touched
    assert not free.any() or err_a[free].max() > 0.05  # the comparison sees the roundings

    # (b) Against the float layer: plus the input and weight quantization errors,
    # |x w - x' w'| <= |x| s_w / 2 + |w| s_in / 2 + s_in s_w / 4 per product (no input
    # saturates: s_in covers max |x|).
    sw = q.w_scales[:, None, None, None]
    spread = float_conv(np.abs(x), np.abs(weights) * 0 + sw / 2, np.zeros(k), stride, pad,
                        dil, groups)
    spread += float_conv(np.ones_like(x) * s_in / 2, np.abs(weights), np.zeros(k), stride,
                         pad, dil, groups)
    spread += float_conv(np.ones_like(x), np.broadcast_to(s_in * sw / 4, weights.shape),
                         np.zeros(k), stride, pad, dil, groups)
    bound_b = s_out * bound_a + spread
    err_b = np.abs(out * s_out - apply_act(y / s_out, q) * s_out)
    assert (err_b <= bound_b + 1e-9).all()


def test_golden_conv_batch_equals_single_images():
    """The stacked batch gives what each image gives alone through conv_accumulate and the
    rescale formula in Python integers."""
    rng = np.random.default_rng(5)
    for stride, pad, dil in ((1, 1, 1), (2, 1, 1), (3, 2, 2), (2, 0, 1)):
        q = quantize_conv(rng.normal(size=(4, 3, 3, 3)), rng.normal(size=4), 0.03, 0.08,
                          "relu")
        x = rng.integers(-128, 128, size=(4, 3, 10, 9)).astype(np.int8)
        batch = golden_conv(q, x, stride, pad, dil)
        for i in range(4):
            layer = ConvLayer(3, 10, 9, 4, 3, 3, stride, pad, dil)
            acc = conv_accumulate(layer, x[i], q.weights, q.bias).view(np.int32)
            for kk in range(4):
                m, s = int(q.scale[kk]), int(q.shift[kk])
                want = [max(min((int(a) * m + (1 << (s - 1))) >> s, 127), 0)
                        for a in acc[kk].ravel()]
                assert batch[i, kk].ravel().tolist() == want
        assert np.array_equal(golden_conv(q, x[1], stride, pad, dil), batch[1])


# --------------------------------------------------------------------------------------------
# streaming calibration


@pytest.mark.parametrize("seed", range(4))
def test_calibrator_against_all_values(seed):
    rng = np.random.default_rng(seed)
    cal = Calibrator(bins=256)
    batches = [rng.normal(size=rng.integers(1, 500)) * 10.0 ** rng.uniform(-3, 3)
               for _ in range(8)]
    batches.insert(rng.integers(0, 8), np.zeros(7))  # zeros before or after a range exists
    for b in batches:
        cal.update("t", b)
        cal.update("other", b * 3)
    allv = np.abs(np.concatenate(batches))
    assert cal.names == ("t", "other")
    assert cal.max_abs("t") == allv.max() and cal.scale("t") == activation_scale(batches)
    width = 2 * allv.max() / 256
    for p in (50, 90, 99, 99.99, 100):
        true = np.percentile(allv, p, method="inverted_cdf")
        est = cal.percentile_abs("t", p)
        assert true <= est <= true + width
    assert cal.scale("t", "percentile", 99.0) == pytest.approx(
        cal.percentile_abs("t", 99.0) / QMAX)
    # Nothing is lost when bins merge: the largest value is in the last occupied bin.
    assert cal.percentile_abs("t", 100) == allv.max()


def test_calibrator_edge_cases():
    cal = Calibrator(bins=4)
    cal.update("z", np.zeros(3))
    assert cal.scale("z") == 1.0 and cal.percentile_abs("z", 50) == 0.0
    cal.update("z", [1.0, 1.0, 1000.0])  # the range starts at 1024: bins of 256
    assert cal.percentile_abs("z", 50) == 256.0  # the 3rd of 6 values lies in bin 0
    cal.update("z", [5000.0])  # the range grows 8-fold, more than the bin count: bins of
    # 2048, the six old values all in bin 0, 5000 in bin 2 (capped at the maximum).
    assert cal.percentile_abs("z", 50) == 2048.0 and cal.percentile_abs("z", 90) == 5000.0
    assert cal.percentile_abs("z", 100) == cal.max_abs("z") == 5000.0
    for bad in (lambda: Calibrator(bins=3), lambda: cal.max_abs("nope"),
                lambda: cal.update("z", [np.nan]), lambda: cal.scale("z", "minmax"),
                lambda: cal.percentile_abs("z", 0)):
        with pytest.raises((ValueError, KeyError)):
            bad()
