# amaranth: UnusedElaboratable=no
"""``npu sim pool|eltwise|reduce`` in-process (small shapes, one lane, so they stay quick)."""

import json

import numpy as np
import pytest

from npu_cli.main import main


def run_json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_pool_cli(capsys):
    s = run_json(capsys, ["sim", "pool", "--backend", "amaranth", "--lanes", "1", "--op", "avg",
                          "--window", "3", "3",
                          "--stride", "2", "1", "--pad", "1", "0", "--shape", "1", "5", "6",
                          "--seed", "3", "--pool-beats", "2"])
    assert s["match"] and s["mismatches"] == 0 and s["pool_beats"] == 2
    assert s["output_elements"] == 3 * 4 and s["cycles"] > 0


def test_eltwise_cli_text(capsys, tmp_path):
    dump = tmp_path / "e.npz"
    assert main(["sim", "eltwise", "--backend", "amaranth", "--lanes", "1", "--op", "gain_bias",
                 "--scale", "0.5",
                 "--bias", "-3", "--shape", "2", "3", "3", "--in-fmt", "fp16",
                 "--dump", str(dump)]) == 0
    out = capsys.readouterr().out
    assert "RTL equals golden model" in out and "elements/cycle" in out
    d = np.load(dump)
    assert d["got"].shape == (2, 3, 3) and np.array_equal(d["got"], d["expected"])


def test_reduce_cli_mean(capsys):
    s = run_json(capsys, ["sim", "reduce", "--backend", "amaranth", "--lanes", "1", "--mean",
                          "--shape", "3", "2", "5",
                          "--out-fmt", "fp16", "--stall", "0.5"])
    assert s["match"] and s["output_elements"] == 3


def test_reduce_cli_across_channels(capsys, tmp_path):
    dump = tmp_path / "r.npz"
    s = run_json(capsys, ["sim", "reduce", "--backend", "amaranth", "--lanes", "1", "--axis",
                          "channel", "--op", "max", "--pre", "abs", "--shape", "4", "2", "3",
                          "--dump", str(dump)])
    assert s["match"] and s["output_elements"] == 2 * 3
    d = np.load(dump)
    # |-128| saturates to 127 in the INT8 output
    ref = np.minimum(np.abs(d["a"].astype(np.int64)).max(axis=0), 127)
    assert np.array_equal(d["got"][0], ref)


@pytest.mark.parametrize("argv", [
    ["sim", "pool", "--lanes", "3"],
    ["sim", "pool", "--lanes", "1", "--window", "2", "2", "--pad", "2", "0"],
    ["sim", "eltwise", "--lanes", "1", "--backend", "verilator", "--vcd", "x.vcd"],
    ["sim", "eltwise", "--preset", "ice40", "--in-fmt", "fp16"],
    ["sim", "reduce", "--op", "mean"],
    ["sim", "reduce", "--axis", "channel", "--post", "sqrt"],
    ["sim", "reduce", "--axis", "channel", "--shape", "2", "64", "70", "--lanes", "1"],
    ["sim", "eltwise", "--scale", "abc"],
    ["sim", "pool", "--lanes", "1", "--pool-beats", "5"],
])
def test_bad_input_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err


def test_block_registered():
    from npu_cli.main import _all_blocks
    assert "planar_engine" in _all_blocks()


@pytest.mark.slow
def test_verilator_backend(capsys):
    """Builds the Verilator bench (minutes the first time, cached afterwards)."""
    s = run_json(capsys, ["sim", "pool", "--backend", "verilator", "--lanes", "2", "--op",
                          "avg", "--window", "3", "3", "--pad", "1", "1", "--stride", "1", "1",
                          "--shape", "2", "9", "10", "--in-fmt", "fp16", "--out-fmt", "fp16"])
    assert s["match"] and s["backend"] == "verilator"
