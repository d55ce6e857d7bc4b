"""``npu sim system``: a program on the whole NPU, against the golden system model.

The program comes from a file (``--program``, ``docs/program.md``) or is a random chain of
``--random N`` layers (``npu_sim.programs.random_program``). It runs on the golden system model
and on the RTL system simulation (``npu_sim.system``: Verilator with the system memory inside
the design, or the Amaranth simulator for small cases); the final system memory and every
queue's status are compared, and the run's figures printed.
"""

import argparse
import json
import sys

from npu_cli.util import CLIError, preset_arg, progress

__all__ = ["add_bench_commands", "add_sim_commands", "cmd_bench_system", "cmd_sim_system"]


def _load(args, say):
    from npu_spec.program import ProgramError, check_config, load
    if args.program:
        try:
            program = load(args.program)
            check_config(program, args.preset)
        except ProgramError as e:
            raise CLIError(str(e), status=2) from None
        return program
    from npu_sim.programs import random_program
    say(f"random program: {args.random} layers, seed {args.seed}")
    try:
        return random_program(args.preset, args.random, args.seed, fmt=args.format)
    except ValueError as e:
        raise CLIError(str(e), status=2) from None


def cmd_sim_system(args):
    from npu_fpga.toolenv import apply_tool_env
    from npu_model.system import run_program
    from npu_sim.system import compare, rtl_run

    if (args.program is None) == (args.random is None):
        raise CLIError("give either --program FILE or --random N", status=2)
    if args.vcd and args.backend != "amaranth":
        raise CLIError("--vcd needs --backend amaranth", status=2)
    apply_tool_env()
    say = progress(args.json)
    program = _load(args, say)
    say(f"golden system model: {sum(q.tasks for q in program.queues)} tasks")
    golden = run_program(program)
    say(f"RTL system simulation on {args.backend}: latency {args.latency}, "
        f"stall {args.stall}")
    try:
        rtl = rtl_run(program, backend=args.backend, latency=args.latency, stall=args.stall,
                      seed=args.seed, progress=say, vcd=args.vcd,
                      gate_clocks=args.gate_clocks)
    except RuntimeError as e:
        raise CLIError(f"the RTL run failed: {e}") from None
    summary = compare(program, golden, rtl)
    summary.update(preset=args.preset.name, backend=args.backend, latency=args.latency,
                   stall=args.stall, rtl_wall_seconds=round(rtl["wall"], 2),
                   sim_cycles=rtl["sim_cycles"])
    if args.dump:
        _dump(args.dump, program, golden, rtl)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"match: {summary['match']} (memory {summary['memory_match']}, "
              f"{summary['memory_bytes_compared']} bytes; queues and exceptions "
              f"{summary['exception_match']})")
        print(f"cycles: {summary['cycles']}  NE busy: {summary['ne_busy_cycles']}  "
              f"PE busy: {summary['pe_busy_cycles']}  DMA busy: {summary['dma_busy_cycles']}")
        print(f"DMA bytes: {summary['dma_bytes']}  bus stall cycles: "
              f"{summary['bus_stall_cycles']}  stall (fetch/dep/write): "
              f"{summary['stall_fetch']}/{summary['stall_dep']}/{summary['stall_write']}")
        print(f"tasks: {summary['tasks']}  error code: {summary['error_code']}")
    return 0 if summary["match"] else 1


def _dump(path, program, golden, rtl):
    import numpy as np

    from npu_model.system import read_tensor
    arrays = {}
    for t in program.tensors:
        arrays[f"golden/{t.name}"] = read_tensor(golden.memory, t)
        memory = rtl["memory"] + bytes(max(0, len(golden.memory) - len(rtl["memory"])))
        arrays[f"rtl/{t.name}"] = read_tensor(memory, t)
    np.savez(path, **arrays)
    print(f"wrote {path}", file=sys.stderr)


def add_sim_commands(ssub):
    p = ssub.add_parser(
        "system", help="a program on the whole NPU against the golden system model",
        description=__doc__.split("\n\n")[1])
    p.add_argument("--preset", type=preset_arg, default="small", help="configuration")
    src = p.add_argument_group("program (one of)")
    src.add_argument("--program", metavar="FILE", help="a program file (npu disasm shows it)")
    src.add_argument("--random", type=int, metavar="N", help="a random chain of N layers")
    p.add_argument("--format", choices=("int8", "fp16", "mixed"),
                   help="arithmetic of a random program (default: random)")
    p.add_argument("--seed", type=int, default=0, help="random program and stall seed")
    p.add_argument("--backend", choices=("verilator", "amaranth"), default="verilator")
    p.add_argument("--latency", type=int, default=4, help="system-memory latency in cycles")
    p.add_argument("--stall", type=float, default=0.0,
                   help="probability that system memory stalls a cycle")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--dump", metavar="FILE.npz", help="write the tensors (golden and RTL)")
    p.add_argument("--vcd", metavar="FILE", help="waveforms (Amaranth backend)")
    _gate_arg(p)
    p.set_defaults(func=cmd_sim_system)


def _gate_arg(p):
    p.add_argument("--gate-clocks", action=argparse.BooleanOptionalAction, default=None,
                   help="Verilator: the engines on clocks that stop while they are idle (same "
                   "cycles and results, faster; docs/system.md); default: the environment "
                   "variable NPU_SIM_GATE (0 or 1), else on")


def cmd_bench_system(args):
    from npu_fpga.toolenv import apply_tool_env
    from npu_sim import system_bench

    apply_tool_env()
    say = progress(args.json)
    results = {}
    if args.which in ("conv-pool", "all"):
        say("conv 3x3 16->16 on 16x16, then a 2x2 max pool through the buffer "
            f"({args.slots} flow-control slots)")
        results["conv_pool"] = system_bench.conv_pool(args.preset, slots=args.slots,
                                                      progress=say)
    if args.which in ("double-buffered", "all"):
        say(f"the same conv from and to system memory at latency {args.latency}, in bands")
        results["double_buffered"] = system_bench.double_buffered(
            args.preset, latency=args.latency, progress=say)
    if args.which in ("speed", "all"):
        say("simulation speed: four 16-channel 32x32 conv layers")
        results["speed"] = system_bench.speed(args.preset, progress=say,
                                              gate_clocks=args.gate_clocks)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for name, figures in results.items():
            print(name + ": " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    ok = all(r.get("match", True) for r in results.values())
    return 0 if ok else 1


def add_bench_commands(bsub):
    p = bsub.add_parser("system", help="system benchmarks: streaming, double buffering, speed",
                        description="Benchmarks of the whole NPU on the system simulation "
                        "(docs/system.md, \"Figures\"), each checked against the golden model.")
    p.add_argument("--preset", type=preset_arg, default="small", help="configuration")
    p.add_argument("--which", choices=("conv-pool", "double-buffered", "speed", "all"),
                   default="all")
    p.add_argument("--latency", type=int, default=20,
                   help="system-memory latency of the double-buffered run")
    p.add_argument("--slots", type=_slots_arg, default=2,
                   help="flow-control slots of the conv-pool ring (0: no flow control, the "
                   "pool waits for the conv's end)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _gate_arg(p)
    p.set_defaults(func=cmd_bench_system)


def _slots_arg(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 1024:
        raise argparse.ArgumentTypeError(f"slots must be 0 to 1023, not {text!r}")
    return value
