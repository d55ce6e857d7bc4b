"""``--format mixed``: binary16 activations, int8 weights with per-channel scales folded into
the post-processor (``npu_compiler.lower.mixed_weights``; ``docs/compiler.md``, "mixed")."""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from npu_compiler.compile import compile_model
from npu_compiler.graph import CompileError
from npu_runtime.runtime import compare, reference, run
from npu_spec.config import preset

from .cases import COS_TOL, REL_TOL, node_case, pytorch_case
from .test_digits import MODEL as DIGITS
from .test_digits import load_train_module

CFG = preset("small")

#: Tolerance of mixed against the stored float outputs: max |error| at most this fraction of
#: the output's largest magnitude. On top of the binary16 errors (``cases.REL_TOL``, 3e-3),
#: each weight is rounded to a step of its channel's max |w| / 127, an error of at most
#: max |w| / 254 (0.4% of the largest weight) per product; summed over the n products of an
#: output these errors, of random sign, grow like sqrt(n) while the output grows like n or
#: sqrt(n). Measured on the cases below: worst 7.9e-3 (test_Conv1d_pad1size1-like 1-D
#: convolutions 4e-3 to 8e-3, gemm and matmul up to 7.2e-3). 1.5e-2 leaves a margin of about
#: 2 and still fails for any wrong element, window or channel (errors of order one).
MIXED_REL_TOL = 1.5e-2
#: Cosine similarity of output and reference (measured at least 0.999974).
MIXED_COS_TOL = 0.9999

PYTORCH = ["test_Conv1d", "test_Conv1d_groups", "test_Conv1d_pad1size1", "test_Conv2d",
           "test_Conv2d_depthwise_strided", "test_Conv2d_dilated", "test_Conv2d_groups",
           "test_Conv2d_no_bias", "test_Conv2d_padding", "test_Conv2d_strided", "test_Linear",
           "test_BatchNorm2d_eval", "test_PReLU_2d", "test_Sigmoid", "test_MaxPool2d"]
NODE = [("conv", "test_conv_with_strides_and_asymmetric_padding"),
        ("gemm", "test_gemm_default_vector_bias"), ("gemm", "test_gemm_transposeA"),
        ("matmul", "test_matmul_2d"), ("batch_normalization", "test_batchnorm_epsilon")]


def _check(model, inputs, expected, batch_one="auto"):
    compiled = compile_model(model, CFG, fmt="mixed",
                             shapes={k: np.shape(v) for k, v in inputs.items()},
                             batch_one=batch_one)
    result = run(compiled.program, inputs, "golden")
    for name, e in compare(result.outputs, expected).items():
        assert e["rel_err"] <= MIXED_REL_TOL and e["cosine"] >= MIXED_COS_TOL, (name, e)
    return compiled, result


@pytest.mark.parametrize("name", PYTORCH)
def test_pytorch_converted_mixed(name):
    compiled, _ = _check(*pytorch_case(name))
    for r in compiled.plan:
        assert not r["kernel_bytes"] or r["kernel_encoding"].endswith("int8"), r


@pytest.mark.parametrize("module,name", NODE)
def test_node_mixed(module, name):
    _check(*node_case(module, name), batch_one=False)


def dequantized(w):
    """Conv weights ``[K, ...]`` as the mixed format holds them, written out: per output
    channel the step ``max |w| / 127``, weights rounded half to even to a multiple of it."""
    w = np.asarray(w, np.float64)
    step = np.abs(w.reshape(len(w), -1)).max(axis=1) / 127
    step = np.where(step > 0, step, 1).reshape((-1,) + (1,) * (w.ndim - 1))
    return (np.rint(w / step) * step).astype(np.float32)


def _conv_dequantized(model):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    weights = {n.input[1] for n in m.graph.node if n.op_type == "Conv"}
    for init in m.graph.initializer:
        if init.name in weights:
            init.CopyFrom(numpy_helper.from_array(dequantized(numpy_helper.to_array(init)),
                                                  init.name))
    return m


