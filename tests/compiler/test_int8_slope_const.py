# amaranth: UnusedElaboratable=no
"""``--format int8``: ``LeakyRelu`` and ``PRelu`` (``npu_compiler.int8elt``), and ``Add``,
``Sub``, ``Mul``, ``Div`` with a constant tensor that is neither a scalar nor one value per
channel (``npu_compiler.int8``; ``docs/compiler.md``, "int8").

Against onnxruntime on the float model the error is quantization's. The calibration runs on
the very inputs of the test, so no tensor exceeds its range (``max |t| = 127 s_t``), and the
bounds follow from the steps (``s_x`` the input's, ``s_y`` the output's, ``a`` the slope):

- leaky ReLU and a scalar ``PRelu`` (one mixed-format layer, binary32 inside, one rounding to
  int8): the input's rounding times the larger slope, ``max(1, |a|) s_x / 2``, the output's
  ``s_y / 2``, and three binary32 roundings (the scale ``s_x / s_y``, the product, the
  slope's) of a value of at most 128 output steps: ``2^-20 127 s_y`` covers them.
- ``PRelu`` with one slope per channel (planar engine): the input's rounding as above; the
  rescaled code rounded to binary16 (``2^-11`` of at most ``127 s_x``, times the slope on the
  negative side) and the slope rounded to binary16 (``2^-11 |a|`` of at most ``127 s_x``):
  ``max(1, |a|) s_x (1/2 + 2^-10 127)``; the ``fma``'s two binary32 roundings
  (``2^-20 127 s_y``) and the final one (``s_y / 2``).
- a constant tensor ``c`` is an int8 operand of scale ``s_c = max |c| / 127`` (for ``Div``,
  ``c`` is the divisor's reciprocal and the operation a ``Mul``), so the bounds of two
  activations hold (``tests/compiler/test_int8_eltwise.py``) with ``s_c`` for the second
  operand's scale.

Between the buffer-resident and the system-memory lowering, and between the golden and the
rtl backends, there is no tolerance: bit for bit.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_cli.main import main
from npu_compiler.compile import compile_model
from npu_compiler.graph import CompileError
from npu_runtime.runtime import reference, run, session
from npu_spec.config import preset

from .models import _init
from .test_int8_eltwise import activation_model, bound

SHAPE = (1, 8, 6, 10)


def _model(nodes, inits, shape=SHAPE, out_shape=None, opset=13):
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape or shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(shape=SHAPE, n=4, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal((n,) + tuple(shape))
            .astype(np.float32)}


def _run(program, feeds, backend="golden"):
    return np.concatenate([run(program, {"x": x}, backend).outputs["y"] for x in feeds["x"]])


def _reference(model, feeds):
    return np.concatenate([reference(model, {"x": x})["y"] for x in feeds["x"]])


def _scales(c):
    meta = c.program.metadata["compiler"]
    return meta["inputs"][0]["scale"], meta["outputs"][0]["scale"]


def _buffer_and_memory(model, feeds):
    """``(compiled on small, [outputs on small, outputs with a 1 KiB buffer])``: the second
    lowering keeps every activation in system memory."""
    got, first = [], None
    for cfg in (preset("small"), preset("small").replace(buffer_kib=1)):
        c = compile_model(model, cfg, fmt="int8", calibration=feeds, evaluator=session)
        first = first or c
        got.append(_run(c.program, feeds))
    assert all("in system memory" in r["how"] for r in c.plan)
    return first, got


# ---- leaky ReLU and PRelu ------------------------------------------------------------------

def slope_model(case, seed=1):
    """``LeakyRelu`` (alpha 0.13), ``PRelu`` with a scalar slope (0.3 or -0.4), or with one
    slope per channel (shape ``(C, 1, 1)`` or ``(1, C, 1, 1)``, random, some negative, some
    above one)."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    if case == "leaky":
        return _model([n("LeakyRelu", ["x"], ["y"], alpha=0.13, name="act")], [])
    slope = {"scalar": np.array([0.3]), "negative": np.array(-0.4),
             "channel": rng.standard_normal((SHAPE[1], 1, 1)) * 0.8,
             "channel4": rng.standard_normal((1, SHAPE[1], 1, 1)) * 0.8}[case]
    s = numpy_helper.from_array(np.asarray(slope, np.float32), "slope")
    return _model([n("PRelu", ["x", "slope"], ["y"], name="act")], [s])


