# amaranth: UnusedElaboratable=no
"""``npu bench switch-latency`` and the ``task_manager`` block, run in-process."""

import json

import pytest

from npu_cli.main import main


def test_switch_latency_bench(capsys):
    assert main(["bench", "switch-latency", "--task-cycles", "40", "--positions", "0,30",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["rows"]
    assert [r["position"] for r in rows] == [0, 30]
    assert all(r["switched"] for r in rows)
    # The switch waits for the rest of the running task, then costs a fixed number of cycles.
    assert rows[0]["after_end"] == rows[1]["after_end"] > 0
    assert rows[0]["latency"] - rows[1]["latency"] == 30
    # latency = (cycles from the push to the running task's end) + after_end
    assert 40 - 30 - 1 <= rows[1]["latency"] - rows[1]["after_end"] <= 40 - 30
    # The SWITCH_LATENCY counter starts one cycle after the push reaches the registers.
    for r in rows:
        assert 0 < r["latency"] - r["counter"] <= 3


@pytest.mark.parametrize("argv", [
    ["bench", "switch-latency", "--task-cycles", "10", "--positions", "10"],
    ["bench", "switch-latency", "--positions", "a,b"],
    ["bench", "switch-latency", "--task-cycles", "0"],
])
def test_switch_latency_bad_input(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("npu")


def test_generate_task_manager(tmp_path):
    out = tmp_path / "tm.v"
    assert main(["generate", "--preset", "ice40", "--block", "task_manager",
                 "-o", str(out)]) == 0
    text = out.read_text()
    assert "module" in text and "writes__payload" in text
