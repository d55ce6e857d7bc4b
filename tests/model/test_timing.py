"""The timing model (``npu_model.timing``) against cycles the RTL measured.

Two kinds of reference, neither made by the model:

* recorded system runs (``tests/model/traces``, written by ``scripts/record_traces.py``
  from the Verilator system simulation of ``small``: the program and its trace);
* the neural engine bench's figures in ``docs/neural_engine.md`` ("Figures"), measured on the
  RTL of one core of ``small`` (16 MACs) and of ``ane`` (256 MACs).
"""

import json
from pathlib import Path

import pytest

from npu_model.timing import estimate, neural_core_cycles, trace_error
from npu_spec.config import preset
from npu_spec.program import load

TRACES = Path(__file__).parent / "traces"
NAMES = sorted(p.stem for p in TRACES.glob("*.json"))

#: Bounds of the model's error on the recorded runs (docs/compiler.md, "The timing model").
TOTAL_BOUND = 0.06
ENGINE_BOUND = {"NEURAL": 0.08, "PLANAR": 0.12, "DMA": 0.05}


def test_there_are_traces():
    assert len(NAMES) >= 10


@pytest.mark.parametrize("name", NAMES)
def test_estimate_is_near_the_rtl(name):
    rec = json.loads((TRACES / f"{name}.json").read_text())
    est = estimate(load(str(TRACES / f"{name}.npu")), latency=rec["latency"])
    assert len(est.tasks) == len(rec["tasks"])
    assert [(t.task_id, t.engine) for t in est.tasks] == \
        sorted(((t[0], t[1]) for t in rec["tasks"]), key=lambda k: k[0])
    err = trace_error(est, rec["tasks"], rec["cycles"])
    assert abs(err["total"]) <= TOTAL_BOUND, err
    for engine, bound in ENGINE_BOUND.items():
        if engine in err:
            assert abs(err[engine][0]) <= bound, (engine, err)


def _layer(cin, cout, size, k, log2w, groups=1):
    return dict(fmt=0, log2w=log2w, groups=groups, icpg=cin // groups, ocpg=cout // groups,
                out_h=size, out_w=size, kh=k, kw=k)


def _dense(layer, slots=8):
    k = layer["groups"] * layer["ocpg"]
    taps = layer["icpg"] * layer["kh"] * layer["kw"]
    return [[taps] * min(slots, k - b) for b in range(0, k, slots)]


@pytest.mark.parametrize("config, layer, rtl", [
    # npu bench neural --preset small (16x16 outputs, work unit 16x1)
    ("small", _layer(16, 16, 16, 3, 4), 37298),
    ("small", _layer(32, 32, 16, 1, 4), 17164),
    ("small", _layer(32, 32, 16, 3, 4, groups=32), 5381),
    # npu bench neural --preset ane --cores-one --int8-only (32x32 outputs, work unit 32x8)
    ("ane", _layer(16, 16, 32, 3, 5), 9817),
    ("ane", _layer(32, 32, 32, 1, 5), 4715),
    ("ane", _layer(32, 32, 32, 3, 5, groups=32), 3336),
])
def test_core_cycles_match_the_engine_bench(config, layer, rtl):
    cycles, _, _ = neural_core_cycles(preset(config), layer, _dense(layer))
    assert abs(cycles / rtl - 1) <= 0.08, (cycles, rtl)


def test_zero_coefficients_save_cycles_but_not_in_proportion():
    # docs/neural_engine.md: 50% zeros take 0.566 of the dense cycles on small (RTL)
    layer = _layer(16, 16, 16, 3, 4)
    dense, _, _ = neural_core_cycles(preset("small"), layer, _dense(layer))
    half, _, _ = neural_core_cycles(preset("small"), layer, [[72] * 8, [72] * 8])
    assert abs(half / dense - 0.566) <= 0.05


def test_the_loader_limits_the_wide_core():
    # A depthwise layer on 256 MACs: rows to load, not MAC commands, set the pace
    # (docs/neural_engine.md, "One ane-shaped core").
    layer = _layer(32, 32, 32, 3, 5, groups=32)
    cycles, rows, _ = neural_core_cycles(preset("ane"), layer, _dense(layer))
    assert rows > 0.9 * (cycles - 200)
