"""The source passes the project's lint rules (``[tool.ruff.lint]`` in pyproject.toml:
pycodestyle, pyflakes, import order)."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is not installed (scripts/setup.sh installs the dev dependencies)"
    result = subprocess.run([ruff, "check", "--no-cache", "spec", "rtl", "sim", "fpga", "cli",
                             "tests", "scripts"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
