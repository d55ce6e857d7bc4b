"""int8 post-training quantization for this NPU's integer path (``docs/quantization.md``).

The neural engine multiplies int8 data by int8 weights and adds the products to an int32
accumulator seeded with the channel's int32 bias; the post-processor turns the accumulator
into an int8 output with the TOSA rescale ``y = floor((acc * M + 2**(s-1)) / 2**s)`` (``M``
a signed int32 multiplier, ``s`` a shift of 0..63, one rounding, half up), adds the output
zero point, saturates to [-128, 127] and applies ReLU (``max(y, zp)``) or a clamp
(``docs/postproc.md``). Padding reads int8 zeros and the engine subtracts no input zero point,
so activations are quantized symmetrically (zero point 0): a real value ``v`` is
``q * scale``. Weights are symmetric per output channel in [-127, 127].

For a layer with input scale ``s_in``, weight scales ``s_w[k]`` and output scale ``s_out``
the accumulator of channel ``k`` is ``sum(q_x q_w) + round(b / (s_in s_w[k]))`` in units of
``s_in s_w[k]``; the post-processor multiplies it by ``m[k] = s_in s_w[k] / s_out``, which
:func:`requantize_params` turns into ``(M, s)``.

This module imports numpy, ``npu_spec`` and ``npu_model`` (the golden functions
:func:`golden_conv` runs).
"""

from dataclasses import dataclass

import numpy as np

from npu_model.conv import ConvLayer, conv_accumulate
from npu_model.mac import FMT
from npu_model.postproc import PostprocConfig, postprocess
from npu_spec.kernel import MAX_SHIFT
from npu_spec.postproc import Act

__all__ = [
    "QMAX",
    "Calibrator",
    "QuantizedConv",
    "activation_scale",
    "bias_int32",
    "dequantize",
    "golden_conv",
    "quantize",
    "quantize_conv",
    "quantize_weights",
    "requantize_params",
    "weight_scales",
]