@pytest.mark.parametrize("name", ["test_Conv2d", "test_Conv1d_pad1size1",
                                  "test_Conv2d_depthwise_strided", "test_Conv2d_no_bias"])
def test_mixed_is_float_arithmetic_on_the_int8_weights(name):
    """Against onnxruntime running the model with the int8 weights (times their scales), the
    mixed program is as close as fp16 is to the float model (``cases.REL_TOL``): what mixed
    adds is only the weights' rounding; the folded scales cost binary32 roundings only."""
    model, inputs, _ = pytorch_case(name)
    compiled = compile_model(model, CFG, fmt="mixed",
                             shapes={k: np.shape(v) for k, v in inputs.items()})
    got = run(compiled.program, inputs, "golden").outputs
    for n, e in compare(got, reference(_conv_dequantized(model), inputs)).items():
        assert e["rel_err"] <= REL_TOL and e["cosine"] >= COS_TOL, (n, e)


def test_mixed_kernels_take_one_byte_a_weight():
    """The digits CNN's raw kernels: one byte less per weight in mixed than in fp16 (its
    groups hold multiples of 4 weights, so no word padding differs); headers are equal."""
    model = onnx.load(str(DIGITS))
    weights = sum(numpy_helper.to_array(i).size for i in model.graph.initializer
                  if i.name in {n.input[1] for n in model.graph.node
                                if n.op_type in ("Conv", "Gemm")})
    kb = {fmt: sum(r["kernel_raw_bytes"] for r in compile_model(model, CFG, fmt=fmt).plan)
          for fmt in ("fp16", "mixed")}
    assert kb["fp16"] - kb["mixed"] == weights == 1864, kb


def test_mixed_needs_the_mixed_datapath():
    import dataclasses
    cfg = dataclasses.replace(CFG, formats=("int8", "fp16"))
    with pytest.raises(CompileError, match="has no mixed datapath"):
        compile_model(onnx.load(str(DIGITS)), cfg, fmt="mixed")


@pytest.fixture(scope="module")
def digits_split():
    digits = load_train_module()
    return digits, digits.load_split()


def test_digits_mixed_follows_float(digits_split):
    """The first held-out images: mixed logits within :data:`MIXED_REL_TOL` of onnxruntime's
    float logits, and the same classes."""
    digits, split = digits_split
    x = split[2][:1]
    compiled = compile_model(str(DIGITS), CFG, fmt="mixed")
    got = run(compiled.program, {"input": x}, "golden").outputs["logits"]
    want = digits.onnxruntime_logits(x, DIGITS)
    e = compare({"logits": got}, {"logits": want})["logits"]
    assert e["rel_err"] <= MIXED_REL_TOL and e["cosine"] >= MIXED_COS_TOL, e
    assert np.array_equal(got.argmax(1), want.argmax(1))


#: Held-out images the mixed program classifies correctly (docs/compiler.md, "mixed").
MIXED_CORRECT = 353


@pytest.mark.slow
def test_digits_mixed_accuracy(digits_split):
    """All 360 held-out images on the golden backend (about 20 s on the loaded 2-core
    machine): within one point of float."""
    digits, (_, _, x_test, y_test) = digits_split
    compiled = compile_model(str(DIGITS), CFG, fmt="mixed")
    logits = run(compiled.program, {"input": x_test}, "golden").outputs["logits"]
    correct = int((logits.argmax(1) == y_test).sum())
    float_correct = int((digits.onnxruntime_logits(x_test, DIGITS).argmax(1) == y_test).sum())
    assert correct >= float_correct - 0.01 * len(x_test)
    assert correct == MIXED_CORRECT


@pytest.mark.slow
def test_digits_mixed_rtl_equals_golden(digits_split):
    """The mixed format (with 4-bit palettized int8 weights) on the RTL: bit for bit."""
    _, split = digits_split
    x = {"input": split[2][:1]}
    compiled = compile_model(str(DIGITS), CFG, fmt="mixed", palette=4)
    golden = run(compiled.program, x, "golden").outputs["logits"]
    rtl = run(compiled.program, x, "rtl").outputs["logits"]
    assert golden.tobytes() == rtl.tobytes()
