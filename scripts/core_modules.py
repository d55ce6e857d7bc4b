"""Per-module resources of a neural engine core on the iCE40UP5K or the ECP5 (Yosys only, no
placement).

Usage: ``python scripts/core_modules.py [--preset icebreaker] [--target ice40-up5k|ecp5-85f]
[--keep DIR]``. The core is elaborated for the target in the out-of-context harness of
``npu_fpga.synth`` and synthesised by the target's Yosys command (``synth_ice40 -dsp``,
``synth_ecp5``) with ``keep_hierarchy`` on the
core, its register file, its datapath and the datapath's sub-units, so no optimisation crosses a
sub-unit's boundary (the flattened core, ``npu synth --block neural_engine``, is somewhat
smaller). Prints per sub-unit LUT4, flip-flops, carry cells, block RAM and DSP (iCE40), or LUT4,
flip-flops, CCU2C (two LUT4s each, not in the LUT4 column), MULT18X18D, DP16KD and LUT RAM
(``TRELLIS_DPR16X4``, 16 x 4 bits each) (ECP5). The LUT4s are Yosys's, before nextpnr packs
them: nextpnr's ``TRELLIS_COMB`` count is about LUT4 + 2 CCU2C + 2 LUT RAM. ``glue`` is the
core and datapath modules themselves and the loader (Yosys 0.70 fails an internal assertion,
``count_id(wire->name) == 0``, when the loader is kept as a module of its own). On the ECP5,
Yosys 0.70 stops in ``abc9`` with an internal assertion on the kernel extractor of the
``ulx3s`` core after about an hour (``docs/synthesis.md``, "ULX3S budget"); its ``yosys.log``
(``--keep``) still has the ``$lut`` count of every module mapped before.
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

UNITS = ("control", "setup", "dma", "extract", "buffer", "order", "shifter", "sequencer", "mac",
         "results", "replay", "post", "writer", "watchdog")

#: Per target: the Yosys command, the cell-name pattern of the ``stat`` lines, and the table's
#: columns as (heading, cell types summed).
FLOWS = {
    "ice40-up5k": ("synth_ice40 -dsp", r"SB_\w+", (
        ("LUT4", ("SB_LUT4",)), ("FF", ("SB_DFF*",)), ("carry", ("SB_CARRY",)),
        ("EBR", ("SB_RAM40_4K",)), ("DSP", ("SB_MAC16",)))),
    "ecp5-85f": ("synth_ecp5", r"\w+", (
        ("LUT4", ("LUT4",)), ("FF", ("TRELLIS_FF",)), ("CCU2C", ("CCU2C",)),
        ("MULT18X18D", ("MULT18X18D",)), ("DP16KD", ("DP16KD",)),
        ("LUT RAM", ("TRELLIS_DPR16X4",)))),
}


def _module_cells(stat_text, pattern):
    """``{module name: Counter(cell type: count)}`` from Yosys ``stat`` output."""
    modules = {}
    for block in re.split(r"\n=== ", "\n" + stat_text):
        head, _, body = block.partition(" ===")
        name = head.strip()
        if name and not name.startswith("design hierarchy"):
            modules[name] = collections.Counter(
                {m.group(2): int(m.group(1))
                 for m in re.finditer(rf"^\s+(\d+)\s+({pattern})\b", body, re.M)})
    return modules


def _count(cells, types):
    return sum(n for cell, n in cells.items()
               for t in types if cell == t or (t.endswith("*") and cell.startswith(t[:-1])))


def _total(modules, prefix):
    """Cells of module ``prefix`` and of every module below it in ``modules``."""
    cells = collections.Counter()
    for name, counts in modules.items():
        if name == prefix or name.startswith(prefix + "."):
            cells.update(counts)
    return cells


def _row(name, cells, columns):
    return f"| {name} | " + " | ".join(f"{_count(cells, types):,}" for _, types in columns) + " |"


def work_directory(keep, prefix):
    """``keep`` (created if need be), or a new temporary directory named ``prefix``."""
    directory = Path(keep or tempfile.mkdtemp(prefix=prefix))
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def kept_stat(dut, name, target, directory, kept):
    """Synthesise ``dut`` in the out-of-context harness, as module ``name``, by ``target``'s Yosys
    command with ``keep_hierarchy`` on the modules ``kept(rtlil_text)`` names; the RTLIL, script,
    log and ``stat`` are written to ``directory``. Returns ``{module: Counter(cell: count)}``."""
    command, pattern, _ = FLOWS[target]
    text = rtlil.convert(OutOfContextHarness(dut), name=name,
                         platform=OutOfContextPlatform(TARGETS[target]),
                         missing_domain=_missing_domain)
    (directory / f"{name}.il").write_text(text)
    (directory / f"{name}.ys").write_text(
        f"read_rtlil {name}.il\nsetattr -mod -set keep_hierarchy 1 {' '.join(kept(text))}\n"
        f"{command} -top {name}\ntee -q -o stat.txt stat\n")
    subprocess.run([find_tool("YOSYS"), "-q", "-l", "yosys.log", "-s", f"{name}.ys"],
                   cwd=directory, check=True, stdout=subprocess.DEVNULL)
    return _module_cells((directory / "stat.txt").read_text(), pattern)


def print_header(title, columns):
    """The title line and the head of the table."""
    print(title)
    print("| module | " + " | ".join(h for h, _ in columns) + " |\n|---|"
          + "---|" * len(columns))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="icebreaker")
    parser.add_argument("--target", choices=tuple(FLOWS), default="ice40-up5k")
    parser.add_argument("--keep", help="directory for the RTLIL, script, log and stat")
    args = parser.parse_args(argv)
    command, _, columns = FLOWS[args.target]
    directory = work_directory(args.keep, "npu-core-modules-")
    kept = ["ne.dut", "ne.dut.control", "ne.dut.datapath"]
    kept += [f"ne.dut.datapath.{u}" for u in UNITS if u != "control"]
    modules = kept_stat(NeuralEngine(preset(args.preset)), "ne", args.target, directory,
                        lambda text: kept)

    print_header(f"preset {args.preset}, {command}", columns)
    units = {u: _total(modules, "ne.dut." + ("control" if u == "control" else f"datapath.{u}"))
             for u in UNITS}
    for unit, cells in units.items():
        print(_row(unit, cells, columns))
    core = _total(modules, "ne.dut")
    glue = core.copy()
    for cells in units.values():
        glue.subtract(cells)
    print(_row("glue (core, datapath, loader)", glue, columns))
    print(_row("core", core, columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
