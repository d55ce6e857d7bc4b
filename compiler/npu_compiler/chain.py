"""Layer chains through the buffer, with NE/PE overlap where the hardware allows (seed 001).

A *chain* is a run of consecutive graph nodes, each a ``Conv`` or a planar ``MaxPool``,
``AveragePool``, ``Relu`` or ``Add`` of an equal-shaped tensor, in which every node's output
is read by the next node alone and is no graph output. When the whole layers fit the buffer
together as the chain goes (the engine's own padding, no input-channel partial sums), the
chain's first input (and each ``Add``'s other operand) is loaded, every intermediate tensor
stays in a buffer dataset that the next layer reads, and only the last layer's output is
stored. Where a conv is followed by a planar layer, the conv writes a flow-controlled ring of
``M`` slots of one output-channel group each (``docs/system.md``, "Flow control") and the
planar task right after it reads the ring as operand ``A`` while the conv runs.

The data processor has one flow-control unit, between neural engine core 0 and the planar
engine's operand ``A``: so only a conv -> planar link overlaps, one ring is open at a time
(the next ring's producer waits for the previous consumer, which the builder's dependencies
give), and a ring's conv runs on core 0 alone. A planar -> conv, conv -> conv or planar ->
planar link is a plain buffer dataset: no overlap, but no round trip through system memory.
When the configuration has more cores and a conv's output channels would be split over them
(:mod:`npu_compiler.cores`), its link to the planar layer after it is a plain dataset too.

How long a chain gets is decided by replaying its buffer allocations (first fit, the
builder's own allocator, on a copy) before any task is emitted: the chain stops before the
first layer whose datasets do not fit beside those still live, or which the engines cannot
run whole.

The results are those of the layers lowered one after the other, bit for bit: the same tasks
compute the same values; only where they live in between changes.
"""

import copy
from types import SimpleNamespace

import numpy as np

from npu_model.builder import BuildError
from npu_spec import planar as planar_spec

from .cores import core_blobs

__all__ = ["CHAIN_OPS", "candidate", "emit", "plan"]

#: The planar operators a chain may hold beside convolutions.
CHAIN_OPS = ("MaxPool", "AveragePool", "Relu", "Add")


def _other(g, node, y):
    """The operand of ``Add`` ``node`` besides ``y``, if it can be loaded as a whole tensor
    of ``y``'s shape; else None."""
    others = [t for t in node.inputs if t != y]
    if (len(node.inputs) != 2 or len(others) != 1 or others[0] in g.consts
            or tuple(g.shapes[others[0]]) != tuple(g.shapes[y])):
        return None
    return others[0]


def candidate(lw, index, skip=()):
    """The node indices of the longest run of chainable nodes of ``lw``'s graph from
    ``index`` (none in ``skip``, e.g. those of a depth-first segment), each node's output
    read by the next alone and no graph output; ``[]`` if shorter than two. Whether the run
    fits, and how much of it, is :func:`plan`'s question."""
    g = lw.g

    def ok(i):
        return i < len(g.nodes) and i not in skip and g.nodes[i].op in ("Conv",) + CHAIN_OPS

    if not ok(index):
        return []
    run = [index]
    while ok(run[-1] + 1):
        node, nxt = g.nodes[run[-1]], g.nodes[run[-1] + 1]
        y = node.outputs[0]
        if y in g.outputs or g.consumers(y) != [nxt]:
            break
        if nxt.op == "Add" and _other(g, nxt, y) is None:
            break
        run.append(run[-1] + 1)
    return run if len(run) > 1 else []


def _conv_part(lw, node):
    """The conv's geometry when it can run whole in a chain: one task, the engine's own
    padding, no partial sums; else None."""
    from .ops import _conv_geometry
    g = lw.g
    w = g.const(node.inputs[1])
    x_shape = g.shapes[node.inputs[0]]
    if w is None or len(x_shape) != 4 or x_shape[0] != 1 or node.attr("group", 1) != 1:
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
    cp = {"w": lw.pruned(np.asarray(w, np.float32).reshape((k, c, kh, kw))), "bias": bias,
          "x": (c, h, wd), "y": (k, oh, ow), "stride": sy, "pad": pad, "dil": dil[0]}
    with lw.model_weights():
        blob = lw.kernels(cp["w"], cp["bias"], 1.0, 1)
    shape = SimpleNamespace
    if lw._layer_error(shape(shape=cp["x"]), blob, shape(shape=cp["y"]), sy, pad, dil[0], 1):
        return None
    cp["parts"] = core_blobs(blob, lw.cores)
    if max(part.words for part in cp["parts"]) > lw.kmem_words:
        return None
    return cp


