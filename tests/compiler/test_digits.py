"""The digits CNN kept in ``models/digits/``: the ONNX file, its float accuracy on
onnxruntime, and its int8 accuracy through ``npu_compiler.quant`` and the golden model's
integer convolution, post-processor and pooling (``docs/quantization.md``)."""

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "digits" / "digits_cnn.onnx"

#: Held-out images classified correctly (of 360), as docs/quantization.md states them.
FLOAT_CORRECT = 351
INT8_CORRECT = 353
HELD_OUT = 360


def load_train_module():
    spec = importlib.util.spec_from_file_location("digits_train",
                                                  ROOT / "models" / "digits" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_model_file_is_valid_onnx():
    model = onnx.load(str(MODEL))
    onnx.checker.check_model(model, full_check=True)
    assert 13 <= model.opset_import[0].version <= 17
    (inp,), (out,) = model.graph.input, model.graph.output
    assert inp.name == "input" and out.name == "logits"
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == [1, 1, 8, 8]
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [n.op_type for n in model.graph.node] == ["Conv", "Relu", "MaxPool", "Conv", "Relu",
                                                     "MaxPool", "Flatten", "Gemm"]


def test_split_is_fixed(split):
    x_train, y_train, x_test, y_test = split
    assert x_train.shape == (1437, 1, 8, 8) and x_test.shape == (HELD_OUT, 1, 8, 8)
    assert 0 <= x_train.min() and x_train.max() <= 1
    assert np.bincount(y_test).tolist() == [36, 36, 35, 37, 36, 37, 36, 36, 35, 36]


def test_float_accuracy_on_onnxruntime(digits, split):
    x_test, y_test = split[2], split[3]
    logits = digits.onnxruntime_logits(x_test, MODEL)
    correct = int((logits.argmax(1) == y_test).sum())
    assert abs(correct - FLOAT_CORRECT) <= 0.005 * HELD_OUT
    # The numpy forward pass used for calibration is the model onnxruntime runs.
    p = digits.load_params(MODEL)
    assert np.allclose(digits.forward(p, x_test), logits, atol=1e-4)


def test_int8_accuracy_within_one_point_of_float(digits, split):
    x_train, _, x_test, y_test = split
    p = digits.load_params(MODEL)
    s0, layers = digits.quantize_model(p, x_train)
    q = digits.int8_logits(s0, layers, x_test)
    assert q.dtype == np.int8 and q.shape == (HELD_OUT, 10)
    correct = int((q.argmax(1) == y_test).sum())
    float_correct = int((digits.forward(p, x_test).argmax(1) == y_test).sum())
    assert correct >= float_correct - 0.01 * HELD_OUT
    assert correct == INT8_CORRECT  # the golden model is deterministic
    # The int8 logits follow the float ones: within a few output steps.
    err = np.abs(q * layers[2].out_scale - digits.forward(p, x_test))
    assert np.percentile(err, 99) < 8 * layers[2].out_scale


def test_int8_with_percentile_calibration(digits, split):
    x_train, _, x_test, y_test = split
    s0, layers = digits.quantize_model(digits.load_params(MODEL), x_train, "percentile")
    correct = int((digits.int8_logits(s0, layers, x_test).argmax(1) == y_test).sum())
    assert correct >= FLOAT_CORRECT - 0.01 * HELD_OUT


@pytest.mark.slow
def test_training_reproduces_the_model(digits, split, tmp_path):
    x_train, y_train = split[0], split[1]
    p = digits.train(x_train, y_train, log=None)
    stored = digits.load_params(MODEL)
    for name, value in stored.items():
        assert np.allclose(p[name], value, atol=1e-5), name


def test_int8_network_as_a_program_on_the_golden_system_model(digits, split):
    """The same quantized layers as a program (``ProgramBuilder``: DMA, neural engine with
    the post-processor's ReLU, planar max pooling; the fully connected layer as a 2x2
    convolution over the pooled [16, 2, 2] tensor) run by the golden system model give the
    int8 logits of the layer-by-layer simulation bit for bit."""
    from npu_compiler.quant import quantize
    from npu_model.builder import ProgramBuilder
    from npu_model.system import read_tensor, run_program
    from npu_spec.config import preset

    x_train, _, x_test, _ = split
    s0, layers = digits.quantize_model(digits.load_params(MODEL), x_train)
    images = x_test[:8]
    want = digits.int8_logits(s0, layers, images)
    weights = [layers[0].weights, layers[1].weights, layers[2].weights.reshape(10, 16, 2, 2)]
    for image, expect in zip(images, want):
        b = ProgramBuilder(preset("small"))
        h = b.load(b.input("x", quantize(image, s0)))
        for i, (layer, w) in enumerate(zip(layers, weights)):
            placement = b.dma_kernels(0, b.kernels(w, **layer.kernel_args()))
            h = b.conv(h, placement, pad=1 if i < 2 else 0, **layer.conv_args())
            if i < 2:
                h = b.max_pool(h, 2)
        b.store(h, b.output("logits", h.shape))
        program = b.build()
        got = read_tensor(run_program(program).memory, program.tensor("logits"))
        assert got.dtype == np.int8
        np.testing.assert_array_equal(got.reshape(10), expect)
