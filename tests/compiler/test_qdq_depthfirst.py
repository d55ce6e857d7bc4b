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


def _q(name, s, z):
    return [numpy_helper.from_array(np.array(s, np.float32), f"s_{name}"),
            numpy_helper.from_array(np.array(z, np.uint8), f"z_{name}")]


def _scale(a):
    """uint8 scale and zero point covering ``a`` and 0."""
    lo, hi = min(a.min(), 0.0), max(a.max(), 0.0)
    s = (hi - lo) / 255
    return s, int(np.clip(np.rint(-lo / s), 0, 255))


def qdq_chain(size=48, c_in=4, seed=5, layers=LAYERS, residual=False):
    """``x`` -> QuantizeLinear (uint8, zero point 128) -> a ``DequantizeLinear`` / ``Conv``
    (int8 per-channel weights, int32 bias) / [``Relu``] / ``QuantizeLinear`` layer (uint8
    with a zero point) per entry of ``layers`` -> ``DequantizeLinear`` -> ``y``; with
    ``residual`` the first layer's output (read by the second layer and, later, by it) plus
    the last one's, quantized, is ``y``. Activation scales from a float64 run on one
    sample. Returns the model and the bound, in steps of ``y``'s scale, of the module
    docstring."""
    rng = np.random.default_rng(seed)
    n, inits, nodes = helper.make_node, _q("x", 4.0 / 255, 128), []
    a = rng.standard_normal((c_in, size, size))
    nodes += [n("QuantizeLinear", ["x", "s_x", "z_x"], ["q_x"]),
              n("DequantizeLinear", ["q_x", "s_x", "z_x"], ["d_x"])]
    prev, s_prev, err, c, done = "d_x", 4.0 / 255, 0.0, c_in, []
    for i, (k, side, relu) in enumerate(layers):
        w = numpy_helper.to_array(_init(rng, f"w{i}", (k, c, side, side), 0.3))
        b = numpy_helper.to_array(_init(rng, f"b{i}", (k,), 0.3))
        s_w = np.abs(w).reshape(k, -1).max(axis=1) / 127
        wq = np.clip(np.rint(w / s_w[:, None, None, None]), -127, 127).astype(np.int8)
        bq = np.rint(b / (s_prev * s_w)).astype(np.int32)
        a = _conv_ref(a, wq * s_w[:, None, None, None], bq * s_prev * s_w, relu)
        s_y, z_y = _scale(a)
        inits += [numpy_helper.from_array(wq, f"wq{i}"),
                  numpy_helper.from_array(s_w.astype(np.float32), f"sw{i}"),
                  numpy_helper.from_array(np.zeros(k, np.int8), f"zw{i}"),
                  numpy_helper.from_array(bq, f"bq{i}"),
                  numpy_helper.from_array((s_prev * s_w).astype(np.float32), f"sb{i}"),
                  numpy_helper.from_array(np.zeros(k, np.int32), f"zb{i}"), *_q(i, s_y, z_y)]
        conv_out = f"c{i}_relu" if relu else f"c{i}"
        nodes += [n("DequantizeLinear", [f"wq{i}", f"sw{i}", f"zw{i}"], [f"w{i}"], axis=0),
                  n("DequantizeLinear", [f"bq{i}", f"sb{i}", f"zb{i}"], [f"b{i}"], axis=0),
                  n("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[side // 2] * 4,
                    name=f"conv{i}")]
        if relu:
            nodes.append(n("Relu", [f"c{i}"], [conv_out]))
        nodes += [n("QuantizeLinear", [conv_out, f"s_{i}", f"z_{i}"], [f"q{i}"]),
                  n("DequantizeLinear", [f"q{i}", f"s_{i}", f"z_{i}"], [f"d{i}"])]
        w_sum = np.abs(wq * s_w[:, None, None, None]).reshape(k, -1).sum(axis=1).max()
        err = 1.0 + err * s_prev * w_sum / s_y
        done.append((a, s_y, err))
        prev, s_prev, c = f"d{i}", s_y, k
    if residual:
        (a0, s0, e0), (a1, s1, e1) = done[0], done[-1]
        s_y, z_y = _scale(a0 + a1)
        inits += _q("y", s_y, z_y)
        nodes += [n("Add", ["d0", prev], ["sum"], name="residual"),
                  n("QuantizeLinear", ["sum", "s_y", "z_y"], ["q_y"]),
                  n("DequantizeLinear", ["q_y", "s_y", "z_y"], ["y"])]
        err = 1.0 + (e0 * s0 + e1 * s1) / s_y
    else:
        nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "qdq_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, size, size])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), err


@pytest.mark.parametrize("shape", [
    {},
    {"layers": ((16, 3, True), (16, 3, True), (16, 1, False)), "residual": True, "seed": 6},
], ids=["chain", "residual"])
def test_qdq_depth_first_equals_layer_by_layer(capsys, shape):
    """``small`` (32,768 buffer elements) cannot hold the first layer's 16 x 48 x 48
    output: memory mode. Depth first: the three convs in interleaved bands, a lower buffer
    peak than layer by layer, the same output bits; within the propagated bound of
    onnxruntime. ``residual``: the first conv's output is also read by the ``Add`` after
    the segment, so it is kept whole (no ring) while the second's is a ring."""
    model, bound = qdq_chain(**shape)
    cfg = preset("small")
    progs = {s: compile_model(model, cfg, fmt="int8", schedule=s)
             for s in ("depth-first", "layer")}
    df = {r["node"]: r for r in progs["depth-first"].plan}
    assert all("depth-first, bands of" in df[f"conv{i}"]["how"] for i in range(3))
    assert all(r["how"] == "in system memory" for r in progs["layer"].plan)
    peaks = {s: c.program.metadata["compiler"]["buffer_peak"] for s, c in progs.items()}
    with capsys.disabled():
        print(f"\nqdq {'residual' if shape else 'chain'} on small: buffer peak "
              f"depth-first {peaks['depth-first']}, layer by layer {peaks['layer']}; tasks "
              f"{sum(r['tasks'] for r in progs['depth-first'].plan)} and "
              f"{sum(r['tasks'] for r in progs['layer'].plan)}")
    assert peaks["depth-first"] < peaks["layer"]
    x = {"x": np.random.default_rng(9).standard_normal((1, 4, 48, 48)).astype(np.float32)}
    out = {s: run(c.program, x, "golden").outputs["y"] for s, c in progs.items()}
    assert np.array_equal(out["depth-first"], out["layer"])
    spec = progs["depth-first"].program.metadata["compiler"]["outputs"][0]
    err = np.abs(out["depth-first"].astype(np.float64) - reference(model, x)["y"])
    assert err.max() / spec["scale"] <= bound + 1e-3
    assert np.mean(err / spec["scale"] < 0.5) > 0.5        # not just within the bound


@pytest.mark.slow
def test_qdq_depth_first_rtl_equals_golden():
    """The chain's depth-first program (uint8 zero points bordering the bands, rings) on
    the Verilator system simulation, equal to the golden model bit for bit."""
    model, _ = qdq_chain()
    c = compile_model(model, preset("small"), fmt="int8", schedule="depth-first")
    assert any("depth-first" in r["how"] for r in c.plan)
    x = {"x": np.random.default_rng(10).standard_normal((1, 4, 48, 48)).astype(np.float32)}
    golden = run(c.program, x, "golden").outputs["y"]
    rtl = run(c.program, x, "rtl").outputs["y"]
    assert golden.tobytes() == rtl.tobytes()
