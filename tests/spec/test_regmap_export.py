"""The register interface exported for host software: JSON and a C header."""

import json
import shutil
import subprocess

import pytest

from npu_spec.config import PRESETS
from npu_spec.dma import DMA
from npu_spec.neural import NEURAL_ENGINE, core_base
from npu_spec.registers import build_register_maps, regmap_c_header, regmap_dict


@pytest.mark.parametrize("name", ["small", "ecp5"])
def test_json_lists_every_register_of_the_build(name):
    config = PRESETS[name]
    d = json.loads(json.dumps(regmap_dict(config)))
    maps = {m["name"]: m for m in d["maps"]}
    assert [f"NE{i}" for i in range(config.cores)] == [n for n in maps if n.startswith("NE")]
    for i in range(config.cores):
        regs = {r["name"]: r for r in maps[f"NE{i}"]["registers"]}
        assert regs["FORMAT"]["address"] == core_base(i) + NEURAL_ENGINE["FORMAT"].offset
    mode = {r["name"]: r for r in maps["DMA"]["registers"]}["MODE"]
    fields = {f["name"]: f for f in mode["fields"]}
    assert fields["fmt"]["offset"] == DMA["MODE"]["fmt"].offset
    assert fields["dir"]["enum"]["MEM_TO_KMEM"] == 2
    assert d["info"]["CONFIG0"]["cores"] == config.cores


def test_c_header_compiles_and_agrees():
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed (Verilator needs one too)"
    config = PRESETS["small"]
    header = regmap_c_header(config)
    checks = []
    for regmap in build_register_maps(config):
        for reg in regmap.registers[:3]:
            name = f"NPU_{regmap.name}_{reg.name}".upper()
            checks.append(f'printf("%u\\n", (unsigned){name});')
            f = reg.fields[-1]
            checks.append(f'printf("%u\\n", (unsigned){name}_{f.name.upper()}_SHIFT);')
    src = "#include <stdio.h>\n" + header + "int main(void){" + "".join(checks) + "return 0;}\n"
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "t.c").write_text(src)
        subprocess.run([cc, "-Wall", "-Werror", "-o", f"{tmp}/t", f"{tmp}/t.c"], check=True)
        out = subprocess.run([f"{tmp}/t"], capture_output=True, text=True, check=True).stdout
    expected = []
    for regmap in build_register_maps(config):
        for reg in regmap.registers[:3]:
            expected += [regmap.base + reg.offset, reg.fields[-1].offset]
    assert [int(x) for x in out.split()] == expected
