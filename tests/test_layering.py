"""The packages import each other in one direction only, and the golden model and the
specification run without Amaranth.

Layers, lowest first: ``npu_spec`` (plain Python) <- ``npu`` (gateware) <- ``npu_fpga`` <-
``npu_sim`` <- ``npu_cli``; ``npu_spec`` <- ``npu_model`` (numpy) <- ``npu_sim``;
``npu_model`` <- ``npu_compiler`` (onnx) <- ``npu_runtime`` (with ``npu_sim`` and onnxruntime)
<- ``npu_cli``.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "npu_spec": ROOT / "spec" / "npu_spec",
    "npu": ROOT / "rtl" / "npu",
    "npu_model": ROOT / "sim" / "npu_model",
    "npu_fpga": ROOT / "fpga" / "npu_fpga",
    "npu_sim": ROOT / "sim" / "npu_sim",
    "npu_cli": ROOT / "cli" / "npu_cli",
    "npu_compiler": ROOT / "compiler" / "npu_compiler",
    "npu_runtime": ROOT / "sim" / "npu_runtime",
}
PROJECT = set(PACKAGES)
#: What each package may import, besides the standard library and itself.
ALLOWED = {
    "npu_spec": set(),
    "npu": {"npu_spec", "amaranth"},
    "npu_model": {"npu_spec", "numpy"},
    "npu_fpga": {"npu_spec", "npu", "amaranth", "amaranth_boards"},
    "npu_sim": {"npu_spec", "npu", "npu_model", "npu_fpga", "amaranth", "numpy", "cocotb"},
    "npu_cli": PROJECT | {"amaranth", "numpy", "onnx", "onnxruntime"},
    "npu_compiler": {"npu_spec", "npu_model", "numpy", "onnx"},
    "npu_runtime": {"npu_spec", "npu_model", "npu_compiler", "npu_sim", "npu_fpga", "numpy",
                    "onnx", "onnxruntime", "matplotlib"},
}
THIRD_PARTY = {"amaranth", "amaranth_boards", "numpy", "cocotb", "onnx", "onnxruntime",
               "matplotlib"}


def imports_of(path):
    """Top-level names of every absolute import in ``path`` (also those inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_run_one_way(package):
    wrong = []
    for path in sorted(PACKAGES[package].rglob("*.py")):
        for name in imports_of(path) - {package}:
            if (name in PROJECT or name in THIRD_PARTY) and name not in ALLOWED[package]:
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "\n".join(wrong)


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"blocked: {{name}}")
        return None
sys.meta_path.insert(0, Block())
"""


def run_blocked(blocked, code):
    return subprocess.run([sys.executable, "-c", BLOCKER.format(blocked=blocked) + code],
                          capture_output=True, text=True, cwd=ROOT)


def test_the_golden_model_runs_without_amaranth():
    code = """
import pkgutil, importlib, numpy as np
import npu_model
for mod in pkgutil.iter_modules(npu_model.__path__):
    importlib.import_module(f"npu_model.{mod.name}")
from npu_model import planar
from npu_spec.planar import make_task
x = np.arange(24, dtype=np.int8).reshape(2, 3, 4)
assert planar.pool(x, "max", 2, 2, 1, 1).shape == (2, 2, 3)
print("ok")
"""
    result = run_blocked({"amaranth", "npu", "npu_sim", "npu_fpga", "npu_cli"}, code)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_the_specification_runs_with_the_standard_library_only():
    code = """
import pkgutil, importlib
import npu_spec
for mod in pkgutil.iter_modules(npu_spec.__path__):
    importlib.import_module(f"npu_spec.{mod.name}")
from npu_spec.registers import register_maps
assert len(register_maps()) >= 4
print("ok")
"""
    result = run_blocked({"amaranth", "numpy", "npu", "npu_model", "npu_sim", "npu_fpga",
                          "npu_cli"}, code)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_the_blocker_blocks():
    """The two tests above would catch an import: a blocked import fails."""
    result = run_blocked({"numpy"}, "import numpy")
    assert result.returncode != 0 and "blocked: numpy" in result.stderr
