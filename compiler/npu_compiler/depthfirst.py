"""Depth-first lowering of layer chains that do not fit the buffer (seed 003, partial
networks; ``docs/scheduling.md``, "In the compiler").

A *segment* is a connected group of row-local layers (``Conv``, ``MaxPool``,
``AveragePool``, ``Relu``, ``Add`` of two tensors, ``Concat`` of channels; four-dimensional,
batch 1) in which some layer does not fit the buffer whole. Its layers are cut into bands of
output rows (:func:`npu_compiler.schedule.row_band_graph`'s units, built here for layers with
several inputs), :func:`npu_compiler.schedule.schedule` orders the bands, and the lowering
emits each stretch of bands (:func:`npu_compiler.schedule.runs`) as soon as its input rows
exist. A tensor made and used only inside the segment lives in a *ring* of system memory
that holds the rows still to be read (:class:`npu_compiler.lower.MView` with ``ring``), not
the whole tensor; the buffer holds one band of one layer at a time.
"""

from dataclasses import dataclass

import numpy as np

from .schedule import RowLayer, Unit, UnitGraph, runs, schedule

__all__ = ["SCHEDULES", "Segment", "emit", "segments"]

#: Values of ``--schedule``: depth first (the default) or layer by layer.
SCHEDULES = ("depth-first", "layer")

#: A band task of a depth-first segment uses at most ``1 / BAND_SHARE`` of the buffer (rows,
#: then output channels, are cut to fit): a policy, not a need of the schedule; it keeps the
#: working set of a band small beside what the rest of the segment holds.
BAND_SHARE = 2

#: Band heights tried, largest first: fewer, larger bands mean fewer tasks; one row gives
#: the lowest peak of live rows.
BANDS = (64, 32, 16, 8, 4, 2, 1)


@dataclass
class Segment:
    """Layers lowered together: ``nodes`` (graph order), their :class:`RowLayer` s keyed by
    node index (``layers``), ``rings`` (tensor -> rows kept), the band ``order`` as runs
    ``(layer, first_row, end_row, units)``, the schedule's ``strategy`` and ``peak``
    (live elements of intermediate rows) and the ``band`` height."""
    nodes: list
    layers: dict
    rings: dict
    order: list
    strategy: str
    peak: int
    band: int
    #: Indices of nodes lowered with the segment that make no bands of their own (in a
    #: quantized model, the nodes a layer's ``QuantizeLinear`` emits, :mod:`npu_compiler.qdq`).
    aux: tuple = ()


def _shape4(g, name):
    shape = tuple(int(n) for n in g.shapes.get(name, ()))
    return shape if len(shape) == 4 and shape[0] == 1 else None


def conv_layer(g, key, node, x, w_shape, out):
    """The :class:`RowLayer` of convolution ``node`` reading tensor ``x`` with weights of
    shape ``w_shape``, its rows written to tensor ``out``, or None if it is not a shape this
    lowering takes."""
    from .ops import _conv_geometry
    xs, ys = _shape4(g, x), _shape4(g, out)
    if xs is None or ys is None or len(w_shape) != 4:
        return None
    k, strides, dil, pads, _ = _conv_geometry(node, xs, w_shape)
    layer = RowLayer(key, (x,), k[0], strides[0], (pads[0], pads[2]), dil[0],
                     row_size=ys[1] * ys[3])
    return layer if layer.out_height(xs[2]) == ys[2] else None


def _row_layer(g, key, node):
    """The :class:`RowLayer` of ``node`` (inputs: the non-constant input tensors), or None
    if it is not row-local or not a shape this lowering takes."""
    from .ops import _pool_attrs
    ins = [i for i in node.inputs if i and i not in g.consts]
    outs = [o for o in node.outputs if o]
    if len(outs) != 1 or not ins or any(_shape4(g, t) is None for t in ins + outs):
        return None
    x, y = _shape4(g, ins[0]), _shape4(g, outs[0])
    kernel, stride, pad = 1, 1, (0, 0)
    if node.op == "Conv":
        w = g.const(node.inputs[1]) if len(node.inputs) > 1 else None
        if len(ins) != 1 or w is None or np.ndim(w) != 4:
            return None
        return conv_layer(g, key, node, ins[0], w.shape, outs[0])
    elif node.op in ("MaxPool", "AveragePool"):
        if len(ins) != 1 or len(node.attr("kernel_shape", ())) != 2:
            return None
        (kh, _), (sy, _), _, pads, (h, _) = _pool_attrs(node, x)
        t, left, b, r = pads
        if (node.op == "AveragePool" and not node.attr("count_include_pad", 0)
                and any(pads)):
            return None         # the edge divisor needs the whole layer (native padding)
        kernel, stride, pad = kh, sy, (t, max(b, (y[2] - 1) * sy + kh - h - t))
    elif node.op == "Add":
        if len(ins) != 2 or _shape4(g, ins[1]) != x or x != y:
            return None
    elif node.op == "Concat":
        if (node.attr("axis") not in (1, -3) or len(ins) != len([i for i in node.inputs if i])
                or any(_shape4(g, i)[2:] != x[2:] for i in ins)):
            return None
    elif node.op != "Relu" or x != y:
        return None
    layer = RowLayer(key, tuple(ins), kernel, stride, pad, 1, row_size=y[1] * y[3])
    return layer if layer.out_height(x[2]) == y[2] else None


