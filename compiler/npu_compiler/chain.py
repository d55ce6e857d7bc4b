"""NE/PE overlap: a convolution streaming into the planar task that consumes it (seed 001).

A ``Conv`` whose output only the next node reads, a ``MaxPool``, ``AveragePool``, ``Relu``
or an ``Add`` of an equal-shaped tensor, runs as one pair of tasks when the whole layer
fits the buffer: the conv's input (and the ``Add``'s other operand) are loaded, the conv
writes its output into a flow-controlled ring of ``M`` slots of one output-channel group each
(``docs/system.md``, "Flow control"), the planar task right after it reads the ring as operand
``A`` while the conv runs, and only the planar result is stored. The conv's output never goes
to system memory and back, and the planar engine works while the neural engine does.

The flow-control unit sits between neural engine core 0 and the planar engine's operand
``A``, so the conv of a chain runs on core 0 alone. When the configuration has more cores
and the conv's output channels would be split over them (:mod:`npu_compiler.cores`), the
pair runs without a ring instead: the conv on every core into a buffer dataset, the planar
task after it from that dataset (no overlap, but no round trip through system memory either,
and the conv at the cores' rate).

The results are those of the two layers lowered one after the other, bit for bit: the same
tasks compute the same values; only where they live in between changes.
"""

import numpy as np

from npu_spec import planar as planar_spec

from .cores import core_blobs

__all__ = ["CHAIN_OPS", "chains", "emit", "plan"]

#: The planar operators a convolution may stream into.
CHAIN_OPS = ("MaxPool", "AveragePool", "Relu", "Add")


def chains(lw, skip=()):
    """``{conv node index: consumer node index}``: every ``Conv`` of ``lw``'s graph whose
    output is read by the next node alone, a :data:`CHAIN_OPS` node, and is no graph output
    (indices in ``skip``, e.g. those of a depth-first segment, are left out). Whether the pair
    fits is decided when it is emitted (:func:`emit`)."""
    g = lw.g
    out = {}
    for i, node in enumerate(g.nodes[:-1]):
        nxt = g.nodes[i + 1]
        if i in skip or i + 1 in skip or node.op != "Conv" or nxt.op not in CHAIN_OPS:
            continue
        y = node.outputs[0]
        if y in g.outputs or g.consumers(y) != [nxt]:
            continue
        if nxt.op == "Add":
            others = [t for t in nxt.inputs if t != y]
            if (len(nxt.inputs) != 2 or len(others) != 1
                    or tuple(g.shapes[others[0]]) != tuple(g.shapes[y])
                    or others[0] in g.consts):
                continue
        out[i] = i + 1
    return out