def slope_bound(case, model, sx, sy):
    """The largest error against the float result (module docstring)."""
    if case == "leaky":
        a = 0.13
    else:
        a = np.abs(numpy_helper.to_array(model.graph.initializer[0])).max()
    if case.startswith("channel"):
        return max(1.0, a) * sx * (0.5 + 2 ** -10 * 127) + sy / 2 + 2 ** -20 * 127 * sy
    return max(1.0, a) * sx / 2 + sy / 2 + 2 ** -20 * 127 * sy


@pytest.mark.parametrize("case, engine, tasks", [
    ("leaky", "NE", 2), ("scalar", "NE", 2), ("negative", "NE", 2),
    ("channel", "PE", 5), ("channel4", "PE", 5)])
def test_slope_against_onnxruntime_and_in_memory(case, engine, tasks):
    """A scalar slope is one neural task (and its kernel load); one slope per channel is a
    load of the slopes and four planar tasks. Within the bound of onnxruntime, and the same
    bits with the activations in system memory."""
    model = slope_model(case)
    feeds = _feeds()
    c, got = _buffer_and_memory(model, feeds)
    assert [(r["op"], r["engine"], r["tasks"]) for r in c.plan] == [(model.graph.node[0]
                                                                     .op_type, engine, tasks)]
    err = np.abs(got[0] - _reference(model, feeds)).max()
    limit = slope_bound(case, model, *_scales(c))
    assert 0 < err <= limit, (err, limit)
    assert got[0].tobytes() == got[1].tobytes()


def test_fused_leaky_relu_equals_the_layer_then_the_activation():
    """A ``Conv`` + ``LeakyRelu`` fused by the front end gives the bits of the same two nodes
    unfused (the conv's output also a graph output), in the buffer and in memory mode."""
    feeds = {"x": (np.random.default_rng(2).standard_normal((2, 1, 4, 12, 12)) * 2)
             .astype(np.float32)}
    got = []
    for fused, cfg in (("fused", preset("small")), ("unfused", preset("small")),
                       ("fused", preset("small").replace(buffer_kib=1))):
        model = activation_model("LeakyRelu", fused)
        c = compile_model(model, cfg, fmt="int8", calibration=feeds, evaluator=session)
        assert [r["op"] for r in c.plan] == (["Conv"] if fused == "fused"
                                             else ["Conv", "LeakyRelu"])
        got.append(_run(c.program, feeds).tobytes())
    assert got[0] == got[1] == got[2]


def test_per_channel_slopes_apply_per_channel():
    """Slopes that differ by channel: a negative input gives ``slope[c] x`` in channel ``c``
    within the bound, so no channel took another's slope (the slopes are 0.1, 0.2, ...)."""
    slope = (np.arange(1, SHAPE[1] + 1) / 10).reshape(-1, 1, 1).astype(np.float32)
    model = _model([helper.make_node("PRelu", ["x", "s"], ["y"], name="act")],
                   [numpy_helper.from_array(slope, "s")])
    feeds = {"x": -np.abs(_feeds()["x"])}
    c = compile_model(model, preset("small"), fmt="int8", calibration=feeds,
                      evaluator=session)
    got = _run(c.program, feeds)
    sx, sy = _scales(c)
    err = np.abs(got - feeds["x"][:, 0] * slope).max()
    assert err <= sx * (0.5 + 2 ** -10 * 127) + sy / 2 + 2 ** -20 * 127 * sy, err


