"""``--format int8``: post-training calibration, the int8 lowering and the runtime's
quantization of inputs and outputs (``docs/compiler.md``, "int8")."""

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_cli.main import main
from npu_compiler.compile import compile_model
from npu_compiler.graph import CompileError
from npu_runtime.runtime import reference, run, session
from npu_spec.config import preset

from .test_digits import MODEL

#: Training images used for calibration.
CALIBRATION = 200


@pytest.fixture(scope="module")
def compiled(split):
    return compile_model(str(MODEL), preset("small"), fmt="int8",
                         calibration={"input": split[0][:CALIBRATION]}, evaluator=session)


def test_digits_int8_accuracy_within_one_point_of_float(digits, split, compiled):
    """All 360 held-out images through one compiled program on the golden backend."""
    _, _, x_test, y_test = split
    logits = run(compiled.program, {"input": x_test}, "golden").outputs["logits"]
    assert logits.dtype == np.float32 and logits.shape == (len(x_test), 10)
    correct = int((logits.argmax(1) == y_test).sum())
    float_logits = digits.onnxruntime_logits(x_test, MODEL)
    float_correct = int((float_logits.argmax(1) == y_test).sum())
    assert correct >= float_correct - 0.01 * len(x_test)
    assert correct == 354  # docs/compiler.md (the golden model is deterministic)
    # Dequantized logits follow the float ones within a few output steps.
    step = compiled.program.metadata["compiler"]["outputs"][0]["scale"]
    assert np.percentile(np.abs(logits - float_logits), 99) < 8 * step


def test_digits_int8_equals_layer_by_layer_simulation(digits, split, compiled):
    """The compiled program gives the int8 logits of ``models/digits/train.py``'s
    layer-by-layer simulation (``quant.golden_conv``, planar pooling) calibrated on the same
    images, code for code."""
    x_train, _, x_test, _ = split
    s0, layers = digits.quantize_model(digits.load_params(MODEL), x_train[:CALIBRATION])
    meta = compiled.program.metadata["compiler"]
    assert meta["inputs"][0]["scale"] == pytest.approx(s0, rel=1e-6)
    assert meta["outputs"][0]["scale"] == pytest.approx(layers[2].out_scale, rel=1e-6)
    images = x_test[:40]
    want = digits.int8_logits(s0, layers, images)
    got = run(compiled.program, {"input": images}, "golden").outputs["logits"]
    codes = np.rint(got / np.float32(meta["outputs"][0]["scale"])).astype(np.int64)
    np.testing.assert_array_equal(codes, want)


@pytest.mark.slow
def test_digits_int8_rtl_equals_golden(split, compiled):
    images = {"input": split[2][:3]}
    golden = run(compiled.program, images, "golden").outputs["logits"]
    rtl = run(compiled.program, images, "rtl").outputs["logits"]
    assert np.array_equal(golden.view(np.uint32), rtl.view(np.uint32))


def test_cli_round_trip_with_npz_and_directory(split, tmp_path, capsys):
    x_train, _, x_test, _ = split
    cal = tmp_path / "cal.npz"
    np.savez(cal, input=x_train[:CALIBRATION])
    prog = tmp_path / "digits.npuprog"
    assert main(["compile", str(MODEL), "--preset", "small", "--format", "int8",
                 "--calibration", str(cal), "-o", str(prog)]) == 0
    plan = capsys.readouterr().out
    assert "raw int8" in plan and "Gemm" in plan and "MaxPool" in plan
    np.save(tmp_path / "x.npy", x_test[:5])
    out = tmp_path / "out.npz"
    assert main(["run", str(prog), "--input", f"input={tmp_path / 'x.npy'}", "--output",
                 str(out)]) == 0
    with np.load(out) as z:
        from_prog = z["logits"]
    assert from_prog.dtype == np.float32 and from_prog.shape == (5, 10)
    capsys.readouterr()
    # The same calibration as a directory of .npy files (batches of 50), compiled by npu run.
    cdir = tmp_path / "caldir"
    cdir.mkdir()
    for i in range(0, CALIBRATION, 50):
        np.save(cdir / f"batch{i:03d}.npy", x_train[i:i + 50])
    out2 = tmp_path / "out2.npz"
    assert main(["run", str(MODEL), "--format", "int8", "--calibration", str(cdir),
                 "--input", f"input={tmp_path / 'x.npy'}", "--output", str(out2), "--check",
                 "--json"]) == 0
    import json
    summary = json.loads(capsys.readouterr().out)
    assert summary["outputs"]["logits"]["cosine"] > 0.999
    with np.load(out2) as z:
        assert np.array_equal(z["logits"], from_prog)


