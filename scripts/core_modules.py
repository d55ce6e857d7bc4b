"""Per-module resources of a neural engine core on the iCE40UP5K (Yosys only, no placement).

Usage: ``python scripts/core_modules.py [--preset icebreaker] [--keep DIR]``. The core is
elaborated for the UP5K in the out-of-context harness of ``npu_fpga.synth`` and synthesised by
``synth_ice40 -dsp`` with ``keep_hierarchy`` on the core, its register file, its datapath and
the datapath's sub-units, so no optimisation crosses a sub-unit's boundary (the flattened core,
``npu synth --block neural_engine``, is somewhat smaller). Prints LUT4, flip-flops, carry
cells, EBR and DSP per sub-unit; ``glue`` is the core and datapath modules themselves and the
loader (Yosys 0.70 fails an internal assertion, ``count_id(wire->name) == 0``, when the loader
is kept as a module of its own).
"""

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from amaranth.back import rtlil

from npu.neural.engine import NeuralEngine
from npu_fpga.synth import (
    TARGETS,
    OutOfContextHarness,
    OutOfContextPlatform,
    _missing_domain,
    find_tool,
)
from npu_spec.config import preset

UNITS = ("control", "setup", "dma", "extract", "buffer", "shifter", "sequencer", "mac",
         "results", "replay", "post", "writer", "watchdog")


def _module_cells(stat_text):
    """``{module name: Counter(cell type: count)}`` from Yosys ``stat`` output."""
    modules = {}
    for block in re.split(r"\n=== ", "\n" + stat_text):
        head, _, body = block.partition(" ===")
        name = head.strip()
        if name and not name.startswith("design hierarchy"):
            modules[name] = collections.Counter(
                {m.group(2): int(m.group(1))
                 for m in re.finditer(r"^\s+(\d+)\s+(SB_\w+)", body, re.M)})
    return modules


def _row(name, cells):
    ffs = sum(v for k, v in cells.items() if k.startswith("SB_DFF"))
    return (f"| {name} | {cells['SB_LUT4']:,} | {ffs:,} | {cells['SB_CARRY']:,} | "
            f"{cells['SB_RAM40_4K']} | {cells['SB_MAC16']} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="icebreaker")
    parser.add_argument("--keep", help="directory for the RTLIL, script, log and stat")
    args = parser.parse_args(argv)
    directory = Path(args.keep or tempfile.mkdtemp(prefix="npu-core-modules-"))
    directory.mkdir(parents=True, exist_ok=True)
    harness = OutOfContextHarness(NeuralEngine(preset(args.preset)))
    (directory / "ne.il").write_text(rtlil.convert(
        harness, name="ne", platform=OutOfContextPlatform(TARGETS["ice40-up5k"]),
        missing_domain=_missing_domain))
    kept = ["ne.dut", "ne.dut.control", "ne.dut.datapath"]
    kept += [f"ne.dut.datapath.{u}" for u in UNITS if u != "control"]
    (directory / "ne.ys").write_text(
        f"read_rtlil ne.il\nsetattr -mod -set keep_hierarchy 1 {' '.join(kept)}\n"
        "synth_ice40 -dsp -top ne\ntee -q -o stat.txt stat\n")
    subprocess.run([find_tool("YOSYS"), "-q", "-l", "yosys.log", "-s", "ne.ys"],
                   cwd=directory, check=True, stdout=subprocess.DEVNULL)
    modules = _module_cells((directory / "stat.txt").read_text())

    def total(prefix):
        cells = collections.Counter()
        for name, counts in modules.items():
            if name == prefix or name.startswith(prefix + "."):
                cells.update(counts)
        return cells

    print("| module | LUT4 | FF | carry | EBR | DSP |\n|---|---|---|---|---|---|")
    units = {u: total("ne.dut." + ("control" if u == "control" else f"datapath.{u}"))
             for u in UNITS}
    for unit, cells in units.items():
        print(_row(unit, cells))
    core = total("ne.dut")
    glue = core.copy()
    for cells in units.values():
        glue.subtract(cells)
    print(_row("glue (core, datapath, loader)", glue))
    print(_row("core", core))
    return 0


if __name__ == "__main__":
    sys.exit(main())
