"""The compiler and runtime on a handmade CNN against onnxruntime, the front end's errors,
and ``npu compile`` / ``npu run`` with good and bad input."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npu_cli.main import main
from npu_compiler.compile import compile_model
from npu_compiler.graph import CompileError
from npu_runtime.runtime import compare, reference, run
from npu_spec.config import preset

from .cases import COS_TOL, REL_TOL
from .models import small_cnn

CFG = preset("small")


@pytest.fixture(scope="module")
def cnn_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("cnn")
    path = d / "cnn.onnx"
    onnx.save(small_cnn(), str(path))
    x = np.random.default_rng(1).standard_normal((2, 3, 12, 12)).astype(np.float32)
    np.save(d / "x.npy", x)
    return path, d / "x.npy", x


def test_small_cnn_against_onnxruntime(cnn_file):
    path, _, x = cnn_file
    compiled = compile_model(str(path), CFG, shapes={"x": x.shape})
    ops = [r["op"] for r in compiled.plan]
    assert "Clip" not in ops and "BatchNormalization" not in ops   # fused into the conv
    result = run(compiled.program, {"x": x})
    assert result.outputs["y"].shape == (2, 10) and result.outputs["se"].shape == (2, 8, 6, 12)
    for name, e in compare(result.outputs, reference(str(path), {"x": x})).items():
        assert e["rel_err"] <= REL_TOL and e["cosine"] >= COS_TOL, (name, e)


@pytest.mark.slow
def test_small_cnn_rtl_equals_golden(cnn_file):
    path, _, x = cnn_file
    compiled = compile_model(str(path), CFG, shapes={"x": (1, 3, 12, 12)})
    golden = run(compiled.program, {"x": x[:1]})
    rtl = run(compiled.program, {"x": x[:1]}, "rtl")
    assert rtl.cycles > 0
    for k in golden.outputs:
        assert np.array_equal(golden.outputs[k].view(np.uint32), rtl.outputs[k].view(np.uint32))


def test_cli_compile_and_run(cnn_file, tmp_path, capsys):
    path, xfile, x = cnn_file
    prog = tmp_path / "cnn.npu"
    assert main(["compile", str(path), "--shape", "x=1x3x12x12", "-o", str(prog)]) == 0
    plan = capsys.readouterr().out
    assert "Transpose" in plan and "kernels raw fp16" in plan
    out = tmp_path / "out.npz"
    assert main(["run", str(path), "--input", f"x={xfile}", "--check", "--json",
                 "--output", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["outputs"]["y"]["rel_err"] <= REL_TOL
    assert summary["outputs"]["y"]["cosine"] >= COS_TOL
    assert [layer["op"] for layer in summary["layers"]][:2] == ["Conv", "Conv"]
    with np.load(out) as z:
        assert z["y"].shape == (2, 10) and z["y"].dtype == np.float32
    # The program file runs as well and gives the same outputs (.npz input by key).
    np.savez(tmp_path / "in.npz", x=x[:1])
    out2 = tmp_path / "out2.npz"
    assert main(["run", str(prog), "--input", f"x={tmp_path / 'in.npz'}",
                 "--output", str(out2)]) == 0
    with np.load(out) as a, np.load(out2) as b:
        assert np.array_equal(a["y"][:1], b["y"])


def _tiny(op="Relu", dims=(1, 4, 5, 5), **attrs):
    node = helper.make_node(op, ["x"], ["y"], name="the_node", **attrs)
    g = helper.make_graph([node], "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         list(dims))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(dims))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case,message", [
    ("truncated", "not a readable ONNX model"),
    ("garbage", "not a readable ONNX model"),
    ("missing", "cannot read"),
    ("unsupported", "node 'the_node' (LogSoftmax): operator LogSoftmax is not supported"),
    ("dynamic", "dynamic dimension 'H' (axis 2) with no value"),
    ("shape", "has shape 1x4x6x5; the program takes 1x4x5x5"),
    ("dtype", "has dtype int64"),
])
def test_cli_bad_input(case, message, tmp_path, capsys):
    model = tmp_path / "m.onnx"
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 4, 5, 5), np.float32))
    if case == "truncated":
        data = _tiny().SerializeToString()
        model.write_bytes(data[:len(data) // 2])
    elif case == "garbage":
        model.write_bytes(b"this is not a model")
    elif case == "unsupported":
        onnx.save(_tiny("LogSoftmax"), str(model))
    elif case == "dynamic":
        onnx.save(_tiny(dims=(1, 4, "H", 5)), str(model))
    elif case == "shape":
        onnx.save(_tiny(), str(model))
        np.save(x, np.zeros((1, 4, 6, 5), np.float32))
    elif case == "dtype":
        onnx.save(_tiny(), str(model))
        np.save(x, np.zeros((1, 4, 5, 5), np.int64))
    args = ["run", str(model if case != "missing" else tmp_path / "none.onnx")]
    if case in ("shape", "dtype"):
        args += ["--shape", "x=1x4x5x5"]
        # Compile for the model's shape, then feed the wrong array.
        prog = tmp_path / "m.npu"
        assert main(["compile", str(model), "-o", str(prog)]) == 0
        args = ["run", str(prog)]
    if case != "dynamic":
        args += ["--input", f"x={x}"]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1], err
    assert "Traceback" not in "".join(err)


def test_dynamic_dimension_from_shape_option():
    graph = compile_model(_tiny(dims=(1, 4, "H", 5)), CFG, shapes={"x": (1, 4, 7, 5)}).graph
    assert graph.shapes["y"] == (1, 4, 7, 5)


def test_unsupported_operator_names_node():
    with pytest.raises(CompileError, match=r"node 'the_node' \(LogSoftmax\)"):
        compile_model(_tiny("LogSoftmax"), CFG)


def test_tensor_beyond_system_memory_names_size():
    with pytest.raises(CompileError, match="KiB\\) of system memory; the configuration has "
                                           "mem_kib=256"):
        compile_model(_tiny(dims=(1, 64, 64, 64)), CFG)


def test_identity_and_dropout_are_removed_and_bn_folded():
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, (4, 4, 1, 1),
                           rng.standard_normal(16).astype(np.float32))
    bn = [helper.make_tensor(n, TensorProto.FLOAT, (4,), v) for n, v in
          (("s", [1.0, 2, 3, 4]), ("b", [0.0, 1, 0, 1]), ("m", [0.5] * 4), ("v", [1.0] * 4))]
    nodes = [helper.make_node("Identity", ["x"], ["i"]),
             helper.make_node("Conv", ["i", "w"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Dropout", ["n"], ["d"]),
             helper.make_node("Relu", ["d"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, 4, 3, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])],
                          [w] + bn)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    compiled = compile_model(model, CFG)
    assert [n.op for n in compiled.graph.nodes] == ["Conv"]
    assert compiled.graph.nodes[0].fused == {"act": "relu"}
    x = rng.standard_normal((1, 4, 3, 3)).astype(np.float32)
    got = run(compiled.program, {"x": x}).outputs
    err = compare(got, reference(model, {"x": x}))["y"]
    assert err["rel_err"] <= REL_TOL


def test_fallback_host_runs_the_tail_on_the_host():
    rng = np.random.default_rng(3)
    w = helper.make_tensor("w", TensorProto.FLOAT, (6, 4, 3, 3),
                           (rng.standard_normal(216) * 0.3).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("LogSoftmax", ["r"], ["s"], axis=1),
             helper.make_node("Elu", ["s"], ["y"])]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, c, 5, 5])
          for n, c in (("x", 4), ("y", 6), ("r", 6))]
    model = helper.make_model(helper.make_graph(nodes, "g", io[:1], io[1:], [w]),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(CompileError, match=r"\(LogSoftmax\)"):
        compile_model(model, CFG)
    compiled = compile_model(model, CFG, fallback="host")
    assert [(r["op"], r["engine"]) for r in compiled.plan] == [
        ("Conv", "NE"), ("LogSoftmax", "host"), ("Elu", "host")]
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    out = run(compiled.program, {"x": x}).outputs
    assert list(out) == ["y", "r"]
    for name, e in compare(out, reference(model, {"x": x})).items():
        assert e["rel_err"] <= REL_TOL and e["cosine"] >= COS_TOL, (name, e)


def _banded_model():
    """A conv and a max pool whose layers do not fit the `small` buffer at once (bands of
    rows with explicit padding), and a conv with more input channels than the input buffer's
    rows (partial sums)."""
    rng = np.random.default_rng(5)
    inits = [helper.make_tensor("w1", TensorProto.FLOAT, (8, 8, 3, 3),
                                (rng.standard_normal(576) * 0.2).astype(np.float32)),
             helper.make_tensor("w2", TensorProto.FLOAT, (4, 384, 1, 1),
                                (rng.standard_normal(1536) * 0.1).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[0, 0, 1, 1]),
             helper.make_node("Reshape", ["p", "shape"], ["q"]),
             helper.make_node("Conv", ["q", "w2"], ["y"])]
    inits.append(helper.make_tensor("shape", TensorProto.INT64, (4,), [1, 384, 4, 4]))
    io = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 64, 48]),
          helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4]),
          helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 8, 64, 48])]
    return helper.make_model(helper.make_graph(nodes, "banded", io[:1], io[1:], inits),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_banded_layers_against_onnxruntime():
    model = _banded_model()
    compiled = compile_model(model, CFG)
    x = np.random.default_rng(6).standard_normal((1, 8, 64, 48)).astype(np.float32)
    out = run(compiled.program, {"x": x}).outputs
    for name, e in compare(out, reference(model, {"x": x})).items():
        assert e["rel_err"] <= REL_TOL and e["cosine"] >= COS_TOL, (name, e)
    conv = compiled.plan[0]
    assert conv["op"] == "Conv" and conv["tasks"] > 4        # more than one band


@pytest.mark.slow
def test_banded_layers_rtl_equals_golden():
    compiled = compile_model(_banded_model(), CFG)
    x = np.random.default_rng(6).standard_normal((1, 8, 64, 48)).astype(np.float32)
    golden = run(compiled.program, {"x": x})
    rtl = run(compiled.program, {"x": x}, "rtl")
    for k in golden.outputs:
        assert np.array_equal(golden.outputs[k].view(np.uint32), rtl.outputs[k].view(np.uint32))


def test_first_departure_names_the_first_layer(cnn_file):
    from npu_runtime.runtime import first_departure
    path, _, x = cnn_file
    assert first_departure(str(path), CFG, {"x": x[:1]}) is None
    # Below binary16's resolution every layer departs: the first one is named.
    node, op, tensor, err = first_departure(str(path), CFG, {"x": x[:1]}, rel_tol=1e-6)
    assert (op, tensor) == ("Conv", "c1") and err > 1e-6


def test_small_ranks_broadcast_and_decomposed_hardswish():
    """A (2, 3) matrix plus a (3,) vector (both inputs), a mean over one axis of a (3, 2, 5)
    tensor, and HardSwish written as Add/Clip/Div/Mul: no host work."""
    consts = [helper.make_tensor("three", TensorProto.FLOAT, (), [3.0]),
              helper.make_tensor("six", TensorProto.FLOAT, (), [6.0]),
              helper.make_tensor("zero", TensorProto.FLOAT, (), [0.0]),
              helper.make_tensor("axes", TensorProto.INT64, (1,), [1])]
    nodes = [helper.make_node("Add", ["m", "v"], ["mv"]),
             helper.make_node("ReduceMean", ["t", "axes"], ["tm"], keepdims=0),
             helper.make_node("Add", ["t", "three"], ["t3"]),
             helper.make_node("Clip", ["t3", "zero", "six"], ["tc"]),
             helper.make_node("Div", ["tc", "six"], ["td"]),
             helper.make_node("Mul", ["t", "td"], ["hs"])]
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("m", f, [2, 3]),
           helper.make_tensor_value_info("v", f, [3]),
           helper.make_tensor_value_info("t", f, [3, 2, 5])]
    outs = [helper.make_tensor_value_info("mv", f, [2, 3]),
            helper.make_tensor_value_info("tm", f, [3, 5]),
            helper.make_tensor_value_info("hs", f, [3, 2, 5])]
    model = helper.make_model(helper.make_graph(nodes, "g", ins, outs, consts),
                              opset_imports=[helper.make_opsetid("", 18)])
    compiled = compile_model(model, CFG)
    rng = np.random.default_rng(7)
    feeds = {"m": rng.standard_normal((2, 3)).astype(np.float32),
             "v": rng.standard_normal(3).astype(np.float32),
             "t": (rng.standard_normal((3, 2, 5)) * 4).astype(np.float32)}
    out = run(compiled.program, feeds).outputs
    assert {k: v.shape for k, v in out.items()} == {"mv": (2, 3), "tm": (3, 5), "hs": (3, 2, 5)}
    for name, e in compare(out, reference(model, feeds)).items():
        assert e["rel_err"] <= REL_TOL and e["cosine"] >= COS_TOL, (name, e)


def test_merged_dma_dimensions_fit_the_size_field():
    # A dense (3, 224, 224) copy is contiguous on both sides: merged into one dimension it
    # would be 150,528 elements, beyond the 16-bit size field of a DMA transfer.
    from npu_compiler.lower import _merge
    from npu_spec.dma import SIZE_BITS
    dims = _merge([224, 224, 3], [2, 448, 448 * 224], [1, 224, 224 * 224])
    assert all(n < 1 << SIZE_BITS for n, _, _ in dims)
    assert int(np.prod([n for n, _, _ in dims])) == 3 * 224 * 224
    assert _merge([8, 4], [2, 16], [1, 8]) == [(32, 2, 1)]
