"""Depth-first lowering (``npu_compiler.depthfirst``): the same bytes as layer by layer,
less buffer, rings of rows instead of whole intermediate tensors."""

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, helper

from npu_compiler.compile import compile_model
from npu_compiler.graph import CompileError
from npu_compiler.lower import MView
from npu_runtime.runtime import compare, reference, run
from npu_spec.config import preset

from .cases import COS_TOL, REL_TOL

#: A buffer of 2,048 elements, so that small images already need bands (4,096 for the
#: residual model: the layer-by-layer lowering of its Add needs rows of 864 elements three
#: times).
CFG = dataclasses.replace(preset("small"), buffer_kib=4)
CFGS = {"conv_conv_pool": CFG, "fire": CFG,
        "residual": dataclasses.replace(CFG, buffer_kib=8)}


def _model(name, nodes, x_shape, outputs, weights, seed):
    rng = np.random.default_rng(seed)
    inits = [helper.make_tensor(k, TensorProto.FLOAT, shape,
                                (rng.standard_normal(int(np.prod(shape))) * 0.3)
                                .astype(np.float32)) for k, shape in weights.items()]
    io = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    io += [helper.make_tensor_value_info(o, TensorProto.FLOAT, [f"{o}{k}" for k in range(4)])
           for o in outputs]
    graph = helper.make_graph(nodes, name, io[:1], io[1:], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_conv_pool():
    """3x3 convs with an asymmetric pad and a (2, 1) stride, then an overlapping max pool
    with ceil mode."""
    n = helper.make_node
    return _model("ccp", [
        n("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]),
        n("Relu", ["a"], ["ar"]),
        n("Conv", ["ar", "w2"], ["b"], pads=[0, 1, 2, 0], strides=[2, 1]),
        n("MaxPool", ["b"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    ], (1, 3, 22, 14), ["y"], {"w1": (6, 3, 3, 3), "b1": (6,), "w2": (5, 6, 3, 3)}, 1)


def fire():
    """A SqueezeNet fire module (squeeze 1x1, expand 1x1 and 3x3, concat) between a strided
    conv and a pool, and a 1x1 conv after it."""
    n = helper.make_node
    return _model("fire", [
        n("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        n("Relu", ["c0"], ["r0"]),
        n("Conv", ["r0", "ws"], ["s"]),
        n("Relu", ["s"], ["sr"]),
        n("Conv", ["sr", "we1"], ["e1"]),
        n("Relu", ["e1"], ["e1r"]),
        n("Conv", ["sr", "we3"], ["e3"], pads=[1, 1, 1, 1]),
        n("Relu", ["e3"], ["e3r"]),
        n("Concat", ["e1r", "e3r"], ["cat"], axis=1),
        n("MaxPool", ["cat"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Conv", ["p", "w9"], ["y"]),
    ], (1, 3, 36, 16), ["y"], {"w0": (8, 3, 3, 3), "ws": (3, 8, 1, 1), "we1": (4, 3, 1, 1),
                               "we3": (5, 3, 3, 3), "w9": (4, 9, 1, 1)}, 2)


def residual():
    """A residual block (two 3x3 convs, the sum with the block's input, a ReLU that is a
    layer of its own) and an average pool with padding counted; the block's input is also a
    graph output."""
    n = helper.make_node
    return _model("res", [
        n("Conv", ["x", "w0"], ["h"], pads=[2, 2, 2, 2], dilations=[2, 2]),
        n("Conv", ["h", "w1"], ["h1"], pads=[1, 1, 1, 1]),
        n("Relu", ["h1"], ["h1r"]),
        n("Conv", ["h1r", "w2"], ["h2"], pads=[1, 1, 1, 1]),
        n("Add", ["h2", "h"], ["s"]),
        n("Relu", ["s"], ["sr"]),
        n("AveragePool", ["sr"], ["y"], kernel_shape=[3, 3], strides=[1, 1],
          pads=[1, 1, 1, 1], count_include_pad=1),
    ], (1, 2, 28, 16), ["y", "h"], {"w0": (4, 2, 3, 3), "w1": (4, 4, 3, 3),
                                    "w2": (4, 4, 3, 3)}, 3)


MODELS = {"conv_conv_pool": conv_conv_pool, "fire": fire, "residual": residual}


def _input(model, seed=7):
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(seed).standard_normal(dims).astype(np.float32)


def _rings(compiled):
    """Intermediate tensors stored with fewer rows than they have."""
    shapes = compiled.graph.shapes
    return [t.name for t in compiled.program.tensors if t.role == "scratch"
            and t.name in shapes and len(t.shape) == 4 and t.shape[2] < shapes[t.name][2]]


@pytest.mark.parametrize("name", MODELS)
def test_depth_first_equals_layer_by_layer(name):
    model = MODELS[name]()
    x = _input(model)
    cfg = CFGS[name]
    layer = compile_model(model, cfg, schedule="layer")
    deep = compile_model(model, cfg, schedule="depth-first")
    assert any("depth-first" in r["how"] for r in deep.plan)
    assert not any("depth-first" in r["how"] for r in layer.plan)
    assert _rings(deep) and not _rings(layer)
    peak_layer, peak_deep = (c.program.metadata["compiler"]["buffer_peak"]
                             for c in (layer, deep))
    assert peak_deep < peak_layer <= cfg.buffer_kib * 512
    a = run(layer.program, {"x": x}).outputs
    b = run(deep.program, {"x": x}).outputs
    assert list(a) == list(b)
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    # and both near onnxruntime (binary16 tolerance)
    for k, e in compare(b, reference(model, {"x": x})).items():
        assert e["rel_err"] <= REL_TOL and e["cosine"] >= COS_TOL, (k, e)


def test_plan_rows_carry_the_buffer_peak():
    deep = compile_model(fire(), CFG)
    peaks = [r["buffer_peak"] for r in deep.plan]
    assert all(0 < p <= 2048 for p in peaks)
    assert max(peaks) == deep.program.metadata["compiler"]["buffer_peak"]
    assert deep.program.metadata["compiler"]["schedule"] == "depth-first"


def test_chains_that_fit_run_layer_by_layer():
    model = residual()
    big = dataclasses.replace(CFG, buffer_kib=32)
    deep = compile_model(model, big)
    assert not any("depth-first" in r["how"] for r in deep.plan)


def test_unknown_schedule_is_an_error():
    with pytest.raises(CompileError, match="schedule must be one of"):
        compile_model(conv_conv_pool(), CFG, schedule="breadth-first")


def test_ring_view_cuts_wrapping_rows():
    v = MView(1000, (2, 10, 4), (80, 8, 2), ring=4, axis=1)      # 2 channels, 4 slots
    part = v.slice(1, 3, 6).slice(0, 1, 2)                          # rows 3..5 of channel 1
    pieces = [(a, b, p.addr, p.shape) for a, b, p in part.pieces()]
    assert pieces == [(0, 1, 1000 + 80 + 3 * 8, (1, 1, 4)), (1, 3, 1000 + 80, (1, 2, 4))]
    assert v.reshape((1, 2, 10, 4)).axis == 2
    with pytest.raises(CompileError):
        v.slice(1, 0, 5).pieces().__next__()


@pytest.mark.slow
def test_depth_first_rtl_equals_golden():
    model = fire()
    x = _input(model)
    compiled = compile_model(model, CFG)
    assert _rings(compiled)
    golden = run(compiled.program, {"x": x})
    rtl = run(compiled.program, {"x": x}, "rtl")
    for k in golden.outputs:
        assert golden.outputs[k].tobytes() == rtl.outputs[k].tobytes(), k


def test_cli_prints_buffer_peaks_for_both_schedules(tmp_path, capsys):
    import re

    import onnx

    from npu_cli.main import main
    n = helper.make_node
    model = _model("chain", [
        n("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        n("Conv", ["a", "w2"], ["b"], pads=[1, 1, 1, 1]),
        n("MaxPool", ["b"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ], (1, 4, 64, 48), ["y"], {"w1": (8, 4, 3, 3), "w2": (8, 8, 3, 3)}, 4)
    path = tmp_path / "chain.onnx"
    onnx.save(model, path)
    peaks = {}
    for schedule in ("layer", "depth-first"):
        assert main(["compile", str(path), "--schedule", schedule]) == 0
        out = capsys.readouterr().out
        rows = [line for line in out.splitlines() if " Conv " in line or " MaxPool " in line]
        assert len(rows) == 3 and all(re.search(r"buffer \d+", r) for r in rows)
        assert all(("depth-first" in r) == (schedule == "depth-first") for r in rows)
        m = re.search(r"buffer peak (\d+) of 32768 elements \(schedule (\S+)\)", out)
        assert m and m.group(2) == schedule
        peaks[schedule] = int(m.group(1))
    assert peaks["depth-first"] <= peaks["layer"] // 2
    assert main(["compile", str(path), "--schedule", "sideways"]) == 2
    assert "invalid choice: 'sideways'" in capsys.readouterr().err
