"""``npu sim conv``, ``npu sim fc`` and ``npu bench neural`` end to end (Verilator)."""

import json

import numpy as np
import pytest

from npu_cli.main import main
from npu_model.conv import ConvLayer, conv_accumulate
from npu_model.postproc import PostprocConfig


def _run(capsys, *argv):
    status = main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_conv_json_and_dump_recheck(capsys, tmp_path):
    dump = tmp_path / "conv.npz"
    status, out, _ = _run(capsys, "sim", "conv", "--input", "3x6x7", "--out-channels", "5",
                          "--kernel", "3x3", "--pad", "1", "--stride", "2", "--format", "int8",
                          "--activation", "relu", "--seed", "4", "--json", "--dump", str(dump))
    assert status == 0
    summary = json.loads(out)
    assert summary["match"] and summary["output"] == [5, 3, 4]
    assert 0 < summary["utilization"] <= 1 and summary["cycles"] > 0
    # The dump alone reproduces the accumulators: golden conv + post-processing of the RTL.
    d = np.load(dump)
    layer = ConvLayer(3, 6, 7, 5, 3, 3, stride=2, pad=1, fmt="int8")
    acc = conv_accumulate(layer, d["inputs"], d["weights"], d["bias"])
    from npu_model.postproc import postprocess
    p = d["post"]
    cfg = PostprocConfig(out_fp16=bool(p[0]), act=int(p[1]), zero_point=int(p[2]), lo=int(p[3]),
                         hi=int(p[4]), alpha=int(p[5]), stochastic=bool(p[6]), seed=int(p[7]))
    for k in range(5):
        vals, _ = postprocess(acc[k].ravel(), 0, int(d["scale"][k]), int(d["shift"][k]), cfg)
        assert np.array_equal(np.asarray(vals).reshape(3, 4), d["rtl"][k])


def test_fc_text_output(capsys):
    status, out, _ = _run(capsys, "sim", "fc", "--in-features", "20", "--out-features", "9",
                          "--batch", "2", "--format", "mixed", "--sparsity", "0.5",
                          "--palette", "4", "--seed", "2")
    assert status == 0
    assert out.startswith("RTL equals golden model: fully connected 20 -> 9")
    assert "MAC utilization" in out and "zero-skip saving" in out


@pytest.mark.parametrize("argv, message", [
    (["sim", "conv", "--input", "3x6", "--out-channels", "2", "--format", "int8"],
     "--input must be 3 positive numbers"),
    (["sim", "conv", "--input", "3x2x2", "--out-channels", "2", "--format", "int8"],
     "does not fit"),
    (["sim", "conv", "--input", "3x4x4", "--out-channels", "2", "--groups", "2",
      "--format", "int8"], "groups=2 must divide"),
    (["sim", "conv", "--preset", "ice40", "--input", "3x4x4", "--out-channels", "2",
      "--format", "fp16"], "has no fp16 hardware"),
    (["sim", "fc", "--in-features", "0", "--out-features", "2", "--format", "int8"],
     "must be positive"),
    (["sim", "conv", "--input", "3x4x4", "--out-channels", "2", "--format", "int8",
      "--sparsity", "1.5"], "must be in [0, 1]"),
])
def test_bad_arguments_one_line(capsys, argv, message):
    status, out, err = _run(capsys, *argv)
    assert status == 2 and out == ""
    assert message in err and err.count("\n") == 1


def test_bench_one_layer(capsys):
    status, out, _ = _run(capsys, "bench", "neural", "--only", "conv1x1", "--json")
    assert status == 0
    rows = json.loads(out)
    assert [r["name"] for r in rows] == ["conv1x1 32->32"]
    assert rows[0]["match"] and rows[0]["utilization"] >= 0.9


def test_generate_lean_blocks(tmp_path, capsys):
    """The lean builds of the extractor and the post-processor as blocks of a preset; a preset
    they do not suit is one line and exit status 2."""
    for block in ("kernel_extract_dense", "postproc_sequential"):
        out = tmp_path / f"{block}.v"
        assert main(["generate", "--preset", "ice40", "--block", block, "-o", str(out)]) == 0
        assert "module" in out.read_text()
    capsys.readouterr()
    assert main(["generate", "--preset", "small", "--block", "postproc_sequential", "-o",
                 str(tmp_path / "x.v")]) == 2
    err = capsys.readouterr().err
    assert "int8 only" in err and len(err.strip().splitlines()) == 1
