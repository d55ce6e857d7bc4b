"""Per-module resources of the task manager on the iCE40UP5K (Yosys only, no placement).

Usage: ``python scripts/taskman_modules.py [--preset icebreaker] [--keep DIR]``. The task
manager of ``npu synth --block task_manager`` (``npu_cli.tasks``) is elaborated for the UP5K in
the out-of-context harness of ``npu_fpga.synth`` and synthesised by ``synth_ice40 -dsp`` with
``keep_hierarchy`` on the task manager and each of its sub-units, so no optimisation crosses a
sub-unit's boundary (the flattened block is somewhat smaller). Prints LUT4, flip-flops, carry
cells, EBR and DSP per sub-unit; ``glue`` is the task manager module itself (queue state,
exception status, interrupt, status wiring).
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from amaranth.back import rtlil
from core_modules import _module_cells, _row, _total

from npu_cli.tasks import BLOCKS
from npu_fpga.synth import (
    TARGETS,
    OutOfContextHarness,
    OutOfContextPlatform,
    _missing_domain,
    find_tool,
)
from npu_spec.config import preset

#: The sub-units of ``npu.taskman.TaskManager`` (its named submodules) kept as modules; the
#: queue state (``queues``) is counted in the glue: Yosys 0.70 fails an internal assertion
#: (``count_id(wire->name) == 0``, in ABC9) when it is kept as a module of its own.
UNITS = ("regfile", "schedule", "fetch", "config_queue", "program", "taskbuf", "dispatch",
         "counters")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="icebreaker")
    parser.add_argument("--keep", help="directory for the RTLIL, script, log and stat")
    args = parser.parse_args(argv)
    directory = Path(args.keep or tempfile.mkdtemp(prefix="npu-taskman-modules-"))
    directory.mkdir(parents=True, exist_ok=True)
    block = BLOCKS["task_manager"](preset(args.preset))
    harness = OutOfContextHarness(block)
    platform = OutOfContextPlatform(TARGETS["ice40-up5k"])
    (directory / "tm.il").write_text(rtlil.convert(
        harness, name="tm", platform=platform, missing_domain=_missing_domain))
    kept = " ".join(["tm.dut"] + [f"tm.dut.{u}" for u in UNITS])
    (directory / "tm.ys").write_text(
        f"read_rtlil tm.il\nsetattr -mod -set keep_hierarchy 1 {kept}\n"
        "synth_ice40 -dsp -top tm\ntee -q -o stat.txt stat\n")
    subprocess.run([find_tool("YOSYS"), "-q", "-l", "yosys.log", "-s", "tm.ys"],
                   cwd=directory, check=True, stdout=subprocess.DEVNULL)
    modules = _module_cells((directory / "stat.txt").read_text())

    print("| module | LUT4 | FF | carry | EBR | DSP |\n|---|---|---|---|---|---|")
    found = {u: _total(modules, f"tm.dut.{u}") for u in UNITS}
    for unit, cells in found.items():
        print(_row(unit, cells))
    whole = _total(modules, "tm.dut")
    glue = whole.copy()
    for cells in found.values():
        glue.subtract(cells)
    print(_row("glue (task manager module)", glue))
    print(_row("task manager", whole))
    return 0


if __name__ == "__main__":
    sys.exit(main())
