"""Programs for the system simulation: random chains of layers, and the named cases.

:func:`random_program` builds a program of ``n`` chained layers with the program builder
(:class:`npu_model.builder.ProgramBuilder`): convolutions (3x3, 1x1, strided, depthwise),
fully connected layers (a convolution over the whole plane), pooling (max, average),
elementwise additions of a skip connection, ReLU, and reductions; int8, fp16 or mixed
arithmetic; random shapes, data, kernel encodings and task-switch flags. A ``conv_flow``
layer is a convolution whose output is a flow-controlled ring of a random number of slots
that a ReLU or a max pooling reads while it runs (``docs/system.md``, "Flow control"). The
input is loaded by the DMA, the result stored by it, so the program's final system memory
holds the answer.
"""

import numpy as np

from npu_model.builder import ProgramBuilder
from npu_spec.descriptors import SWITCH_POINTS

__all__ = ["int_params", "random_program"]

#: Task-switch flags a random program sets (a single queue: they change no result).
_FLAGS = ("tse", "dpc", "tsr", "spl", "irq")


def int_params(rng, k, taps):
    """Random int8 post-processing parameters of ``k`` output channels summing ``taps``
    products: bias, scale and a shift that keeps the outputs in range."""
    bias = rng.integers(-(1 << 10), 1 << 10, k)
    scale = rng.integers(1 << 28, 1 << 30, k)
    shift = np.full(k, min(63, round(36.5 + 0.5 * np.log2(max(1, taps)))))
    return dict(bias=bias, scale=scale, shift=shift)


def _float_params(rng, k):
    bias = np.asarray(rng.standard_normal(k) * 0.1, np.float32).view(np.uint32)
    scale = np.asarray(rng.random(k) * 0.5 + 0.25, np.float32).view(np.uint32)
    return dict(bias=bias, scale=scale, shift=np.zeros(k, np.int64))


def _flags(rng):
    return {name: True for name in _FLAGS if rng.random() < 0.15}


def random_program(config, layers, seed, *, fmt=None, name=None):
    """A random program of ``layers`` chained layers for ``config``.

    ``fmt`` is ``"int8"``, ``"fp16"`` or ``"mixed"`` (default: a random format the
    configuration has). Returns the :class:`npu_spec.program.Program`; its metadata lists the
    layers.
    """
    rng = np.random.default_rng(seed)
    formats = [f for f in ("int8", "fp16", "mixed") if f in config.formats]
    fmt = fmt or formats[int(rng.integers(len(formats)))]
    if fmt not in config.formats:
        raise ValueError(f"configuration {config.name!r} has no {fmt} arithmetic")
    b = ProgramBuilder(config)
    c = int(rng.choice([4, 8]))
    h, w = (int(v) for v in rng.integers(5, 13, 2))
    data_fp16 = fmt == "fp16"
    if data_fp16:
        x = (rng.standard_normal((c, h, w)) * 0.5).astype(np.float16)
    else:
        x = rng.integers(-128, 128, (c, h, w)).astype(np.int8)
    cur = b.load(b.input("x", x), **_flags(rng))
    skip = cur
    names = []
    for _ in range(layers):
        c, h, w = cur.shape
        kinds = ["conv", "conv1x1", "relu", "conv_flow"]
        if h >= 2 and w >= 2:
            kinds += ["maxpool", "avgpool", "conv_s2"]
        if skip is not None and skip.shape == cur.shape and skip is not cur:
            kinds += ["add_skip", "add_skip"]
        if h * w > 1 and h <= 16 and w <= 16 and c * h <= 64:
            kinds.append("fc")
        if c <= 8 and h * w > 1:
            kinds.append("depthwise")
        kinds.append("reduce")
        kind = kinds[int(rng.integers(len(kinds)))]
        names.append(kind)
        flags = _flags(rng)
        if kind in ("conv", "conv1x1", "conv_s2", "fc", "depthwise", "conv_flow"):
            k = int(rng.choice([4, 8])) if kind != "depthwise" else c
            if kind == "conv_flow":
                k = int(rng.choice([4, 8, 16]))
            if kind == "fc":
                kh, kw, stride, pad = h, w, 1, 0
            elif kind == "conv1x1":
                kh = kw = 1
                stride, pad = 1, 0
            else:
                kh = kw = 3
                stride, pad = (2 if kind == "conv_s2" else 1), 1
            groups = c if kind == "depthwise" else 1
            icpg = c // groups
            coef_fp16 = fmt == "fp16" or (fmt == "mixed" and not data_fp16)
            mac_fmt = {(False, False): "int8", (True, True): "fp16",
                       (False, True): "i8f16", (True, False): "f16i8"}[(data_fp16, coef_fp16)]
            if coef_fp16:
                wts = (rng.standard_normal((k, icpg, kh, kw)) * 0.3).astype(np.float16)
                wts = wts.view(np.uint16)
            else:
                wts = rng.integers(-128, 128, (k, icpg, kh, kw)).astype(np.int8)
                if rng.random() < 0.3:
                    wts[rng.random(wts.shape) < 0.5] = 0
            params = (_float_params(rng, k) if (data_fp16 or coef_fp16)
                      else int_params(rng, k, icpg * kh * kw))
            sparse = bool(rng.random() < 0.3)
            placement = b.dma_kernels(0, b.kernels(wts, fmt=mac_fmt, groups=groups,
                                                   sparse=sparse, **params), **flags)
            act = "relu" if rng.random() < 0.4 else "none"
            slots = int(rng.integers(1, 4)) if kind == "conv_flow" else 0
            out = b.conv(cur, placement, stride=stride, pad=pad, act=act, slots=slots)
            data_fp16 = out.fmt == "fp16"
            if slots:
                # The consumer: the next planar task, reading the ring while the conv runs;
                # not a switch point (a barrier) when the ring is smaller than the tensor.
                cflags = _flags(rng)
                if out.stored_planes < out.shape[0]:
                    cflags = {k: v for k, v in cflags.items() if k not in SWITCH_POINTS}
                if min(out.shape[1:]) >= 2 and rng.random() < 0.5:
                    out = b.max_pool(out, 2, **cflags)
                else:
                    out = b.relu(out, **cflags)
        elif kind == "relu":
            out = b.relu(cur, **flags)
        elif kind == "maxpool":
            out = b.max_pool(cur, 2, **flags)
        elif kind == "avgpool":
            out = b.planar(cur, flags=flags, mode="pool", op="avg", kh=2, kw=2, sy=2, sx=2)
        elif kind == "add_skip":
            out = b.add(cur, skip, **flags)
        else:
            out = b.planar(cur, flags=flags, mode="reduce", op="sum", axis="plane",
                           scale=1.0 / (h * w))
        if kind != "add_skip" and rng.random() < 0.5:
            skip = cur
        cur = out
    b.store(cur, b.output("y", cur.shape, cur.fmt))
    program = b.build(name or f"random-{layers}-{seed}")
    return program
