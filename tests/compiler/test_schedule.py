"""Partial-network scheduling (``npu_compiler.schedule``): seed 003's reference cases, the
row-band graph of convolution chains, and properties on random DAGs."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_compiler.schedule import (
    Comparison,
    RowLayer,
    Unit,
    UnitGraph,
    band_for_budget,
    check_order,
    compare,
    depth_first_order,
    layer_by_layer_order,
    layer_windows,
    live_profile,
    partial_network,
    peak,
    row_band_graph,
    runs,
    schedule,
)

# --------------------------------------------------------------------------------------------
# seed 003's examples


def matmul_2x2():
    """FIG. 3: layer A makes a 2x2 matrix, B = A W; b_ij reads row i of A."""
    a = [Unit(f"a{i}{j}", "A") for i in (1, 2) for j in (1, 2)]
    b = [Unit(f"b{i}{j}", "B", (f"a{i}1", f"a{i}2")) for i in (1, 2) for j in (1, 2)]
    return UnitGraph(a + b)


def fig5():
    """FIG. 5 as its text describes it: B1 and B2 read A1, A2; B3 and B4 read A3, A4; C_j
    reads B_j and B_(j+1), C4 wrapping round to B1 (B2 is freed after C2, B3 after C3, B1
    and B4 after C4)."""
    a = [Unit(f"A{i}", "A") for i in range(1, 5)]
    pairs = {1: (1, 2), 2: (1, 2), 3: (3, 4), 4: (3, 4)}
    b = [Unit(f"B{j}", "B", tuple(f"A{i}" for i in pairs[j])) for j in range(1, 5)]
    c = [Unit(f"C{j}", "C", (f"B{j}", f"B{j % 4 + 1}")) for j in range(1, 5)]
    return UnitGraph(a + b + c)


def test_matmul_2x2_peak_4_to_2():
    g = matmul_2x2()
    order = depth_first_order(g)
    assert order == ["a11", "a12", "b11", "b12", "a21", "a22", "b21", "b22"]
    assert peak(g, order) == 2
    assert compare(g).layer_by_layer == 4 and compare(g).whole_layers == 4


def test_fig5_order_and_peaks():
    g = fig5()
    order = depth_first_order(g)
    assert order == "A1 A2 B1 B2 C1 A3 A4 B3 C2 B4 C3 C4".split()
    # Live A/B units while each is computed (the C outputs are written out).
    assert live_profile(g, order) == [1, 2, 3, 4, 2, 3, 4, 5, 5, 5, 3, 2]
    assert compare(g) == Comparison(depth_first=5, layer_by_layer=6, whole_layers=8)
    assert schedule(g).peak == 5 and schedule(g).strategy == "depth-first"


@pytest.mark.parametrize("m", [3, 4, 10, 57])
def test_three_tap_chain_m_to_3(m):
    """FIG. 4: B_j reads A_j, A_(j+1), A_(j+2); by hand and through row_band_graph."""
    a = [Unit(i, "A") for i in range(m)]
    b = [Unit(("B", j), "B", (j, j + 1, j + 2)) for j in range(m - 2)]
    g = UnitGraph(a + b)
    c = compare(g)
    assert (c.depth_first, c.layer_by_layer, c.whole_layers) == (3, m, m)
    g2 = row_band_graph(m, [RowLayer("B", kernel=3)])
    c2 = compare(g2)
    assert (c2.depth_first, c2.layer_by_layer, c2.whole_layers) == (3, m, m)


def test_counting_outputs_adds_one_live_output():
    g = fig5()
    assert peak(g, depth_first_order(g), count_outputs=True) == 6


# --------------------------------------------------------------------------------------------
# row bands


def test_row_band_dependencies():
    # 3x3 conv, stride 2, pad 1 on 9 rows -> 5 rows; bands of 2 output rows, input bands of 3.
    g = row_band_graph(9, [RowLayer("c", kernel=3, stride=2, pad=1, band=2, row_size=10)],
                       input_band=3, input_row_size=4)
    conv = [u for u in g if u.layer == "c"]
    assert [u.rows for u in conv] == [(0, 2), (2, 4), (4, 5)]
    # Rows 0-1 read input rows -1..3 -> 0..3 (bands 0, 1); rows 2-3 read 3..7 (bands 1, 2);
    # row 4 reads 7..9 -> 7, 8 (band 2).
    assert [u.inputs for u in conv] == [(("input", 0), ("input", 1)),
                                        (("input", 1), ("input", 2)), (("input", 2),)]
    assert [u.size for u in conv] == [20, 20, 10]
    assert [u.size for u in g if u.layer == "input"] == [12, 12, 12]


def test_row_band_dilation_and_two_inputs():
    g = row_band_graph(8, [RowLayer("a", kernel=1, row_size=2),
                           RowLayer("b", kernel=3, pad=1, row_size=2),
                           RowLayer("cat", inputs=("a", "b"), kernel=3, dilation=2, pad=2)])
    u = g.units[("cat", 0)]
    # Output row 0 reads rows -2, 0, 2 -> 0 and 2 of both inputs.
    assert u.inputs == (("a", 0), ("a", 2), ("b", 0), ("b", 2))


@pytest.mark.parametrize("bad, message", [
    (lambda: row_band_graph(4, [RowLayer("c", inputs=("x",))]), "not an earlier layer"),
    (lambda: row_band_graph(2, [RowLayer("c", kernel=3)]), "does not fit"),
    (lambda: RowLayer("c", kernel=0), "kernel must be at least 1"),
    (lambda: UnitGraph([Unit("a", 0, ("b",)), Unit("b", 0, ("a",))]), "cycle"),
    (lambda: UnitGraph([Unit("a", 0), Unit("a", 1)]), "two units"),
    (lambda: UnitGraph([Unit("a", 0, ("z",))]), "not a unit"),
    (lambda: UnitGraph([Unit("a", 0), Unit("b", 1, ("a",)), Unit("c", 0, ("b",))]),
     "read each other"),
])
def test_bad_graphs(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


def test_check_order_rejects_bad_orders():
    g = fig5()
    order = depth_first_order(g)
    for wrong in (order[1:], order + ["A1"], order[2:3] + order[:2] + order[3:],
                  order[:-1] + ["Z"]):
        with pytest.raises(ValueError):
            check_order(g, wrong)


# --------------------------------------------------------------------------------------------
# properties on random graphs


@st.composite
def layered_dags(draw):
    """Random layered DAGs: each unit reads 1-3 units of the previous layer, sometimes also
    of an earlier one (skip connections); random sizes."""
    layers, units = [], []
    for li in range(draw(st.integers(1, 5))):
        row = []
        for i in range(draw(st.integers(1, 6))):
            inputs = ()
            if li:
                pool = [u.name for u in layers[-1]]
                if li > 1 and draw(st.booleans()):
                    pool += [u.name for u in layers[draw(st.integers(0, li - 2))]]
                k = draw(st.integers(1, min(3, len(pool))))
                inputs = tuple(draw(st.permutations(pool))[:k])
            row.append(Unit(f"{li}.{i}", li, inputs, draw(st.integers(0, 9))))
        layers.append(row)
        units += row
    return UnitGraph(units)


def ancestors(g, name):
    seen, todo = set(), [name]
    while todo:
        for s in g.units[todo.pop()].inputs:
            if s not in seen:
                seen.add(s)
                todo.append(s)
    return seen


@settings(max_examples=150, deadline=None)
@given(layered_dags())
def test_orders_are_complete_and_topological(g):
    for order in (depth_first_order(g), layer_by_layer_order(g), list(schedule(g).order)):
        check_order(g, order)
        position = {n: i for i, n in enumerate(order)}
        assert all(position[s] < position[u.name] for u in g for s in u.inputs)


@settings(max_examples=150, deadline=None)
@given(layered_dags())
def test_partial_network_is_the_dependency_cone(g):
    for name in g.units:
        net = partial_network(g, name)
        assert net[-1] == name and set(net[:-1]) == ancestors(g, name)


@settings(max_examples=150, deadline=None)
@given(layered_dags())
def test_schedule_never_above_layer_by_layer(g):
    c = compare(g)
    s = schedule(g)
    assert s.peak == peak(g, list(s.order))
    assert s.peak <= c.depth_first and s.peak <= c.layer_by_layer <= c.whole_layers


def brute_peak(g, order, keep):
    """Live size at each step, recomputed from scratch per step (a reference for
    live_profile)."""
    pos = {n: i for i, n in enumerate(order)}
    layer_end = {}
    for n, i in pos.items():
        layer_end[g.units[n].layer] = max(layer_end.get(g.units[n].layer, -1), i)
    best = 0
    for t in range(len(order)):
        live = 0
        for n, u in g.units.items():
            readers = g.consumers[n]
            if not readers:
                continue
            end = (max(pos[c] for c in readers) if keep == "unit"
                   else max(layer_end[g.units[c].layer] for c in readers))
            if pos[n] <= t <= end:
                live += u.size
        best = max(best, live)
    return best


@settings(max_examples=100, deadline=None)
@given(layered_dags(), st.sampled_from(["unit", "layer"]))
def test_peak_against_brute_force(g, keep):
    for order in (depth_first_order(g), layer_by_layer_order(g)):
        assert peak(g, order, keep) == brute_peak(g, order, keep)


@st.composite
def same_chains(draw):
    """Chains of stride-1 'same' convolutions on images tall against their receptive field,
    one-row bands: the case partial networks are for."""
    layers = [RowLayer(f"l{i}", (f"l{i - 1}",) if i else ("input",),
                       kernel=(k := draw(st.sampled_from([1, 3, 5, 7]))), pad=k // 2,
                       row_size=draw(st.integers(1, 8)))
              for i in range(draw(st.integers(1, 5)))]
    field = 1 + sum(layer.kernel - 1 for layer in layers)
    height = draw(st.integers(2 * field, 4 * field + 8))
    return row_band_graph(height, layers, input_row_size=draw(st.integers(1, 8)))


@settings(max_examples=100, deadline=None)
@given(same_chains())
def test_depth_first_beats_layer_by_layer_on_tall_chains(g):
    c = compare(g)
    assert c.depth_first <= c.layer_by_layer


# --------------------------------------------------------------------------------------------
# SqueezeNet 1.1 in row bands

#: SqueezeNet 1.1's layers up to conv10: (name, kernel, stride, pad, channels), "fire"
#: entries as (squeeze, expand) channels. Its global average pool reads conv10 from memory.
SQUEEZENET_11 = [("conv1", 3, 2, 0, 64), ("pool1", 3, 2, 0, None), ("fire", 16, 64),
                 ("fire", 16, 64), ("pool3", 3, 2, 0, None), ("fire", 32, 128),
                 ("fire", 32, 128), ("pool5", 3, 2, 0, None), ("fire", 48, 192),
                 ("fire", 48, 192), ("fire", 64, 256), ("fire", 64, 256),
                 ("conv10", 1, 1, 0, 1000)]


def squeezenet_graph(size, band=1):
    """Row-band graph of SqueezeNet 1.1 on a ``size`` x ``size`` RGB input, sizes in
    elements (a row of a layer is its width times its channels). A fire module is a 1x1
    squeeze, then 1x1 and 3x3 (pad 1) expands read together by the next layer (the concat)."""
    layers, prev, width, channels = [], ("input",), size, 3
    fire = 2

    def add(name, inputs, k, s, p, ch):
        nonlocal width
        layer = RowLayer(name, inputs, k, s, p, 1, 0, band)
        out = layer.out_height(width)
        layers.append(RowLayer(name, inputs, k, s, p, 1, out * ch, band))
        return out

    for entry in SQUEEZENET_11:
        if entry[0] == "fire":
            _, sq, ex = entry
            name = f"fire{fire}"
            add(f"{name}/squeeze", prev, 1, 1, 0, sq)
            add(f"{name}/e1", (f"{name}/squeeze",), 1, 1, 0, ex)
            add(f"{name}/e3", (f"{name}/squeeze",), 3, 1, 1, ex)
            prev, channels, fire = (f"{name}/e1", f"{name}/e3"), 2 * ex, fire + 1
        else:
            name, k, s, p, ch = entry
            channels = channels if ch is None else ch
            width = add(name, prev, k, s, p, channels)
            prev = (name,)
    return row_band_graph(size, layers, input_row_size=3 * size, input_band=band)


@pytest.mark.parametrize("size", [64, 224])
def test_squeezenet_depth_first_halves_the_peak(size):
    """The goal of issue 14: the depth-first peak at most half the layer-by-layer one
    (docs/scheduling.md has the figures)."""
    g = squeezenet_graph(size)
    # conv1 (3x3, stride 2, no pad) has (size - 3) // 2 + 1 rows of as many columns x 64.
    conv1 = [u for u in g if u.layer == "conv1"]
    assert len(conv1) == (size - 3) // 2 + 1 and conv1[0].size == len(conv1) * 64
    assert len([u for u in g if u.layer == "conv10"]) == {64: 3, 224: 13}[size]
    c = compare(g)
    assert c.depth_first * 2 <= c.layer_by_layer <= c.whole_layers
    assert schedule(g).strategy == "depth-first"


def random_dag(seed):
    """A random layered DAG from ``random.Random(seed)``, as ``layered_dags`` draws them (the
    figures of docs/scheduling.md use it)."""
    rng = random.Random(seed)
    layers, units = [], []
    for li in range(rng.randint(1, 5)):
        row = []
        for i in range(rng.randint(1, 6)):
            inputs = ()
            if li:
                pool = [u.name for u in layers[-1]]
                if li > 1 and rng.random() < 0.5:
                    pool += [u.name for u in layers[rng.randrange(li - 1)]]
                inputs = tuple(rng.sample(pool, rng.randint(1, min(3, len(pool)))))
            row.append(Unit(f"{li}.{i}", li, inputs, rng.randint(0, 9)))
        layers.append(row)
        units += row
    return UnitGraph(units)


def test_depth_first_alone_can_exceed_layer_by_layer():
    """Why ``schedule`` takes the minimum: some DAGs make the plain depth-first order hold
    more than layer by layer."""
    worse = [s for s in range(200) if (c := compare(random_dag(s))).depth_first >
             c.layer_by_layer]
    assert worse
    for s in worse[:5]:
        g = random_dag(s)
        assert schedule(g).peak <= compare(g).layer_by_layer


# --------------------------------------------------------------------------------------------
# tasks and buffers


def test_runs_merge_consecutive_rows():
    g = row_band_graph(6, [RowLayer("c", kernel=3, pad=1)])
    order = depth_first_order(g)
    r = runs(g, order)
    # input 0, 1 | c 0 | input 2 | c 1 | ... : rows 0-1 of the input form one run.
    assert r[0][:3] == ("input", 0, 2) and r[1][:3] == ("c", 0, 1)
    assert [n for run in r for n in run[3]] == order
    assert runs(g, layer_by_layer_order(g)) == [
        ("input", 0, 6, tuple(("input", i) for i in range(6))),
        ("c", 0, 6, tuple(("c", i) for i in range(6)))]
    fig = fig5()
    assert len(runs(fig, depth_first_order(fig))) == 12  # no rows: one unit a run


@settings(max_examples=100, deadline=None)
@given(same_chains())
def test_layer_windows_bound_the_peak(g):
    order = depth_first_order(g)
    w = layer_windows(g, order)
    assert peak(g, order) <= sum(w.values())
    for layer, size in w.items():  # each window is the peak of that layer alone
        alone = UnitGraph([Unit(u.name, u.layer, tuple(s for s in u.inputs),
                                u.size if u.layer == layer else 0, u.rows) for u in g])
        assert peak(alone, order) == size


def test_three_tap_chain_window_is_three_rows():
    g = row_band_graph(40, [RowLayer("c", kernel=3, row_size=5)], input_row_size=2)
    assert layer_windows(g, depth_first_order(g)) == {"input": 6}


def test_band_for_budget():
    layers = [RowLayer("a", kernel=3, pad=1, row_size=10), RowLayer("b", kernel=3, pad=1,
                                                                    row_size=10)]
    band, g, plan = band_for_budget(64, layers, 200, input_row_size=10)
    assert plan.peak <= 200 and band >= 1
    bigger = [RowLayer(la.name, la.inputs, la.kernel, la.stride, la.pad, la.dilation,
                       la.row_size, 2 * band) for la in layers]
    g2 = row_band_graph(64, bigger, input_row_size=10, input_band=2 * band)
    assert schedule(g2).peak > 200  # the next larger band does not fit
    with pytest.raises(ValueError, match="no band height fits 10"):
        band_for_budget(64, layers, 10, input_row_size=10)
