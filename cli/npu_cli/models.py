"""``npu bench models``: compile ONNX models for several presets and print the timing model's
estimated cycles, MAC utilization, buffer peak and compile time (``docs/compiler.md``,
"Estimated cycles on small and ane")."""

import json
import time

from npu_cli.util import CLIError, positive, progress

__all__ = ["add_bench_commands"]


def _presets(text):
    from npu_spec.config import preset
    try:
        return [preset(name.strip()) for name in text.split(",") if name.strip()]
    except ValueError as e:
        raise CLIError(f"npu bench models: {e}", status=2) from None


def _row(path, config, args, shapes):
    """One model on one configuration: the figures of the table."""
    from npu_compiler.compile import compile_model
    from npu_compiler.graph import CompileError
    from npu_model.timing import estimate
    from npu_runtime.runtime import session
    from npu_spec.dataproc import buffer_elements
    t0 = time.process_time()
    try:
        compiled = compile_model(path, config, fmt=args.format, shapes=shapes,
                                 calibration=args.calibration, evaluator=session,
                                 schedule=args.schedule)
    except CompileError as e:
        raise CLIError(f"npu bench models: {path}: {e}", status=2) from None
    seconds = time.process_time() - t0
    prog = compiled.program
    est = estimate(prog)
    macs = sum(r.get("macs") or 0 for r in compiled.plan)
    meta = prog.metadata.get("compiler", {})
    engines = {}
    for t in est.tasks:
        engines[t.engine] = engines.get(t.engine, 0) + t.cycles
    return {"model": str(path), "preset": config.name, "format": args.format,
            "schedule": meta.get("schedule"), "tasks": len(est.tasks),
            "cycles_estimate": est.cycles, "macs": macs or None,
            "mac_utilization_estimate": round(macs / (est.cycles * config.cores * config.macs),
                                              5) if macs else None,
            "engine_cycles": engines,
            "buffer_peak": meta.get("buffer_peak"), "buffer_elements": buffer_elements(config),
            "memory_bytes": len(prog.memory), "compile_seconds": round(seconds, 2)}


def cmd_models(args):
    import dataclasses
    say = progress(args.json)
    shapes = dict(args.shape or [])
    rows = []
    for config in _presets(args.preset):
        if args.mem_kib and args.mem_kib > config.mem_kib:
            config = dataclasses.replace(config, mem_kib=args.mem_kib)
        for path in args.models:
            say(f"compiling {path} for {config.name}")
            rows.append(_row(path, config, args, shapes))
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'model':<28} {'preset':<6} {'schedule':<11} {'tasks':>6} {'cycles (est.)':>14} "
          f"{'MAC util':>9} "
          f"{'NE':>6} {'PE':>6} {'DMA':>6} {'buffer peak':>18} {'compile':>8}")
    for r in rows:
        busy = {k: r["engine_cycles"].get(k, 0) / r["cycles_estimate"]
                for k in ("NEURAL", "PLANAR", "DMA")}
        util = "-" if r["mac_utilization_estimate"] is None else \
            f"{r['mac_utilization_estimate']:.2%}"
        peak = "-" if r["buffer_peak"] is None else \
            f"{r['buffer_peak']:,} / {r['buffer_elements']:,}"
        name = r["model"].rsplit("/", 1)[-1]
        print(f"{name:<28} {r['preset']:<6} {r['schedule'] or '-':<11} {r['tasks']:>6} "
              f"{r['cycles_estimate']:>14,} "
              f"{util:>9} {busy['NEURAL']:>6.0%} {busy['PLANAR']:>6.0%} {busy['DMA']:>6.0%} "
              f"{peak:>18} {r['compile_seconds']:>7.1f}s")
    print("cycles: npu_model.timing's estimate (not a simulation); NE/PE/DMA: each engine's "
          "busy share of them")
    return 0


def add_bench_commands(bsub):
    from npu_cli.compiler import _shape_arg
    from npu_compiler.compile import FORMATS, SCHEDULE_CHOICES
    p = bsub.add_parser("models", help="estimated cycles and MAC utilization of ONNX models "
                                       "on several presets (timing model)",
                        description="Compile each model for each preset and print the timing "
                                    "model's estimate (npu_model.timing): cycles, MAC "
                                    "utilization, each engine's busy share, the buffer peak "
                                    "and the compile time (CPU).")
    p.add_argument("models", nargs="+", metavar="MODEL.onnx")
    p.add_argument("--preset", default="small,ane", metavar="P1,P2",
                   help="presets, comma-separated (default small,ane)")
    p.add_argument("--format", default="fp16", choices=FORMATS)
    p.add_argument("--calibration", metavar="FILE.npz|DIR", help="int8: sample inputs")
    p.add_argument("--schedule", default=SCHEDULE_CHOICES[0], choices=SCHEDULE_CHOICES,
                   help=f"the compiler's schedule (default {SCHEDULE_CHOICES[0]})")
    p.add_argument("--mem-kib", type=positive, metavar="KIB",
                   help="system memory at least this large on every preset")
    p.add_argument("--shape", type=_shape_arg, action="append",
                   help="NAME=1x3x12x12: an input's shape where it is dynamic")
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p.set_defaults(func=cmd_models)
