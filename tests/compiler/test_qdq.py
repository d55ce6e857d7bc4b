"""Quantized ONNX models compiled with their own scales (``npu_compiler.qdq``,
``docs/quantization.md`` "Quantized models"), compared with onnxruntime running the same
quantized model.

Tolerance: **one int8 step** per output of a single quantized layer. The NPU rounds
``acc * M / 2**s`` (``|M / 2**s - f| <= f 2**-31``, ``quant.requantize_params``) half up;
onnxruntime rounds ``acc * f`` computed in binary32 (``f`` itself a binary32 product and
quotient, relative error below ``2**-21`` altogether) half to even. With int32 biases (as
``quantize_static`` writes them, and as ``QLinearConv`` takes them) both start from the same
integer accumulator, so before rounding they differ by less than ``|acc f| 2**-20``, far
below one step for the unsaturated range (``|acc f| < 2**9``); saturation and the clamp are
1-Lipschitz. Two roundings of values less than one apart differ by at most one. A float bias
added to an accumulator is rounded to accumulator units (``f / 2`` steps more); the tests
below keep ``f < 1``, so the bound stays one step. Across several layers a one-step
difference can grow, so the digits network is held to statistics (and observed equal).
"""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_cli.main import main
from npu_compiler.compile import compile_model
from npu_compiler.graph import CompileError
from npu_runtime.runtime import reference, run
from npu_spec.config import preset

from .test_digits import MODEL

ort_quant = pytest.importorskip("onnxruntime.quantization")