def _gap_model(seed=1):
    """Conv + Relu, GlobalAveragePool, Flatten, Gemm (B not transposed), Relu output."""
    rng = np.random.default_rng(seed)

    def init(name, shape, scale=0.4):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)
    n = helper.make_node
    graph = helper.make_graph(
        [n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
         n("Relu", ["c"], ["r"]),
         n("Conv", ["r", "wd"], ["d"], group=6, pads=[1, 1, 1, 1]),
         n("GlobalAveragePool", ["d"], ["g"]),
         n("Flatten", ["g"], ["f"]),
         n("Gemm", ["f", "wfc", "bfc"], ["y"])],
        "gap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [init("w", (6, 3, 3, 3)), init("b", (6,)), init("wd", (6, 1, 3, 3)),
         init("wfc", (6, 5)), init("bfc", (5,))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_global_average_pool_depthwise_strided_against_onnxruntime():
    rng = np.random.default_rng(2)
    model = _gap_model()
    cal = rng.standard_normal((64, 1, 3, 10, 10)).astype(np.float32)
    c = compile_model(model, preset("small"), fmt="int8", calibration={"x": cal},
                      evaluator=session)
    x = rng.standard_normal((4, 3, 10, 10)).astype(np.float32)
    got = run(c.program, {"x": x}, "golden").outputs["y"]
    ref = np.concatenate([reference(model, {"x": x[i:i + 1]})["y"] for i in range(4)])
    # int8 activations: a few steps of the output scale (max|y| / 127) of error.
    step = c.program.metadata["compiler"]["outputs"][0]["scale"]
    assert 0 < np.abs(got - ref).max() < 4 * step   # nonzero: it is int8, not float


def _residual(seed=3):
    """Conv + Relu, Conv, Add of the two (a residual), Relu, MaxPool."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.5).astype(np.float32), k)
             for k, s in (("w1", (4, 2, 3, 3)), ("w2", (4, 4, 3, 3)), ("b2", (4,)))]
    graph = helper.make_graph(
        [n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
         n("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
         n("Add", ["c2", "r1"], ["s"], name="residual"), n("Relu", ["s"], ["r2"]),
         n("MaxPool", ["r2"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
        "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_residual_add_against_onnxruntime():
    rng = np.random.default_rng(4)
    model = _residual()
    cal = rng.standard_normal((32, 1, 2, 6, 6)).astype(np.float32)
    c = compile_model(model, preset("small"), fmt="int8", calibration={"x": cal},
                      evaluator=session)
    assert [r["engine"] for r in c.plan if r["op"] == "Add"] == ["PE"]
    x = rng.standard_normal((3, 2, 6, 6)).astype(np.float32)
    got = run(c.program, {"x": x}, "golden").outputs["y"]
    ref = reference(model, {"x": x})["y"]
    step = c.program.metadata["compiler"]["outputs"][0]["scale"]
    assert 0 < np.abs(got - ref).max() < 4 * step


@pytest.mark.slow
def test_residual_add_rtl_equals_golden():
    rng = np.random.default_rng(4)
    c = compile_model(_residual(), preset("small"), fmt="int8", evaluator=session,
                      calibration={"x": rng.standard_normal((8, 1, 2, 6, 6)).astype(np.float32)})
    x = {"x": rng.standard_normal((1, 2, 6, 6)).astype(np.float32)}
    golden = run(c.program, x, "golden").outputs["y"]
    rtl = run(c.program, x, "rtl").outputs["y"]
    assert np.array_equal(golden.view(np.uint32), rtl.view(np.uint32))


def _with(op_nodes, out_shape, name="m"):
    n = helper.make_node
    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    k = numpy_helper.from_array(np.ones((1, 2, 1, 1), np.float32), "k")
    graph = helper.make_graph(
        [n("Conv", ["x", "w"], ["c"])] + [n(*a, **kw) for a, kw in op_nodes], name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], [w, k])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("nodes, shape, message", [
    ([(("Abs", ["c"], ["y"]), {"name": "abs"})], [1, 2, 4, 4],
     r"node 'abs' \(Abs\): operator Abs is not supported with --format int8"),
    ([(("Softmax", ["x"], ["s"]), {"name": "soft"}), (("Add", ["c", "s"], ["y"]), {})],
     [1, 2, 4, 4],
     r"node 'soft' \(Softmax\): operator Softmax is not supported"),
])
def test_unsupported_int8_operator_names_node_and_op(nodes, shape, message):
    model = _with(nodes, shape)
    cal = {"x": np.ones((2, 1, 2, 4, 4), np.float32)}
    with pytest.raises(CompileError, match=message):
        compile_model(model, preset("small"), fmt="int8", calibration=cal)
    # fp16 takes the same model.
    compile_model(model, preset("small"), fmt="fp16")


def test_fused_leaky_relu_without_the_mixed_datapath_is_an_error():
    """A leaky ReLU fused into a conv runs as a mixed-format layer after it
    (``test_int8_slope_const.py``); a preset without that datapath refuses it in one line."""
    model = _gap_model()
    model.graph.node[1].op_type = "LeakyRelu"
    with pytest.raises(CompileError, match=r"\(Conv\): LeakyRelu in int8 needs the int8 "
                                           r"x binary16 \(mixed\) datapath"):
        compile_model(model, preset("small").replace(formats=("int8",)), fmt="int8",
                      calibration={"x": np.ones((1, 3, 10, 10), np.float32)})


@pytest.mark.parametrize("case, message", [
    ("none", "--format int8 needs --calibration"),
    ("shape", "a calibration array has shape 1x1x4x4"),
    ("missing", "calibration file .* does not exist"),
    ("key", "has no array 'input'"),
    ("fp16", "--calibration is for --format int8"),
])
def test_cli_int8_errors(case, message, tmp_path, capsys):
    args = ["compile", str(MODEL), "--format", "int8"]
    if case == "shape":
        np.save(tmp_path / "bad.npy", np.zeros((1, 1, 4, 4), np.float32))
        args += ["--calibration", str(tmp_path)]
    elif case == "missing":
        args += ["--calibration", str(tmp_path / "nothing.npz")]
    elif case == "key":
        np.savez(tmp_path / "two.npz", a=np.zeros((1, 1, 8, 8)), b=np.zeros((1, 1, 8, 8)))
        args += ["--calibration", str(tmp_path / "two.npz")]
    elif case == "fp16":
        np.savez(tmp_path / "c.npz", input=np.zeros((1, 1, 8, 8), np.float32))
        args = ["compile", str(MODEL), "--calibration", str(tmp_path / "c.npz")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("npu: error: ") and re.search(message, last), last


def test_int8_model_file_is_unchanged():
    """Calibration exposes intermediate tensors on a copy; the model is not modified."""
    model = onnx.load(str(MODEL))
    before = model.SerializeToString()
    compile_model(model, preset("small"), fmt="int8",
                  calibration={"input": np.zeros((2, 1, 1, 8, 8), np.float32)})
    assert model.SerializeToString() == before


def test_reference_evaluator_calibrates_like_onnxruntime(split):
    """Without an evaluator the compiler calibrates with the onnx package's reference
    evaluator; its scales match onnxruntime's."""
    from npu_compiler.frontend import load_graph, read_model
    from npu_compiler.int8 import calibrate
    model = read_model(str(MODEL))
    graph = load_graph(model)
    samples = {"input": [split[0][:20]]}
    ref = calibrate(model, graph, samples)
    ort = calibrate(model, graph, samples, session)
    assert set(ref) == set(ort) and len(ref) >= 9
    for name in ort:
        assert ref[name] == pytest.approx(ort[name], rel=1e-5), name


def test_icebreaker_integer_planar_engine(split):
    """The ``icebreaker`` preset's integer planar engine (``planar_impl="int8"``) computes the
    digits CNN's planar tasks (max pooling): the compiled program gives the logits of the
    same preset with the binary32 planar engine, byte for byte (the slow board test runs it
    on the RTL); a residual ``Add`` (rescaled through binary16 on the planar engine, which
    this preset does not have) is a compile error naming the node, not a task the engine
    would refuse at run time."""
    x_train, _, x_test, _ = split
    ice = preset("icebreaker")
    assert ice.planar_impl == "int8"
    logits = {}
    for cfg in (ice, ice.replace(planar_impl="float")):
        c = compile_model(str(MODEL), cfg, fmt="int8", calibration={"input": x_train[:50]},
                          evaluator=session)
        assert any(r["engine"] == "PE" for r in c.plan)
        logits[cfg.planar_impl] = run(c.program, {"input": x_test[:4]},
                                      "golden").outputs["logits"]
    assert logits["int8"].tobytes() == logits["float"].tobytes()
    rng = np.random.default_rng(4)
    with pytest.raises(CompileError, match=r"node 'residual' \(Add\): the planar engine of "
                                           r"this build does not compute binary16"):
        compile_model(_residual(), ice, fmt="int8", evaluator=session,
                      calibration={"x": rng.standard_normal((8, 1, 2, 6, 6))
                                   .astype(np.float32)})
