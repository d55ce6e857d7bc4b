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
import sys
from pathlib import Path

from npu.dataproc.dataproc import DataProcessor
from npu_spec.config import preset

sys.path.insert(0, str(Path(__file__).parent))
from core_modules import (  # noqa: E402
    FLOWS,
    _row,
    _total,
    kept_stat,
    print_header,
    work_directory,
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ulx3s")
    parser.add_argument("--target", choices=tuple(FLOWS), default="ecp5-85f")
    parser.add_argument("--keep", help="directory for the RTLIL, script, log and stat")
    args = parser.parse_args(argv)
    command, _, columns = FLOWS[args.target]
    directory = work_directory(args.keep, "npu-dataproc-modules-")
    units = []

    def kept(text):
        # The direct submodules of the data processor, from the RTLIL's module names.
        names = {line.split()[-1].lstrip("\\") for line in text.splitlines()
                 if line.startswith("module ")}
        units.extend(sorted(n for n in names if n.startswith("dp.dut.") and n.count(".") == 2))
        return ["dp.dut", *units]
    modules = kept_stat(DataProcessor(preset(args.preset)), "dp", args.target, directory, kept)

    print_header(f"preset {args.preset}, {command}", columns)
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