def _opset(graph, opset=13):
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _float_conv_model(seed, groups=1, stride=1, pad=1, relu=True, k=4, c=4, hw=7):
    """Conv (+ Relu) -> Conv 1x1 -> Flatten -> Gemm: float, for quantize_static."""
    rng = np.random.default_rng(seed)

    def init(name, shape, scale=0.5):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[pad] * 4, strides=[stride] * 2,
               group=groups)]
    nodes += [n("Relu", ["c1"], ["r1"])] if relu else [n("Identity", ["c1"], ["r1"])]
    oh = (hw + 2 * pad - 3) // stride + 1
    nodes += [n("Conv", ["r1", "w2"], ["c2"]), n("Flatten", ["c2"], ["f"]),
              n("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])],
        [init("w1", (k, c // groups, 3, 3)), init("b1", (k,)), init("w2", (3, k, 1, 1)),
         init("wf", (6, 3 * oh * oh), 0.2), init("bf", (6,))])
    return _opset(graph)


class _Reader:
    """quantize_static's calibration reader over a list of feeds."""

    def __init__(self, feeds):
        self.items = iter(feeds)

    def get_next(self):
        return next(self.items, None)


def quantize(model, feeds, tmp_path, fmt="QDQ", symmetric=True, per_channel=True, **kw):
    """The model quantized by onnxruntime's ``quantize_static``: int8 symmetric activations
    (``symmetric``) or uint8 asymmetric ones, int8 weights."""
    q = ort_quant
    src, dst = tmp_path / "float.onnx", tmp_path / f"q_{fmt}.onnx"
    onnx.save(model, str(src))
    reader = type("Reader", (_Reader, q.CalibrationDataReader), {})(feeds)
    q.quantize_static(str(src), str(dst), reader, quant_format=getattr(q.QuantFormat, fmt),
                      activation_type=q.QuantType.QInt8 if symmetric else q.QuantType.QUInt8,
                      weight_type=q.QuantType.QInt8, per_channel=per_channel,
                      extra_options={"ActivationSymmetric": symmetric}, **kw)
    return onnx.load(str(dst))


def steps(model, compiled, inputs, name):
    """``|NPU - onnxruntime|`` of output ``name`` in steps of its scale (golden backend)."""
    got = run(compiled.program, inputs, "golden").outputs[name]
    ref = reference(model, inputs)[name]
    spec = {o["name"]: o for o in compiled.program.metadata["compiler"]["outputs"]}[name]
    if spec["dtype"] != "float32":
        return np.abs(got.astype(np.int64) - ref.astype(np.int64))
    return np.abs(got.astype(np.float64) - ref) / spec["scale"]


# The conv layers the QDQ tests run (``_float_conv_model`` arguments), with their test ids.
CONV_SHAPES = pytest.mark.parametrize("shape", [
    {"seed": 1},
    {"seed": 2, "groups": 2, "stride": 2},
    {"seed": 3, "groups": 4, "pad": 0, "relu": False},
], ids=["3x3", "grouped-strided", "depthwise-unpadded"])


@pytest.mark.parametrize("symmetric", [True, False], ids=["int8-sym", "uint8-asym"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
@CONV_SHAPES
def test_qdq_layers_within_one_step_of_onnxruntime(tmp_path, symmetric, per_channel, shape):
    model = _float_conv_model(**shape)
    rng = np.random.default_rng(10)
    cal = [{"x": rng.standard_normal((1, 4, 7, 7)).astype(np.float32)} for _ in range(16)]
    qmodel = quantize(model, cal, tmp_path, "QDQ", symmetric, per_channel)
    compiled = compile_model(qmodel, preset("small"), fmt="int8")
    # One plan row a layer, named after its Conv / Gemm (the QuantizeLinear that ends it and
    # the DequantizeLinear nodes that only rename codes have none).
    ops = [r["op"] for r in compiled.plan]
    assert ops.count("Conv") == 2 and ops.count("Gemm") == 1
    assert "QuantizeLinear" not in ops and "DequantizeLinear" not in ops
    x = {"x": rng.standard_normal((4, 4, 7, 7)).astype(np.float32)}
    d = steps(qmodel, compiled, x, "y")
    assert d.max() <= 1 + 1e-6


@pytest.mark.parametrize("symmetric", [True, False], ids=["int8-sym", "uint8-asym"])
def test_qdq_global_average_pool_within_one_step(tmp_path, symmetric):
    """Conv -> GlobalAveragePool (a depthwise layer of weight 1 over the plane) -> Flatten
    -> Gemm."""
    rng = np.random.default_rng(6)
    n = helper.make_node
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), k)
             for k, s in (("w", (6, 3, 3, 3)), ("b", (6,)), ("wf", (4, 6)), ("bf", (4,)))]
    graph = helper.make_graph(
        [n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         n("GlobalAveragePool", ["c"], ["g"]), n("Flatten", ["g"], ["f"]),
         n("Gemm", ["f", "wf", "bf"], ["y"], transB=1)], "gap",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    cal = [{"x": rng.standard_normal((1, 3, 5, 5)).astype(np.float32)} for _ in range(16)]
    qmodel = quantize(_opset(graph), cal, tmp_path, "QDQ", symmetric)
    assert "GlobalAveragePool" in {nd.op_type for nd in qmodel.graph.node}
    compiled = compile_model(qmodel, preset("small"), fmt="int8")
    x = {"x": rng.standard_normal((3, 3, 5, 5)).astype(np.float32)}
    assert steps(qmodel, compiled, x, "y").max() <= 1 + 1e-6


@pytest.mark.parametrize("symmetric", [True, False], ids=["int8-sym", "uint8-asym"])
def test_qdq_residual_add_within_one_step(tmp_path, symmetric):
    """Conv -> Relu -> Conv, Add of the two (a residual), Relu: the Add on the planar
    engine through binary16. Each operand's term ``(q - z) s / s_y`` is rounded to binary16
    (half an ulp: below 1/4 step while it is under 1024 steps), so the sum before its one
    rounding is within 1/2 step of the exact one: one step from onnxruntime."""
    rng = np.random.default_rng(9)
    n = helper.make_node
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.5).astype(np.float32), k)
             for k, s in (("w1", (4, 2, 3, 3)), ("b1", (4,)), ("w2", (4, 4, 3, 3)),
                          ("b2", (4,)))]
    graph = helper.make_graph(
        [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
         n("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
         n("Add", ["c2", "r1"], ["s"], name="residual"), n("Relu", ["s"], ["y"])], "res",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], inits)
    cal = [{"x": rng.standard_normal((1, 2, 6, 6)).astype(np.float32)} for _ in range(16)]
    qmodel = quantize(_opset(graph), cal, tmp_path, "QDQ", symmetric)
    compiled = compile_model(qmodel, preset("small"), fmt="int8")
    assert [r["engine"] for r in compiled.plan if r["op"] == "Add"] == ["PE"]
    x = {"x": rng.standard_normal((3, 2, 6, 6)).astype(np.float32)}
    assert steps(qmodel, compiled, x, "y").max() <= 1 + 1e-6


