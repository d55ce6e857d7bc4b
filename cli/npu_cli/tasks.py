"""``npu`` commands of the task manager: the ``task_manager`` block and
``npu bench switch-latency``."""

import json

from npu_cli.util import CLIError, positive, preset_arg, progress

__all__ = ["BLOCKS", "add_bench_commands"]


def _task_manager(config):
    from npu.taskman import TaskManager
    return TaskManager(config)


BLOCKS = {"task_manager": _task_manager}


def _positions(text):
    import argparse
    try:
        values = [int(p, 0) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"must be non-negative integers, not {text!r}")
    return values


def cmd_bench_switch_latency(args):
    from npu_sim.taskman import switch_latency
    say = progress(args.json)
    if args.positions and max(args.positions) >= args.task_cycles:
        raise CLIError(f"positions must be below --task-cycles {args.task_cycles}, "
                       f"not {max(args.positions)}", status=2)
    say(f"switch latency, preset {args.preset.name}, running task of {args.task_cycles} "
        f"cycles (amaranth simulation)")
    rows = switch_latency(args.preset, task_cycles=args.task_cycles, positions=args.positions)
    if not all(r["switched"] for r in rows):
        raise CLIError("a request did not cause a switch at the TSR task", status=1)
    if args.json:
        print(json.dumps({"preset": args.preset.name, "task_cycles": args.task_cycles,
                          "rows": rows}, indent=2))
        return 0
    print("position  latency  after_end  SWITCH_LATENCY")
    for r in rows:
        print(f"{r['position']:8d}  {r['latency']:7d}  {r['after_end']:9d}  {r['counter']:14d}")
    return 0


def add_bench_commands(subparsers):
    b = subparsers.add_parser(
        "switch-latency",
        help="cycles from a higher-priority enqueue to its first task, by request position")
    b.add_argument("--preset", type=preset_arg, default="small",
                   help="configuration preset (default small)")
    b.add_argument("--task-cycles", type=positive, default=64,
                   help="length of the running (TSE, TSR) task in cycles (default 64)")
    b.add_argument("--positions", type=_positions, default=None,
                   help="comma-separated request positions in cycles after the task starts "
                        "(default 0, 1/4, 1/2, 3/4 of the task and 4 cycles before its end)")
    b.add_argument("--json", action="store_true", help="print a JSON summary only")
    b.set_defaults(func=cmd_bench_switch_latency)
