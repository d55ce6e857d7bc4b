"""Softmax on the NPU (``docs/compiler.md``, "Softmax"): against onnxruntime and against a
float64 softmax with a stated per-element bound; golden against RTL bit for bit (slow)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npu_compiler import frontend
from npu_compiler.compile import compile_model
from npu_compiler.graph import CompileError
from npu_model.postproc import PWL_ERROR_BOUND_F16
from npu_runtime.runtime import compare, reference, run
from npu_spec.config import preset

from .cases import COS_TOL, REL_TOL

CFG = preset("small")


def softmax_model(shape, axis=None, opset=13):
    attrs = {} if axis is None else {"axis": axis}
    node = helper.make_node("Softmax", ["x"], ["y"], name="sm", **attrs)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in "xy"]
    g = helper.make_graph([node], "softmax", io[:1], io[1:])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def softmax_f64(x, axes):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True)


def bound(p, n):
    """Per-element bound on the NPU's error against the float64 softmax of the same binary16
    inputs, ``p`` the exact result and ``n`` the elements per softmax. Each exp term has an
    absolute error of at most ``eps``: the table's bound after rounding to binary16 plus the
    rounding of ``x - max`` to binary16 (``|d| e^d 2^-11 <= 2^-11 / e``). The largest term is
    exactly 1 (``exp(0)``), so the sum ``S >= 1`` is off by at most ``(n - 1) eps``, and
    ``p_i = e_i / S`` by at most ``eps (1 + p_i (n - 1))``; the reciprocal and the product
    are each rounded to binary16 (``2^-11 p_i`` together)."""
    eps = PWL_ERROR_BOUND_F16["exp"] + 2.0 ** -11 / np.e
    return eps * (1 + p * (n - 1)) + 2.0 ** -11 * p


CASES = [
    ((1, 10), None),             # a classifier's last layer
    ((1, 6, 3, 5), 1),           # over the channels: the maximum broadcast as a row
    ((2, 7), -1),                # per row: the maximum broadcast per channel
    ((1, 4, 5), 1),              # a middle axis of a rank-3 tensor
    ((1, 300), -1),              # a long vector
    ((1, 4, 5, 6), 2),           # the maxima vary over C and W: through a transposed copy
    ((3, 4, 5), 1),              # the same on a rank-3 tensor
]


@pytest.mark.parametrize("fmt", ["fp16", "mixed"])
@pytest.mark.parametrize("shape,axis", CASES)
def test_softmax_against_onnxruntime(shape, axis, fmt):
    model = softmax_model(shape, axis)
    x = (np.random.default_rng(len(shape) + shape[-1]).standard_normal(shape) * 2.5
         ).astype(np.float32)
    compiled = compile_model(model, CFG, fmt=fmt)
    got = run(compiled.program, {"x": x}).outputs["y"].astype(np.float64)
    e = compare({"y": got}, reference(model, {"x": x}))["y"]
    assert e["rel_err"] <= REL_TOL and e["cosine"] >= COS_TOL, e
    # Against float64 on the binary16 inputs the NPU sees, element by element.
    ax = (axis if axis is not None else -1) % len(shape)
    want = softmax_f64(x.astype(np.float16), ax)
    assert (np.abs(got - want) <= bound(want, shape[ax])).all()


def test_softmax_opset11_semantics_in_the_lowering(monkeypatch):
    """Before opset 13 the softmax runs over every axis from ``axis`` on. With the version
    converter at work the model arrives as Flatten, Softmax-13, Reshape; with its opset kept
    (the converter failing) the lowering reads the old semantics itself."""
    model = softmax_model((1, 3, 2, 4), axis=1, opset=11)
    x = np.random.default_rng(4).standard_normal((1, 3, 2, 4)).astype(np.float32)
    want = softmax_f64(x.astype(np.float16), (1, 2, 3))
    converted = compile_model(model, CFG)
    assert [r["op"] for r in converted.plan] == ["Flatten", "Softmax", "Reshape"]
    monkeypatch.setattr(frontend, "_convert", lambda m: m)
    kept = compile_model(model, CFG)
    assert [r["op"] for r in kept.plan] == ["Softmax"] and kept.graph.opset == 11
    for compiled in (converted, kept):
        got = run(compiled.program, {"x": x}).outputs["y"].astype(np.float64)
        assert (np.abs(got - want) <= bound(want, 24)).all()
        e = compare({"y": got}, reference(model, {"x": x}))["y"]
        assert e["rel_err"] <= REL_TOL and e["cosine"] >= COS_TOL, e


def test_softmax_one_hot_and_equal_logits():
    """A dominant logit gives exactly 1 (exp(0) = 1, the others 0 from the table's tail);
    equal logits give exactly 1/n when 1/n is a binary16 value."""
    x = np.array([[-30.0, 40.0, 1.0, 0.0], [5.0, 5.0, 5.0, 5.0]], np.float32)
    compiled = compile_model(softmax_model((2, 4), -1), CFG)
    got = run(compiled.program, {"x": x}).outputs["y"]
    assert got.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.25] * 4]


def test_softmax_transposes_only_when_needed():
    plain = compile_model(softmax_model((1, 4, 5, 6), axis=1), CFG)
    moved = compile_model(softmax_model((1, 4, 5, 6), axis=2), CFG)
    assert moved.plan[0]["tasks"] > plain.plan[0]["tasks"]


def test_softmax_unsupported_layouts_and_int8_name_the_node():
    with pytest.raises(CompileError, match=r"node 'sm' \(Softmax\): a softmax with 1600 "
                                           r"maxima to broadcast"):
        compile_model(softmax_model((1, 4, 40, 40), axis=1), CFG)
    x = np.random.default_rng(1).standard_normal((4, 1, 10)).astype(np.float32)
    with pytest.raises(CompileError, match=r"\(Softmax\): operator Softmax is not supported "
                                           r"with --format int8"):
        compile_model(softmax_model((1, 10)), CFG, fmt="int8", calibration={"x": x})


@pytest.mark.slow
@pytest.mark.parametrize("shape,axis", [((1, 10), None), ((1, 3, 2, 2), 1), ((1, 2, 3, 4), 2)])
def test_softmax_rtl_equals_golden(shape, axis):
    model = softmax_model(shape, axis)
    x = (np.random.default_rng(2).standard_normal(shape) * 3).astype(np.float32)
    compiled = compile_model(onnx.load_from_string(model.SerializeToString()), CFG)
    golden = run(compiled.program, {"x": x})
    rtl = run(compiled.program, {"x": x}, "rtl")
    assert rtl.cycles > 0
    assert np.array_equal(golden.outputs["y"].view(np.uint32), rtl.outputs["y"].view(np.uint32))