def _planar_part(lw, node, y, yshape):
    """The planar task (``fields``, ``x`` its input shape, ``out`` its output shape, ``b``
    the other operand of an ``Add``) reading tensor ``y`` of shape ``yshape`` whole; else
    None."""
    from .ops import _pool_attrs
    g = lw.g
    k, oh, ow = yshape
    if node.op == "Relu":
        return {"fields": {"mode": "eltwise", "op": "relu"}, "x": yshape, "out": yshape,
                "b": None}
    if node.op == "Add":
        return {"fields": {"mode": "eltwise", "op": "add"}, "x": yshape, "out": yshape,
                "b": _other(g, node, y)}
    if len([o for o in node.outputs if o]) > 1 or len(node.attr("kernel_shape", ())) != 2:
        return None
    (ph, pw), (sy, sx), _, pads, _ = _pool_attrs(node, g.shapes[y])
    out_shape = g.shapes[node.outputs[0]]
    if len(out_shape) != 4:
        return None
    poh, pow_ = out_shape[2], out_shape[3]
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
    return {"fields": fields, "x": yshape, "out": shape, "b": None}


def _shape3(g, name):
    shape = tuple(int(n) for n in g.shapes[name])
    return shape[1:] if len(shape) == 4 and shape[0] == 1 else None


class _Dry:
    """The buffer's first-fit allocator, copied: :func:`plan` replays a chain's datasets
    on it."""

    def __init__(self, lw):
        self.regions = copy.deepcopy(lw.b._buf)
        self.planes = lw.cfg.acc_slots

    def buffer(self, shape):
        return SimpleNamespace(addr=self.regions.alloc(int(np.prod(shape))), shape=shape)

    def ring(self, shape, slots):
        c, h, w = shape
        return SimpleNamespace(addr=self.regions.alloc(min(c, slots * self.planes) * h * w),
                               shape=shape)

    def release(self, *datasets):
        for ds in datasets:
            self.regions.release(ds.addr)


class _Real:
    """The lowering's buffer, for :func:`emit`."""

    def __init__(self, lw):
        self.lw = lw

    def buffer(self, shape):
        return self.lw.buffer(shape)

    def ring(self, shape, slots):
        return self.lw.b.ring(shape, slots, "fp16")

    def release(self, *datasets):
        self.lw.release(*datasets)


def _allocate(buf, step, held):
    """A step's datasets, in one order for :func:`plan` and :func:`emit`: the planar
    result, the conv's output (a ring when ``slots``), the ``Add`` operand, the input
    (unless ``held``, the previous step's result). The result first: it takes the lowest
    free space, so what the step frees (its input, the ring) lies above it, where the next
    step's datasets go (results of consecutive steps alternate around the held one rather
    than climbing)."""
    ds = {"in": held}
    if step["pp"] is not None:
        ds["res"] = buf.buffer(step["pp"]["out"])
    if step["cp"] is not None:
        y = step["cp"]["y"]
        ds["y"] = buf.ring(y, step["slots"]) if step["slots"] else buf.buffer(y)
    if step["pp"] is not None and step["pp"]["b"] is not None:
        ds["b"] = buf.buffer(step["pp"]["out"])
    if held is None:
        ds["in"] = buf.buffer(step["cp"]["x"] if step["cp"] else step["pp"]["x"])
    return ds


def _steps(lw, nodes):
    """The chain's steps as far as the engines take them: a conv, a planar layer, or a
    conv with the planar layer after it (``slots`` 0 until :func:`plan` sizes its ring)."""
    g = lw.g
    steps, j, shape = [], 0, None
    while j < len(nodes):
        node = nodes[j]
        y = node.inputs[0] if j == 0 else nodes[j - 1].outputs[0]
        if node.op == "Conv":
            cp = _conv_part(lw, node)
            if cp is None or (shape is not None and cp["x"] != shape):
                break
            nxt = nodes[j + 1] if j + 1 < len(nodes) and nodes[j + 1].op != "Conv" else None
            pp = (_planar_part(lw, nxt, node.outputs[0], cp["y"])
                  if nxt is not None and len(cp["parts"]) == 1 else None)
            steps.append({"nodes": [node] + ([nxt] if pp else []), "cp": cp, "pp": pp,
                          "slots": 0})
            shape = pp["out"] if pp else cp["y"]
        else:
            x = shape if shape is not None else _shape3(g, y)
            pp = _planar_part(lw, node, y, x) if x is not None else None
            if pp is None:
                break
            steps.append({"nodes": [node], "cp": None, "pp": pp, "slots": 0})
            shape = pp["out"]
        j += len(steps[-1]["nodes"])
    return steps


