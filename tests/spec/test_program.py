"""The program file format (``npu_spec.program``): round trip, checks, configuration."""

import json
import zipfile

import pytest

from npu_spec.config import preset
from npu_spec.program import (
    FORMAT_VERSION,
    MEMORY_MEMBER,
    PROGRAM_MEMBER,
    BaseEntry,
    ConfigMismatchError,
    Program,
    ProgramError,
    QueueSetup,
    Tensor,
    check_config,
    load,
    save,
)

CFG = preset("small")


def _program():
    return Program(CFG, (BaseEntry(0x100, 0x1000),),
                   (QueueSetup(2, priority=3, network=7, base_index=0, head=0x180, tail=0x1A0,
                               tasks=4),),
                   (Tensor("x", "input", 0x400, "int8", (2, 3, 4)),
                    Tensor("y", "output", 0x800, "fp16", (3, 4), (2, 6))),
                   bytes(range(256)) * 9, {"name": "test"})


def test_round_trip(tmp_path):
    p = _program()
    path = save(p, tmp_path / "p.npu")
    q = load(path)
    assert q == p
    assert q.tensor("x").strides == (12, 4, 1) and q.tensor("y").strides == (2, 6)
    assert q.tensor("y").extent == (0x800, 0x800 + 2 * 2 + 3 * 6 + 2)
    with zipfile.ZipFile(path) as z:
        doc = json.loads(z.read(PROGRAM_MEMBER))
        assert z.read(MEMORY_MEMBER) == p.memory
    assert doc["format_version"] == FORMAT_VERSION
    assert doc["config"]["formats"] == ["int8", "fp16", "mixed"]
    assert doc["queues"][0] == {"index": 2, "priority": 3, "network": 7, "base_index": 0,
                                "head": 0x180, "tail": 0x1A0, "tasks": 4}


def test_config_mismatch():
    p = _program()
    check_config(p, CFG)
    check_config(p, CFG.replace(name="renamed", target="elsewhere"))     # labels only
    with pytest.raises(ConfigMismatchError, match="macs: program 16, build 32") as e:
        check_config(p, CFG.replace(macs=32, buffer_kib=128))
    assert [d[0] for d in e.value.differences] == ["macs", "buffer_kib"]
    assert isinstance(e.value, ProgramError)


@pytest.mark.parametrize("change,message", [
    (lambda d: d.update(format_version=99), "format version 99"),
    (lambda d: d["config"].update(bogus=1), "unknown configuration fields: bogus"),
    (lambda d: d["config"].update(macs=3), "macs must be even"),
    (lambda d: d["queues"][0].update(index=8), "beyond the 8 queues"),
    (lambda d: d["queues"][0].update(base_index=1), "base-table entry 1"),
    (lambda d: d["tensors"][0].update(role="weights"), "role must be one of"),
    (lambda d: d["tensors"][0].update(addr=CFG.mem_kib * 1024 - 4), "outside the"),
    (lambda d: d["tensors"].append(dict(d["tensors"][0])), "two tensors are named 'x'"),
    (lambda d: d.pop("queues"), "KeyError"),
])
def test_bad_content(tmp_path, change, message):
    doc = _program().to_json()
    change(doc)
    path = tmp_path / "bad.npu"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(PROGRAM_MEMBER, json.dumps(doc))
        z.writestr(MEMORY_MEMBER, _program().memory)
    with pytest.raises(ProgramError, match=message):
        load(path)


def test_bad_files(tmp_path):
    (tmp_path / "text").write_text("hello")
    with pytest.raises(ProgramError, match="not a zip archive"):
        load(tmp_path / "text")
    with pytest.raises(ProgramError, match="cannot read"):
        load(tmp_path / "missing")
    with zipfile.ZipFile(tmp_path / "empty.npu", "w") as z:
        z.writestr(PROGRAM_MEMBER, "{}")
    with pytest.raises(ProgramError, match="no memory.bin"):
        load(tmp_path / "empty.npu")
    with pytest.raises(ProgramError, match="memory image has"):
        Program(CFG.replace(mem_kib=1), memory=bytes(1025))
