"""``npu sim system`` and ``npu generate --regmap``: argument and program checks (the runs
themselves are in tests/system)."""

import json

import numpy as np
import pytest

from npu_cli.main import main
from npu_model.builder import ProgramBuilder
from npu_spec.config import preset


def _program(tmp_path, name="ecp5"):
    b = ProgramBuilder(preset(name))
    x = b.load(b.input("x", np.arange(32, dtype=np.int8).reshape(2, 4, 4)))
    b.store(x, b.output("y", (2, 4, 4)))
    path = tmp_path / "p.npu"
    b.build().save(path)
    return path


def test_program_for_another_configuration_exits_2(tmp_path, capsys):
    status = main(["sim", "system", "--preset", "small", "--program",
                   str(_program(tmp_path, "ecp5"))])
    assert status == 2
    err = capsys.readouterr().err
    assert "cores" in err and "mem_width" in err


@pytest.mark.parametrize("args", [[], ["--program", "x.npu", "--random", "3"]])
def test_program_or_random_exactly_one(args, capsys):
    assert main(["sim", "system", *args]) == 2
    assert "--program FILE or --random N" in capsys.readouterr().err


def test_not_a_program_file_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.npu"
    bad.write_bytes(b"not a zip")
    assert main(["sim", "system", "--program", str(bad)]) == 2
    assert "not a program file" in capsys.readouterr().err


def test_regmap_json(tmp_path):
    out = tmp_path / "regs.json"
    assert main(["generate", "--regmap", "json", "--preset", "ecp5", "-o", str(out)]) == 0
    d = json.loads(out.read_text())
    assert [m["name"] for m in d["maps"]].count("NE1") == 1
    assert d["info"]["CONFIG3"]["mem_width"] == 64
