"""Partial-network scheduling: order a network's computations so intermediates die young.

A network is cut into *compute units* (a row band of a layer's output, a tile, a single value),
each with the units it reads and the size it occupies while it is live. :class:`UnitGraph`
holds that DAG. The scheduler traces every output's dependencies back through the layers (its
*partial network*, :func:`partial_network`) and computes the outputs one after the other,
depth first (:func:`depth_first_order`): a unit is computed when the first output that needs it
is computed, so consecutive outputs that share intermediates run together and each
intermediate is freed right after its last consumer. :func:`live_profile` and :func:`peak`
measure the live intermediates of any order; :func:`compare` sets the depth-first order
against the layer-by-layer order (freeing at last use) and against keeping whole layers.
:func:`row_band_graph` builds the unit graph of a chain or DAG of convolution-like layers cut
into row bands. ``docs/scheduling.md`` describes the API and the measurements.

This module uses the standard library only.
"""

from dataclasses import dataclass
from typing import Hashable

__all__ = [
    "Comparison",
    "RowLayer",
    "Schedule",
    "Unit",
    "UnitGraph",
    "band_for_budget",
    "check_order",
    "compare",
    "depth_first_order",
    "layer_by_layer_order",
    "layer_windows",
    "live_profile",
    "partial_network",
    "peak",
    "row_band_graph",
    "runs",
    "schedule",
]

#: Freeing policies of :func:`live_profile`.
KEEP = ("unit", "layer")


@dataclass(frozen=True)
class Unit:
    """One compute unit.

    ``name`` is any hashable key unique in the graph; ``layer`` the layer it belongs to;
    ``inputs`` the names of the units it reads; ``size`` what it occupies while live (elements
    or bytes, the caller's choice); ``rows`` the output rows ``(first, end)`` of a row band
    (:func:`row_band_graph`), else None.
    """
    name: Hashable
    layer: Hashable
    inputs: tuple = ()
    size: int = 1
    rows: tuple | None = None

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if self.size < 0:
            raise ValueError(f"unit {self.name!r} has a negative size {self.size}")


class UnitGraph:
    """A DAG of :class:`Unit` s, in the order given (which is the order within a layer).

    Raises ``ValueError`` for a duplicate name, an input that is not a unit, a cycle, or layers
    that depend on each other both ways (no layer-by-layer order exists).

    Members
    -------
    units : dict
        Name -> :class:`Unit`, in the given order.
    consumers : dict
        Name -> tuple of the names of the units that read it, in graph order.
    layers : tuple
        The layers in a topological order (a layer after every layer it reads).
    sinks : tuple
        The units nobody reads (the network's outputs), in layer-by-layer order.
    """

    def __init__(self, units):
        self.units = {}
        for unit in units:
            if unit.name in self.units:
                raise ValueError(f"two units are named {unit.name!r}")
            self.units[unit.name] = unit
        consumers = {name: [] for name in self.units}
        for unit in self.units.values():
            for src in unit.inputs:
                if src not in self.units:
                    raise ValueError(f"unit {unit.name!r} reads {src!r}, which is not a unit")
                consumers[src].append(unit.name)
        self.consumers = {name: tuple(c) for name, c in consumers.items()}
        self._topological_check()
        self.layers = self._layer_order()
        self.sinks = tuple(n for n in layer_by_layer_order(self) if not self.consumers[n])

    def __len__(self):
        return len(self.units)

    def __iter__(self):
        return iter(self.units.values())

    def _topological_check(self):
        indegree = {name: len(set(u.inputs)) for name, u in self.units.items()}
        ready = [name for name, d in indegree.items() if d == 0]
        seen = 0
        while ready:
            name = ready.pop()
            seen += 1
            for c in set(self.consumers[name]):
                indegree[c] -= 1
                if indegree[c] == 0:
                    ready.append(c)
        if seen != len(self.units):
            stuck = next(name for name, d in indegree.items() if d > 0)
            raise ValueError(f"the unit graph has a cycle through {stuck!r}")

    def _layer_order(self):
        reads = {}
        for unit in self.units.values():
            deps = reads.setdefault(unit.layer, set())
            deps.update(self.units[s].layer for s in unit.inputs if
                        self.units[s].layer != unit.layer)
        order, placed = [], set()
        pending = list(reads)
        while pending:
            progress = [layer for layer in pending if reads[layer] <= placed]
            if not progress:
                raise ValueError(f"layers {pending!r} read each other: no layer-by-layer order")
            for layer in progress:
                order.append(layer)
                placed.add(layer)
            pending = [layer for layer in pending if layer not in placed]
        return tuple(order)

    def total_size(self, count_outputs=False):
        """The size of every unit (sinks only with ``count_outputs``)."""
        return sum(u.size for n, u in self.units.items() if count_outputs or self.consumers[n])


