"""``--schedule auto``: the compiler keeps the schedule the timing model estimates faster."""

import numpy as np
import pytest

from npu_compiler.compile import compile_model
from npu_compiler.graph import CompileError
from npu_model.timing import estimate
from npu_runtime.runtime import run, session
from npu_spec.config import preset

from .test_depthfirst import CFGS, MODELS, _input
from .test_int8_memory import fire_net


@pytest.mark.parametrize("name", MODELS)
def test_auto_keeps_the_program_with_fewer_estimated_cycles(name):
    model, cfg = MODELS[name](), CFGS[name]
    auto = compile_model(model, cfg, schedule="auto")
    meta = auto.program.metadata["compiler"]
    both = {s: compile_model(model, cfg, schedule=s) for s in ("depth-first", "layer")}
    cycles = {s: estimate(c.program).cycles for s, c in both.items()}
    assert meta["schedule_estimates"] == cycles
    kept = min(cycles, key=cycles.get)
    assert meta["schedule"] == kept
    assert auto.program.memory == both[kept].program.memory
    assert auto.program.queues == both[kept].program.queues


def test_auto_on_the_int8_fire_network_takes_layer_by_layer():
    # RTL (docs/compiler.md, "A SqueezeNet-like network at 64x64 in int8"): depth first
    # 1,268,206 cycles, layer by layer 1,170,692; the model must rank them the same way.
    cal = {"x": np.random.default_rng(1).standard_normal((16, 1, 3, 64, 64))
           .astype(np.float32)}
    auto = compile_model(fire_net(64), preset("small"), fmt="int8", calibration=cal,
                         evaluator=session, schedule="auto")
    est = auto.program.metadata["compiler"]["schedule_estimates"]
    assert auto.program.metadata["compiler"]["schedule"] == "layer"
    assert abs(est["depth-first"] / 1268206 - 1) < 0.03
    assert abs(est["layer"] / 1170692 - 1) < 0.03


def test_without_bands_auto_compiles_once():
    auto = compile_model("models/digits/digits_cnn.onnx", preset("small"), schedule="auto")
    meta = auto.program.metadata["compiler"]
    assert meta["schedule"] == "depth-first"
    assert meta["schedule_estimates"] == {"depth-first": None}


def test_the_user_may_force_either_schedule():
    model, cfg = MODELS["fire"](), CFGS["fire"]
    for s in ("depth-first", "layer"):
        c = compile_model(model, cfg, schedule=s)
        assert c.program.metadata["compiler"]["schedule"] == s
        assert "schedule_estimates" not in c.program.metadata["compiler"]
    with pytest.raises(CompileError, match="schedule must be one of"):
        compile_model(model, cfg, schedule="fastest")


def test_auto_gives_the_same_outputs():
    model, cfg = MODELS["conv_conv_pool"](), CFGS["conv_conv_pool"]
    x = _input(model)
    a = run(compile_model(model, cfg, schedule="auto").program, {"x": x}).outputs
    b = run(compile_model(model, cfg, schedule="depth-first").program, {"x": x}).outputs
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["conv_conv_pool", "fire"])
def test_the_rtl_ranks_the_schedules_as_the_model_does(name):
    model, cfg = MODELS[name](), CFGS[name]
    x = _input(model)
    rtl, est = {}, {}
    for s in ("depth-first", "layer"):
        c = compile_model(model, cfg, schedule=s)
        rtl[s] = run(c.program, {"x": x}, "rtl").cycles
        est[s] = estimate(c.program).cycles
        assert abs(est[s] / rtl[s] - 1) < 0.06, (s, est[s], rtl[s])
    assert (rtl["layer"] < rtl["depth-first"]) == (est["layer"] < est["depth-first"])
