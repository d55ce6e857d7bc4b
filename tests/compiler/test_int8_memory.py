"""``--format int8`` with activations in system memory (``npu_compiler.int8mem``;
``docs/compiler.md``, "int8"): networks whose int8 activations do not fit the buffer, cut into
bands, and the operators that need system memory (``Concat``, ``AveragePool``, asymmetric
pads, non-square strides, layers with more input channels than the input buffer's rows).

Bit for bit: the same network lowered with every activation in the buffer (on a preset with a
larger buffer) and in system memory (bands on ``small``, or a buffer of 1 KiB) gives the same
int8 outputs, since int8 accumulation is exact. Against onnxruntime on the float model: the
error is int8 quantization's (per-tensor activation scales, per-channel weights), bounded in
steps of the output's scale (``max |y| / 127`` of the calibration)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_cli.main import main
from npu_compiler.compile import compile_model
from npu_runtime.runtime import reference, run, session
from npu_spec.config import preset

from .test_digits import MODEL


def _model(nodes, inits, x_shape, y_shape, name="m"):
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _init(rng, name, shape):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 4
    return numpy_helper.from_array(
        (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name)


def big_conv(size=64):
    """Conv 3 -> 16 (3x3, pads 1) + Relu and a padded MaxPool: 16 x size x size int8
    activations, beyond the ``small`` buffer (32,768 elements) at 48 and above."""
    rng = np.random.default_rng(5)
    n = helper.make_node
    return _model([n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="big"),
                   n("Relu", ["c"], ["r"]),
                   n("MaxPool", ["r"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                     pads=[1, 1, 1, 1])],
                  [_init(rng, "w", (16, 3, 3, 3)), _init(rng, "b", (16,))],
                  [1, 3, size, size], [1, 16, size // 2, size // 2])


def fire_net(size=64):
    """A SqueezeNet-like network: a strided conv, a ``ceil_mode`` max pool, a fire module
    (squeeze 1x1, expand 1x1 and 3x3, ``Concat``), a ``Concat`` of an operand of another
    scale (the pool's output), a grouped conv with asymmetric pads and strides (2, 1),
    average pools (``count_include_pad`` 1 and 0), a conv of 272 input channels (more than
    the input buffer's 256 rows), global average pool, ``Flatten``, ``Gemm``."""
    rng = np.random.default_rng(7)
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w0", "b0"], ["c0"], strides=[2, 2], name="conv0"),
        n("Relu", ["c0"], ["r0"]),
        n("MaxPool", ["r0"], ["p0"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        n("Conv", ["p0", "ws", "bs"], ["s"]), n("Relu", ["s"], ["rs"]),
        n("Conv", ["rs", "we1", "be1"], ["e1"]), n("Relu", ["e1"], ["re1"]),
        n("Conv", ["rs", "we3", "be3"], ["e3"], pads=[1, 1, 1, 1]), n("Relu", ["e3"], ["re3"]),
        n("Concat", ["re1", "re3", "p0"], ["f"], axis=1, name="fire"),
        n("Conv", ["f", "wa", "ba"], ["a"], pads=[0, 1, 2, 1], strides=[2, 1], group=16,
          name="asym"),
        n("Relu", ["a"], ["ra"]),
        n("AveragePool", ["ra"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
          count_include_pad=1),
        n("AveragePool", ["ap"], ["aq"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("Conv", ["aq", "ww", "bw"], ["wd"], name="wide"), n("Relu", ["wd"], ["rw"]),
        n("GlobalAveragePool", ["rw"], ["g"]), n("Flatten", ["g"], ["fl"]),
        n("Gemm", ["fl", "wf", "bf"], ["y"], transB=1)]
    inits = [_init(rng, k, s) for k, s in (
        ("w0", (32, 3, 3, 3)), ("b0", (32,)), ("ws", (16, 32, 1, 1)), ("bs", (16,)),
        ("we1", (64, 16, 1, 1)), ("be1", (64,)), ("we3", (64, 16, 3, 3)), ("be3", (64,)),
        ("wa", (272, 10, 3, 3)), ("ba", (272,)), ("ww", (24, 272, 1, 1)), ("bw", (24,)),
        ("wf", (10, 24)), ("bf", (10,)))]
    return _model(nodes, inits, [1, 3, size, size], [1, 10])


def _compile(model, config, x, seed=1, items=8):
    """``model`` compiled in int8, calibrated on ``items`` random inputs and on ``x`` (the
    inputs of the test: no value saturates, so the error is rounding's alone)."""
    rng = np.random.default_rng(seed)
    cal = np.concatenate([rng.standard_normal((items,) + x.shape[1:]), x])
    return compile_model(model, config, fmt="int8", evaluator=session,
                         calibration={"x": cal[:, None].astype(np.float32)})


def _steps(c, model, x):
    """The largest error against onnxruntime in steps of the output's scale."""
    got = run(c.program, {"x": x}, "golden").outputs["y"]
    ref = reference(model, {"x": x})["y"]
    step = c.program.metadata["compiler"]["outputs"][0]["scale"]
    return np.abs(got - ref).max() / step, got


def test_conv_beyond_the_buffer_runs_in_bands_and_equals_the_buffer_resident_lowering():
    model = big_conv(64)
    small = preset("small")
    x = np.random.default_rng(2).standard_normal((2, 3, 64, 64)).astype(np.float32)
    c = _compile(model, small, x)
    assert all("in system memory" in r["how"] for r in c.plan)
    conv = next(r for r in c.plan if r["node"] == "big")
    assert conv["tasks"] > 4       # bands: several fills, loads, convs and stores
    big = _compile(model, small.replace(buffer_kib=512), x)
    assert not any("in system memory" in r["how"] for r in big.plan)
    steps, got = _steps(c, model, x)
    assert 0 < steps <= 2
    assert got.tobytes() == run(big.program, {"x": x}, "golden").outputs["y"].tobytes()


@pytest.mark.parametrize("model_name", ["digits", "residual"])
def test_memory_mode_equals_buffer_mode_bit_for_bit(model_name, split):
    """A 1 KiB buffer forces every activation of the digits CNN and of a residual block
    into system memory; the outputs equal those of the buffer-resident lowering."""
    from .test_int8 import _residual
    if model_name == "digits":
        import onnx
        model, xs, name = onnx.load(str(MODEL)), split[2][:6], "input"
        cal = {"input": split[0][:50]}
    else:
        model, name = _residual(), "x"
        rng = np.random.default_rng(4)
        xs = rng.standard_normal((3, 2, 6, 6)).astype(np.float32)
        cal = {"x": rng.standard_normal((16, 1, 2, 6, 6)).astype(np.float32)}
    outs = []
    for cfg in (preset("small"), preset("small").replace(buffer_kib=1)):
        c = compile_model(model, cfg, fmt="int8", calibration=cal, evaluator=session)
        outs.append((c, run(c.program, {name: xs}, "golden").outputs))
    (resident, a), (memory, b) = outs
    assert not any("in system memory" in r["how"] for r in resident.plan)
    assert any("in system memory" in r["how"] for r in memory.plan)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k


def test_squeezenet_like_network_against_onnxruntime():
    """Every operator of memory mode in one network at 64x64 (its first activation, 32 x 31
    x 31 int8 values, is beyond the ``small`` buffer with its input)."""
    model = fire_net(64)
    x = np.random.default_rng(3).standard_normal((2, 3, 64, 64)).astype(np.float32)
    c = _compile(model, preset("small").replace(mem_kib=1024), x)
    rows = {r["node"]: r for r in c.plan}
    # The pool's output has another scale than the fire module's: requantized on the NE.
    assert rows["fire"]["op"] == "Concat" and rows["fire"]["engine"] == "NE"
    steps, _ = _steps(c, model, x)
    assert 0 < steps <= 4


def test_depth_first_equals_layer_by_layer_bit_for_bit():
    """Under the depth-first schedule (the default) the layers of the SqueezeNet-like network
    that do not fit the buffer run as interleaved row bands, their intermediate tensors in
    rings of rows; the outputs equal those of the layer-by-layer schedule bit for bit, with
    less system memory."""
    model = fire_net(64)
    x = np.random.default_rng(3).standard_normal((1, 3, 64, 64)).astype(np.float32)
    rng = np.random.default_rng(1)
    cal = {"x": np.concatenate([rng.standard_normal((4,) + x.shape[1:]), x])[:, None]
           .astype(np.float32)}
    cfg = preset("small").replace(mem_kib=1024)
    runs = {}
    for schedule in ("depth-first", "layer"):
        c = compile_model(model, cfg, fmt="int8", calibration=cal, evaluator=session,
                          schedule=schedule)
        runs[schedule] = (c, run(c.program, {"x": x}, "golden").outputs["y"])
    (df, a), (layer, b) = runs["depth-first"], runs["layer"]
    segment = [r for r in df.plan if r["how"].startswith("depth-first")]
    assert {r["node"] for r in segment} >= {"conv0", "fire", "asym"}
    assert not any(r["how"].startswith("depth-first") for r in layer.plan)
    assert a.tobytes() == b.tobytes()
    assert len(df.program.memory) <= len(layer.program.memory)


def _constants():
    """Conv, then ``Add`` of a per-channel constant, ``Mul`` by a scalar, ``Sub`` from a
    per-channel constant (``c - x``), ``Div`` by a scalar, ``Sub`` of a scalar."""
    rng = np.random.default_rng(11)
    n = helper.make_node
    consts = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in (
        ("bias", rng.standard_normal((1, 6, 1, 1))), ("two", np.array(2.5)),
        ("from", rng.standard_normal((6, 1, 1))), ("four", np.array([4.0])),
        ("half", np.array(0.5)))]
    return _model([n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                   n("Add", ["c", "bias"], ["a"]), n("Mul", ["two", "a"], ["m"]),
                   n("Sub", ["from", "m"], ["s"]), n("Div", ["s", "four"], ["d"]),
                   n("Sub", ["d", "half"], ["y"])],
                  [_init(rng, "w", (6, 3, 3, 3))] + consts, [1, 3, 12, 12], [1, 6, 12, 12])


def test_arithmetic_with_constants_in_the_buffer_and_in_memory():
    """``Add``, ``Sub``, ``Mul``, ``Div`` with a scalar or per-channel constant: a depthwise
    1x1 layer each, within 4 output steps of onnxruntime (one rounding per layer), the same
    bits with every activation in system memory."""
    model = _constants()
    x = np.random.default_rng(12).standard_normal((2, 3, 12, 12)).astype(np.float32)
    outs = []
    for cfg in (preset("small"), preset("small").replace(buffer_kib=1)):
        c = _compile(model, cfg, x)
        assert [r["engine"] for r in c.plan] == ["NE"] * 6
        steps, got = _steps(c, model, x)
        assert 0 < steps <= 4
        outs.append(got)
    assert outs[0].tobytes() == outs[1].tobytes()


def test_two_cores_equal_one_core_in_system_memory():
    """On ``ecp5`` (two cores, a 256 KiB buffer) a conv of 16 x 96 x 96 outputs runs depth
    first in system memory; split over both cores (each its own kernels, reloaded when a band
    of another layer overwrote them) it gives the bits of one core."""
    model = big_conv(96)
    x = np.random.default_rng(9).standard_normal((1, 3, 96, 96)).astype(np.float32)
    outs = []
    for cores in (1, 2):
        rng = np.random.default_rng(1)
        cal = np.concatenate([rng.standard_normal((4,) + x.shape[1:]), x])[:, None]
        c = compile_model(model, preset("ecp5").replace(mem_kib=1024), fmt="int8",
                          calibration={"x": cal.astype(np.float32)}, evaluator=session,
                          cores=cores)
        assert all(r["how"].startswith("depth-first") for r in c.plan)
        assert max(r["cores"] for r in c.plan) == cores
        outs.append(run(c.program, {"x": x}, "golden").outputs["y"])
    assert outs[0].tobytes() == outs[1].tobytes()


@pytest.mark.parametrize("axis, second, out_shape, requantized", [
    (1, "d", [1, 6, 8, 8], False),   # channels; both operands take the Concat's scale
    (1, "x", [1, 6, 8, 8], True),    # a graph input: requantized on the neural engine
    (2, "d", [1, 3, 16, 8], False),  # rows
    (3, "x", [1, 3, 8, 16], True),   # columns, requantized
])
def test_concat_along_each_axis_against_onnxruntime(axis, second, out_shape, requantized):
    rng = np.random.default_rng(13)
    n = helper.make_node
    model = _model([n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                    n("Conv", ["x", "w2"], ["d"], pads=[1, 1, 1, 1]),
                    n("Concat", ["c", second], ["y"], axis=axis, name="join")],
                   [_init(rng, "w", (3, 3, 3, 3)), _init(rng, "w2", (3, 3, 3, 3))],
                   [1, 3, 8, 8], out_shape)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    c = _compile(model, preset("small"), x)
    join = next(r for r in c.plan if r["node"] == "join")
    assert join["engine"] == ("NE" if requantized else "-")
    steps, _ = _steps(c, model, x)
    assert 0 < steps <= 2


def test_cli_compiles_a_network_beyond_the_buffer(tmp_path, capsys):
    import onnx
    onnx.save(big_conv(48), tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "cal.npz", x=rng.standard_normal((4, 1, 3, 48, 48)).astype(np.float32))
    np.save(tmp_path / "x.npy", rng.standard_normal((1, 3, 48, 48)).astype(np.float32))
    prog = str(tmp_path / "m.npu")
    assert main(["compile", str(tmp_path / "m.onnx"), "--format", "int8", "--calibration",
                 str(tmp_path / "cal.npz"), "-o", prog]) == 0
    assert "in system memory" in capsys.readouterr().out
    assert main(["run", str(tmp_path / "m.onnx"), "--format", "int8", "--calibration",
                 str(tmp_path / "cal.npz"), "--input", f"x={tmp_path / 'x.npy'}",
                 "--check"]) == 0
    assert "cosine" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("make, size", [(big_conv, 48), (fire_net, 32)])
def test_memory_mode_rtl_equals_golden(make, size):
    model = make(size)
    cfg = preset("small")
    x = {"x": np.random.default_rng(9).standard_normal((1, 3, size, size)).astype(np.float32)}
    c = _compile(model, cfg, x["x"])
    assert all("in system memory" in r["how"] for r in c.plan if r["tasks"])
    if make is big_conv:    # the conv's 16 x 48 x 48 output does not fit: depth first
        assert all(r["how"].startswith("depth-first") for r in c.plan)
    golden = run(c.program, x, "golden").outputs["y"]
    rtl = run(c.program, x, "rtl").outputs["y"]
    assert golden.tobytes() == rtl.tobytes()