def partial_network(graph, name):
    """The partial network of unit ``name``: every unit it depends on, traced back through the
    layers, then ``name`` itself, in an order where each unit follows its inputs."""
    if name not in graph.units:
        raise ValueError(f"{name!r} is not a unit of the graph")
    return _depth_first(graph, [name])


def _depth_first(graph, targets, done=None, eager_sinks=False):
    """Post-order walk from ``targets``: each unit after its inputs (in their listed order),
    units in ``done`` skipped. With ``eager_sinks`` a sink (a unit nobody reads) is emitted as
    soon as its inputs are done, so it never prolongs their lives. Iterative, so long chains do
    not hit the recursion limit."""
    done = set() if done is None else done
    order = []

    def emit(name):
        done.add(name)
        order.append(name)
        if not eager_sinks:
            return
        for c in graph.consumers[name]:
            if (c not in done and not graph.consumers[c]
                    and all(s in done for s in graph.units[c].inputs)):
                done.add(c)
                order.append(c)

    for target in targets:
        if target in done:
            continue
        stack = [(target, iter(graph.units[target].inputs))]
        on_path = {target}
        while stack:
            name, pending = stack[-1]
            nxt = next((s for s in pending if s not in done and s not in on_path), None)
            if nxt is None:
                stack.pop()
                on_path.discard(name)
                if name not in done:
                    emit(name)
            else:
                on_path.add(nxt)
                stack.append((nxt, iter(graph.units[nxt].inputs)))
    return order


def depth_first_order(graph, outputs=None):
    """The partial-network order: for each output in turn (default: the sinks in
    layer-by-layer order, those of layers that others read last), the units of its partial
    network not computed yet, each after its inputs, then the output. Any sink is computed
    as soon as its inputs are (outputs are written out as they are made; a unit nobody reads,
    such as a row a strided layer skips, would otherwise hold its inputs until its turn)."""
    if outputs is None:
        # Sinks of layers that another layer reads (rows a strided layer skips) come last:
        # led by them, the walk would compute their inputs early and hold them.
        read = {graph.units[s].layer for u in graph for s in u.inputs}
        outputs = ([n for n in graph.sinks if graph.units[n].layer not in read] +
                   [n for n in graph.sinks if graph.units[n].layer in read])
    for name in outputs:
        if name not in graph.units:
            raise ValueError(f"output {name!r} is not a unit of the graph")
    done = set()
    order = _depth_first(graph, outputs, done, eager_sinks=True)
    # Units no listed output needs (possible with an explicit ``outputs``) come last.
    order += _depth_first(graph, list(graph.sinks), done, eager_sinks=True)
    return order


def layer_by_layer_order(graph):
    """Every unit of a layer before any unit of the next layer (layers in
    :attr:`UnitGraph.layers` order), graph order within a layer."""
    rank = {layer: i for i, layer in enumerate(graph.layers)}
    names = list(graph.units)
    index = {name: i for i, name in enumerate(names)}
    return sorted(names, key=lambda n: (rank[graph.units[n].layer], index[n]))


def check_order(graph, order):
    """Raise ``ValueError`` unless ``order`` lists every unit once, each after its inputs."""
    position = {}
    for i, name in enumerate(order):
        if name not in graph.units:
            raise ValueError(f"the order lists {name!r}, which is not a unit")
        if name in position:
            raise ValueError(f"the order lists {name!r} twice")
        position[name] = i
    missing = [n for n in graph.units if n not in position]
    if missing:
        raise ValueError(f"the order misses {len(missing)} units, first {missing[0]!r}")
    for name in order:
        for src in graph.units[name].inputs:
            if position[src] > position[name]:
                raise ValueError(f"{name!r} comes before its input {src!r}")


def live_profile(graph, order, keep="unit", count_outputs=False):
    """Live size while each unit of ``order`` is computed: the unit itself, its inputs and
    every other unit computed earlier and not yet freed.

    ``keep="unit"`` frees a unit right after its last consumer; ``keep="layer"`` keeps a
    layer's units until every unit of every layer that reads them is done (whole tensors, as
    a layer-at-a-time executor allocates them). Sinks (outputs, written out as they are made)
    count only with ``count_outputs``; then they are freed as soon as they are computed.
    """
    if keep not in KEEP:
        raise ValueError(f"keep must be one of {', '.join(KEEP)}, not {keep!r}")
    check_order(graph, order)
    position = {name: i for i, name in enumerate(order)}
    if keep == "layer":
        layer_end = {}
        for name, i in position.items():
            layer = graph.units[name].layer
            layer_end[layer] = max(layer_end.get(layer, -1), i)
    freed_after = {}
    for name in order:
        readers = graph.consumers[name]
        if not readers:
            free = position[name]
        elif keep == "unit":
            free = max(position[c] for c in readers)
        else:
            free = max(layer_end[graph.units[c].layer] for c in readers)
        freed_after.setdefault(free, []).append(name)
    live, profile = 0, []
    for i, name in enumerate(order):
        unit = graph.units[name]
        if count_outputs or graph.consumers[name]:
            live += unit.size
        profile.append(live)
        for gone in freed_after.get(i, ()):
            if count_outputs or graph.consumers[gone]:
                live -= graph.units[gone].size
    return profile


