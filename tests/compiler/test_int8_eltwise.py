"""``--format int8``: ``Add``, ``Sub`` and ``Mul`` of two activations, with broadcast, and
the piecewise-linear activations ``Sigmoid``, ``Tanh``, ``Gelu`` (``npu_compiler.int8elt``;
``docs/compiler.md``, "int8").

Against onnxruntime on the float model the error is quantization's. With the calibration run
on the very inputs of the test, no tensor exceeds its range (``max |t| = 127 s_t``), so the
bound is stated from the steps (``s_x``, ``s_v`` of the operands, ``s_y`` of the result):

- ``Add`` / ``Sub``: each operand rounded to its code (``s / 2`` each), each rescaled code
  rounded to binary16 (``2^-11`` relative, ``2^-10`` with the binary32 rounding before it, of
  at most ``127 s``), the result rounded to int8 (``s_y / 2``):
  ``(s_x + s_v + s_y) / 2 + 2^-10 127 (s_x + s_v)``.
- ``Mul``: ``x v - (x + e_x)(v + e_v)`` with ``|e| <= s / 2`` is at most
  ``127 s_x s_v + s_x s_v / 4``; the rescaled vector rounded to binary16 moves the product
  by ``2^-10`` of at most ``127 s_y``; the final rounding ``s_y / 2``.
- ``Sigmoid``, ``Tanh``, ``Gelu``: the input's rounding times the function's largest slope
  ``L`` (1/4, 1, 1.13), the table's error after binary16 (``E``: 6.0e-4, 9.0e-4, 1.4e-3,
  ``docs/postproc.md``), the binary16 rounding of a result of up to ``127 s_y`` (``2^-11``
  relative, for GELU's tail ``x``) and the final rounding:
  ``L s_x / 2 + E + 2^-11 127 s_y + s_y / 2``.
- ``Clip``, ``HardSigmoid`` (slope ``alpha``): ``alpha s_x / 2 + s_y / 2``; ``HardSwish``
  (slope up to 3/2): ``3/2 s_x / 2``, the gate's rounding (``1/254`` times ``|x| <= 127
  s_x``), the product's binary16 and final roundings: ``5/4 s_x + (1/2 + 2^-10 127) s_y``.

Between the buffer-resident and the system-memory lowering, and between the golden and the
rtl backends, there is no tolerance: bit for bit.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_cli.main import main
from npu_compiler.compile import compile_model
from npu_compiler.graph import CompileError
from npu_runtime.runtime import reference, run, session
from npu_spec.config import preset

from .models import _init

#: (full operand, broadcast operand) shapes: per channel, a plane shared by the channels, a
#: scalar tensor, equal shapes, one value per row, and the broadcast operand first.
SHAPES = [((1, 8, 6, 10), (1, 8, 1, 1)), ((1, 8, 6, 10), (1, 1, 6, 10)),
          ((1, 8, 6, 10), (1, 1, 1, 1)), ((1, 8, 6, 10), (1, 8, 6, 10)),
          ((1, 8, 6, 10), (1, 1, 6, 1)), ((1, 8, 1, 1), (1, 8, 6, 10))]


def binary_model(op, sx, sv):
    """``y = op(x, v)`` of two graph inputs."""
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "v"], ["y"], name="elt")], "elt",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, sx),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, sv)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                       list(np.broadcast_shapes(sx, sv)))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _inputs(sx, sv, n=4, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n,) + sx).astype(np.float32),
            "v": rng.standard_normal((n,) + sv).astype(np.float32)}


def _run(program, feeds, backend="golden"):
    n = len(next(iter(feeds.values())))
    return np.concatenate([run(program, {k: v[i] for k, v in feeds.items()},
                               backend).outputs["y"] for i in range(n)])


def _scales(c):
    meta = c.program.metadata["compiler"]
    s = {t["name"]: t["scale"] for t in meta["inputs"] + meta["outputs"]}
    return s["x"], s["v"], s["y"]


def bound(op, sx, sv, sy):
    """The largest error against the float result (module docstring)."""
    if op == "Mul":
        return 127 * sx * sv + sx * sv / 4 + sy / 2 + 2 ** -10 * 127 * sy
    return (sx + sv + sy) / 2 + 2 ** -10 * 127 * (sx + sv)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("sx, sv", SHAPES)
def test_binary_against_onnxruntime(op, sx, sv):
    model = binary_model(op, sx, sv)
    feeds = _inputs(sx, sv)
    c = compile_model(model, preset("small"), fmt="int8", calibration=feeds,
                      evaluator=session)
    assert [(r["op"], r["engine"], r["tasks"]) for r in c.plan] == [(op, "PE", 3)]
    got = _run(c.program, feeds)
    ref = np.concatenate([reference(model, {k: v[i] for k, v in feeds.items()})["y"]
                          for i in range(len(feeds["x"]))])
    err = np.abs(got - ref).max()
    assert 0 < err <= bound(op, *_scales(c)), (err, bound(op, *_scales(c)))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("sx, sv", [((1, 8, 20, 30), (1, 8, 1, 1)),
                                    ((1, 8, 20, 30), (1, 1, 20, 30)),
                                    ((1, 8, 20, 30), (1, 1, 20, 1)),
                                    ((1, 8, 1, 1), (1, 8, 20, 30)),
                                    ((1, 8, 20, 30), (1, 8, 20, 30))])
def test_memory_mode_equals_buffer_bit_for_bit(op, sx, sv):
    """A 4 KiB buffer (2,048 elements) does not hold the 4,800-element operand: memory mode,
    in boxes with the vector's part loaded beside each; the outputs equal those of the
    buffer-resident lowering on ``small``."""
    model = binary_model(op, sx, sv)
    feeds = _inputs(sx, sv, n=2, seed=1)
    outs = []
    for cfg in (preset("small"), preset("small").replace(buffer_kib=4)):
        c = compile_model(model, cfg, fmt="int8", calibration=feeds, evaluator=session)
        outs.append(_run(c.program, feeds))
    assert "in system memory" in c.plan[0]["how"] and c.plan[0]["tasks"] > 3
    assert outs[0].tobytes() == outs[1].tobytes()


def squeeze_excitation(c=8, size=6, seed=3, stride=1):
    """A conv, then squeeze-excitation (global average pool, 1x1 conv + Relu, 1x1 conv +
    Sigmoid as the gate), ``x * gate`` (a ``(1, C, H, W)`` times a
    ``(1, C, 1, 1)``), the residual ``+ f``, then ``- m`` with ``m`` the mean over the
    channels (a 1x1 conv to one channel: a ``(1, 1, H, W)`` plane broadcast over them).
    ``stride``: of the first conv (a large input, small activations after it)."""
    rng = np.random.default_rng(seed)
    n = helper.make_node

    def init(name, shape, scale=0.4):
        return _init(rng, name, shape, scale)
    graph = helper.make_graph(
        [n("Conv", ["x", "w", "b"], ["f"], pads=[1, 1, 1, 1], strides=[stride, stride]),
         n("GlobalAveragePool", ["f"], ["g"]),
         n("Conv", ["g", "w1", "b1"], ["h"]), n("Relu", ["h"], ["hr"]),
         n("Conv", ["hr", "w2", "b2"], ["e"]), n("Sigmoid", ["e"], ["gate"]),
         n("Mul", ["f", "gate"], ["s"], name="excite"),
         n("Add", ["s", "f"], ["r"], name="residual"),
         n("Conv", ["r", "wm"], ["m"]),
         n("Sub", ["r", "m"], ["y"], name="centre")],
        "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, (size - 1) // stride + 1,
                                                                 (size - 1) // stride + 1])],
        [init("w", (c, 3, 3, 3)), init("b", (c,)), init("w1", (c // 2, c, 1, 1)),
         init("b1", (c // 2,)), init("w2", (c, c // 2, 1, 1)), init("b2", (c,), 1.0),
         numpy_helper.from_array(np.full((1, c, 1, 1), 1.0 / c, np.float32), "wm")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _se_compiled(cfg=None):
    rng = np.random.default_rng(4)
    cal = {"x": rng.standard_normal((16, 1, 3, 6, 6)).astype(np.float32)}
    return compile_model(squeeze_excitation(), cfg or preset("small"), fmt="int8",
                         calibration=cal, evaluator=session)


def test_squeeze_excitation_against_onnxruntime():
    c = _se_compiled()
    rows = {r["node"]: r for r in c.plan}
    assert [rows[k]["engine"] for k in ("excite", "residual", "centre")] == ["PE"] * 3
    model = squeeze_excitation()
    x = np.random.default_rng(5).standard_normal((3, 1, 3, 6, 6)).astype(np.float32)
    got = _run(c.program, {"x": x}).reshape(3, 8, 6, 6)
    ref = np.stack([reference(model, {"x": xi})["y"][0] for xi in x])
    # Five int8 layers in a row, each adding about one step of its own scale: a few steps
    # of the output's.
    step = c.program.metadata["compiler"]["outputs"][0]["scale"]
    assert 0 < np.abs(got - ref).max() < 4 * step


def test_squeeze_excitation_in_memory_equals_buffer():
    x = {"x": np.random.default_rng(6).standard_normal((1, 1, 3, 6, 6)).astype(np.float32)}
    buffer = _run(_se_compiled().program, x)
    small = _se_compiled(preset("small").replace(buffer_kib=1))
    assert all("in system memory" in r["how"] for r in small.plan if r["op"] != "Flatten")
    assert _run(small.program, x).tobytes() == buffer.tobytes()


def test_broadcast_rtl_equals_golden():
    """One quick rtl run: a per-channel ``Mul`` (the squeeze-excitation shape)."""
    model = binary_model("Mul", (1, 8, 6, 10), (1, 8, 1, 1))
    feeds = _inputs((1, 8, 6, 10), (1, 8, 1, 1), n=1)
    c = compile_model(model, preset("small"), fmt="int8", calibration=feeds,
                      evaluator=session)
    assert _run(c.program, feeds, "rtl").tobytes() == _run(c.program, feeds).tobytes()


@pytest.mark.slow
@pytest.mark.parametrize("size, stride", [(6, 1), (112, 7)], ids=["buffer", "memory"])
def test_squeeze_excitation_rtl_equals_golden(size, stride):
    """On ``small`` (its Verilator build shared with the other tests): at 6x6 in the buffer;
    with a 3x112x112 input (37,632 codes, more than the buffer's 32,768) in memory mode."""
    rng = np.random.default_rng(7)
    model = squeeze_excitation(size=size, stride=stride)
    cal = {"x": rng.standard_normal((4, 1, 3, size, size)).astype(np.float32)}
    c = compile_model(model, preset("small"), fmt="int8", calibration=cal, evaluator=session)
    assert ("in system memory" in c.plan[0]["how"]) == (stride > 1)
    x = {"x": cal["x"][:1]}
    assert _run(c.program, x, "rtl").tobytes() == _run(c.program, x).tobytes()


@pytest.mark.parametrize("op, sx, sv, message", [
    ("Add", (1, 4, 1, 6), (1, 1, 5, 1),
     r"node 'elt' \(Add\): broadcast of \(1, 4, 1, 6\) and \(1, 1, 5, 1\) with neither "
     r"the output's shape \(--format int8\)"),
    ("Mul", (1, 4, 5, 6), (1, 4, 1, 6),
     r"node 'elt' \(Mul\): broadcast of \(1, 4, 1, 6\) over \(1, 4, 5, 6\) \(the smaller "
     r"operand must vary over one block of axes\)"),
])
def test_unsupported_binary_is_one_line(op, sx, sv, message, tmp_path, capsys):
    model = binary_model(op, sx, sv)
    feeds = _inputs(sx, sv, n=1)
    with pytest.raises(CompileError, match=message):
        compile_model(model, preset("small"), fmt="int8", calibration=feeds)
    import onnx
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "cal.npz", **feeds)
    assert main(["compile", str(tmp_path / "m.onnx"), "--format", "int8", "--calibration",
                 str(tmp_path / "cal.npz"), "-o", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and last.startswith("npu: error: node 'elt'"), err


#: ``(largest slope, table error after binary16)`` of each activation (module docstring).
PWL = {"Sigmoid": (0.25, 6.0e-4), "Tanh": (1.0, 9.0e-4), "Gelu": (1.13, 1.4e-3)}


def activation_model(op, fused, seed=0):
    """``op`` of the input, or (``fused``) of a 3x3 conv 4 -> 8 whose output is also a graph
    output (so the front end does not fuse it) or not (so it does)."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    w = numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.5)
                                .astype(np.float32), "w")
    nodes = [n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv")] if fused else []
    nodes.append(n(op, ["c" if fused else "x"], ["y"], name="act"))
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8 if fused else 4, 12, 12])]
    if fused == "unfused":
        outs.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 8, 12, 12]))
    graph = helper.make_graph(nodes, "act", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4, 12, 12])], outs, [w] if fused else [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _x(n, seed):
    return {"x": (np.random.default_rng(seed).standard_normal((n, 1, 4, 12, 12)) * 2)
            .astype(np.float32)}


@pytest.mark.parametrize("op", list(PWL))
def test_activation_against_onnxruntime(op):
    model = activation_model(op, False)
    feeds = _x(4, 1)
    c = compile_model(model, preset("small"), fmt="int8", calibration=feeds,
                      evaluator=session)
    assert [(r["op"], r["engine"], r["tasks"]) for r in c.plan] == [(op, "NE", 3)]
    got = _run(c.program, feeds)
    ref = np.concatenate([reference(model, {"x": x})["y"] for x in feeds["x"]])
    meta = c.program.metadata["compiler"]
    sx, sy = meta["inputs"][0]["scale"], meta["outputs"][0]["scale"]
    slope, table = PWL[op]
    limit = slope * sx / 2 + table + 2 ** -11 * 127 * sy + sy / 2
    err = np.abs(got - ref).max()
    assert 0 < err <= limit, (err, limit)


@pytest.mark.parametrize("op", list(PWL))
def test_fused_activation_equals_the_layer_then_the_activation(op):
    """A ``Conv`` + ``op`` fused by the front end gives the bits of the same two nodes
    unfused (the conv's output also a graph output): the conv at its own calibrated scale,
    then the activation; and in memory mode (a 1 KiB buffer) the same bits again."""
    feeds = _x(2, 2)
    got = []
    for fused, cfg in (("fused", preset("small")), ("unfused", preset("small")),
                       ("fused", preset("small").replace(buffer_kib=1))):
        model = activation_model(op, fused)
        c = compile_model(model, cfg, fmt="int8", calibration=feeds, evaluator=session)
        assert [r["op"] for r in c.plan] == (["Conv"] if fused == "fused" else ["Conv", op])
        got.append(_run(c.program, feeds).tobytes())
    assert got[0] == got[1] == got[2]


def test_activation_without_the_mixed_datapath_is_one_line():
    cfg = preset("small").replace(formats=("int8",))
    with pytest.raises(CompileError, match=r"node 'act' \(Sigmoid\): Sigmoid in int8 needs "
                                           r"the int8 x binary16 \(mixed\) datapath"):
        compile_model(activation_model("Sigmoid", False), cfg, fmt="int8", calibration=_x(1, 3))


def clamp_model(case):
    """``Clip(-1, 2)``, ``HardSigmoid(0.3, 0.4)``, ``HardSwish`` of the input, or HardSwish
    written as ``x * Clip(x + 3, 0, 6) / 6``."""
    n = helper.make_node

    def const(name, v):
        return numpy_helper.from_array(np.asarray(v, np.float32), name)
    nodes, inits = {
        "Clip": ([n("Clip", ["x", "lo", "hi"], ["y"], name="act")],
                 [const("lo", -1.0), const("hi", 2.0)]),
        "HardSigmoid": ([n("HardSigmoid", ["x"], ["y"], name="act", alpha=0.3, beta=0.4)], []),
        "HardSwish": ([n("HardSwish", ["x"], ["y"], name="act")], []),
        "written": ([n("Add", ["x", "three"], ["a"]), n("Clip", ["a", "zero", "six"], ["b"]),
                     n("Mul", ["x", "b"], ["m"]), n("Div", ["m", "six"], ["y"])],
                    [const("three", 3.0), const("zero", 0.0), const("six", 6.0)]),
    }[case]
    graph = helper.make_graph(nodes, case, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4, 12, 12])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4, 12, 12])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case", ["Clip", "HardSigmoid", "HardSwish", "written"])
def test_clamped_activation_against_onnxruntime_and_in_memory(case):
    model = clamp_model(case)
    feeds = {"x": (np.random.default_rng(8).standard_normal((4, 1, 4, 12, 12)) * 3)
             .astype(np.float32)}
    ref = np.concatenate([reference(model, {"x": x})["y"] for x in feeds["x"]])
    got = []
    for cfg in (preset("small"), preset("small").replace(buffer_kib=1)):
        c = compile_model(model, cfg, fmt="int8", calibration=feeds, evaluator=session)
        got.append(_run(c.program, feeds))
    meta = c.program.metadata["compiler"]
    sx, sy = meta["inputs"][0]["scale"], meta["outputs"][0]["scale"]
    limit = {"Clip": sx / 2 + sy / 2, "HardSigmoid": 0.3 * sx / 2 + sy / 2,
             "HardSwish": 1.25 * sx + (0.5 + 2 ** -10 * 127) * sy,
             "written": 4 * sy}[case]     # four roundings in a row: a few output steps
    err = np.abs(got[0] - ref).max()
    assert 0 < err <= limit * (1 + 1e-6), (err, limit)
    assert got[0].tobytes() == got[1].tobytes()
