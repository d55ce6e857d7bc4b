"""``npu bench models`` and the timing model's figures in ``npu run --json``."""

import json

import numpy as np

from npu_cli.main import main

DIGITS = "models/digits/digits_cnn.onnx"


def test_run_json_has_the_estimate(tmp_path, capsys):
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal((1, 1, 8, 8)).astype(np.float32))
    assert main(["run", DIGITS, "--input", f"input={x}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cycles"] is None                    # the golden backend measures nothing
    assert out["cycles_estimate"] > 1000
    assert 0 < out["mac_utilization_estimate"] < 1
    convs = [r for r in out["layers"] if r["op"] == "Conv"]
    assert convs and all(r["cycles_estimate"] > 0 and 0 < r["utilization_estimate"] <= 1
                         for r in convs)
    spans = [r["cycles_estimate"] for r in out["layers"] if r["cycles_estimate"] is not None]
    assert out["cycles_estimate"] * 0.5 <= sum(spans)


def test_bench_models_on_two_presets(capsys):
    assert main(["bench", "models", DIGITS, "--preset", "small,ane", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["preset"] for r in rows] == ["small", "ane"]
    small, ane = rows
    assert small["macs"] == ane["macs"] > 0
    # 4096 MACs instead of 16: a far lower utilization on a model this small
    assert ane["mac_utilization_estimate"] < small["mac_utilization_estimate"] / 10
    for r in rows:
        assert r["buffer_peak"] <= r["buffer_elements"]
        assert set(r["engine_cycles"]) <= {"NEURAL", "PLANAR", "DMA"}


def test_bench_models_table_and_bad_input(tmp_path, capsys):
    assert main(["bench", "models", DIGITS, "--preset", "small"]) == 0
    out = capsys.readouterr().out
    assert "digits_cnn.onnx" in out and "small" in out
    assert main(["bench", "models", DIGITS, "--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'tiny'" in err and "Traceback" not in err
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["bench", "models", str(bad), "--preset", "small"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines()
              if not line.startswith("[npu]")]          # progress lines aside
    assert len(errors) == 1 and errors[0].startswith("npu bench models: ")