def peak(graph, order, keep="unit", count_outputs=False):
    """The largest value of :func:`live_profile` (0 for an empty graph)."""
    return max(live_profile(graph, order, keep, count_outputs), default=0)


@dataclass(frozen=True)
class Comparison:
    """Peaks of live intermediates of three ways to run one unit graph."""
    depth_first: int
    layer_by_layer: int
    whole_layers: int


def compare(graph, count_outputs=False):
    """The peaks of :func:`depth_first_order` (freeing at last use), of
    :func:`layer_by_layer_order` freeing at last use, and of the layer-by-layer order keeping
    whole layers (``keep="layer"``)."""
    lbl = layer_by_layer_order(graph)
    return Comparison(
        depth_first=peak(graph, depth_first_order(graph), "unit", count_outputs),
        layer_by_layer=peak(graph, lbl, "unit", count_outputs),
        whole_layers=peak(graph, lbl, "layer", count_outputs))


@dataclass(frozen=True)
class Schedule:
    """The order to run, its peak of live intermediates, and which strategy it came from
    (``"depth-first"`` or ``"layer-by-layer"``)."""
    order: tuple
    peak: int
    strategy: str


def schedule(graph, count_outputs=False):
    """The lowest-peak order among the depth-first order (:func:`depth_first_order`), the
    depth-first order led by the sinks in plain layer-by-layer order, and the layer-by-layer
    order; all free every unit after its last use, ties go to depth first.

    Depth first is not always lower: when a layer's halo covers most of its input, or on DAGs
    with outputs in many layers, finishing one output early can hold more than a layer at a
    time does (``docs/scheduling.md`` has figures). Taking the minimum keeps the result never
    above layer by layer."""
    candidates = [("depth-first", depth_first_order(graph)),
                  ("depth-first", depth_first_order(graph, graph.sinks)),
                  ("layer-by-layer", layer_by_layer_order(graph))]
    best = None
    for strategy, order in candidates:
        p = peak(graph, order, "unit", count_outputs)
        if best is None or p < best.peak:
            best = Schedule(tuple(order), p, strategy)
    return best


# --------------------------------------------------------------------------------------------
# convolution-like layers in row bands


@dataclass(frozen=True)
class RowLayer:
    """A layer that slides a window along the rows (H) of its inputs: convolution, pooling,
    or an elementwise layer (``kernel=1``).

    ``inputs`` names earlier layers (or the graph's input); all inputs have the same height and
    each is read through the same window (a concatenation or a sum of them). ``pad`` is the
    zero padding ``(top, bottom)`` (an int for both); ``row_size`` the size of one output row
    (width x channels x bytes, say); ``band`` the output rows per unit.
    """
    name: Hashable
    inputs: tuple = ("input",)
    kernel: int = 1
    stride: int = 1
    pad: tuple | int = 0
    dilation: int = 1
    row_size: int = 1
    band: int = 1

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        pad = (self.pad, self.pad) if isinstance(self.pad, int) else tuple(self.pad)
        object.__setattr__(self, "pad", pad)
        for field in ("kernel", "stride", "dilation", "band"):
            if getattr(self, field) < 1:
                raise ValueError(f"layer {self.name!r}: {field} must be at least 1, not "
                                 f"{getattr(self, field)}")
        if len(pad) != 2 or min(pad) < 0:
            raise ValueError(f"layer {self.name!r}: pad must be one or two non-negative "
                             f"integers, not {self.pad!r}")
        if not self.inputs:
            raise ValueError(f"layer {self.name!r} has no inputs")

    def out_height(self, height):
        span = self.dilation * (self.kernel - 1) + 1
        return (height + self.pad[0] + self.pad[1] - span) // self.stride + 1

    def rows_needed(self, first, end, height):
        """The input rows (sorted) that output rows ``first .. end - 1`` read, padding
        excluded."""
        rows = set()
        for o in range(first, end):
            base = o * self.stride - self.pad[0]
            rows.update(r for r in range(base, base + self.dilation * self.kernel,
                                         self.dilation) if 0 <= r < height)
        return sorted(rows)


def _bands(height, band):
    return [(r, min(height, r + band)) for r in range(0, height, band)]


