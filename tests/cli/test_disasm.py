"""``npu disasm``: a program file in readable form."""

import json

import numpy as np

from npu_cli.main import main
from npu_model.builder import ProgramBuilder
from npu_spec.config import preset


def _program(tmp_path):
    b = ProgramBuilder(preset("small"), network=2, priority=4)
    x = b.load(b.input("x", np.arange(32, dtype=np.int8).reshape(2, 4, 4)))
    k = b.dma_kernels(0, b.kernels(np.ones((2, 2, 1, 1), np.int8), scale=1 << 30, shift=30))
    y = b.conv(x, k)
    p = b.max_pool(y, 2, tsr=True)
    b.store(p, b.output("y", p.shape))
    path = tmp_path / "p.npu"
    b.build().save(path)
    return path


def test_text(tmp_path, capsys):
    assert main(["disasm", str(_program(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "queue 0: priority 4 network 2" in out
    assert "tensor x: input int8 shape (2, 4, 4)" in out
    assert "task 2 @" in out and ": NEURAL flags - dep 1" in out
    assert "CORE0.KERNEL: kh=1 kw=1 stride=1 dilation=1 pad=0" in out
    assert ": PLANAR flags tsr dep 1" in out
    assert "PLANAR_ENGINE" not in out and "MODE: mode=POOL op=0" in out
    assert "dataset NE0_IN: 2x4x4 at 0 cstride 16 rstride 4" in out
    assert "dataset PE_OUT: 2x2x2" in out
    assert "MODE: dir=MEM_TO_KMEM fmt=WORD core=0" in out


def test_json(tmp_path, capsys):
    assert main(["disasm", "--json", str(_program(tmp_path))]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["macs"] == 16
    tasks = doc["descriptors"][0]["tasks"]
    assert [t["engine"] for t in tasks] == ["DMA", "DMA", "NEURAL", "PLANAR", "DMA"]
    assert [t["dep"] for t in tasks] == [0, 0, 1, 1, 1]
    conv = tasks[2]
    fmt = next(w for w in conv["writes"] if w["register"] == "CORE0.FORMAT")
    assert fmt["map"] == "NEURAL_ENGINE" and fmt["fields"]["fmt"] == "INT8"
    assert conv["datasets"]["NE0_OUT"]["channels"] == 2


def test_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.npu"
    bad.write_text("not a program")
    assert main(["disasm", str(bad)]) == 2
    assert "not a program file" in capsys.readouterr().err
    assert main(["disasm", str(tmp_path / "missing.npu")]) == 2