def _elements(g, names):
    return sum(int(np.prod(g.shapes[n])) for n in names)


def segments(lw, bands=BANDS, layer_of=None):
    """The segments of ``lw``'s graph worth a depth-first schedule: ``{node index:
    Segment}`` for every node of each. A segment's band height is the first of ``bands``
    whose schedule is depth first with its live intermediate rows within half the buffer
    (room for them beside one band's working datasets), else the one with the lowest
    peak. ``layer_of(g, i, node)``: ``(RowLayer, aux)`` of node ``i`` (``aux``: indices of
    the nodes lowered with it that make no bands, :attr:`Segment.aux`) or None; by default
    the row-local operators of the module docstring, without ``aux``."""
    g = lw.g
    layers, aux = {}, {}
    for i, node in enumerate(g.nodes):
        found = layer_of(g, i, node) if layer_of else (_row_layer(g, i, node), ())
        if found is not None and found[0] is not None:
            layers[i], aux[i] = found
    made = {g.nodes[i].outputs[0]: i for i in layers}
    parent = {i: i for i in layers}

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, layer in layers.items():
        for t in layer.inputs:
            if t in made:
                parent[root(i)] = root(made[t])
    groups = {}
    for i in layers:
        groups.setdefault(root(i), []).append(i)
    readers = {}
    for k, node in enumerate(g.nodes):
        for t in node.inputs:
            readers.setdefault(t, set()).add(k)
    out = {}
    for members in groups.values():
        extra = tuple(sorted({k for i in members for k in aux[i]} - set(members)))
        seg = _segment(lw, sorted(members), layers, readers, bands, extra)
        if seg is not None:
            out.update({i: seg for i in members + list(extra)})
    return out


def _read_inside(g, tensor, readers, inside, extra):
    """Whether only nodes of the segment read ``tensor``, also through the outputs of its
    ``extra`` nodes that read it (a quantized model's ``DequantizeLinear``)."""
    ks = readers.get(tensor)
    if not ks or not ks <= inside or tensor in g.outputs:
        return False
    return all(_read_inside(g, o, readers, inside, extra) for k in ks if k in extra
               for o in g.nodes[k].outputs if o)


def _segment(lw, members, layers, readers, bands, extra=()):
    g = lw.g
    inside = set(members) | set(extra)
    internal = [g.nodes[i].outputs[0] for i in members
                if _read_inside(g, g.nodes[i].outputs[0], readers, inside, set(extra))]
    too_big = any(_elements(g, list(layers[i].inputs) + g.nodes[i].outputs[:1]) > lw.buf_size
                  for i in members)
    if not internal or not too_big:
        return None
    # The segment runs where its last layer is: nothing outside may read its tensors first.
    last = members[-1]
    if any(k > last for k in extra):
        return None
    made = {o for i in inside for o in g.nodes[i].outputs if o}
    if any(k < last and k not in inside for t in made for k in readers.get(t, ())):
        return None
    best = None
    for band in bands:
        graph = _unit_graph(g, members, layers, band)
        plan = schedule(graph)
        if best is None or plan.peak < best[2].peak:
            best = (band, graph, plan)
        if plan.strategy == "depth-first" and plan.peak <= lw.buf_size // 2:
            best = (band, graph, plan)
            break
    band, graph, plan = best
    order = runs(graph, plan.order)
    rings = {t: _ring_rows(g, t, members, layers, order) for t in internal}
    return Segment([g.nodes[i] for i in members], {i: layers[i] for i in members},
                   rings, order, plan.strategy, plan.peak, band, tuple(extra))