def plan(lw, nodes):
    """How the run ``nodes`` (from :func:`candidate`) is chained: its steps as far as they
    fit the buffer beside what is live, each ring with the most slots that fit (up to the
    conv's output-channel groups); None when fewer than two layers would be chained."""
    steps = _steps(lw, nodes)
    buf = _Dry(lw)
    held, out = None, []
    for step in steps:
        if step["pp"] is not None and step["cp"] is not None:
            groups = -(-step["cp"]["y"][0] // lw.cfg.acc_slots)
            choices = range(groups, 0, -1)
        else:
            choices = (0,)
        for slots in choices:
            trial = copy.deepcopy(buf)
            try:
                ds = _allocate(trial, dict(step, slots=slots), held)
            except BuildError:          # the buffer is full
                continue
            buf = trial
            out.append(dict(step, slots=slots))
            buf.release(*[d for key, d in ds.items() if key not in ("res", "y")])
            if step["pp"] is not None and "y" in ds:
                buf.release(ds["y"])
            held = ds["res"] if step["pp"] is not None else ds["y"]
            break
        else:
            break
    if sum(len(s["nodes"]) for s in out) < 2:
        return None
    return out


def _how(step, node, prev, nxt, overlap_in, overlap_out):
    parts = []
    if prev is not None:
        parts.append(f"reads {prev.name}'s output from the buffer"
                     + (" while it runs" if overlap_in else ""))
    if nxt is not None:
        if overlap_out:
            slots = step["slots"]
            parts.append(f"output streams into {nxt.name} through a ring of {slots} "
                         f"slot{'s' if slots > 1 else ''}")
        else:
            parts.append(f"output kept in the buffer for {nxt.name}")
    return "chained: " + "; ".join(parts)


def emit(lw, steps):
    """Lower the chain planned by :func:`plan` (``steps``); one plan row a layer."""
    nodes = [n for s in steps for n in s["nodes"]]
    rows = {}
    for i, node in enumerate(nodes):
        step = next(s for s in steps if node in s["nodes"])
        ringed = step["slots"] > 0
        lw._begin(node, _how(step, node, nodes[i - 1] if i else None,
                             nodes[i + 1] if i + 1 < len(nodes) else None,
                             ringed and node is step["nodes"][-1] and i > 0
                             and nodes[i - 1] is step["nodes"][0],
                             ringed and node is step["nodes"][0]))
        lw._pause()
        rows[node.name] = (lw._row, lw._step)
    buf = _Real(lw)
    held = None
    for n, step in enumerate(steps):
        held = _emit_step(lw, buf, step, held, rows, first=n == 0)
    last = nodes[-1]
    lw._resume(*rows[last.name])
    lw.store3(held, lw._output_tensor(last.outputs[0]).reshape(held.shape))
    lw.release(held)
    lw._pause()
    for node in nodes:
        lw._resume(*rows[node.name])
        lw._end()


def _emit_step(lw, buf, step, held, rows, first):
    """The tasks of one step; returns the dataset holding its result."""
    ds = _allocate(buf, step, held)
    cp, pp = step["cp"], step["pp"]
    conv = step["nodes"][0] if cp else None
    planar = step["nodes"][-1] if pp else None
    if pp is not None and pp["b"] is not None:
        lw._resume(*rows[planar.name])
        lw.load3(lw.view(pp["b"]).reshape(pp["out"]), ds["b"])
        lw._pause()
    src = ds["in"]
    if first:
        node = step["nodes"][0]
        lw._resume(*rows[node.name])
        lw.load3(lw.view(node.inputs[0]).reshape(src.shape), src)
        lw._pause()
    result = ds.get("y")
    if cp is not None:
        lw._resume(*rows[conv.name])
        with lw.model_weights():
            lw.conv_task(src, cp["w"], cp["bias"], 1.0, 1, ds["y"], stride=cp["stride"],
                         pad=cp["pad"], dilation=cp["dil"],
                         act=dict(conv.fused) if conv.fused else None,
                         cores=1 if step["slots"] else None)
        lw._pause()
        lw.release(src)
        src = ds["y"]
    if pp is not None:
        lw._resume(*rows[planar.name])
        lw.planar(src, ds.get("b"), out=ds["res"], **pp["fields"])
        lw._pause()
        lw.release(src, *([ds["b"]] if "b" in ds else []))
        result = ds["res"]
    return result