@pytest.mark.parametrize("symmetric", [True, False], ids=["int8-sym", "uint8-asym"])
def test_qdq_leaky_relu_within_one_step(tmp_path, symmetric):
    """A quantized model (onnxruntime's ``quantize_static``, QDQ) with ``LeakyRelu`` between
    ``DequantizeLinear`` and ``QuantizeLinear`` after each of two convs: the mixed-format
    layer with the model's scales and zero points (bias ``-z_x``, the post-processor's zero
    point ``z_y``). onnxruntime rounds the float result of the same codes, so the two differ
    by at most one step (``tests/compiler/test_qdq.py``); in memory mode the same bits."""
    from .test_qdq import _opset, quantize, steps
    rng = np.random.default_rng(9)
    n = helper.make_node
    inits = [_init(rng, k, s, 0.5) for k, s in (("w1", (4, 2, 3, 3)), ("b1", (4,)),
                                                 ("w2", (4, 4, 3, 3)), ("b2", (4,)))]
    graph = helper.make_graph(
        [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
         n("LeakyRelu", ["c1"], ["r1"], alpha=0.2),
         n("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
         n("LeakyRelu", ["c2"], ["y"], alpha=0.05)], "leaky",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], inits)
    cal = [{"x": rng.standard_normal((1, 2, 6, 6)).astype(np.float32)} for _ in range(16)]
    qmodel = quantize(_opset(graph), cal, tmp_path, "QDQ", symmetric)
    assert [nd.op_type for nd in qmodel.graph.node].count("LeakyRelu") == 2
    x = {"x": rng.standard_normal((3, 2, 6, 6)).astype(np.float32)}
    got = []
    for cfg in (preset("small"), preset("small").replace(buffer_kib=1)):
        compiled = compile_model(qmodel, cfg, fmt="int8")
        assert [(r["op"], r["engine"]) for r in compiled.plan] == [("Conv", "NE"),
                                                                   ("LeakyRelu", "NE")] * 2
        assert steps(qmodel, compiled, x, "y").max() <= 1 + 1e-6
        got.append(run(compiled.program, x, "golden").outputs["y"].tobytes())
    assert got[0] == got[1]


