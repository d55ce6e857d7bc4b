"""Golden model of the neural engine's convolution, bit for bit (``docs/neural_engine.md``).

A layer is a 2-D convolution (``groups``, stride, dilation, zero padding) of an input
``[C, IH, IW]`` with weights ``[K, C / groups, KH, KW]`` and one bias per output channel; a
fully connected layer is a 1x1 convolution (see :func:`fc_as_conv`). The accumulators are what
the MAC array holds at the end of a work unit, before the post-processor.

The contract with the RTL:

* Every output starts from its channel's bias (int32, or binary32 bits).
* The products are added in scan order: input channel of the kernel, kernel row, kernel column
  (``ic``, ``ky``, ``kx``), each with one rounding (binary32 add, round to nearest even) or
  int32 wrap-around.
* A zero coefficient (int8 0, binary16 +0 or -0) is skipped: it adds nothing, not even a signed
  zero or the NaN of ``inf * 0``.
* A channel whose kernel is all zero yields its bias (a NaN bias becomes the canonical NaN).
* Input positions outside the image (padding) hold zero (int8 0, binary16 +0) and are
  multiplied like any other value.
"""

from dataclasses import dataclass

import numpy as np

from npu_spec.formats import F32_NEG_INF
from npu_spec.neural import result_order, work_unit

from . import fp
from .kernel_codec import beats as kernel_beats
from .mac import FMT
from .postproc import lfsr_init, postprocess

__all__ = ["ConvLayer", "conv_accumulate", "engine_output", "fc_as_conv", "layer_macs"]

_F32_MINUS_INF = np.uint32(F32_NEG_INF)


