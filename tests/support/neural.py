"""Shared builders for the neural engine's unit tests: random layers, their geometry, kernel
groups that fit them."""

import numpy as np

from npu_model import kernel_codec as kc
from npu_model.neural import output_groups, tiles
from npu_spec.mac import MacFormat
from npu_spec.neural import engine_geometry, halo_width, make_layer, work_unit, work_unit_shapes

FORMATS = {"int8": MacFormat.INT8, "fp16": MacFormat.FP16, "i8f16": MacFormat.I8F16,
           "f16i8": MacFormat.F16I8}


def random_layer(rng, config, *, fmt=None, max_side=9, max_channels=4, palette=None,
                 sparse=None):
    """The register fields of a random layer that runs on ``config`` (its halo fits, and its
    groups fit the input buffer)."""
    _, row_values, _ = engine_geometry(config)
    shapes = work_unit_shapes(config)
    while True:
        groups = int(rng.choice([1, 1, 2, 3, 5]))
        icpg = int(rng.integers(1, max_channels + 1))
        ocpg = int(rng.integers(1, max_channels + 3))
        kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        stride, dilation = int(rng.integers(1, 3)), int(rng.choice([1, 1, 2]))
        log2w = int(rng.choice(shapes))
        if halo_width(log2w, kw, stride, dilation) > row_values:
            continue
        name = fmt or str(rng.choice([f for f in FORMATS if _built(config, f)]))
        return make_layer(
            fmt=FORMATS[name], log2w=log2w, groups=groups, icpg=icpg, ocpg=ocpg,
            in_h=int(rng.integers(1, max_side + 1)), in_w=int(rng.integers(1, max_side + 1)),
            out_h=int(rng.integers(1, max_side + 1)), out_w=int(rng.integers(1, max_side + 1)),
            kh=kh, kw=kw, stride=stride, dilation=dilation, pad=int(rng.integers(0, 3)),
            sparse=int(rng.random() < 0.5) if sparse is None else sparse,
            palette=int(rng.choice([0, 0, 2, 4])) if palette is None else palette)


def _built(config, name):
    family = {"int8": "int8", "fp16": "fp16", "i8f16": "mixed", "f16i8": "mixed"}[name]
    return family in config.formats


def coef_fp16(fields):
    return MacFormat(fields["fmt"]) in (MacFormat.FP16, MacFormat.I8F16)


def data_fp16(fields):
    return MacFormat(fields["fmt"]) in (MacFormat.FP16, MacFormat.F16I8)


def random_groups(rng, fields, config, *, sparsity=0.5):
    """Encoded kernel groups (:func:`npu_model.kernel_codec.encode`) for every output-channel
    group of ``fields``, with random weights (some channels all zero) and parameters."""
    fp16 = coef_fp16(fields)
    encoded = []
    for group in output_groups(fields, config.acc_slots):
        shape = (group["ocg"], fields["icpg"], fields["kh"], fields["kw"])
        if fp16:
            w = rng.normal(0, 1, size=shape).astype(np.float16).view(np.uint16)
        else:
            w = rng.integers(-128, 128, size=shape).astype(np.int8)
        w[rng.random(shape) < sparsity] = 0
        w[rng.random(group["ocg"]) < 0.15] = 0
        ocg = group["ocg"]
        encoded.append(kc.encode(
            w, coef_fp16=fp16, sparse=bool(fields["sparse"]), palette_bits=fields["palette"],
            bias=rng.integers(0, 1 << 32, ocg), scale=rng.integers(0, 1 << 32, ocg),
            shift=rng.integers(0, 64, ocg)))
    return encoded


def geometry(fields, config):
    """The values ``npu.neural.layer.LayerSetup`` derives from ``fields``
    (``npu.neural.layouts.geometry_layout``), computed from the specification."""
    w, h = work_unit(config.macs, fields["log2w"])
    tiles_y, tiles_x = tiles(fields, config.macs)
    return {
        "unit_w": w, "unit_h": h, "log2h": h.bit_length() - 1,
        "out_channels": fields["groups"] * fields["ocpg"],
        "fp_data": int(data_fp16(fields)), "fp_coef": int(coef_fp16(fields)),
        "is_int": int(MacFormat(fields["fmt"]) == MacFormat.INT8),
        "tiles_y": tiles_y, "tiles_x": tiles_x,
        "halo_w": halo_width(fields["log2w"], fields["kw"], fields["stride"],
                             fields["dilation"]),
    }


def random_kernel_group(rng, *, coef_fp16, sparse, bits, ocg=None):
    """One encoded kernel group of a random small shape (``ocg`` channels, else 1-8), 40% zero
    weights, random parameters."""
    shape = (ocg or int(rng.integers(1, 9)), int(rng.integers(1, 4)), 2, 2)
    if coef_fp16:
        w = rng.normal(0, 1, size=shape).astype(np.float16).view(np.uint16)
    else:
        w = rng.integers(-128, 128, size=shape).astype(np.int8)
    w[rng.random(shape) < 0.4] = 0
    return kc.encode(w, coef_fp16=coef_fp16, sparse=sparse, palette_bits=bits,
                     bias=rng.integers(0, 1 << 32, shape[0]),
                     scale=rng.integers(0, 1 << 32, shape[0]),
                     shift=rng.integers(0, 64, shape[0]))