@pytest.mark.parametrize("act", ["LeakyRelu", "Sigmoid"])
def test_fused_activation_in_a_depth_first_chain(act):
    """Conv + ``act`` (fused, then run as a layer of its own after the conv), Conv + Relu, on
    a 4x48x48 input with an 8 KiB buffer (memory mode): a chain the depth-first schedule
    would take, but the split activation has no band function, so its layers run one after
    the other; the same bits as ``--schedule layer`` and within 4 output steps of
    onnxruntime (two layers, each a few roundings)."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), n(act, ["a"], ["b"]),
             n("Conv", ["b", "w2"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["y"])]
    model = _model(nodes, [_init(rng, "w1", (8, 4, 3, 3)), _init(rng, "w2", (8, 8, 3, 3))],
                   (1, 4, 48, 48), (1, 8, 48, 48))
    feeds = _feeds((1, 4, 48, 48), n=2, seed=1)
    x = {"x": feeds["x"][:1]}
    got = []
    for schedule in ("depth-first", "layer"):
        c = compile_model(model, preset("small").replace(buffer_kib=8), fmt="int8",
                          calibration=feeds, evaluator=session, schedule=schedule)
        assert [r["how"] for r in c.plan] == ["in system memory"] * 2
        got.append(_run(c.program, x))
    assert got[0].tobytes() == got[1].tobytes()
    err = np.abs(got[0] - _reference(model, x)).max()
    assert 0 < err <= 4 * _scales(c)[1], err


# ---- constant tensors ----------------------------------------------------------------------

def const_model(op, xshape, cshape, reverse=False, seed=1):
    """``y = op(x, c)`` (``op(c, x)`` when ``reverse``) with a random constant ``c`` (for
    ``Div`` kept away from zero)."""
    c = np.random.default_rng(seed).standard_normal(cshape).astype(np.float32)
    if op == "Div":
        c = np.sign(c) * (np.abs(c) + 0.5)
    ins = ["c", "x"] if reverse else ["x", "c"]
    return _model([helper.make_node(op, ins, ["y"], name="elt")],
                  [numpy_helper.from_array(c, "c")], xshape,
                  list(np.broadcast_shapes(xshape, cshape))), c


#: ``(op, x shape, constant shape, reverse)``: a plane shared by the channels (the planar
#: engine's broadcast vector), a constant of the input's shape, a rank-2 divisor, ``c - x``,
#: ``c / x`` (a scalar and a plane over the activation),
#: a constant larger than ``x`` (``x`` the vector), shapes of which neither is the output's
#: and a constant varying over two separate blocks of axes (both broadcast to the output's
#: shape at compile time).
CONSTANTS = [("Add", SHAPE, (1, 1, 6, 10), False), ("Mul", SHAPE, SHAPE, False),
             ("Div", SHAPE, (6, 10), False), ("Sub", SHAPE, SHAPE, True),
             ("Mul", (1, 1, 6, 10), SHAPE, False), ("Add", (1, 8, 1, 1), (1, 1, 6, 10), False),
             ("Mul", SHAPE, (1, 8, 1, 10), False), ("Sub", SHAPE, (1, 1, 6, 1), False),
             ("Div", SHAPE, (), True), ("Div", SHAPE, (1, 1, 6, 10), True)]


@pytest.mark.parametrize("op, xshape, cshape, reverse", CONSTANTS)
def test_constant_tensor_against_onnxruntime_and_in_memory(op, xshape, cshape, reverse):
    """The constant quantized with its own scale and loaded (one DMA task), then the three
    planar tasks of two activations (for ``c / x`` those of :func:`div_bound`); within the
    bound of onnxruntime; the same bits in system memory."""
    model, const = const_model(op, xshape, cshape, reverse)
    feeds = _feeds(xshape)
    if op == "Div" and reverse:     # a divisor away from zero
        feeds["x"] = np.sign(feeds["x"]) * (np.abs(feeds["x"]) + 0.5)
    c, got = _buffer_and_memory(model, feeds)
    assert [(r["op"], r["engine"], r["tasks"]) for r in c.plan] == [(op, "PE", 4)]
    effective = 1.0 / const if op == "Div" and not reverse else const
    s_c = float(np.abs(effective.astype(np.float64)).max()) / 127
    sx, sy = _scales(c)
    if op == "Div" and reverse:
        limit = div_bound(s_c, sx, sy, 127 * s_c, np.abs(feeds["x"]).min())
    else:
        limit = bound("Mul" if op == "Div" else op, sx, s_c, sy)
    err = np.abs(got[0] - _reference(model, feeds)).max()
    assert 0 < err <= limit, (err, limit)
    assert got[0].tobytes() == got[1].tobytes()


def test_constant_divisor_scales_each_element():
    """``x / c`` with ``c`` a plane of 1, 1/2, 1/4, 1/8 in turn: an input of ones gives
    ``1 / c``, element by element, within the bound (an element of the wrong place is off by
    at least 1)."""
    c = (2.0 ** -(np.arange(60) % 4)).reshape(1, 1, 6, 10).astype(np.float32)
    model = _model([helper.make_node("Div", ["x", "c"], ["y"], name="elt")],
                   [numpy_helper.from_array(c, "c")])
    feeds = {"x": np.ones((1,) + SHAPE, np.float32)}
    comp = compile_model(model, preset("small"), fmt="int8", calibration=feeds,
                         evaluator=session)
    got = _run(comp.program, feeds)
    sx, sy = _scales(comp)
    assert np.abs(got - np.broadcast_to(1 / c, got.shape)).max() <= bound("Mul", sx, 8 / 127,
                                                                          sy)


# ---- division of two activations -----------------------------------------------------------

def div_bound(s_a, s_b, s_y, a_max, b_min):
    """The largest error of ``a / b`` (module docstring)."""
    b_q = b_min - s_b / 2
    return (s_a / (2 * b_q) + a_max * s_b / (2 * b_min * b_q) + s_y / 2
            + 2 ** -10 * 127 * s_y)


@pytest.mark.parametrize("sx, sv", [(SHAPE, SHAPE), (SHAPE, (1, 8, 1, 1)),
                                    ((1, 8, 1, 1), SHAPE), (SHAPE, (1, 1, 6, 10))])
def test_div_of_activations_against_onnxruntime_and_in_memory(sx, sv):
    """``x / v`` of two inputs, ``|v|`` in ``[0.5, 2]``, with broadcast either way: the
    divisor's reciprocals (one planar reduction), a copy of the dividend and one ``mul``;
    within :func:`div_bound` of onnxruntime; memory mode (a 1 KiB buffer) bit for bit."""
    from .test_int8_eltwise import binary_model
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4,) + sx).astype(np.float32),
             "v": (np.sign(rng.standard_normal((4,) + sv)) * rng.uniform(0.5, 2, (4,) + sv))
             .astype(np.float32)}
    model = binary_model("Div", sx, sv)
    got = []
    for cfg in (preset("small"), preset("small").replace(buffer_kib=1)):
        c = compile_model(model, cfg, fmt="int8", calibration=feeds, evaluator=session)
        got.append(np.concatenate([run(c.program, {k: v[i] for k, v in feeds.items()},
                                       "golden").outputs["y"] for i in range(4)]))
        if cfg.buffer_kib != 1:
            assert [(r["op"], r["engine"], r["tasks"]) for r in c.plan] == [("Div", "PE", 3)]
            meta = c.program.metadata["compiler"]
            s = {t["name"]: t["scale"] for t in meta["inputs"] + meta["outputs"]}
    assert "in system memory" in c.plan[0]["how"]
    ref = np.concatenate([reference(model, {k: v[i] for k, v in feeds.items()})["y"]
                          for i in range(4)])
    err = np.abs(got[0] - ref).max()
    limit = div_bound(s["x"], s["v"], s["y"], np.abs(feeds["x"]).max(),
                      np.abs(feeds["v"]).min())
    assert 0 < err <= limit, (err, limit)
    assert got[0].tobytes() == got[1].tobytes()


def test_division_by_zero_saturates():
    """A divisor code of 0 gives an infinite reciprocal: ``x / 0`` saturates to the int8
    limit of the sign of ``x`` (127 or -128; ``0 / 0`` is NaN, which becomes 0), as the
    float result quantized would."""
    from .test_int8_eltwise import binary_model
    model = binary_model("Div", SHAPE, SHAPE)
    rng = np.random.default_rng(3)
    cal = {"x": rng.standard_normal((2,) + SHAPE).astype(np.float32),
           "v": rng.uniform(0.5, 2, (2,) + SHAPE).astype(np.float32)}
    c = compile_model(model, preset("small"), fmt="int8", calibration=cal, evaluator=session)
    s_y = c.program.metadata["compiler"]["outputs"][0]["scale"]
    x = np.tile(np.array([-1.0, 0.0, 1.0], np.float32), 160).reshape(SHAPE)
    y = run(c.program, {"x": x, "v": np.zeros(SHAPE, np.float32)}, "golden").outputs["y"]
    limit = np.where(x > 0, 127, np.where(x < 0, -128, 0)) * s_y
    assert np.array_equal(y, limit.astype(np.float32))


# ---- what stays unsupported: one line naming the node and the operator ---------------------

@pytest.mark.parametrize("model, message", [
    (_model([helper.make_node("PRelu", ["x", "s"], ["y"], name="act")],
            [_init(np.random.default_rng(0), "s", (1, 1, 6, 10))]),
     r"node 'act' \(PRelu\): a slope of shape \(1, 1, 6, 10\) over \(1, 8, 6, 10\) \(a "
     r"scalar or one slope per channel only\) \(--format int8\)"),
    (helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["s"]),
         helper.make_node("PRelu", ["x", "s"], ["y"], name="act")], "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)]),
        opset_imports=[helper.make_opsetid("", 13)]),
     r"node 'act' \(PRelu\): the slope must be a constant \(--format int8\)"),
], ids=["prelu_plane", "prelu_activation_slope"])
def test_unsupported_is_one_line(model, message, tmp_path, capsys):
    feeds = _feeds(n=1)
    with pytest.raises(CompileError, match=message):
        compile_model(model, preset("small"), fmt="int8", calibration=feeds,
                      evaluator=session)
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "cal.npz", **feeds)
    assert main(["compile", str(tmp_path / "m.onnx"), "--format", "int8", "--calibration",
                 str(tmp_path / "cal.npz"), "-o", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("npu: error")]
    assert "Traceback" not in err and len(errors) == 1, err
    assert errors[0].startswith("npu: error: node"), err


@pytest.mark.parametrize("case", ["leaky", "channel"])
def test_slope_without_the_datapath_it_needs_is_one_line(case):
    """A scalar slope needs the mixed datapath; per-channel slopes the planar engine's
    binary16 (a preset with int8 only has neither)."""
    cfg = preset("small").replace(formats=("int8",))
    with pytest.raises(CompileError, match=r"node 'act' \((LeakyRelu|PRelu)\): .*"):
        compile_model(slope_model(case), cfg, fmt="int8", calibration=_feeds(n=1))


# ---- rtl -----------------------------------------------------------------------------------

def mixed_network(seed=4):
    """A conv with a fused leaky ReLU, ``PRelu`` per channel, ``Mul`` by a ``(1, 1, H, W)``
    plane, ``Div`` by a ``(1, C, H, W)`` tensor, ``Sub`` of a ``(1, C, 1, W)`` constant, and
    ``Div`` by an activation (the sigmoid of the leaky ReLU's output)."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    div = rng.standard_normal((1, 8, 6, 10))
    inits = [_init(rng, "w", (8, 3, 3, 3), 0.4), _init(rng, "b", (8,)),
             _init(rng, "slope", (8, 1, 1), 0.5), _init(rng, "plane", (1, 1, 6, 10), 1.0),
             numpy_helper.from_array((np.sign(div) * (np.abs(div) + 0.5)).astype(np.float32),
                                     "div"),
             _init(rng, "cols", (1, 8, 1, 10), 0.5)]
    nodes = [n("Conv", ["x", "w", "b"], ["f"], pads=[1, 1, 1, 1]),
             n("LeakyRelu", ["f"], ["l"], alpha=0.1),
             n("PRelu", ["l", "slope"], ["p"]), n("Mul", ["p", "plane"], ["m"]),
             n("Div", ["m", "div"], ["d"]), n("Sub", ["d", "cols"], ["e"]),
             n("Sigmoid", ["l"], ["g"]), n("Div", ["e", "g"], ["y"])]
    return _model(nodes, inits, (1, 3, 6, 10), SHAPE)


@pytest.mark.slow
def test_reciprocal_task_rtl_cycles_and_estimate():
    """``Div`` of two ``(1, 8, 6, 10)`` activations on the rtl backend: the golden bits, and
    the reciprocal reduction (480 groups through the serial post-processor) within 5% of the
    timing model's estimate (``npu_model.timing.REDUCE_POST``)."""
    from npu_model import timing

    from .test_int8_eltwise import binary_model
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(SHAPE).astype(np.float32),
             "v": rng.uniform(0.5, 2, SHAPE).astype(np.float32)}
    c = compile_model(binary_model("Div", SHAPE, SHAPE), preset("small"), fmt="int8",
                      calibration=feeds, evaluator=session)
    rtl = run(c.program, feeds, "rtl")
    assert rtl.outputs["y"].tobytes() == run(c.program, feeds, "golden").outputs["y"].tobytes()
    longest = max(rtl.tasks, key=lambda t: t[3] - t[2])
    assert longest[1] == "PLANAR" and longest[3] - longest[2] > 480 * 70
    est = {t.task_id: t.end - t.start for t in timing.estimate(c.program).tasks}
    assert abs(est[longest[0]] / (longest[3] - longest[2]) - 1) < 0.05


@pytest.mark.slow
@pytest.mark.parametrize("buffer_kib", [None, 1], ids=["buffer", "memory"])
def test_network_rtl_equals_golden(buffer_kib):
    """The network of :func:`mixed_network` on ``small`` (and with a 1 KiB buffer, every
    activation in system memory): the rtl backend gives the golden backend's bits."""
    cfg = preset("small") if buffer_kib is None else preset("small").replace(buffer_kib=1)
    feeds = _feeds((1, 3, 6, 10), n=4, seed=5)
    c = compile_model(mixed_network(), cfg, fmt="int8", calibration=feeds, evaluator=session)
    assert [r["op"] for r in c.plan] == ["Conv", "PRelu", "Mul", "Div", "Sub", "Sigmoid",
                                         "Div"]
    x = {"x": feeds["x"][:1]}
    assert _run(c.program, x, "rtl").tobytes() == _run(c.program, x).tobytes()