@pytest.mark.parametrize("symmetric", [True, False], ids=["int8-sym", "uint8-asym"])
def test_qoperator_conv_within_one_step_of_onnxruntime(tmp_path, symmetric):
    """QuantFormat.QOperator: QLinearConv, with the Relu between the two convolutions."""
    rng = np.random.default_rng(5)
    n = helper.make_node
    w1 = numpy_helper.from_array(rng.standard_normal((5, 3, 3, 3)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 5, 1, 1)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
         n("Conv", ["r1", "w2"], ["y"])], "qop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], [w1, b1, w2])
    cal = [{"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)} for _ in range(16)]
    qmodel = quantize(_opset(graph), cal, tmp_path, "QOperator", symmetric)
    assert "QLinearConv" in {nd.op_type for nd in qmodel.graph.node}
    compiled = compile_model(qmodel, preset("small"), fmt="int8")
    x = {"x": rng.standard_normal((3, 3, 6, 6)).astype(np.float32)}
    assert steps(qmodel, compiled, x, "y").max() <= 1 + 1e-6


# ---- hand-built operator-oriented graphs ---------------------------------------------------


def _t(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _qlinearconv(rng, x_type=np.uint8, z_x=131, z_y=120, pad=1, per_channel=True):
    """QLinearConv on integer input and output (``x_type``), int32 bias, then nothing: the
    graph's input and output are the integer tensors."""
    k, c = 6, 3
    w = rng.integers(-127, 128, (k, c, 3, 3)).astype(np.int8)
    s_w = (rng.uniform(0.002, 0.01, k) if per_channel else np.float32(0.005)).astype(np.float32)
    tt = TensorProto.UINT8 if x_type == np.uint8 else TensorProto.INT8
    inits = [_t("xs", np.float32(0.03)), _t("xz", x_type(z_x)), _t("w", w), _t("ws", s_w),
             _t("wz", np.zeros(k if per_channel else (), np.int8)), _t("ys", np.float32(0.05)),
             _t("yz", x_type(z_y)), _t("b", rng.integers(-3000, 3000, k).astype(np.int32))]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                            ["y"], pads=[pad] * 4, name="qconv")
    graph = helper.make_graph(
        [node], "qlinearconv", [helper.make_tensor_value_info("x", tt, [1, c, 5, 5])],
        [helper.make_tensor_value_info("y", tt, [1, k, 5 + 2 * pad - 2, 5 + 2 * pad - 2])],
        inits)
    return _opset(graph)


@pytest.mark.parametrize("x_type, z_x, z_y, pad, per_channel", [
    (np.uint8, 131, 120, 1, True),     # uint8 with zero points, padded: a border of z_x
    (np.uint8, 0, 128, 0, False),      # per-tensor weights, unpadded
    (np.int8, -7, 3, 1, True),         # int8 with non-zero zero points
    (np.int8, 0, 0, 1, True),          # the NPU's native symmetric form
])
def test_qlinearconv_integer_io_within_one_step(x_type, z_x, z_y, pad, per_channel):
    rng = np.random.default_rng(7)
    model = _qlinearconv(rng, x_type, z_x, z_y, pad, per_channel)
    compiled = compile_model(model, preset("small"), fmt="int8")
    info = np.iinfo(x_type)
    x = {"x": rng.integers(info.min, info.max + 1, (4, 3, 5, 5)).astype(x_type)}
    got = run(compiled.program, x, "golden").outputs["y"]
    assert got.dtype == x_type
    d = steps(model, compiled, x, "y")
    assert d.max() <= 1
    assert (d == 0).mean() > 0.9    # not a test that passes by saturating everything
    assert len(np.unique(got)) > 20


def _conv_integer_chain(rng, relu=True):
    """ConvInteger (uint8 x, int8 w, zero points) -> Cast -> Mul(per-channel scale) ->
    Add(float bias) -> Relu -> QuantizeLinear -> DequantizeLinear: float in and out."""
    k, c = 4, 2
    n = helper.make_node
    scale = rng.uniform(0.001, 0.003, (1, k, 1, 1)).astype(np.float32)
    inits = [_t("xs", np.float32(0.02)), _t("xz", np.uint8(100)),
             _t("w", rng.integers(-100, 100, (k, c, 3, 3)).astype(np.int8)),
             _t("wz", np.int8(0)), _t("m", scale),
             _t("bias", rng.standard_normal((1, k, 1, 1)).astype(np.float32)),
             _t("ys", np.float32(0.04)), _t("yz", np.int8(0))]
    nodes = [n("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             n("ConvInteger", ["xq", "w", "xz", "wz"], ["acc"], name="convint"),
             n("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             n("Mul", ["accf", "m"], ["scaled"]), n("Add", ["scaled", "bias"], ["biased"])]
    nodes += [n("Relu", ["biased"], ["act"])] if relu else [n("Identity", ["biased"], ["act"])]
    nodes += [n("QuantizeLinear", ["act", "ys", "yz"], ["yq"]),
              n("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(
        nodes, "convinteger", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, k, 4, 4])], inits)
    return _opset(graph)


@pytest.mark.parametrize("relu", [True, False])
def test_conv_integer_chain_within_one_step(relu):
    rng = np.random.default_rng(11)
    model = _conv_integer_chain(rng, relu)
    compiled = compile_model(model, preset("small"), fmt="int8")
    x = {"x": rng.uniform(-2, 3, (4, 2, 6, 6)).astype(np.float32)}
    d = steps(model, compiled, x, "y")
    assert d.max() <= 1 + 1e-6
    assert [r["engine"] for r in compiled.plan if r["tasks"]].count("NE") == 1


def _matmuls(rng):
    """QLinearMatMul (int8) then MatMulInteger (uint8 via a requantization) chains."""
    n = helper.make_node
    inits = [_t("as", np.float32(0.05)), _t("az", np.int8(4)),
             _t("b", rng.integers(-128, 128, (12, 8)).astype(np.int8)),
             _t("bs", rng.uniform(0.005, 0.02, 8).astype(np.float32)),
             _t("bz", np.zeros(8, np.int8)), _t("ys", np.float32(0.1)), _t("yz", np.int8(-5)),
             _t("b2", rng.integers(0, 256, (8, 5)).astype(np.uint8)), _t("b2z", np.uint8(128)),
             _t("m", np.float32(0.1 * 0.01)), _t("zs", np.float32(0.2)), _t("zz", np.int8(0))]
    nodes = [n("QuantizeLinear", ["x", "as", "az"], ["xq"]),
             n("QLinearMatMul", ["xq", "as", "az", "b", "bs", "bz", "ys", "yz"], ["h"]),
             n("MatMulInteger", ["h", "b2", "yz", "b2z"], ["acc"]),
             n("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             n("Mul", ["m", "accf"], ["z"]),
             n("QuantizeLinear", ["z", "zs", "zz"], ["zq"]),
             n("DequantizeLinear", ["zq", "zs", "zz"], ["y"]),
             n("DequantizeLinear", ["h", "ys", "yz"], ["hidden"])]
    graph = helper.make_graph(
        nodes, "matmuls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5]),
         helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, 8])], inits)
    return _opset(graph)


def test_qlinearmatmul_and_matmulinteger():
    """Both outputs: the first layer's (one rounding: within one step) and the second's,
    whose input is the first's output (so a one-step difference there moves it by at most
    ``sum|w| f`` steps; the test asserts that bound from the first layer's errors)."""
    rng = np.random.default_rng(12)
    model = _matmuls(rng)
    compiled = compile_model(model, preset("small"), fmt="int8")
    x = {"x": rng.uniform(-6, 6, (6, 12)).astype(np.float32)}
    got = run(compiled.program, x, "golden").outputs
    ref = {k: np.concatenate([reference(model, {"x": x["x"][i:i + 1]})[k] for i in range(6)])
           for k in ("y", "hidden")}
    dh = np.abs(got["hidden"] - ref["hidden"]) / 0.1
    assert dh.max() <= 1 + 1e-6
    w2 = next(t for t in model.graph.initializer if t.name == "b2")
    f = 0.1 * 0.01 / 0.2
    spread = np.abs(numpy_helper.to_array(w2).astype(np.int64) - 128).sum(axis=0) * f
    dy = np.abs(got["y"] - ref["y"]) / 0.2
    assert np.all(dy <= 1 + dh.max() * spread[None, :] + 1e-6)


# ---- the digits CNN ------------------------------------------------------------------------


def _digits_quantized(split, directory, fmt="QDQ", symmetric=True):
    x_train = split[0]
    feeds = [{"input": x_train[i:i + 1]} for i in range(200)]
    return quantize(onnx.load(str(MODEL)), feeds, directory, fmt, symmetric)


@pytest.fixture(scope="module")
def digits_qdq(split, tmp_path_factory):
    return _digits_quantized(split, tmp_path_factory.mktemp("digits"))


def _agreement(model, images):
    """``(NPU logits, onnxruntime logits, differences in output steps)`` on ``images``."""
    compiled = compile_model(model, preset("small"), fmt="int8")
    got = run(compiled.program, {"input": images}, "golden").outputs["logits"]
    ref = reference(model, {"input": images})["logits"]
    step = compiled.program.metadata["compiler"]["outputs"][0]["scale"]
    return got, ref, np.abs(got.astype(np.float64) - ref) / step


def test_digits_qdq_accuracy_and_agreement(digits, split, digits_qdq):
    """All 360 held-out images (about 13 s of CPU): accuracy within one point of the float
    model's, and the logits agree with onnxruntime running the QDQ model
    (``models/digits/quantized.py`` prints the figures of docs/quantization.md)."""
    _, _, x_test, y_test = split
    got, ref, d = _agreement(digits_qdq, x_test)
    float_logits = digits.onnxruntime_logits(x_test, MODEL)
    correct = int((got.argmax(1) == y_test).sum())
    float_correct = int((float_logits.argmax(1) == y_test).sum())
    assert abs(correct - float_correct) <= 0.01 * len(y_test)
    assert np.mean(d <= 1 + 1e-6) >= 0.99
    assert np.mean(got.argmax(1) == ref.argmax(1)) >= 0.99


def test_digits_qoperator_uint8_agreement(split, tmp_path):
    """QOperator with uint8 asymmetric activations (QLinearConv with padding and zero
    points, int8 MaxPool and Flatten, com.microsoft.QGemm), on 60 held-out images."""
    model = _digits_quantized(split, tmp_path, "QOperator", False)
    assert {"QLinearConv", "QGemm"} <= {n.op_type for n in model.graph.node}
    got, ref, d = _agreement(model, split[2][:60])
    assert np.mean(d <= 1 + 1e-6) >= 0.99
    assert np.mean(got.argmax(1) == ref.argmax(1)) >= 0.98


def test_cli_compiles_and_checks_without_calibration(split, digits_qdq, tmp_path, capsys):
    model = tmp_path / "digits_qdq.onnx"
    onnx.save(digits_qdq, str(model))
    assert main(["compile", str(model), "--format", "int8", "-o",
                 str(tmp_path / "p.npuprog")]) == 0
    plan = capsys.readouterr().out
    assert "Conv" in plan and "raw int8" in plan and "QuantizeLinear" not in plan
    np.save(tmp_path / "x.npy", split[2][:4])
    assert main(["run", str(model), "--format", "int8", "--input",
                 f"input={tmp_path / 'x.npy'}", "--check", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["outputs"]["logits"]
    assert out["cosine"] > 0.9999


@pytest.mark.slow
def test_digits_qdq_rtl_equals_golden(split, digits_qdq):
    compiled = compile_model(digits_qdq, preset("small"), fmt="int8")
    images = {"input": split[2][:2]}
    golden = run(compiled.program, images, "golden").outputs["logits"]
    rtl = run(compiled.program, images, "rtl").outputs["logits"]
    assert np.array_equal(golden.view(np.uint32), rtl.view(np.uint32))


@pytest.mark.slow
def test_padded_zero_point_rtl_equals_golden():
    """uint8 QLinearConv with padding and a non-zero input zero point: the bordered copy
    (planar fill and copy) and the layer on the RTL, bit for bit."""
    rng = np.random.default_rng(7)
    compiled = compile_model(_qlinearconv(rng), preset("small"), fmt="int8")
    x = {"x": rng.integers(0, 256, (1, 3, 5, 5)).astype(np.uint8)}
    golden = run(compiled.program, x, "golden").outputs["y"]
    rtl = run(compiled.program, x, "rtl").outputs["y"]
    assert golden.dtype == np.uint8 and np.array_equal(golden, rtl)


# ---- what the NPU cannot represent ---------------------------------------------------------


def _with_weight_zero_point(rng, zp):
    model = _qlinearconv(rng, np.int8, 0, 0, 1, False)
    for t in model.graph.initializer:
        if t.name == "wz":
            t.CopyFrom(_t("wz", np.int8(zp)))
    return model


def _per_axis_activation(rng):
    model = _qlinearconv(rng, np.int8, 0, 0, 1, True)
    for t in model.graph.initializer:
        if t.name == "xs":
            t.CopyFrom(_t("xs", np.full(3, 0.03, np.float32)))
    return model


def _unquantized_output(rng):
    n = helper.make_node
    graph = helper.make_graph(
        [n("QuantizeLinear", ["x", "s", "z"], ["q"]), n("DequantizeLinear", ["q", "s", "z"], ["d"]),
         n("Conv", ["d", "w"], ["y"], name="float_conv")], "unq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        [_t("s", np.float32(0.1)), _t("z", np.int8(0)),
         _t("w", rng.standard_normal((2, 2, 1, 1)).astype(np.float32))])
    return _opset(graph)


def _int16(rng):
    n = helper.make_node
    graph = helper.make_graph(
        [n("QuantizeLinear", ["x", "s", "z"], ["q"], name="q16"),
         n("DequantizeLinear", ["q", "s", "z"], ["y"])], "i16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        [_t("s", np.float32(0.1)), _t("z", np.int16(0))])
    return _opset(graph, 21)


@pytest.mark.parametrize("make, fmt, words", [
    (lambda r: _with_weight_zero_point(r, 100), "int8", ["'qconv'", "zero point", "[-128, 127]"]),
    (_per_axis_activation, "int8", ["'qconv'", "per-axis"]),
    (_unquantized_output, "int8", ["'float_conv'", "without a QuantizeLinear"]),
    (_int16, "int8", ["'q16'", "int16"]),
    (lambda r: _qlinearconv(r), "fp16", ["qconv", "--format int8"]),
], ids=["weight-zero-point", "per-axis-activation", "unquantized", "int16", "fp16"])
def test_unrepresentable_models_are_one_line_errors(make, fmt, words, tmp_path, capsys):
    rng = np.random.default_rng(3)
    model = make(rng)
    with pytest.raises(CompileError) as e:
        compile_model(model, preset("small"), fmt=fmt)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert main(["compile", str(path), "--format", fmt]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if not line.startswith("[npu]")]
    assert len(errors) == 1 and words[0] in errors[0] and "Traceback" not in err


def test_small_weight_zero_point_is_folded(tmp_path):
    """A weight zero point that keeps ``q - z`` in int8 is subtracted at compile time."""
    rng = np.random.default_rng(8)
    model = _qlinearconv(rng, np.int8, 0, 0, 1, False)
    for t in model.graph.initializer:
        if t.name == "wz":
            t.CopyFrom(_t("wz", np.int8(0)))
        if t.name == "w":
            w = rng.integers(-100, 100, (6, 3, 3, 3)).astype(np.int8)
            t.CopyFrom(_t("w", w))
    model.graph.initializer.append(_t("wz2", np.int8(-20)))
    model.graph.node[0].input[5] = "wz2"
    compiled = compile_model(model, preset("small"), fmt="int8")
    x = {"x": rng.integers(-128, 128, (2, 3, 5, 5)).astype(np.int8)}
    assert steps(model, compiled, x, "y").max() <= 1


def test_calibration_is_refused_for_a_quantized_model():
    rng = np.random.default_rng(3)
    with pytest.raises(CompileError, match="carries its own scales"):
        compile_model(_qlinearconv(rng), preset("small"), fmt="int8",
                      calibration={"x": np.zeros((1, 3, 5, 5), np.uint8)})
