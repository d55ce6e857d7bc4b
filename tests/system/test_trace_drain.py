"""Per-task timing of programs longer than the trace buffer: the host drains the trace while
it waits for the NPU (``docs/system.md``, "Draining the trace while the program runs"), so a
program of more than 32 tasks has every task's start and end on the ``rtl`` backend, and the
per-layer figures of ``npu run`` cover every layer."""

import json

import numpy as np
import onnx
import pytest

from npu_cli.main import main
from npu_compiler.compile import compile_model
from npu_model.system import run_program
from npu_runtime.runtime import prepare
from npu_sim.system import SystemCommands, Tag, compare, response_layout, rtl_run
from npu_spec.config import PRESETS

from ..compiler.models import activation_chain

CFG = PRESETS["small"]
LAYERS = 16


def _chain():
    compiled = compile_model(activation_chain(LAYERS), CFG)
    x = np.random.default_rng(4).standard_normal((1, 4, 5, 5)).astype(np.float32)
    return compiled, x


def test_every_task_of_a_long_program_is_traced():
    compiled, x = _chain()
    program = prepare(compiled.program, {"x": x})
    tasks = program.queues[0].tasks
    assert tasks > 32                               # more than the buffer holds
    rtl = rtl_run(program, backend="verilator", latency=4)
    summary = compare(program, run_program(program), rtl)
    assert summary["match"], summary
    assert not rtl["trace_overflow"]
    starts = [t[0] for t in rtl["trace"] if not t[2]]
    ends = [t[0] for t in rtl["trace"] if t[2]]
    assert sorted(starts) == sorted(ends) == list(range(tasks))
    # Each task ends after it starts, and the stamps never go back in time.
    span = {}
    for task, _, end, _, _, cycle in rtl["trace"]:
        span.setdefault(task, [None, None])[end] = cycle
    assert all(start < end for start, end in span.values())
    cycles = [t[5] for t in rtl["trace"]]
    assert cycles == sorted(cycles)


def test_npu_run_reports_every_layer(tmp_path, capsys):
    model, xfile = tmp_path / "chain.onnx", tmp_path / "x.npy"
    onnx.save(activation_chain(LAYERS), str(model))
    np.save(xfile, np.random.default_rng(5).standard_normal((1, 4, 5, 5)).astype(np.float32))
    assert main(["run", str(model), "--input", f"x={xfile}", "--backend", "golden,rtl",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["bit_exact"] and "trace_overflow" not in summary
    layers = summary["layers"]
    assert len(layers) == LAYERS
    assert all(layer["cycles"] and layer["cycles"] > 0 for layer in layers), layers
    assert all(layer["cycles"] < summary["cycles"] for layer in layers)


def test_answers_are_parsed_around_trace_beats():
    """TRACE beats come between any answers and are not counted; a MEM_READ of no words is
    an empty answer; a missing beat is an error."""
    cmds = SystemCommands(32)
    cmds.read(1, "a").mem_read(0, 0, "empty").drain(2, 1, 1, "idle").mem_read(0, 2, "m")
    assert cmds.expected == 4
    layout = response_layout(32)

    def beat(tag, value):
        return layout.const({"tag": tag, "data": value}).as_value().value

    beats = [beat(Tag.WORD, 7), beat(Tag.TRACE, 0x1234 | 5 << 32), beat(Tag.TRACE, 9),
             beat(Tag.WORD, 99), beat(Tag.DATA, 1), beat(Tag.DATA, 2)]
    assert cmds.parse(beats) == [("read", "a", 7), ("mem", "empty", []),
                                 ("trace", None, (0x1234, 5)), ("trace", None, (9, 0)),
                                 ("poll", "idle", 99), ("mem", "m", [1, 2])]
    with pytest.raises(RuntimeError, match="answered 3 of 4 commands"):
        cmds.parse(beats[:-1])
    with pytest.raises(RuntimeError, match="more than 4 beats"):
        cmds.parse(beats + [beat(Tag.WORD, 0)])