#: Largest int8 magnitude used by scales (weights use [-QMAX, QMAX], so they are symmetric).
QMAX = 127
#: Largest post-processor multiplier (``scale`` is a signed int32).
MAX_MULTIPLIER = (1 << 31) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def weight_scales(weights):
    """Per-output-channel symmetric scales ``max|W[k]| / 127`` of ``weights`` ``[K, ...]``
    (1.0 for an all-zero channel, whose weights quantize to 0 whatever the scale)."""
    w = np.asarray(weights, np.float64)
    if w.ndim < 1 or w.shape[0] == 0:
        raise ValueError(f"weights need an output-channel axis, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("weights must be finite")
    peak = np.abs(w.reshape(w.shape[0], -1)).max(axis=1)
    return np.where(peak > 0, peak / QMAX, 1.0)


def quantize(x, scale, zero_point=0, qmin=-128, qmax=127):
    """``clamp(round_half_even(x / scale) + zero_point, qmin, qmax)`` as int8 (``scale`` may
    broadcast, e.g. ``[K, 1, 1, 1]`` per channel)."""
    scale = np.asarray(scale, np.float64)
    if np.any(~(scale > 0)) or not np.all(np.isfinite(scale)):
        raise ValueError("scales must be positive and finite")
    q = np.rint(np.asarray(x, np.float64) / scale) + zero_point
    return np.clip(q, qmin, qmax).astype(np.int8)


def dequantize(q, scale, zero_point=0):
    """``(q - zero_point) * scale`` in float64."""
    return (np.asarray(q, np.float64) - zero_point) * np.asarray(scale, np.float64)


def quantize_weights(weights):
    """``(q, scales)``: int8 weights in [-127, 127] with per-output-channel scales."""
    scales = weight_scales(weights)
    shape = (-1,) + (1,) * (np.ndim(weights) - 1)
    return quantize(weights, scales.reshape(shape), qmin=-QMAX, qmax=QMAX), scales


def activation_scale(samples, method="maxabs", percentile=99.99):
    """Per-tensor symmetric scale of an activation from calibration values.

    ``samples``: an array or a list of arrays (any shapes) of the tensor's float values over
    the calibration inputs. ``method="maxabs"``: ``max|x| / 127`` (nothing saturates on the
    calibration set); ``"percentile"``: the ``percentile``-th percentile of ``|x|`` over 127
    (outliers saturate, the rest gets finer steps). A tensor that is all zero gets 1.0.
    """
    if isinstance(samples, (list, tuple)):
        values = np.concatenate([np.abs(np.asarray(s, np.float64)).ravel() for s in samples])
    else:
        values = np.abs(np.asarray(samples, np.float64)).ravel()
    if values.size == 0:
        raise ValueError("no calibration values")
    if not np.all(np.isfinite(values)):
        raise ValueError("calibration values must be finite")
    if method == "maxabs":
        peak = values.max()
    elif method == "percentile":
        if not 0 < percentile <= 100:
            raise ValueError(f"percentile must be in (0, 100], not {percentile}")
        peak = np.percentile(values, percentile)
    else:
        raise ValueError(f"method must be maxabs or percentile, not {method!r}")
    return float(peak / QMAX) if peak > 0 else 1.0


class Calibrator:
    """Running statistics of named activations over calibration batches, for inputs too many
    to keep: per name the largest ``|x|`` and a histogram of ``|x|``.

    The histogram has ``bins`` (a power of two) equal bins over ``[0, top)``, ``top`` a power of
    two at least the largest ``|x|`` seen; when a larger value arrives, ``top`` doubles as often
    as needed and neighbouring bins merge, so every value is counted once, in a bin whose edges
    are multiples of the current width. :meth:`scale` with ``method="percentile"`` returns the
    upper edge of the bin holding the ``ceil(p n / 100)``-th smallest ``|x|``, capped at the
    largest: at most one bin width (``top / bins <= 2 max|x| / bins``) above that order
    statistic, never below it.
    """

    def __init__(self, bins=2048):
        if bins < 2 or bins & (bins - 1):
            raise ValueError(f"bins must be a power of two of at least 2, not {bins}")
        self.bins = bins
        self._max = {}
        self._top = {}
        self._counts = {}

    @property
    def names(self):
        """The names seen, in first-seen order."""
        return tuple(self._max)

    def update(self, name, values):
        """Add the values of activation ``name`` (any shape)."""
        a = np.abs(np.asarray(values, np.float64)).ravel()
        if not np.all(np.isfinite(a)):
            raise ValueError(f"calibration values of {name!r} must be finite")
        if a.size == 0:
            return
        peak = float(a.max())
        if name not in self._max:
            self._max[name] = 0.0
            self._top[name] = 0.0
            self._counts[name] = np.zeros(self.bins, np.int64)
        self._max[name] = max(self._max[name], peak)
        top = self._top[name]
        if peak >= top and peak > 0:
            new_top = top if top > 0 else 2.0 ** np.ceil(np.log2(peak))
            while new_top <= peak:
                new_top *= 2
            if top > 0:
                factor = int(round(new_top / top))
                counts = self._counts[name]
                if factor >= self.bins:
                    merged = np.zeros(self.bins, np.int64)
                    merged[0] = counts.sum()
                else:
                    merged = np.zeros(self.bins, np.int64)
                    merged[:self.bins // factor] = counts.reshape(-1, factor).sum(axis=1)
                self._counts[name] = merged
            self._top[name] = top = new_top
        if top == 0:  # only zeros so far: they belong to the first bin whatever the range
            self._counts[name][0] += a.size
            return
        index = np.minimum((a * (self.bins / top)).astype(np.int64), self.bins - 1)
        self._counts[name] += np.bincount(index, minlength=self.bins)

    def max_abs(self, name):
        """The largest ``|x|`` of ``name``."""
        if name not in self._max:
            raise KeyError(f"no calibration values for {name!r}")
        return self._max[name]

    def percentile_abs(self, name, percentile):
        """The histogram estimate of the ``percentile``-th percentile of ``|x|`` (see the
        class)."""
        if not 0 < percentile <= 100:
            raise ValueError(f"percentile must be in (0, 100], not {percentile}")
        peak = self.max_abs(name)
        if peak == 0:
            return 0.0
        counts = self._counts[name]
        rank = int(np.ceil(percentile / 100 * counts.sum()))
        i = int(np.searchsorted(np.cumsum(counts), max(rank, 1)))
        return min((i + 1) * self._top[name] / self.bins, peak)

    def scale(self, name, method="maxabs", percentile=99.99):
        """The symmetric per-tensor scale of ``name`` (as :func:`activation_scale`)."""
        if method == "maxabs":
            peak = self.max_abs(name)
        elif method == "percentile":
            peak = self.percentile_abs(name, percentile)
        else:
            raise ValueError(f"method must be maxabs or percentile, not {method!r}")
        return float(peak / QMAX) if peak > 0 else 1.0


def requantize_params(factor):
    """The post-processor's ``(multiplier, shift)`` for real factors ``factor`` (scalar or
    array): ``multiplier / 2**shift`` nearest to ``factor`` with the most multiplier bits.

    Normally ``2**30 <= multiplier <= 2**31 - 1`` (31 significant bits, relative error at most
    ``2**-31``); factors below ``2**-33`` use the largest shift, 63, with a smaller multiplier
    (absolute error at most ``2**-64``). ``shift`` 0 takes factors up to ``2**31 - 1``.
    Raises ``ValueError`` for a factor that is not positive and finite or too large.
    """
    f = np.asarray(factor, np.float64)
    if np.any(~(f > 0)) or not np.all(np.isfinite(f)):
        raise ValueError(f"requantization factors must be positive and finite, got "
                         f"{f[~(np.isfinite(f) & (f > 0))].ravel()[:1]}")
    mults, shifts = [], []
    for value in f.ravel():
        mant, exp = np.frexp(value)  # value = mant * 2**exp, 0.5 <= mant < 1
        shift = 31 - int(exp)
        if shift > MAX_SHIFT:
            shift = MAX_SHIFT
        if shift < 0:
            raise ValueError(f"requantization factor {value} exceeds the largest multiplier "
                             f"{MAX_MULTIPLIER} with shift 0")
        mult = int(np.rint(np.ldexp(value, shift)))
        if mult > MAX_MULTIPLIER:  # mant rounded up to 1.0: one bit less, same value
            if shift == 0:
                raise ValueError(f"requantization factor {value} exceeds the largest "
                                 f"multiplier {MAX_MULTIPLIER} with shift 0")
            shift -= 1
            mult = int(np.rint(np.ldexp(value, shift)))
        mults.append(mult)
        shifts.append(shift)
    shape = f.shape
    return (np.array(mults, np.int64).reshape(shape), np.array(shifts, np.int64).reshape(shape))


def bias_int32(bias, in_scale, w_scales):
    """The accumulator seeds ``round_half_even(b[k] / (in_scale * w_scales[k]))`` (int64
    array of int32 values); ``ValueError`` if one does not fit int32."""
    b = np.asarray(bias, np.float64)
    q = np.rint(b / (in_scale * np.asarray(w_scales, np.float64)))
    bad = (q < INT32_MIN) | (q > INT32_MAX) | ~np.isfinite(q)
    if np.any(bad):
        k = int(np.flatnonzero(bad)[0])
        raise ValueError(f"the bias of channel {k} ({b.ravel()[k]}) does not fit int32 at "
                         f"scale {in_scale * np.ravel(w_scales)[k]}")
    return q.astype(np.int64)


def _activation(activation, out_scale):
    """``(act name, lo, hi)`` of the int8 post-processor for ``activation``."""
    if activation is None or activation == "none":
        return "none", -128, 127
    if activation == "relu":
        return "relu", -128, 127
    if activation == "relu6":
        activation = ("clip", 0.0, 6.0)
    if isinstance(activation, tuple) and len(activation) == 3 and activation[0] == "clip":
        lo, hi = float(activation[1]), float(activation[2])
        if not lo <= hi:
            raise ValueError(f"clip bounds must satisfy lo <= hi, got {lo}, {hi}")
        lo8 = int(np.clip(np.rint(lo / out_scale), -128, 127))
        hi8 = int(np.clip(np.rint(hi / out_scale), -128, 127))
        return "clamp", lo8, hi8
    raise ValueError(f"activation must be None, 'relu', 'relu6' or ('clip', lo, hi), not "
                     f"{activation!r}")


@dataclass(frozen=True)
class QuantizedConv:
    """An int8 convolution (or fully connected layer as a 1x1 convolution) for the NPU.

    ``weights`` int8 ``[K, C/groups, KH, KW]``; ``bias``, ``scale`` (the multiplier), ``shift``
    per channel (int64 arrays of the register values); ``act`` (``none``, ``relu``, ``clamp``)
    with int8 bounds ``lo``, ``hi``; the real scales it was made with and the exact
    requantization factors ``factor`` that ``scale / 2**shift`` approximates.
    """
    weights: np.ndarray
    bias: np.ndarray
    scale: np.ndarray
    shift: np.ndarray
    act: str
    lo: int
    hi: int
    in_scale: float
    out_scale: float
    w_scales: np.ndarray
    factor: np.ndarray
    zero_point: int = 0

    def kernel_args(self):
        """Keyword arguments of ``ProgramBuilder.kernels(self.weights, **...)``."""
        return {"bias": self.bias, "scale": self.scale, "shift": self.shift, "fmt": "int8"}

    def conv_args(self):
        """Post-processor keyword arguments of ``ProgramBuilder.conv``."""
        return {"act": self.act, "zero_point": self.zero_point, "lo": self.lo, "hi": self.hi,
                "out_fp16": False}

    def postproc_config(self):
        """The golden model's :class:`npu_model.postproc.PostprocConfig` of this layer."""
        return PostprocConfig(out_fp16=False, act=Act[self.act.upper()],
                              zero_point=self.zero_point, lo=self.lo & 0xFF, hi=self.hi & 0xFF)


def quantize_conv(weights, bias, in_scale, out_scale, activation=None):
    """Quantize a float convolution layer.

    ``weights`` ``[K, C/groups, KH, KW]`` (a fully connected ``[K, C]`` becomes ``[K, C, 1,
    1]``), ``bias`` ``[K]`` or None, the per-tensor ``in_scale`` of its input and
    ``out_scale`` of its output (:func:`activation_scale`), ``activation`` None, ``"relu"``,
    ``"relu6"`` or ``("clip", lo, hi)`` (fused into the post-processor).
    """
    w = np.asarray(weights, np.float64)
    if w.ndim == 2:
        w = w[:, :, None, None]
    if w.ndim != 4:
        raise ValueError(f"weights must be [K, C, KH, KW] or [K, C], got shape {w.shape}")
    for name, value in (("in_scale", in_scale), ("out_scale", out_scale)):
        if not (np.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be positive and finite, not {value}")
    k = w.shape[0]
    b = np.zeros(k) if bias is None else np.asarray(bias, np.float64).reshape(-1)
    if b.shape != (k,):
        raise ValueError(f"bias has {b.size} values, the layer has {k} output channels")
    act, lo, hi = _activation(activation, out_scale)
    q, w_scales = quantize_weights(w)
    factor = in_scale * w_scales / out_scale
    mult, shift = requantize_params(factor)
    return QuantizedConv(q, bias_int32(b, in_scale, w_scales), mult, shift, act, lo, hi,
                         float(in_scale), float(out_scale), w_scales, factor)


def golden_conv(qconv, x, stride=1, pad=0, dilation=1, groups=1):
    """Run ``qconv`` on int8 inputs with the golden model: ``x`` ``[C, H, W]`` or a batch
    ``[N, C, H, W]``; returns int8 outputs of the same rank.

    The accumulators come from :func:`npu_model.conv.conv_accumulate` and every channel goes
    through :func:`npu_model.postproc.postprocess` (int8 path). A batch runs as one tall image:
    each item zero-padded by ``pad`` and stacked along H at a multiple of ``stride``, so every
    output window sees exactly the rows (and padding zeros) it sees alone; the accumulation
    order per output is the engine's.
    """
    x = np.asarray(x)
    single = x.ndim == 3
    if single:
        x = x[None]
    if x.ndim != 4 or x.dtype != np.int8:
        raise ValueError(f"inputs must be int8 [C, H, W] or [N, C, H, W], got {x.dtype} "
                         f"{x.shape}")
    n, c, h, w = x.shape
    kh, kw = qconv.weights.shape[2:]
    probe = ConvLayer(c, h, w, qconv.weights.shape[0], kh, kw, stride, pad, dilation, groups)
    oh, ow = probe.out_height, probe.out_width
    block = -(-(h + 2 * pad) // stride) * stride
    tall = np.zeros((c, n * block, w + 2 * pad), np.int8)
    for i in range(n):
        tall[:, i * block + pad:i * block + pad + h, pad:pad + w] = x[i]
    layer = ConvLayer(c, n * block, w + 2 * pad, qconv.weights.shape[0], kh, kw, stride, 0,
                      dilation, groups)
    acc = conv_accumulate(layer, tall, qconv.weights, qconv.bias)
    rows = (np.arange(n)[:, None] * (block // stride) + np.arange(oh)[None, :]).ravel()
    acc = acc[:, rows, :ow]  # [K, N * OH, OW]
    cfg = qconv.postproc_config()
    out = np.empty(acc.shape, np.int8)
    for k in range(acc.shape[0]):
        vals, _ = postprocess(acc[k].ravel(), FMT["int8"], int(qconv.scale[k]) & 0xFFFFFFFF,
                              int(qconv.shift[k]), cfg)
        out[k] = (np.asarray(vals) & 0xFF).astype(np.uint8).view(np.int8).reshape(acc[k].shape)
    out = out.reshape(-1, n, oh, ow).transpose(1, 0, 2, 3)
    return out[0] if single else out
