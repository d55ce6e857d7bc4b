"""Regenerate the generated documentation (for now ``docs/registers.md``).

Usage: ``python scripts/gen_docs.py [--check]``. With ``--check`` nothing is written and the exit
status is 1 if a generated file is out of date.
"""

import argparse
import sys
from pathlib import Path

from npu_spec.registers import registers_markdown, write_docs

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only check that the generated files are up to date")
    args = parser.parse_args(argv)

    path = ROOT / "docs" / "registers.md"
    if args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != registers_markdown():
            print(f"{path.relative_to(ROOT)} is out of date; run python scripts/gen_docs.py",
                  file=sys.stderr)
            return 1
        print(f"{path.relative_to(ROOT)} is up to date")
        return 0
    write_docs(path)
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
