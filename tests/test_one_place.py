"""Every fact is stated in one place: code tables, descriptor constants and register addresses
appear in exactly one source file, the specification's (``docs/architecture.md``)."""

import enum
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import npu_spec
from npu_spec.registers import ADDRESS_WINDOWS, register_maps

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for top in ("spec", "rtl", "sim", "fpga", "cli")
           for p in sorted((ROOT / top).rglob("*.py"))]


def _coded_enums():
    for info in pkgutil.iter_modules(npu_spec.__path__):
        module = importlib.import_module(f"npu_spec.{info.name}")
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, enum.IntEnum) and hasattr(obj, "bits")
                    and obj.__module__ == module.__name__ and len(obj) >= 3):
                yield module, obj


CODE_TABLES = sorted({(m.__name__, e.__name__): (m, e) for m, e in _coded_enums()}.items())


def _restated(text, codes):
    """How many members of ``codes`` a file states as ``NAME = value`` or ``"name": value``."""
    count = 0
    for member in codes:
        name = re.escape(member.name)
        pattern = (rf"(\b{name}\s*=\s*{member.value}\b)|"
                   rf"([\"']{name.lower()}[\"']\s*:\s*{member.value}\b)")
        count += bool(re.search(pattern, text, flags=re.IGNORECASE))
    return count


@pytest.mark.parametrize("key", [k for k, _ in CODE_TABLES], ids=lambda k: ".".join(k))
def test_code_tables_are_stated_once(key):
    module, codes = dict(CODE_TABLES)[key]
    need = min(4, len(codes))
    files = [p.relative_to(ROOT).as_posix() for p in SOURCES
             if _restated(p.read_text(), codes) >= need]
    assert files == [module.__file__[len(str(ROOT)) + 1:]], files


def test_descriptor_constants_are_stated_once():
    files = {p.relative_to(ROOT).as_posix() for p in SOURCES
             if re.search(r"0x[dD]7\b|HEADER_WORDS\s*=\s*\d|MAGIC\s*=\s*0x[dD]7", p.read_text())}
    assert files == {"spec/npu_spec/descriptors.py"}


def test_register_addresses_are_stated_once():
    """No source file but the address-window table writes a block's register address (or a
    window bound) as a number."""
    addresses = {m.base + r.offset for m in register_maps() for r in m.registers}
    addresses |= {b for start, size in ADDRESS_WINDOWS.values() for b in (start, start + size)}
    addresses = {a for a in addresses if a >= 0x1000}    # NPU_INFO's small offsets are common
    literal = re.compile(r"\b0[xX][0-9A-Fa-f_]+\b")
    files = set()
    for p in SOURCES:
        for lit in literal.findall(p.read_text()):
            if int(lit.replace("_", ""), 16) in addresses:
                files.add(p.relative_to(ROOT).as_posix())
    assert files == {"spec/npu_spec/registers.py"}


def test_the_checks_can_fail():
    """The patterns find a restated table, a magic number and an address."""
    from npu_spec.planar import EltOp
    assert _restated('ELT = {"copy": 0, "relu": 1, "abs": 2, "neg": 3}', EltOp) == 4
    assert _restated("ADD = 6\nSUB = 7\nMUL = 8\nMAX = 9", EltOp) == 4
