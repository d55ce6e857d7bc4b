"""Quantized (QDQ) models with their int8 tensors in system memory (``npu_compiler.qdq`` on
``npu_compiler.int8mem``; ``docs/compiler.md``, "Quantized models").

A quantized model whose tensors do not fit the buffer is lowered again in memory mode, as a
calibrated int8 one: the layers the model's ``QuantizeLinear`` nodes end are emitted in bands
of output rows, padded explicitly with the input's zero point. Against the buffer-resident
lowering (the same model on a larger buffer) bit for bit: int32 accumulation is exact and
each output sees the same codes. Against onnxruntime on the quantized model: within one step
of the output's scale, as in the buffer (``test_qdq.py``), plus :data:`F32`: both outputs
are float32 roundings of ``(q - z) s``, each within ``2^-24`` of up to 255 steps."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_compiler.compile import compile_model
from npu_runtime.runtime import run
from npu_spec.config import preset

from .models import _init
from .test_qdq import CONV_SHAPES, _float_conv_model, _opset, quantize, steps

pytest.importorskip("onnxruntime.quantization")

#: The float32 rounding of two dequantized outputs of up to 255 steps, in steps.
F32 = 2 * 255 * 2.0 ** -24


def big_net(size=64, seed=11):
    """Conv 4 -> 16 (3x3, pads 1) + Relu: 16 x size x size activations, twice the ``small``
    buffer at 64; a padded max pool, a 1x1 conv, a residual ``Add`` of two such tensors,
    a second max pool, a global average pool (planes up to 16x16) and a ``Gemm``."""
    rng = np.random.default_rng(seed)
    n = helper.make_node

    def init(name, shape, scale=0.4):
        return _init(rng, name, shape, scale)
    graph = helper.make_graph(
        [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="big"),
         n("Relu", ["c1"], ["r1"]),
         n("MaxPool", ["r1"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
         n("Conv", ["p", "w2", "b2"], ["c2"]),
         n("Conv", ["p", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]),
         n("Add", ["c2", "c3"], ["s"], name="residual"),
         n("Relu", ["s"], ["r2"]),
         n("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
         n("GlobalAveragePool", ["p2"], ["g"]), n("Flatten", ["g"], ["f"]),
         n("Gemm", ["f", "wf", "bf"], ["y"], transB=1)], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [init("w1", (16, 4, 3, 3)), init("b1", (16,)), init("w2", (16, 16, 1, 1)),
         init("b2", (16,)), init("w3", (16, 16, 3, 3), 0.1), init("b3", (16,)),
         init("wf", (5, 16)), init("bf", (5,))])
    return _opset(graph)


def _feeds(shape, n, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1,) + shape[1:]).astype(np.float32)}
            for _ in range(n)]


@pytest.mark.parametrize("symmetric", [True, False], ids=["int8-sym", "uint8-asym"])
def test_qdq_network_beyond_the_buffer(tmp_path, symmetric):
    """``small`` (32,768 buffer elements) cannot hold the 65,536 codes of ``big``'s output:
    memory mode; within one step of onnxruntime on the quantized model."""
    qmodel = quantize(big_net(), _feeds((1, 4, 64, 64), 4, 1), tmp_path, "QDQ", symmetric)
    c = compile_model(qmodel, preset("small"), fmt="int8")
    rows = {r["node"]: r for r in c.plan}
    assert rows["big"]["how"] == "in system memory" and rows["big"]["tasks"] > 4
    assert rows["residual"]["engine"] == "PE"
    x = {"x": np.concatenate([f["x"] for f in _feeds((1, 4, 64, 64), 2, 2)])}
    assert steps(qmodel, c, x, "y").max() <= 1 + F32


@pytest.mark.parametrize("symmetric", [True, False], ids=["int8-sym", "uint8-asym"])
@CONV_SHAPES
def test_qdq_memory_mode_equals_buffer_bit_for_bit(tmp_path, symmetric, shape):
    """The layers of ``test_qdq.py`` at 14x14: in the buffer on ``small``, in system memory
    with a 2 KiB buffer (1,024 elements: not the first conv's 784 input and 784 output
    codes together)."""
    model = _float_conv_model(hw=14, **shape)
    qmodel = quantize(model, _feeds((1, 4, 14, 14), 8, 3), tmp_path, "QDQ", symmetric)
    x = {"x": np.concatenate([f["x"] for f in _feeds((1, 4, 14, 14), 2, 4)])}
    outs, hows = [], []
    for cfg in (preset("small"), preset("small").replace(buffer_kib=2)):
        c = compile_model(qmodel, cfg, fmt="int8")
        outs.append(run(c.program, x, "golden").outputs["y"])
        hows.append({r["how"] for r in c.plan if r["op"] != "Flatten"})
    # In memory mode layer by layer or (a chain of convs) depth first in bands.
    assert hows[0] == {""} and all(h.endswith("in system memory") for h in hows[1])
    assert outs[0].tobytes() == outs[1].tobytes()
    assert steps(qmodel, c, x, "y").max() <= 1 + F32


def test_qdq_gemm_over_planes_larger_than_a_kernel(tmp_path):
    """A ``Gemm`` over a flattened ``(3, 24, 24)`` tensor: its kernel would be 24x24 (more
    than the engine's 16x16), so the network goes to system memory, where the ``Gemm``
    reads the tensor as 1,728 channels of one element, folded."""
    qmodel = quantize(_float_conv_model(hw=24, seed=1), _feeds((1, 4, 24, 24), 8, 3),
                      tmp_path, "QDQ", False)
    c = compile_model(qmodel, preset("small"), fmt="int8")
    assert {r["how"] for r in c.plan if r["op"] != "Flatten"} == {"in system memory"}
    x = {"x": np.concatenate([f["x"] for f in _feeds((1, 4, 24, 24), 2, 4)])}
    assert steps(qmodel, c, x, "y").max() <= 1 + F32


def se_net():
    """``test_int8_eltwise.squeeze_excitation`` (``x * sigmoid(...)``, a residual ``+``, a
    ``-`` broadcast over the channels) ending in a 1x1 conv, so that its output is quantized
    too."""
    from .test_int8_eltwise import squeeze_excitation
    model = squeeze_excitation()
    g = model.graph
    rng = np.random.default_rng(2)
    g.node[-1].output[0] = "d"
    g.node.append(helper.make_node("Conv", ["d", "wo", "bo"], ["y"], name="out"))
    g.initializer.extend([
        numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) * 0.4).astype(np.float32),
                                "wo"),
        numpy_helper.from_array((rng.standard_normal(4) * 0.1).astype(np.float32), "bo")])
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6]))
    return model


@pytest.mark.parametrize("symmetric", [True, False], ids=["int8-sym", "uint8-asym"])
def test_qdq_squeeze_excitation(tmp_path, symmetric):
    """A quantized squeeze-excitation block: ``Sigmoid`` (the mixed-format layer with the
    input's zero point as its bias), ``Mul`` of a ``(1, C, H, W)`` and a ``(1, C, 1, 1)``
    tensor (with an output zero point: ``z_y + a b`` by the planar ``fma``), ``Add``, ``Sub``
    with broadcast. In the buffer and in memory mode bit for bit; against onnxruntime within
    two steps: the sigmoid's table (6.0e-4 from the exact value, a sixth of the gate's step)
    may move the gate's code by one, which the layers after it carry."""
    qmodel = quantize(se_net(), _feeds((1, 3, 6, 6), 8, 2), tmp_path, "QDQ", symmetric)
    x = {"x": np.concatenate([f["x"] for f in _feeds((1, 3, 6, 6), 3, 6)])}
    outs = []
    for cfg in (preset("small"), preset("small").replace(buffer_kib=1)):
        c = compile_model(qmodel, cfg, fmt="int8")
        outs.append(run(c.program, x, "golden").outputs["y"])
        rows = {r["node"]: r for r in c.plan}
        assert [rows[k]["engine"] for k in ("excite", "residual", "centre")] == ["PE"] * 3
    assert outs[0].tobytes() == outs[1].tobytes()
    assert steps(qmodel, c, x, "y").max() <= 2 + F32


@pytest.mark.slow
def test_qdq_squeeze_excitation_rtl_equals_golden(tmp_path):
    """uint8: the ``fma`` with a broadcast operand and zero points on the RTL."""
    qmodel = quantize(se_net(), _feeds((1, 3, 6, 6), 8, 2), tmp_path, "QDQ", False)
    c = compile_model(qmodel, preset("small"), fmt="int8")
    x = {"x": _feeds((1, 3, 6, 6), 1, 7)[0]["x"]}
    golden = run(c.program, x, "golden").outputs["y"]
    assert run(c.program, x, "rtl").outputs["y"].tobytes() == golden.tobytes()


@pytest.mark.slow
def test_qdq_memory_mode_rtl_equals_golden(tmp_path):
    """``big_net`` with uint8 activations (zero points: bands bordered with them) in memory
    mode on ``small``, on the RTL, bit for bit."""
    qmodel = quantize(big_net(), _feeds((1, 4, 64, 64), 4, 1), tmp_path, "QDQ", False)
    c = compile_model(qmodel, preset("small"), fmt="int8")
    assert all(r["how"] == "in system memory" for r in c.plan if r["op"] != "Flatten")
    x = {"x": _feeds((1, 4, 64, 64), 1, 5)[0]["x"]}
    golden = run(c.program, x, "golden").outputs["y"]
    rtl = run(c.program, x, "rtl").outputs["y"]
    assert golden.tobytes() == rtl.tobytes()