def _unit_graph(g, members, layers, band):
    """Bands of ``band`` output rows of every layer; a band reads the bands of the tensors
    made inside the segment holding the rows it needs."""
    made = {g.nodes[i].outputs[0]: i for i in members}
    units = []
    for i in members:
        layer = layers[i]
        h_in = _shape4(g, layer.inputs[0])[2]
        h_out = layer.out_height(h_in)
        for b, r0 in enumerate(range(0, h_out, band)):
            r1 = min(h_out, r0 + band)
            rows = layer.rows_needed(r0, r1, h_in)
            inputs = sorted({(made[t], r // band) for t in layer.inputs if t in made
                             for r in rows})
            size = (r1 - r0) * layer.row_size
            units.append(Unit((i, b), i, tuple(inputs), size, (r0, r1)))
    return UnitGraph(units)


def _ring_rows(g, tensor, members, layers, order):
    """Rows of ``tensor`` to keep so that every band reads rows not yet overwritten: the
    most rows between the oldest still to be read and the newest written, checked by
    replaying ``order`` (all of them if the check fails)."""
    h = _shape4(g, tensor)[2]
    producer = next(i for i in members if g.nodes[i].outputs[0] == tensor)
    reads = []          # (step, first row read, last row read)
    for step, (key, r0, r1, _) in enumerate(order):
        layer = layers[key]
        if tensor in layer.inputs:
            rows = layer.rows_needed(r0, r1, h)
            if rows:
                reads.append((step, rows[0], rows[-1]))
    ring = 0
    for step, (key, r0, r1, _) in enumerate(order):
        if key == producer:
            later = [lo for s, lo, _ in reads if s > step]
            ring = max(ring, r1 - min([r0] + later))
    ring = min(h, max(ring, 1))
    slots = {}
    for key, r0, r1, _ in order:
        if key == producer:
            for r in range(r0, r1):
                slots[r % ring] = r
        elif tensor in layers[key].inputs:
            if any(slots.get(r % ring) != r for r in layers[key].rows_needed(r0, r1, h)):
                return h
    return ring


def emit(lw, seg):
    """Lower ``seg``: set up every layer (its band function deferred), then run the bands in
    the schedule's order, each charged to its layer's plan row."""
    from . import ops
    lw._rings = dict(seg.rings)
    fns, rows = {}, {}
    lw._defer = {}
    for key, node in zip(seg.layers, seg.nodes):
        lw._begin(node, f"{seg.strategy}, bands of {seg.band} rows")
        lw._defer[node.name] = fns.setdefault(key, []).append
        if node.op in ("Conv", "MaxPool", "AveragePool"):
            ops.LOWER[node.op](lw, node)
        else:
            fns[key].append(_rowwise(lw, node))
        lw._pause()
        rows[key] = (lw._row, lw._step)
    lw._defer = None
    for key, r0, r1, _ in seg.order:
        lw._resume(*rows[key])
        for fn in fns[key]:         # one per part of the channels
            fn(r0, r1)
        lw._pause()
    for key in seg.layers:
        lw._resume(*rows[key])
        lw._row["schedule_peak"] = seg.peak
        lw._end()
    lw._rings = {}


def _rowwise(lw, node):
    """The band function of ``Relu``, ``Add`` or ``Concat``: rows through the buffer in
    chunks that fit, the planar engine for ``Relu`` and ``Add``, DMA only for ``Concat``."""
    g = lw.g
    ins = [lw.view(i).reshape(_shape4(g, i)[1:]) for i in node.inputs if i]
    out = lw._output_tensor(node.outputs[0]).reshape(_shape4(g, node.outputs[0])[1:])
    op = {"Relu": "relu", "Add": "add"}.get(node.op)

    budget = lw.band_budget(node)

    def chunks(c, w, first, end, operands):
        per_row = operands * c * w
        if per_row <= budget:
            cstep, rstep = c, max(1, budget // per_row)
        else:
            cstep, rstep = max(1, budget // (operands * w)), 1
        for c0 in range(0, c, cstep):
            for r0 in range(first, end, rstep):
                yield c0, min(c, c0 + cstep), r0, min(end, r0 + rstep)

    def part(v, c0, c1, r0, r1):
        return v.slice(0, c0, c1).slice(1, r0, r1)

    def bands(first, end):
        if op is None:
            off = 0
            for x in ins:
                ci, _, w = x.shape
                for c0, c1, r0, r1 in chunks(ci, w, first, end, 1):
                    ds = lw.buffer((c1 - c0, r1 - r0, w))
                    lw.load3(part(x, c0, c1, r0, r1), ds)
                    lw.store3(ds, part(out, off + c0, off + c1, r0, r1))
                    lw.release(ds)
                off += ci
            return
        c, _, w = out.shape
        for c0, c1, r0, r1 in chunks(c, w, first, end, len(ins)):
            ds = [lw.buffer((c1 - c0, r1 - r0, w)) for _ in ins]
            for d, x in zip(ds, ins):
                lw.load3(part(x, c0, c1, r0, r1), d)
            lw.planar(*ds, out=ds[0], mode="eltwise", op=op)
            lw.store3(ds[0], part(out, c0, c1, r0, r1))
            lw.release(*ds)
    return bands
