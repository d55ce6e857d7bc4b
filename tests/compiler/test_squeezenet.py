"""SqueezeNet 1.1 (the onnx package's ``light`` model, seeded random weights) compiled for
``small`` with enough system memory for its weights, on the golden backend against
onnxruntime (``docs/compiler.md``, "SqueezeNet 1.1")."""

import dataclasses

import numpy as np
import pytest

from npu_compiler.compile import compile_model
from npu_runtime.runtime import compare, reference
from npu_runtime.runtime import run as run_program
from npu_spec.config import preset

from .models import light_model

#: The binary16 weights alone are 2.4 MB; 8 MiB holds them, the activations and the program.
CFG = dataclasses.replace(preset("small"), mem_kib=8192)

#: fp16 against onnxruntime's float32: every activation is stored as binary16 (relative
#: rounding 2**-11, about 4.9e-4) through 26 layers of convolutions; the errors of the layers
#: add up, partly cancelling. Measured at 64x64: see docs/compiler.md.
REL_TOL = 1e-2
COS_TOL = 0.9999


@pytest.fixture(scope="module")
def squeezenet64():
    model = light_model("squeezenet", size=64)
    x = np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)
    return model, compile_model(model, CFG), x


@pytest.mark.slow
def test_squeezenet64_golden_against_onnxruntime(squeezenet64):
    model, compiled, x = squeezenet64
    out = run_program(compiled.program, {"data_0": x}).outputs
    errors = compare(out, reference(model, {"data_0": x}))
    assert len(errors) == 1
    for name, e in errors.items():
        assert out[name].shape == (1, 1000, 1, 1)
        assert e["rel_err"] <= REL_TOL and e["cosine"] >= COS_TOL, (name, e)


@pytest.mark.slow
def test_squeezenet64_rtl_equals_golden(squeezenet64):
    """The whole network on the Verilator system simulation: outputs and the final system
    memory (all 8 MiB) equal the golden backend's bit for bit, and the trace, drained while
    the program runs, has every one of its thousands of tasks (docs/compiler.md)."""
    _, compiled, x = squeezenet64
    golden = run_program(compiled.program, {"data_0": x})
    rtl = run_program(compiled.program, {"data_0": x}, "rtl")
    for name, value in golden.outputs.items():
        assert np.array_equal(value.view(np.uint32), rtl.outputs[name].view(np.uint32)), name
    n = len(rtl.memory)
    assert n == CFG.mem_kib * 1024
    assert rtl.memory == golden.memory[:n] + bytes(n - len(golden.memory[:n]))
    assert not rtl.trace_overflow
    assert sorted(t[0] for t in rtl.tasks) == list(range(compiled.program.queues[0].tasks))
    assert rtl.cycles > 0


@pytest.mark.slow
def test_squeezenet64_with_softmax_golden_against_onnxruntime():
    """The model's own last layer, a softmax over 1000 classes (opset 9: Flatten, Softmax,
    Reshape after conversion), on the NPU: the probabilities against onnxruntime with the
    same tolerance as the logits (docs/compiler.md, "Softmax")."""
    model = light_model("squeezenet", size=64, drop_softmax=False)
    x = np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)
    compiled = compile_model(model, CFG)
    assert ("Softmax", "NE") in [(r["op"], r["engine"]) for r in compiled.plan]
    out = run_program(compiled.program, {"data_0": x}).outputs
    (name, e), = compare(out, reference(model, {"data_0": x})).items()
    assert out[name].shape == (1, 1000, 1, 1)
    assert abs(float(out[name].astype(np.float64).sum()) - 1.0) <= 1e-2
    assert e["rel_err"] <= REL_TOL and e["cosine"] >= COS_TOL, (name, e)
