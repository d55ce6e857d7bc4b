"""Per-sub-unit resources of one ``npu synth`` block on the ECP5 or the iCE40 (Yosys only).

Usage: ``python scripts/block_modules.py --block planar_engine --preset ulx3s
[--target ecp5-85f] [--depth 1] [--keep DIR]``. The block is elaborated in the out-of-context
harness of ``npu_fpga.synth`` and synthesised by the target's Yosys command with
``keep_hierarchy`` on the block and on its submodules down to ``--depth`` levels, so no
optimisation crosses a sub-unit's boundary (the flattened block of ``npu synth --no-pnr`` is
somewhat smaller). Prints one row per kept sub-unit (its cells and those of everything below
it), the block's own logic (``glue``) and the block; the columns are those of
``scripts/core_modules.py``. Memories are not modules (a warning names them; their cells
count in their parent's row). Yosys 0.70 may stop in ``abc9`` with an internal assertion
(``count_id(wire->name) == 0``) on some kept modules, as it does with ``--block planar_engine
--preset ulx3s --depth 2``; ``yosys.log`` (``--keep``) then still has the ``$lut`` count of
every module mapped before.
"""

import argparse
import sys

from amaranth.hdl import Fragment
from core_modules import FLOWS, _row, _total, kept_stat, print_header, work_directory

from npu_cli.main import _block
from npu_cli.util import preset_arg
from npu_fpga.synth import TARGETS, OutOfContextPlatform


def _submodule_paths(block, platform, depth):
    """Hierarchical names (below the block) of its submodules down to ``depth`` levels."""
    paths = []

    def walk(fragment, prefix, level):
        for sub, name, _ in fragment.subfragments:
            path = f"{prefix}.{name}"
            paths.append(path)
            if level < depth:
                walk(sub, path, level + 1)
    walk(Fragment.get(block, platform), "", 1)
    return [p[1:] for p in paths]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", required=True)
    parser.add_argument("--preset", type=preset_arg, default="ulx3s")
    parser.add_argument("--target", choices=tuple(FLOWS), default="ecp5-85f")
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--keep", help="directory for the RTLIL, script, log and stat")
    args = parser.parse_args(argv)
    command, _, columns = FLOWS[args.target]
    directory = work_directory(args.keep, "npu-block-modules-")
    platform = OutOfContextPlatform(TARGETS[args.target])
    units = _submodule_paths(_block(args.preset, args.block), platform, args.depth)
    kept = ["top.dut"] + [f"top.dut.{u}" for u in units]
    modules = kept_stat(_block(args.preset, args.block), "top", args.target, directory,
                        lambda text: kept)

    print_header(f"block {args.block}, preset {args.preset.name}, {command}", columns)
    block = _total(modules, "top.dut")
    glue = block.copy()
    for unit in units:
        if "." not in unit:
            cells = _total(modules, f"top.dut.{unit}")
            glue.subtract(cells)
        print(_row(unit, _total(modules, f"top.dut.{unit}"), columns))
    print(_row("glue (the block's own logic)", glue, columns))
    print(_row("block", block, columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