def row_band_graph(height, layers, *, input_name="input", input_row_size=1, input_band=1):
    """The unit graph of ``layers`` (:class:`RowLayer`, each after the layers it reads) on an
    input of ``height`` rows: every layer's output cut into bands of ``band`` rows, each band
    reading the bands of its inputs that hold the rows its window covers.

    The input is a layer too (``input_name``, bands of ``input_band`` rows of
    ``input_row_size``), so its bands are loaded when first needed and count as live. Unit
    names are ``(layer, band index)``; :attr:`Unit.rows` holds the band's rows.
    """
    heights = {input_name: height}
    bands = {input_name: _bands(height, input_band)}
    units = [Unit((input_name, i), input_name, (), (r1 - r0) * input_row_size, (r0, r1))
             for i, (r0, r1) in enumerate(bands[input_name])]
    for layer in layers:
        if layer.name in heights:
            raise ValueError(f"two layers are named {layer.name!r}")
        unknown = [s for s in layer.inputs if s not in heights]
        if unknown:
            raise ValueError(f"layer {layer.name!r} reads {unknown[0]!r}, which is not an "
                             f"earlier layer")
        h_in = {heights[s] for s in layer.inputs}
        if len(h_in) != 1:
            raise ValueError(f"layer {layer.name!r} reads inputs of different heights "
                             f"{sorted(h_in)}")
        h_in = h_in.pop()
        h_out = layer.out_height(h_in)
        if h_out < 1:
            raise ValueError(f"layer {layer.name!r}: the window does not fit {h_in} rows")
        heights[layer.name] = h_out
        bands[layer.name] = _bands(h_out, layer.band)
        for i, (r0, r1) in enumerate(bands[layer.name]):
            rows = layer.rows_needed(r0, r1, h_in)
            inputs = []
            for src in layer.inputs:
                src_band = bands[src][0][1] - bands[src][0][0]
                inputs += [(src, b) for b in sorted({r // src_band for r in rows})]
            units.append(Unit((layer.name, i), layer.name, tuple(inputs),
                              (r1 - r0) * layer.row_size, (r0, r1)))
    return UnitGraph(units)


# --------------------------------------------------------------------------------------------
# from an order to tasks and buffers


def runs(graph, order):
    """``order`` as tasks: maximal stretches of consecutive units of one layer whose rows
    follow each other, each ``(layer, first_row, end_row, names)``. Units without rows form
    stretches of one."""
    out = []
    for name in order:
        unit = graph.units[name]
        last = out[-1] if out else None
        if (last is not None and unit.rows is not None and last[0] == unit.layer
                and last[2] == unit.rows[0]):
            out[-1] = (last[0], last[1], unit.rows[1], last[3] + (name,))
        else:
            first, end = unit.rows if unit.rows is not None else (None, None)
            out.append((unit.layer, first, end, (name,)))
    return out


def layer_windows(graph, order, count_outputs=False):
    """Per layer, the largest live size of its own units at any step of ``order`` (freeing at
    last use): the size of a ring buffer that holds the layer's live bands. Their sum bounds
    :func:`peak` from above; it is what per-layer rings need, free of fragmentation."""
    check_order(graph, order)
    position = {name: i for i, name in enumerate(order)}
    events = {}
    for name, unit in graph.units.items():
        readers = graph.consumers[name]
        if not readers and not count_outputs:
            continue
        end = max((position[c] for c in readers), default=position[name])
        events.setdefault(unit.layer, []).append((position[name], end, unit.size))
    windows = {}
    for layer, spans in events.items():
        delta = {}
        for start, end, size in spans:
            delta[start] = delta.get(start, 0) + size
            delta[end + 1] = delta.get(end + 1, 0) - size
        live = best = 0
        for step in sorted(delta):
            live += delta[step]
            best = max(best, live)
        windows[layer] = best
    return windows


def band_for_budget(height, layers, budget, *, input_row_size=1, bands=None):
    """The largest band height (the same for every layer and the input) whose best
    :func:`schedule` peaks within ``budget``: ``(band, graph, schedule)``. Fewer, larger bands
    mean fewer tasks. ``bands`` lists the candidates (default: the powers of two up to
    ``height``, largest first). ``ValueError`` names the smallest peak found if none fits."""
    candidates = bands or [1 << k for k in range(height.bit_length())][::-1]
    best = None
    for band in candidates:
        bl = [RowLayer(la.name, la.inputs, la.kernel, la.stride, la.pad, la.dilation,
                       la.row_size, band) for la in layers]
        graph = row_band_graph(height, bl, input_row_size=input_row_size, input_band=band)
        plan = schedule(graph)
        if plan.peak <= budget:
            return band, graph, plan
        if best is None or plan.peak < best[1]:
            best = (band, plan.peak)
    raise ValueError(f"no band height fits {budget}: the smallest peak is {best[1]} "
                     f"(bands of {best[0]} rows)")
