"""The depth-first schedule on quantized (QDQ) models in memory mode (``npu_compiler.qdq``,
``_QDQ.segment_layer``; ``docs/compiler.md``, "Quantized models").

A hand-built QDQ chain of three convolutions whose activations do not fit the ``small``
buffer: under ``--schedule depth-first`` its layers run as interleaved row bands with the
intermediate tensors in rings, and its output equals the layer-by-layer schedule's bit for
bit (the same int32 accumulators and requantizations, in another order).

Against onnxruntime running the same model: the propagated one-step bound of
``test_qdq.py``. The first layer is within one step of its scale (same int32 accumulator,
one rounding each side). A layer reading codes that differ by at most ``e`` steps of scale
``s_in`` moves its value before rounding by at most ``e s_in max_k sum |w_k| / s_out``
steps of its own scale (``w_k`` the dequantized weights of output channel ``k``; ReLU and
saturation are 1-Lipschitz), plus its own rounding's one step."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_compiler.compile import compile_model
from npu_runtime.runtime import reference, run
from npu_spec.config import preset

from .models import _init

pytest.importorskip("onnxruntime")

#: (output channels, kernel side, ReLU) of each convolution of :func:`qdq_chain`.
LAYERS = ((16, 3, True), (16, 3, True), (8, 1, False))


def _float_chain(rng, c_in):
    """Float weights and biases of :data:`LAYERS`."""
    params, c = [], c_in
    for i, (k, side, _) in enumerate(LAYERS):
        w = _init(rng, f"w{i}", (k, c, side, side), 0.3)
        b = _init(rng, f"b{i}", (k,), 0.3)
        params.append((numpy_helper.to_array(w), numpy_helper.to_array(b)))
        c = k
    return params


def _conv_ref(x, w, b, relu):
    """A float64 stride-1 convolution with 'same' padding (for the scales only)."""
    k, c, side, _ = w.shape
    p = side // 2
    xp = np.pad(x, ((0, 0), (p, p), (p, p)))
    h, width = x.shape[1:]
    y = np.zeros((k, h, width)) + b[:, None, None]
    for dy in range(side):
        for dx in range(side):
            y += np.einsum("kc,chw->khw", w[:, :, dy, dx], xp[:, dy:dy + h, dx:dx + width])
    return np.maximum(y, 0) if relu else y


def qdq_chain(size=48, c_in=4, seed=5):
    """``x`` -> QuantizeLinear (uint8, zero point 128) -> three ``DequantizeLinear`` /
    ``Conv`` (int8 per-channel weights, int32 bias) / [``Relu``] / ``QuantizeLinear``
    layers (uint8 with zero points) -> ``DequantizeLinear`` -> ``y``. Activation scales
    from a float64 run on one sample. Returns the model and the per-layer ``(s_in, s_out,
    max_k sum |w_k|)`` of the error bound."""
    rng = np.random.default_rng(seed)
    params = _float_chain(rng, c_in)
    n, inits, nodes = helper.make_node, [], []
    sample = rng.standard_normal((c_in, size, size))
    s_x, a = 4.0 / 255, sample
    inits += [numpy_helper.from_array(np.array(s_x, np.float32), "s_x"),
              numpy_helper.from_array(np.array(128, np.uint8), "z_x")]
    nodes += [n("QuantizeLinear", ["x", "s_x", "z_x"], ["q_x"]),
              n("DequantizeLinear", ["q_x", "s_x", "z_x"], ["d_x"])]
    prev, s_prev, bound = "d_x", s_x, []
    for i, ((w, b), (_, side, relu)) in enumerate(zip(params, LAYERS)):
        s_w = np.abs(w).reshape(w.shape[0], -1).max(axis=1) / 127
        wq = np.clip(np.rint(w / s_w[:, None, None, None]), -127, 127).astype(np.int8)
        bq = np.rint(b / (s_prev * s_w)).astype(np.int32)
        a = _conv_ref(a, wq * s_w[:, None, None, None], bq * s_prev * s_w, relu)
        lo, hi = min(a.min(), 0.0), max(a.max(), 0.0)
        s_y = (hi - lo) / 255
        z_y = int(np.clip(np.rint(-lo / s_y), 0, 255))
        inits += [numpy_helper.from_array(wq, f"wq{i}"),
                  numpy_helper.from_array(s_w.astype(np.float32), f"sw{i}"),
                  numpy_helper.from_array(np.zeros(len(s_w), np.int8), f"zw{i}"),
                  numpy_helper.from_array(bq, f"bq{i}"),
                  numpy_helper.from_array((s_prev * s_w).astype(np.float32), f"sb{i}"),
                  numpy_helper.from_array(np.zeros(len(s_w), np.int32), f"zb{i}"),
                  numpy_helper.from_array(np.array(s_y, np.float32), f"s{i}"),
                  numpy_helper.from_array(np.array(z_y, np.uint8), f"z{i}")]
        conv_out = f"c{i}_relu" if relu else f"c{i}"
        nodes += [n("DequantizeLinear", [f"wq{i}", f"sw{i}", f"zw{i}"], [f"w{i}"], axis=0),
                  n("DequantizeLinear", [f"bq{i}", f"sb{i}", f"zb{i}"], [f"b{i}"], axis=0),
                  n("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[side // 2] * 4,
                    name=f"conv{i}")]
        if relu:
            nodes.append(n("Relu", [f"c{i}"], [conv_out]))
        nodes += [n("QuantizeLinear", [conv_out, f"s{i}", f"z{i}"], [f"q{i}"]),
                  n("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"])]
        w_sum = np.abs(wq * s_w[:, None, None, None]).reshape(w.shape[0], -1).sum(axis=1)
        bound.append((s_prev, s_y, float(w_sum.max())))
        prev, s_prev = f"d{i}", s_y
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "qdq_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                       [1, LAYERS[-1][0], size, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return model, bound


def _steps_bound(bound):
    e = 1.0
    for s_in, s_out, w_sum in bound[1:]:
        e = 1.0 + e * s_in * w_sum / s_out
    return e


def test_qdq_depth_first_equals_layer_by_layer(capsys):
    """``small`` (32,768 buffer elements) cannot hold the first layer's 16 x 48 x 48
    output: memory mode. Depth first: the three layers in interleaved bands, a lower buffer
    peak than layer by layer, the same output bits; within the propagated bound of
    onnxruntime."""
    model, bound = qdq_chain()
    cfg = preset("small")
    progs = {s: compile_model(model, cfg, fmt="int8", schedule=s)
             for s in ("depth-first", "layer")}
    df = {r["node"]: r for r in progs["depth-first"].plan}
    assert all("depth-first, bands of" in df[f"conv{i}"]["how"] for i in range(3))
    assert all(r["how"] == "in system memory" for r in progs["layer"].plan)
    peaks = {s: c.program.metadata["compiler"]["buffer_peak"] for s, c in progs.items()}
    with capsys.disabled():
        print(f"\nqdq chain on small: buffer peak depth-first {peaks['depth-first']}, "
              f"layer by layer {peaks['layer']}; tasks "
              f"{sum(r['tasks'] for r in progs['depth-first'].plan)} and "
              f"{sum(r['tasks'] for r in progs['layer'].plan)}")
    assert peaks["depth-first"] < peaks["layer"]
    x = {"x": np.random.default_rng(9).standard_normal((1, 4, 48, 48)).astype(np.float32)}
    out = {s: run(c.program, x, "golden").outputs["y"] for s, c in progs.items()}
    assert np.array_equal(out["depth-first"], out["layer"])
    spec = progs["depth-first"].program.metadata["compiler"]["outputs"][0]
    err = np.abs(out["depth-first"].astype(np.float64) - reference(model, x)["y"])
    assert err.max() / spec["scale"] <= _steps_bound(bound) + 1e-3
    assert np.mean(err / spec["scale"] < 0.5) > 0.5        # not just within the bound