@dataclass(frozen=True)
class ConvLayer:
    """Shape of a convolution layer. ``fmt`` is a MAC format name of
    :data:`npu_model.mac.FMT`: ``int8``, ``fp16``, ``f16i8`` (binary16 data, int8 weights) or
    ``i8f16`` (int8 data, binary16 weights)."""
    channels: int
    height: int
    width: int
    out_channels: int
    kh: int
    kw: int
    stride: int = 1
    pad: int = 0
    dilation: int = 1
    groups: int = 1
    fmt: str = "int8"

    def __post_init__(self):
        for name in ("channels", "height", "width", "out_channels", "kh", "kw", "stride",
                     "dilation", "groups"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.pad < 0:
            raise ValueError(f"pad must not be negative, not {self.pad}")
        if self.channels % self.groups or self.out_channels % self.groups:
            raise ValueError(f"groups={self.groups} must divide channels={self.channels} and "
                             f"out_channels={self.out_channels}")
        if self.fmt not in FMT:
            raise ValueError(f"unknown format {self.fmt!r}; choose from {', '.join(FMT)}")
        if self.out_height < 1 or self.out_width < 1:
            raise ValueError(f"the {self.kh}x{self.kw} kernel (dilation {self.dilation}) does "
                             f"not fit the padded {self.height}x{self.width} input")

    @property
    def icpg(self):
        """Input channels per group (the kernel's input channels)."""
        return self.channels // self.groups

    @property
    def ocpg(self):
        """Output channels per group."""
        return self.out_channels // self.groups

    @property
    def out_height(self):
        return (self.height + 2 * self.pad - self.dilation * (self.kh - 1) - 1) // self.stride + 1

    @property
    def out_width(self):
        return (self.width + 2 * self.pad - self.dilation * (self.kw - 1) - 1) // self.stride + 1

    @property
    def data_fp16(self):
        return self.fmt in ("fp16", "f16i8")

    @property
    def coef_fp16(self):
        return self.fmt in ("fp16", "i8f16")

    @property
    def weight_shape(self):
        return (self.out_channels, self.icpg, self.kh, self.kw)

    @property
    def output_shape(self):
        return (self.out_channels, self.out_height, self.out_width)


def layer_macs(layer):
    """Multiply-adds of the layer counted densely (every weight, every output)."""
    return (layer.out_channels * layer.out_height * layer.out_width *
            layer.icpg * layer.kh * layer.kw)


def _is_zero(codes, is_fp16):
    codes = np.asarray(codes).astype(np.uint16)
    if is_fp16:
        return (codes & 0x7FFF) == 0
    return (codes & 0xFF) == 0


def _to_operand(codes, is_fp16, float_path):
    """Binary32 bits on the float path (binary16 or int8 operands, both exact), else int32."""
    codes = np.asarray(codes).astype(np.uint16)
    if is_fp16:
        return fp.f16_to_f32(codes)
    ints = (codes & 0xFF).astype(np.uint8).view(np.int8)
    return fp.int8_to_f32(ints) if float_path else ints.astype(np.int32)


def conv_accumulate(layer, inputs, weights, bias):
    """Accumulator values of every output: ``[K, OH, OW]`` uint32 (int32 or binary32 bits).

    ``inputs`` is ``[C, IH, IW]`` of int8 values or binary16 codes, ``weights`` is
    ``layer.weight_shape`` of int8 values or binary16 codes, ``bias`` is ``[K]`` of int32
    values or binary32 bits.
    """
    inputs = np.asarray(inputs)
    weights = np.asarray(weights)
    if inputs.shape != (layer.channels, layer.height, layer.width):
        raise ValueError(f"inputs have shape {inputs.shape}, the layer needs "
                         f"{(layer.channels, layer.height, layer.width)}")
    if weights.shape != layer.weight_shape:
        raise ValueError(f"weights have shape {weights.shape}, the layer needs "
                         f"{layer.weight_shape}")
    bias = (np.asarray(bias).astype(np.int64) & 0xFFFF_FFFF).astype(np.uint32)
    if bias.shape != (layer.out_channels,):
        raise ValueError(f"bias has shape {bias.shape}, the layer needs ({layer.out_channels},)")
    is_int = layer.fmt == "int8"
    s, d, p = layer.stride, layer.dilation, layer.pad
    oh, ow = layer.out_height, layer.out_width

    # Zero-padded input as operands.
    padded = np.zeros((layer.channels, layer.height + 2 * p + s * oh + d * layer.kh,
                       layer.width + 2 * p + s * ow + d * layer.kw), np.uint16)
    padded[:, p:p + layer.height, p:p + layer.width] = inputs.astype(np.uint16)
    data = _to_operand(padded, layer.data_fp16, not is_int)
    coef_zero = _is_zero(weights, layer.coef_fp16)
    coef = _to_operand(weights, layer.coef_fp16, not is_int)
    if not is_int:
        data, coef = fp.mac_operand(data), fp.mac_operand(coef)

    # Every output channel at once: step through the scan order (ic, ky, kx) and update the
    # channels whose coefficient at that step is nonzero; the others keep their value, which
    # is the skip of a zero coefficient.
    k_all = layer.out_channels
    first = (np.arange(k_all) // layer.ocpg) * layer.icpg     # first input channel per output
    if is_int:
        acc = np.broadcast_to(bias.view(np.int32).astype(np.int64)[:, None, None],
                              layer.output_shape).copy()
    else:
        acc = np.broadcast_to(bias[:, None, None], layer.output_shape).copy()
    for ic in range(layer.icpg):
        for ky in range(layer.kh):
            for kx in range(layer.kw):
                ks = np.flatnonzero(~coef_zero[:, ic, ky, kx])
                if not ks.size:
                    continue
                y0, x0 = ky * d, kx * d
                rows = slice(y0, y0 + s * oh, s)
                cols = slice(x0, x0 + s * ow, s)
                chans = slice(ic, ic + 1) if layer.groups == 1 else first[ks] + ic
                if ks.size == k_all:
                    ks = slice(None)        # a view instead of a copy
                if is_int:
                    # int32 wrap-around is addition modulo 2**32: wrapping once at the end
                    # gives the same bits as wrapping after every step.
                    w = coef[ks, ic, ky, kx][:, None, None]
                    acc[ks] += data[chans, rows, cols].astype(np.int64) * w.astype(np.int64)
                else:
                    # f32_add(acc, f32_mul(window, w)) with the exact product
                    window = tuple(f[chans, rows, cols] for f in data)
                    w = tuple(f[ks, ic, ky, kx][:, None, None] for f in coef)
                    acc[ks] = fp.f32_add_product(acc[ks], window, w)
    if is_int:
        return fp.int32_wrap(acc).view(np.uint32)
    dead = coef_zero.reshape(k_all, -1).all(axis=1)
    if dead.any():
        acc[dead] = fp.f32_max(acc[dead], _F32_MINUS_INF)   # a NaN bias becomes canonical
    return acc


def fc_as_conv(in_features, out_features, batch, fmt, mapping="batch"):
    """The :class:`ConvLayer` a fully connected layer maps to.

    ``mapping="batch"``: the batch is the spatial axis (``[in, 1, batch]`` input, the weight
    matrix is the kernel: ``out_features`` 1x1 kernels). ``mapping="weights"``: the weight
    matrix is the data (``[in, 1, out]``: input channel ``c``, position ``o`` holds
    ``W[o, c]``) and each batch row is a 1x1 kernel, so the output is ``[batch, 1, out]``.
    """
    if mapping == "batch":
        return ConvLayer(in_features, 1, batch, out_features, 1, 1, fmt=fmt)
    if mapping == "weights":
        swapped = {"f16i8": "i8f16", "i8f16": "f16i8"}.get(fmt, fmt)
        return ConvLayer(in_features, 1, out_features, batch, 1, 1, fmt=swapped)
    raise ValueError(f"unknown mapping {mapping!r}; choose batch or weights")


def engine_output(layer, config, fields, inputs, weights, bias, scale, shift, post, groups):
    """The outputs of a neural engine core of ``config``: ``(out, acc)``.

    ``fields`` are the layer-register fields (:func:`npu_spec.neural.make_layer`; the
    work-unit shape ``log2w`` is read from them), ``weights`` the effective weights the kernel
    blobs encode, ``scale`` / ``shift`` the per-channel rescale, ``post`` the
    :class:`npu_model.postproc.PostprocConfig` and ``groups`` the
    :class:`npu_model.kernel_codec.EncodedGroup` of each output-channel group. The result beats
    are post-processed in the core's order (:func:`npu_spec.neural.result_order`), which sets
    the stochastic-rounding stream. ``out`` is ``[K, OH, OW]`` uint16 (binary16 codes or
    sign-extended int8), ``acc`` the accumulators before post-processing.
    """
    acc = conv_accumulate(layer, inputs, weights, bias)
    macs = config.macs
    w, h = work_unit(macs, fields["log2w"])
    oh, ow = layer.out_height, layer.out_width
    out = np.zeros(layer.output_shape, np.uint16)
    lane_y = np.arange(macs) // w
    lane_x = np.arange(macs) % w
    fmt = FMT[layer.fmt]
    slot_orders = [[b.slot for b in kernel_beats(g.header, g.body, g.config) if b.last]
                   for g in groups]
    state = lfsr_init(post.seed, macs)
    for k, ty, tx in result_order(fields, config, slot_orders):
        ys, xs = ty * h + lane_y, tx * w + lane_x
        inside = (ys < oh) & (xs < ow)
        vals = np.zeros(macs, np.uint32)
        vals[inside] = acc[k, ys[inside], xs[inside]]
        res, state = postprocess(vals, fmt, int(scale[k]), int(shift[k]), post, state,
                                 config.formats)
        out[k, ys[inside], xs[inside]] = np.asarray(res)[inside]
    return out, acc
