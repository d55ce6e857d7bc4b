"""Per-module resources of the data processor on the ECP5 or the iCE40UP5K (Yosys only, no
placement).

Usage: ``python scripts/dataproc_modules.py [--preset ulx3s] [--target ecp5-85f|ice40-up5k]
[--keep DIR]``. The data processor is elaborated for the target in the out-of-context harness
of ``npu_fpga.synth`` and synthesised by the target's Yosys command with ``keep_hierarchy`` on
each of its direct submodules (the buffer, the ports, the register file, the kernel memories),
so no optimisation crosses a submodule's boundary; ``glue`` is the data processor's own logic
(the dataset register slices and the flow-control wiring). Columns as in
``scripts/core_modules.py``.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from amaranth.back import rtlil

from npu.dataproc.dataproc import DataProcessor
from npu_fpga.synth import (
    TARGETS,
    OutOfContextHarness,
    OutOfContextPlatform,
    _missing_domain,
    find_tool,
)
from npu_spec.config import preset

sys.path.insert(0, str(Path(__file__).parent))
from core_modules import FLOWS, _module_cells, _row, _total  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ulx3s")
    parser.add_argument("--target", choices=tuple(FLOWS), default="ecp5-85f")
    parser.add_argument("--keep", help="directory for the RTLIL, script, log and stat")
    args = parser.parse_args(argv)
    command, pattern, columns = FLOWS[args.target]
    directory = Path(args.keep or tempfile.mkdtemp(prefix="npu-dataproc-modules-"))
    directory.mkdir(parents=True, exist_ok=True)
    dut = DataProcessor(preset(args.preset))
    harness = OutOfContextHarness(dut)
    (directory / "dp.il").write_text(rtlil.convert(
        harness, name="dp", platform=OutOfContextPlatform(TARGETS[args.target]),
        missing_domain=_missing_domain))
    # The direct submodules of the data processor, from the RTLIL's module names.
    text = (directory / "dp.il").read_text()
    names = sorted({line.split()[-1].lstrip("\\") for line in text.splitlines()
                    if line.startswith("module ")})
    units = [n for n in names if n.startswith("dp.dut.") and n.count(".") == 2]
    (directory / "dp.ys").write_text(
        f"read_rtlil dp.il\nsetattr -mod -set keep_hierarchy 1 dp.dut {' '.join(units)}\n"
        f"{command} -top dp\ntee -q -o stat.txt stat\n")
    subprocess.run([find_tool("YOSYS"), "-q", "-l", "yosys.log", "-s", "dp.ys"],
                   cwd=directory, check=True, stdout=subprocess.DEVNULL)
    modules = _module_cells((directory / "stat.txt").read_text(), pattern)

    print(f"preset {args.preset}, {command}")
    print("| module | " + " | ".join(h for h, _ in columns) + " |\n|---|"
          + "---|" * len(columns))
    total = _total(modules, "dp.dut")
    glue = total.copy()
    for unit in units:
        cells = _total(modules, unit)
        glue.subtract(cells)
        print(_row(unit[len("dp.dut."):], cells, columns))
    print(_row("glue", glue, columns))
    print(_row("data processor", total, columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
