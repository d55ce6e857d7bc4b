"""Several neural-engine cores on one layer (``npu_compiler.cores``) and a conv streaming
into the planar layer after it (``npu_compiler.chain``): the same bits as one core and as the
layers one after the other on the golden backend, the RTL equal to the golden backend, fewer
cycles."""

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from npu_cli.main import main
from npu_compiler.compile import compile_model
from npu_compiler.cores import core_blobs, task_cores
from npu_model.builder import ProgramBuilder
from npu_runtime.runtime import run
from npu_spec.config import PRESETS

from .models import _init

MODEL = Path(__file__).resolve().parents[2] / "models" / "digits" / "digits_cnn.onnx"
ECP5 = PRESETS["ecp5"]
SMALL = PRESETS["small"]


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def conv_then(op, seed=0, c=4, k=24, size=10, pool_pads=0):
    """A 3x3 conv ``c -> k`` (pad 1, bias) on ``size x size``, then ``op``: ``MaxPool``
    (2x2, stride 2, or 3x3 stride 2 with ``pool_pads``), ``AveragePool`` (2x2), ``Relu`` or
    ``Add`` (of the model's input passed through a 1x1 conv ``c -> k``, as second operand),
    then a ReLU on the planar engine."""
    rng = np.random.default_rng(seed)
    inits = [_init(rng, "w", (k, c, 3, 3)), _init(rng, "b", (k,)),
             _init(rng, "ws", (k, c, 1, 1))]
    n = helper.make_node
    nodes = [n("Conv", ["x", "ws"], ["skip"])] if op == "Add" else []
    nodes.append(n("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]))
    if op == "MaxPool" and pool_pads:
        nodes.append(n("MaxPool", ["y"], ["z"], kernel_shape=[3, 3], strides=[2, 2],
                       pads=[pool_pads] * 4))
    elif op in ("MaxPool", "AveragePool"):
        nodes.append(n(op, ["y"], ["z"], kernel_shape=[2, 2], strides=[2, 2]))
    elif op == "Add":
        nodes.append(n("Add", ["y", "skip"], ["z"]))
    else:
        nodes.append(n(op, ["y"], ["z"]))
    nodes.append(n("Relu", ["z"], ["out"]))
    side = ((size - 1) // 2 + 1 if pool_pads else size // 2) if "Pool" in op else size
    graph = helper.make_graph(
        nodes, f"conv_{op.lower()}",
        [helper.make_tensor_value_info("x", 1, [1, c, size, size])],
        [helper.make_tensor_value_info("out", 1, [1, k, side, side])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _input(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run(model, config, x, backend="golden", **kw):
    compiled = compile_model(model, config, **kw)
    result = run(compiled.program, {"x": x}, backend)
    return compiled, result


# ---- several cores ---------------------------------------------------------------------------

def test_core_blobs_deal_whole_groups():
    b = ProgramBuilder(SMALL)
    rng = np.random.default_rng(1)
    w = rng.integers(-5, 6, (20, 3, 3, 3)).astype(np.int8)     # groups of 8, 8, 4 channels
    blob = b.kernels(w, bias=np.arange(20), scale=1)
    parts = core_blobs(blob, 2)
    assert [p.weight_shape[0] for p in parts] == [8, 12]
    assert sum((p.groups for p in parts), ()) == blob.groups
    assert all(p.weight_shape[1:] == (3, 3, 3) for p in parts)
    assert [p.weight_shape[0] for p in core_blobs(blob, 16)] == [8, 8, 4]
    assert core_blobs(blob, 1) == [blob]
    grouped = b.kernels(w[:, :1], bias=0, scale=1, groups=20)
    assert core_blobs(grouped, 2) == [grouped]


@pytest.mark.parametrize("fmt", ["fp16", "mixed", "int8"])
def test_digits_two_cores_equal_one_core(fmt, split):
    kw = {"calibration": {"input": split[0][:50]}} if fmt == "int8" else {}
    x = {"input": split[2][:2]}
    outs, plans = [], []
    for cores in (1, 2):
        c = compile_model(MODEL, ECP5, fmt=fmt, cores=cores, **kw)
        plans.append({r["node"]: r["cores"] for r in c.plan})
        outs.append(run(c.program, x, "golden").outputs["logits"])
    np.testing.assert_array_equal(_bits(outs[0]), _bits(outs[1]))
    assert set(plans[0].values()) == {1}
    # conv1 has 8 output channels (one group), conv2 16, fc 10: two groups each.
    assert plans[1]["conv1"] == 1 and plans[1]["conv2"] == 2 and plans[1]["fc"] == 2


def test_two_cores_with_palette_keep_the_layer_palette():
    """--palette is lossy: the cores' parts must share the layer's palette."""
    model = conv_then("Relu", seed=3, k=32)
    x = _input(4, (1, 4, 10, 10))
    a = _run(model, ECP5, x, cores=1, palette=2)[1].outputs["out"]
    b = _run(model, ECP5, x, cores=2, palette=2)[1].outputs["out"]
    np.testing.assert_array_equal(_bits(a), _bits(b))


@pytest.mark.parametrize("schedule", ["depth-first", "layer"])
def test_two_cores_on_bands(schedule):
    """Layers cut into row bands (a buffer of 4096 elements) split over two cores."""
    model = conv_then("MaxPool", c=8, k=32, size=24)
    config = ECP5.replace(buffer_kib=8)
    x = _input(10, (1, 8, 24, 24))
    one, a = _run(model, config, x, cores=1, schedule=schedule)
    two, b = _run(model, config, x, schedule=schedule)
    np.testing.assert_array_equal(_bits(a.outputs["out"]), _bits(b.outputs["out"]))
    conv = next(r for r in two.plan if r["op"] == "Conv")
    assert conv["cores"] == 2 and conv["tasks"] > 6 and "chained" not in conv["how"]


def test_ane_splits_within_the_descriptor_slot():
    """Each core adds its layer registers and datasets to the task's descriptor: on ``ane``
    the task manager's slot takes two of its 16 cores in one task."""
    ane = PRESETS["ane"]
    n = task_cores(ane)
    assert 2 <= n < ane.cores
    model = conv_then("MaxPool", c=8, k=64, size=12)
    x = _input(9, (1, 8, 12, 12))
    one, a = _run(model, ane, x, cores=1)
    many, b = _run(model, ane, x)
    np.testing.assert_array_equal(_bits(a.outputs["out"]), _bits(b.outputs["out"]))
    assert [r["cores"] for r in many.plan if r["op"] == "Conv"] == [n]


def test_cli_cores(tmp_path, capsys):
    assert main(["compile", str(MODEL), "--preset", "ecp5", "-o", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "2 cores]  (conv2)" in out and "2 cores]  (fc)" in out
    assert main(["compile", str(MODEL), "--preset", "ecp5", "--cores", "1",
                 "-o", str(tmp_path / "p")]) == 0
    assert "cores]" not in capsys.readouterr().out
    assert main(["compile", str(MODEL), "--preset", "ecp5", "--cores", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "npu: error: --cores must be 1 to 2 on preset 'ecp5', not 3"


# ---- NE -> PE chains -------------------------------------------------------------------------

CHAINS = ["MaxPool", "AveragePool", "Relu", "Add", "MaxPool-padded"]


@pytest.mark.parametrize("op", CHAINS)
@pytest.mark.parametrize("fmt", ["fp16", "mixed"])
def test_chain_equals_layer_by_layer(op, fmt):
    model = conv_then(op.split("-")[0], pool_pads=1 if "padded" in op else 0)
    x = _input(5, (1, 4, 10, 10))
    chained, a = _run(model, SMALL, x, fmt=fmt)
    plain, b = _run(model, SMALL, x, fmt=fmt, chain=False)
    np.testing.assert_array_equal(_bits(a.outputs["out"]), _bits(b.outputs["out"]))
    hows = {r["node"]: r["how"] for r in chained.plan}
    conv = next(r["node"] for r in chained.plan if r["op"] == "Conv" and r["out"][0][1] == 24
                and "chained" in r["how"])
    assert "ring of 3 slots" in hows[conv]
    assert not any("chained" in r["how"] for r in plain.plan)
    # The conv's output never goes to memory: fewer tasks.
    assert chained.program.queues[0].tasks < plain.program.queues[0].tasks


def test_chain_with_prune_and_palette():
    """The chained conv gets the model's weights pruned and palettized as any other."""
    model = conv_then("MaxPool", seed=2)
    x = _input(3, (1, 4, 10, 10))
    for kw in ({"prune": 0.5}, {"palette": 2}):
        a = _run(model, SMALL, x, **kw)[1].outputs["out"]
        b = _run(model, SMALL, x, chain=False, **kw)[1].outputs["out"]
        c = _run(model, SMALL, x)[1].outputs["out"]
        np.testing.assert_array_equal(_bits(a), _bits(b))
        assert not np.array_equal(_bits(a), _bits(c))


def test_chain_with_a_ring_smaller_than_the_tensor():
    """A buffer too small for the whole conv output beside its input and the pool's: the
    ring keeps fewer slots than the tensor has groups (layer by layer: the depth-first
    schedule would take the pair as row bands)."""
    model = conv_then("MaxPool", c=8, k=64, size=8)
    config = SMALL.replace(buffer_kib=8)        # 4096 elements
    x = _input(6, (1, 8, 8, 8))
    chained, a = _run(model, config, x, schedule="layer")
    _, b = _run(model, config, x, chain=False, schedule="layer")
    np.testing.assert_array_equal(_bits(a.outputs["out"]), _bits(b.outputs["out"]))
    how = next(r["how"] for r in chained.plan if r["op"] == "Conv")
    # 512 input + 1024 pooled + 5 slots of 8 planes of 64 elements fill the 4096.
    assert "ring of 5 slots" in how


def test_two_cores_chain_keeps_the_output_in_the_buffer():
    model = conv_then("MaxPool")
    x = _input(7, (1, 4, 10, 10))
    chained, a = _run(model, ECP5, x)
    _, b = _run(model, ECP5, x, cores=1, chain=False)
    np.testing.assert_array_equal(_bits(a.outputs["out"]), _bits(b.outputs["out"]))
    row = next(r for r in chained.plan if r["op"] == "Conv")
    assert row["cores"] == 2 and "kept in the buffer" in row["how"]


def test_digits_int8_chain_equals_layer_by_layer(split):
    cal = {"input": split[0][:50]}
    x = {"input": split[2][:3]}
    outs = []
    for chain in (True, False):
        c = compile_model(MODEL, SMALL, fmt="int8", calibration=cal, chain=chain)
        outs.append(run(c.program, x, "golden").outputs["logits"])
        assert any("ring of 2 slots" in r.get("how", "") for r in c.plan) == chain
    np.testing.assert_array_equal(_bits(outs[0]), _bits(outs[1]))


def long_chain(seed=0, c=4, size=12, first="Conv"):
    """``first`` (a 3x3 conv ``c -> 16`` with a fused ReLU, or a 2x2 max pool), then a 2x2
    max pool, a 3x3 conv ``-> 24``, a 2x2 average pool, an add of a second input (the
    pooled size), a ReLU on the planar engine: six layers, each read by the next alone."""
    rng = np.random.default_rng(seed)
    k1 = 16 if first == "Conv" else c
    inits = [_init(rng, "w1", (16, c, 3, 3)), _init(rng, "b1", (16,)),
             _init(rng, "w2", (24, k1, 3, 3)), _init(rng, "b2", (24,))]
    n = helper.make_node
    side = size // 4
    nodes = ([n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"])]
             if first == "Conv" else [n("MaxPool", ["x"], ["r1"], kernel_shape=[1, 1])])
    nodes += [n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
              n("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
              n("AveragePool", ["c2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
              n("Add", ["s", "p2"], ["a"]),
              n("Relu", ["a"], ["out"])]
    graph = helper.make_graph(
        nodes, "long_chain",
        [helper.make_tensor_value_info("x", 1, [1, c, size, size]),
         helper.make_tensor_value_info("s", 1, [1, 24, side, side])],
        [helper.make_tensor_value_info("out", 1, [1, 24, side, side])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run2(model, config, xs, backend="golden", **kw):
    compiled = compile_model(model, config, **kw)
    return compiled, run(compiled.program, xs, backend)


def _long_inputs(seed, c=4, size=12):
    return {"x": _input(seed, (1, c, size, size)), "s": _input(seed + 1, (1, 24, size // 4,
                                                                          size // 4))}


@pytest.mark.parametrize("fmt", ["fp16", "mixed"])
def test_chain_of_six_layers(fmt):
    """conv -> pool -> conv -> pool -> add -> ReLU as one chain: two rings (each conv into
    its pool), the rest plain buffer datasets; only the last output is stored."""
    model = long_chain()
    xs = _long_inputs(3)
    chained, a = _run2(model, SMALL, xs, fmt=fmt)
    plain, b = _run2(model, SMALL, xs, fmt=fmt, chain=False)
    np.testing.assert_array_equal(_bits(a.outputs["out"]), _bits(b.outputs["out"]))
    hows = [r["how"] for r in chained.plan]
    assert len(hows) == 6 and all(h.startswith("chained: ") for h in hows), hows
    assert sum("through a ring of" in h for h in hows) == 2
    assert "reads MaxPool_2's output from the buffer; output streams into" in hows[2]
    # Only the last layer's output is in system memory.
    names = {t.name for t in chained.program.tensors}
    assert "out" in names and not names & {"r1", "p1", "c2", "p2", "a"}
    assert chained.program.queues[0].tasks < plain.program.queues[0].tasks


def test_chain_may_start_on_the_planar_engine():
    model = long_chain(first="MaxPool")
    xs = _long_inputs(4)
    chained, a = _run2(model, SMALL, xs)
    _, b = _run2(model, SMALL, xs, chain=False)
    np.testing.assert_array_equal(_bits(a.outputs["out"]), _bits(b.outputs["out"]))
    assert all(r["how"].startswith("chained: ") for r in chained.plan)


def _conv_pool_twice(seed=0, size=16):
    """A 3x3 conv 4 -> 8, a 1x1 max pool (same size), a 1x1 conv 8 -> 32, a 2x2 max pool."""
    rng = np.random.default_rng(seed)
    inits = [_init(rng, "w1", (8, 4, 3, 3)), _init(rng, "w2", (32, 8, 1, 1))]
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             n("MaxPool", ["c1"], ["p1"], kernel_shape=[1, 1]),
             n("Conv", ["p1", "w2"], ["c2"]),
             n("MaxPool", ["c2"], ["out"], kernel_shape=[2, 2], strides=[2, 2])]
    graph = helper.make_graph(
        nodes, "conv_pool_twice", [helper.make_tensor_value_info("x", 1, [1, 4, size, size])],
        [helper.make_tensor_value_info("out", 1, [1, 32, size // 2, size // 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("kib, chained", [(11, 2), (12, 4)])
def test_chain_stops_where_the_buffer_is_full(kib, chained):
    """16x16 planes: the first conv and pool need 2,048 (pooled) + 2,048 (a ring of one
    slot) + 1,024 (input) elements, the second pair 2,048 (held) + 2,048 + 2,048. A buffer
    of 5,632 elements (11 KiB) chains the first pair only (the second alone would need
    6,144 as well); 6,144 (12 KiB) all four layers, the second pair's datasets in the space
    the first one freed (each step's result is placed first, below what it frees)."""
    model = _conv_pool_twice()
    x = _input(5, (1, 4, 16, 16))
    config = SMALL.replace(buffer_kib=kib)
    compiled, a = _run(model, config, x, schedule="layer")
    _, b = _run(model, config, x, chain=False, schedule="layer")
    np.testing.assert_array_equal(_bits(a.outputs["out"]), _bits(b.outputs["out"]))
    hows = [r["how"] for r in compiled.plan]
    assert [h.startswith("chained: ") for h in hows] == [True] * chained + [False] * (
        4 - chained), hows
    names = {t.name for t in compiled.program.tensors}
    assert ("p1" in names) == ("c2" in names) == (chained == 2)


def random_run(seed):
    """A random run of 3 to 6 chainable layers on a random input (convs 1x1 or 3x3 with
    stride 1 or 2, max and average pools, ReLUs, adds of an extra input), each read by the
    next alone; ``(model, inputs)``."""
    rng = np.random.default_rng(seed)
    c, size = int(rng.integers(1, 9)), int(rng.integers(6, 17))
    shape = [1, c, size, size]
    n = helper.make_node
    nodes, inits, ins, feeds = [], [], [], {}
    x = "x"
    ins.append(helper.make_tensor_value_info("x", 1, list(shape)))
    feeds["x"] = _input(seed, tuple(shape))
    for i in range(int(rng.integers(3, 7))):
        y = f"t{i}"
        op = rng.choice(["Conv", "Conv", "MaxPool", "AveragePool", "Relu", "Add"])
        if op == "Conv":
            k, kk = int(rng.integers(1, 25)), int(rng.choice([1, 3]))
            stride = int(rng.choice([1, 2]))
            inits += [_init(rng, f"w{i}", (k, shape[1], kk, kk)), _init(rng, f"b{i}", (k,))]
            nodes.append(n("Conv", [x, f"w{i}", f"b{i}"], [y], pads=[kk // 2] * 4,
                           strides=[stride, stride]))
            side = (shape[2] + 2 * (kk // 2) - kk) // stride + 1
            shape = [1, k, side, side]
        elif op in ("MaxPool", "AveragePool") and shape[2] >= 2:
            nodes.append(n(op, [x], [y], kernel_shape=[2, 2], strides=[2, 2]))
            shape = [1, shape[1], shape[2] // 2, shape[3] // 2]
        elif op == "Add":
            ins.append(helper.make_tensor_value_info(f"s{i}", 1, list(shape)))
            feeds[f"s{i}"] = _input(seed + i + 1, tuple(shape))
            nodes.append(n("Add", [x, f"s{i}"] if rng.random() < 0.5 else [f"s{i}", x], [y]))
        else:
            nodes.append(n("Relu", [x], [y]))
        x = y
    graph = helper.make_graph(nodes, f"run{seed}", ins,
                              [helper.make_tensor_value_info(x, 1, list(shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


@pytest.mark.parametrize("seed", range(12))
def test_random_runs_chain_bit_exact(seed):
    """Random runs of layers, on a random buffer size (some runs stop early), give the same
    bits chained as layer by layer."""
    model, feeds = random_run(seed)
    kib = int(np.random.default_rng(seed).choice([4, 8, 16, 64]))
    config = SMALL.replace(buffer_kib=kib)
    compiled, a = _run2(model, config, feeds, schedule="layer")
    _, b = _run2(model, config, feeds, schedule="layer", chain=False)
    out = model.graph.output[0].name
    np.testing.assert_array_equal(_bits(a.outputs[out]), _bits(b.outputs[out]))


def test_a_chain_the_builder_refuses_is_lowered_without_it():
    """Random run 236 (conv, average pool, conv, conv, add): chained from its first or its
    second layer, the add (a ring's consumer) would have to wait for tasks of two other
    engines, which one dependency distance cannot express; ``lower`` lowers again with no
    chain starting there, and the last three layers still chain."""
    model, feeds = random_run(236)
    config = SMALL.replace(buffer_kib=16)
    compiled, a = _run2(model, config, feeds, schedule="layer")
    _, b = _run2(model, config, feeds, schedule="layer", chain=False)
    out = model.graph.output[0].name
    np.testing.assert_array_equal(_bits(a.outputs[out]), _bits(b.outputs[out]))
    chained = [r["how"].startswith("chained: ") for r in compiled.plan]
    assert chained == [False, False, True, True, True], compiled.plan


def test_chain_on_two_cores():
    """A conv split over two cores keeps its output in a plain dataset for the pool; the
    rest of the chain is the same."""
    model = long_chain()
    xs = _long_inputs(6)
    chained, a = _run2(model, ECP5, xs)
    _, b = _run2(model, ECP5, xs, cores=1, chain=False)
    np.testing.assert_array_equal(_bits(a.outputs["out"]), _bits(b.outputs["out"]))
    rows = [r for r in chained.plan if r["op"] == "Conv"]
    assert all(r["cores"] == 2 and "kept in the buffer" in r["how"] for r in rows)


# ---- on the RTL ------------------------------------------------------------------------------

def _rtl_equals_golden(program, inputs, name):
    """Run ``program`` on the golden model and the RTL; output ``name`` must agree bit for bit.
    Returns the golden output and the RTL's cycles."""
    golden = run(program, inputs, "golden").outputs[name]
    rtl = run(program, inputs, "rtl")
    np.testing.assert_array_equal(_bits(golden), _bits(rtl.outputs[name]))
    return golden, rtl.cycles

@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["fp16", "int8"])
def test_digits_two_cores_rtl_equals_golden_and_is_faster(fmt, split):
    kw = {"calibration": {"input": split[0][:50]}} if fmt == "int8" else {}
    x = {"input": split[2][:1]}
    cycles, outs = [], []
    for cores in (1, 2):
        c = compile_model(MODEL, ECP5, fmt=fmt, cores=cores, **kw)
        golden, n = _rtl_equals_golden(c.program, x, "logits")
        outs.append(golden)
        cycles.append(n)
    np.testing.assert_array_equal(_bits(outs[0]), _bits(outs[1]))
    assert cycles[1] < cycles[0]


@pytest.mark.slow
def test_conv_pool_two_cores_rtl_equals_golden_and_is_faster():
    """Two cores with the pair kept in the buffer against one core with a ring."""
    model = conv_then("MaxPool", c=8, k=32, size=12)
    x = _input(11, (1, 8, 12, 12))
    cycles, outs = [], []
    for cores in (1, 2):
        c = compile_model(model, ECP5, cores=cores)
        golden, n = _rtl_equals_golden(c.program, {"x": x}, "out")
        outs.append(golden)
        cycles.append(n)
    np.testing.assert_array_equal(_bits(outs[0]), _bits(outs[1]))
    assert cycles[1] < cycles[0]


@pytest.mark.slow
@pytest.mark.parametrize("op", ["MaxPool", "Add", "MaxPool-padded"])
def test_chain_rtl_equals_golden_and_is_faster(op):
    model = conv_then(op.split("-")[0], pool_pads=1 if "padded" in op else 0)
    x = _input(8, (1, 4, 10, 10))
    cycles = []
    for chain in (True, False):
        c = compile_model(model, SMALL, chain=chain)
        cycles.append(_rtl_equals_golden(c.program, {"x": x}, "out")[1])
    assert cycles[0] < cycles[1]


@pytest.mark.slow
def test_long_chain_rtl_equals_golden_and_is_faster():
    model = long_chain(size=16)
    xs = _long_inputs(9, size=16)
    cycles = []
    for chain in (True, False):
        c = compile_model(model, SMALL, chain=chain)
        cycles.append(_rtl_equals_golden(c.program, xs, "out")[1])
    assert cycles[0] < cycles[1]