def _conv_part(lw, node):
    """The conv's geometry when it can be the producer of a chain: the whole layer at once,
    the engine's own padding, no partial sums; else None."""
    from .ops import _conv_geometry
    g = lw.g
    w = g.const(node.inputs[1])
    x_shape = g.shapes[node.inputs[0]]
    if w is None or x_shape[0] != 1 or node.attr("group", 1) != 1:
        return None
    (kh, kw), (sy, sx), dil, pads, spatial = _conv_geometry(node, x_shape, w.shape)
    c, k = w.shape[1], w.shape[0]
    if (kh > 16 or kw > 16 or dil[0] != dil[1] or dil[0] > 7 or sy != sx or sy > 7
            or len(set(pads)) != 1 or pads[0] > 15 or c > max(1, lw.buffer_rows // kh)):
        return None
    h, wd = spatial
    pad = pads[0]
    oh = (h + 2 * pad - dil[0] * (kh - 1) - 1) // sy + 1
    ow = (wd + 2 * pad - dil[0] * (kw - 1) - 1) // sy + 1
    bias = (np.asarray(g.const(node.inputs[2]), np.float32)
            if len(node.inputs) > 2 and node.inputs[2] else np.zeros(k, np.float32))
    return {"w": lw.pruned(np.asarray(w, np.float32).reshape((k, c, kh, kw))), "bias": bias,
            "x": (c, h, wd), "y": (k, oh, ow), "stride": sy, "pad": pad, "dil": dil[0]}


def _planar_part(lw, node, y, yshape):
    """The consumer's planar task (``fields``, the output shape, the other operand of an
    ``Add``) when it can read the whole conv output at once; else None."""
    from .ops import _pool_attrs
    g = lw.g
    k, oh, ow = yshape
    if node.op == "Relu":
        return {"fields": {"mode": "eltwise", "op": "relu"}, "out": yshape, "b": None}
    if node.op == "Add":
        other = next(t for t in node.inputs if t != y)
        return {"fields": {"mode": "eltwise", "op": "add"}, "out": yshape, "b": other}
    if len([o for o in node.outputs if o]) > 1:
        return None
    (ph, pw), (sy, sx), _, pads, _ = _pool_attrs(node, g.shapes[y])
    out_shape = g.shapes[node.outputs[0]]
    poh, pow_ = (out_shape[2], out_shape[3]) if len(out_shape) == 4 else (1, out_shape[2])
    t, left, b, r = pads
    b = max(b, (poh - 1) * sy + ph - oh - t)
    r = max(r, (pow_ - 1) * sx + pw - ow - left)
    is_max = node.op == "MaxPool"
    include = bool(node.attr("count_include_pad", 0))
    if (ph > planar_spec.MAX_WINDOW or pw > planar_spec.MAX_WINDOW or t != b or left != r
            or t >= ph or left >= pw or not (is_max or not include or t == left == 0)):
        return None
    fields = {"mode": "pool", "op": "max" if is_max else "avg", "kh": ph, "kw": pw, "sy": sy,
              "sx": sx, "py": t, "px": left}
    task = planar_spec.make_task(channels=k, height=oh, width=ow, in_fmt=1, out_fmt=1,
                                 **fields)
    if not planar_spec.pool_fits(task, lw.cfg):
        return None
    shape = (k, (oh + 2 * t - ph) // sy + 1, (ow + 2 * left - pw) // sx + 1)
    if shape != (k, poh, pow_):
        return None
    return {"fields": fields, "out": shape, "b": None}


def plan(lw, conv, consumer):
    """How the pair runs: ``(conv part, planar part, slots)``, ``slots`` 0 for a pair
    without a ring (the conv split over several cores); None when it does not fit."""
    cp = _conv_part(lw, conv)
    if cp is None:
        return None
    pp = _planar_part(lw, consumer, conv.outputs[0], cp["y"])
    if pp is None:
        return None
    k, oh, ow = cp["y"]
    c, h, w = cp["x"]
    fixed = c * h * w + int(np.prod(pp["out"])) + (k * oh * ow if pp["b"] else 0)
    planes = lw.cfg.acc_slots
    groups = -(-k // planes)
    with lw.model_weights():
        blob = lw.kernels(cp["w"], cp["bias"], 1.0, 1)
    parts = core_blobs(blob, lw.cores)
    if len(parts) > 1:
        fits = (fixed + k * oh * ow <= lw.buf_size
                and max(part.words for part in parts) <= lw.kmem_words)
        return (cp, pp, 0) if fits else None
    if blob.words > lw.kmem_words:
        return None
    for slots in range(groups, 0, -1):
        if fixed + min(k, slots * planes) * oh * ow <= lw.buf_size:
            return cp, pp, slots
    return None


def emit(lw, conv, consumer, how):
    """Lower ``conv`` and ``consumer`` as a chain planned by :func:`plan` (``how``); one plan
    row each."""
    cp, pp, slots = how
    ring = (f"streams into {consumer.name} through a ring of {slots} "
            f"slot{'s' if slots > 1 else ''}" if slots else
            f"kept in the buffer for {consumer.name}")
    lw._begin(consumer, f"chained: reads {conv.name}'s output from the buffer"
                        + (" while it runs" if slots else ""))
    operand = None
    if pp["b"] is not None:
        operand = lw.buffer(cp["y"])
        lw.load3(lw.view(pp["b"]).reshape(cp["y"]), operand)
    lw._pause()
    consumer_row = (lw._row, lw._step)
    lw._begin(conv, f"chained: output {ring}")
    src = lw.buffer(cp["x"])
    lw.load3(lw.view(conv.inputs[0]).reshape(cp["x"]), src)
    dst = lw.b.ring(cp["y"], slots, "fp16") if slots else lw.buffer(cp["y"])
    with lw.model_weights():
        lw.conv_task(src, cp["w"], cp["bias"], 1.0, 1, dst, stride=cp["stride"],
                     pad=cp["pad"], dilation=cp["dil"],
                     act=dict(conv.fused) if conv.fused else None,
                     cores=1 if slots else None)
    lw._pause()
    conv_row = (lw._row, lw._step)
    lw._resume(*consumer_row)
    res = lw.buffer(pp["out"])
    lw.planar(dst, operand, out=res, **pp["fields"])
    out = lw._output_tensor(consumer.outputs[0])
    lw.store3(res, out.reshape(pp["out"]))
    lw.release(src, dst, res, *([operand] if operand is not None else []))
    lw._pause()
    lw._resume(*conv_row)
    lw._end()
    lw._resume(*consumer_row)
    lw._end()
