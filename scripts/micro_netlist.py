"""The micro neural unit's board netlist under Icarus on the digits CNN's layer shapes
(``docs/micro.md``, "The neural unit's board netlist").

Usage: ``python scripts/micro_netlist.py [--seed 1]``. Prints the Yosys script and the cells of
the netlist (``npu_sim.micro_netlist``: ``MicroNeural(pooling=True)`` mapped with the
iCEBreaker build's options), then runs the tasks of ``scripts/micro_unit_cycles.py`` (the same
seed gives the same tasks, so its cycles are comparable with that script's rows ``conv1``,
``conv2``, ``fc``, ``pool1/ne``, ``pool2/ne``) on the netlist and checks each against the
golden model's task bit for bit: one row a task with its cycles from start to done and the
CPU time Icarus took.
"""

import argparse
import resource
import tempfile

import numpy as np
from micro_unit_cycles import BUF, CONFIG, CONVS, POOLS, conv_task, pool_task

from npu_model.system import run_neural_task, run_planar_task
from npu_sim.micro_netlist import cell_counts, micro_ne_netlist, run_netlist, yosys_script


def _children_cpu():
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    netlist = micro_ne_netlist(progress=print)
    print(yosys_script(), end="")
    cells = cell_counts((netlist / "netlist.v").read_text())
    print("cells: " + ", ".join(f"{name} {count:,}" for name, count in sorted(cells.items())))
    rng = np.random.default_rng(args.seed)
    tasks = []
    for name, *shape in CONVS:
        regs, kmem, _, _ = conv_task(rng, *shape)
        tasks.append((name, regs, kmem, rng.integers(0, 1 << 16, BUF).astype(np.uint16), False))
    kmem0 = np.zeros(CONFIG.kernel_kib * 256, np.uint32)
    for name, *shape in POOLS:
        regs, _ = pool_task(*shape)
        tasks.append((name, regs, kmem0, rng.integers(0, 1 << 16, BUF).astype(np.uint16), True))
    print(f"{'task':<8} {'cycles':>8} {'Icarus CPU s':>13} {'cycles/s':>9}  golden")
    with tempfile.TemporaryDirectory(prefix="npu-micro-netlist-") as work:
        for name, regs, kmem, buffer, pool in tasks:
            if pool:
                code, want = run_planar_task(CONFIG, regs, buffer)
            else:
                code, want = run_neural_task(CONFIG, regs, buffer, kmem)
            start = _children_cpu()
            err, got, cycles = run_netlist(buffer, regs, kmem, pool=pool, work_dir=work,
                                           netlist=netlist)
            cpu = _children_cpu() - start
            same = code == err == 0 and np.array_equal(np.array(got, np.uint16), want)
            print(f"{name:<8} {cycles:>8,} {cpu:>13.1f} {cycles / cpu:>9,.0f}  "
                  f"{'same' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
