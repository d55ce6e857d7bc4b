"""Record RTL task traces of small programs for the timing model's tests.

For each case: compile the model for ``small``, run it on the Verilator system simulation
(memory latency 4, as ``npu run --backend rtl``), and write ``DIR/NAME.npu`` (the program,
inputs written) and ``DIR/NAME.json`` (``cycles``: host start to idle; ``tasks``: per task
``[task ID, engine, start, end]`` from the trace). ``npu_model.timing`` is checked against
these files (``tests/model/test_timing.py``). Usage, from the repository root with
``PYTHONPATH`` as in ``scripts/env.sh`` plus ``compiler`` and the root::

    python scripts/record_traces.py [--preset small:cores=2] tests/model/traces [NAME ...]

With ``--preset`` the programs are compiled for that configuration (``npu --preset`` syntax)
and the files are named ``NAME@PRESET``.
"""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent


def _digits():
    spec = importlib.util.spec_from_file_location("t", ROOT / "models" / "digits" / "train.py")
    t = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(t)
    xtr, _, xte, _ = t.load_split()
    return str(ROOT / "models" / "digits" / "digits_cnn.onnx"), xtr[:200], xte[:1]


def conv_model(cin, cout, size, k=3, pad=1, group=1, stride=1, zeros=0.0, seed=0):
    """One ``Conv`` (+ ``Relu``) on ``(1, cin, size, size)`` with seeded weights, a fraction
    ``zeros`` of them zero."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((cout, cin // group, k, k)).astype(np.float32) * 0.3
    if zeros:
        w[rng.random(w.shape) < zeros] = 0.0
    b = rng.standard_normal(cout).astype(np.float32) * 0.1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, group=group,
                              strides=[stride] * 2),
             helper.make_node("Relu", ["c"], ["y"])]
    out = (size + 2 * pad - k) // stride + 1
    g = helper.make_graph(nodes, "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         [1, cin, size, size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         [1, cout, out, out])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def cases():
    """``{name: (model, format, inputs, calibration[, schedule])}``."""
    digits, cal, x1 = _digits()
    sys.path.insert(0, str(ROOT))
    from tests.compiler.models import small_cnn
    rng = np.random.default_rng(1)
    cnn_x = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
    out = {
        "digits_fp16": (digits, "fp16", {"input": x1}, None),
        "digits_int8": (digits, "int8", {"input": x1}, {"input": cal}),
        "digits_mixed": (digits, "mixed", {"input": x1}, None),
        "cnn_fp16": (small_cnn(), "fp16", {"x": cnn_x}, None),
    }
    convs = {
        "conv3x3_16": dict(cin=16, cout=16, size=12),
        "conv1x1_32": dict(cin=32, cout=32, size=8, k=1, pad=0),
        "dw3x3_24": dict(cin=24, cout=24, size=10, group=24),
        "conv3x3_s2": dict(cin=8, cout=12, size=13, stride=2),
        "conv3x3_sparse": dict(cin=16, cout=16, size=10, zeros=0.5),
        "conv5x5_4": dict(cin=4, cout=20, size=9, k=5, pad=2),
    }
    for k, (name, kw) in enumerate(convs.items()):
        m = conv_model(seed=k, **kw)
        x = np.random.default_rng(10 + k).standard_normal(
            (1, kw["cin"], kw["size"], kw["size"])).astype(np.float32)
        fmt = ("fp16", "int8", "mixed")[k % 3]
        calib = {"x": np.random.default_rng(20 + k).standard_normal((8,) + x.shape)
                 .astype(np.float32)} if fmt == "int8" else None
        out[f"{name}_{fmt}"] = (m, fmt, {"x": x}, calib)
    out.update(held_out())
    return out


def held_out():
    """Cases recorded after the model's constants were set: its validation, not its fit.
    ``fire32_int8`` is ``tests/compiler/test_int8_memory.py::fire_net(32)`` in int8."""
    from tests.compiler.models import activation_chain, small_cnn
    from tests.compiler.test_int8_memory import fire_net
    out = {}
    x16 = np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)
    out["cnn16_mixed"] = (small_cnn(seed=1, size=16), "mixed", {"x": x16}, None)
    xa = np.random.default_rng(6).standard_normal((1, 4, 5, 5)).astype(np.float32)
    out["chain6_fp16"] = (activation_chain(6), "fp16", {"x": xa}, None)
    convs = {
        "conv3x3_32to24_int8": dict(cin=32, cout=24, size=14),
        "conv1x1_64to16_fp16": dict(cin=64, cout=16, size=6, k=1, pad=0),
        "dw5x5_16_fp16": dict(cin=16, cout=16, size=12, k=5, pad=2, group=16),
        "conv3x3_s2_16to32_mixed": dict(cin=16, cout=32, size=16, stride=2),
        "conv3x3_sparse75_fp16": dict(cin=8, cout=16, size=12, zeros=0.75),
    }
    for k, (name, kw) in enumerate(convs.items()):
        fmt = name.rsplit("_", 1)[1]
        x = np.random.default_rng(30 + k).standard_normal(
            (1, kw["cin"], kw["size"], kw["size"])).astype(np.float32)
        calib = {"x": np.random.default_rng(40 + k).standard_normal((8,) + x.shape)
                 .astype(np.float32)} if fmt == "int8" else None
        out[name] = (conv_model(seed=50 + k, **kw), fmt, {"x": x}, calib)
    xf = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    cal = {"x": np.random.default_rng(1).standard_normal((16, 1, 3, 32, 32)).astype(np.float32)}
    out["fire32_int8"] = (fire_net(32), "int8", {"x": xf}, cal)
    return out


def record(name, case, out_dir, config):
    from npu_compiler.compile import compile_model
    from npu_runtime.runtime import prepare, run, session
    model, fmt, inputs, calib = case[:4]
    schedule = case[4] if len(case) > 4 else "depth-first"
    compiled = compile_model(model, config, fmt=fmt, calibration=calib,
                             schedule=schedule,
                             evaluator=session,
                             shapes={k: np.shape(v) for k, v in inputs.items()})
    prog = prepare(compiled.program, inputs)
    res = run(prog, inputs, "rtl")
    if res.trace_overflow:
        raise RuntimeError(f"{name}: the trace overflowed")
    prog.save(str(out_dir / f"{name}.npu"))
    tasks = [[t[0], t[1], t[2], t[3]] for t in res.tasks]
    (out_dir / f"{name}.json").write_text(json.dumps(
        {"name": name, "format": fmt, "cycles": res.cycles, "latency": 4,
         "tasks": tasks}) + "\n")
    print(f"{name}: {len(tasks)} tasks, {res.cycles} cycles", flush=True)


def main(argv):
    from npu_cli.util import preset_arg
    config = preset_arg("small")
    if argv[:1] == ["--preset"]:
        config, argv = preset_arg(argv[1]), argv[2:]
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    every = cases()
    names = argv[1:] or list(every)
    suffix = "" if config.name == "small" else "@" + config.name.replace(":", "_")
    for name in names:
        record(name + suffix, every[name], out_dir, config)


if __name__ == "__main__":
    main(sys.argv[1:])
