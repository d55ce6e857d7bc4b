"""No gateware function is longer than about 250 lines: an engine composes sub-units, each
of which can be read and tested alone (``docs/architecture.md``)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 250


def long_functions(top, limit=LIMIT):
    """``"path:line name: N lines"`` (path relative to ``top``) for every function of ``limit``
    lines or more."""
    found = []
    for path in sorted(top.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines >= limit:
                    found.append(f"{path.relative_to(top)}:{node.lineno} {node.name}: "
                                 f"{lines} lines")
    return found


def test_gateware_functions_are_short():
    found = long_functions(ROOT / "rtl")
    assert not found, "\n".join(found)


def test_the_check_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "long.py").write_text(f"def elaborate():\n{body}\n")
    assert long_functions(tmp_path) == [f"long.py:1 elaborate: {LIMIT + 1} lines"]
