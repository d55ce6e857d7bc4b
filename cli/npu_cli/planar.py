"""``npu sim pool|eltwise|reduce``: one planar engine task through the RTL and the golden model.

Each command builds a task from its options, makes random operands (seeded), runs the RTL
with random stalls on every stream, compares every output element with the golden model
(:mod:`npu_model.planar`) and prints the agreement, the cycle count and the elements per cycle.
"""

import json
import time

from npu_cli.util import CLIError, add_sim_options, positive, progress

__all__ = ["BLOCKS", "add_sim_commands"]


def _planar_engine(config):
    from npu.planar.engine import PlanarEngine
    return PlanarEngine(config)


BLOCKS = {"planar_engine": _planar_engine}

_FMTS = {"int8": 0, "fp16": 1}


def _f32(text):
    import numpy as np
    try:
        return int(np.float32(float(text)).view(np.uint32))
    except ValueError:
        raise CLIError(f"not a number: {text!r}", status=2) from None


def _config(args):
    cfg = args.preset
    if args.lanes is not None:
        if args.lanes & (args.lanes - 1):
            raise CLIError(f"--lanes must be a power of two, not {args.lanes}", status=2)
        cfg = cfg.replace(planar_lanes=args.lanes)
    if args.pool_beats is not None:
        try:
            cfg = cfg.replace(planar_pool_beats=args.pool_beats)
        except ValueError as e:   # NPUConfig checks the range
            raise CLIError(f"--pool-beats: {e}", status=2) from None
    if "fp16" in (args.in_fmt, args.out_fmt) and not cfg.has_fp16:
        raise CLIError(f"preset {cfg.name!r} has no fp16 hardware "
                       f"(formats: {', '.join(cfg.formats)})", status=2)
    return cfg


def _common(p):
    add_sim_options(p, backend_default="verilator")
    p.add_argument("--lanes", type=positive, default=None,
                   help="P of the P x P lanes (default: the preset's planar_lanes)")
    p.add_argument("--pool-beats", type=positive, default=None, metavar="K",
                   help="width of the pooling filters in beats, 1 to 4 (default: the preset's "
                        "planar_pool_beats); overlapping windows need about kw / sx")
    p.add_argument("--shape", type=positive, nargs=3, default=(2, 8, 8),
                   metavar=("C", "H", "W"), help="input tensor shape (default 2 8 8)")
    p.add_argument("--in-fmt", choices=tuple(_FMTS), default="int8")
    p.add_argument("--out-fmt", choices=tuple(_FMTS), default="int8")
    p.add_argument("--vcd", metavar="FILE.vcd", help="waveform (amaranth backend)")


def _run(args, task, label):
    import numpy as np

    from npu_sim import planar as ps

    cfg = _config(args)
    lanes = cfg.planar_lanes ** 2
    say = progress(args.json)
    if args.backend == "verilator" and args.vcd:
        raise CLIError("--vcd is only supported with --backend amaranth", status=2)
    err = ps.task_error(task, cfg)
    if err:
        raise CLIError(f"{label}: the engine rejects this task ({err.name.lower()})", status=2)
    rng = np.random.default_rng(args.seed)
    a, b, c = ps.random_operands(rng, task)
    expected = ps.golden(task, a, b, c, lanes=lanes)
    say(f"{label}: RTL on {args.backend}, {lanes} lanes, stall probability {args.stall}")
    t0 = time.perf_counter()
    if args.backend == "amaranth":
        got, cycles, rtl_err = ps.run_amaranth(cfg, task, a, b, c, seed=args.seed,
                                               stall=args.stall, vcd=args.vcd)
    else:
        from npu_fpga.toolenv import apply_tool_env
        from npu_sim.verilator import VerilatorError
        apply_tool_env()
        try:
            (got, cycles, rtl_err), = ps.run_verilator(cfg, [(task, a, b, c)], seed=args.seed,
                                                       stall=args.stall, progress=say)
        except VerilatorError as e:
            raise CLIError(str(e).splitlines()[0]) from None
    seconds = time.perf_counter() - t0
    if rtl_err or got is None:
        raise CLIError(f"{label}: RTL reported error {rtl_err}")
    bad = ps.compare(expected, got, task["out_fmt"])
    n_in = int(np.asarray(a).size)
    n_out = int(np.asarray(expected).size)
    summary = {
        "command": label, "preset": cfg.name, "lanes": lanes,
        "pool_beats": cfg.planar_pool_beats, "backend": args.backend,
        "seed": args.seed, "stall": args.stall, "task": task,
        "input_elements": n_in, "output_elements": n_out,
        "mismatches": int(bad.size), "match": bool(bad.size == 0), "cycles": int(cycles),
        "input_elements_per_cycle": round(n_in / max(1, cycles), 3),
        "output_elements_per_cycle": round(n_out / max(1, cycles), 3),
        "rtl_wall_seconds": round(seconds, 3),
    }
    if args.dump:
        np.savez_compressed(args.dump, a=a, b=b, c=c, expected=expected, got=got,
                            **{f"task_{k}": v for k, v in task.items()})
        say(f"wrote {args.dump}")
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        verdict = ("RTL equals golden model" if not bad.size
                   else f"RTL DIFFERS from golden model ({bad.size} elements)")
        print(f"{verdict}: {label}, {n_out - bad.size} of {n_out} output elements match "
              f"(preset {cfg.name}, {lanes} lanes, seed {args.seed})")
        print(f"throughput: {cycles} cycles, {summary['input_elements_per_cycle']} input "
              f"elements/cycle, {summary['output_elements_per_cycle']} output elements/cycle "
              f"at stall probability {args.stall}")
    return 0 if not bad.size else 1


def _base_task(args, mode, op):
    from npu_sim import planar as ps
    c, h, w = args.shape
    return ps.make_task(mode=mode, op=op, in_fmt=_FMTS[args.in_fmt],
                        out_fmt=_FMTS[args.out_fmt], channels=c, height=h, width=w)


def cmd_pool(args):
    from npu_model import planar as pl
    task = _base_task(args, 1, pl.POOL_OPS[args.op])
    kh, kw = args.window
    sy, sx = args.stride
    py, px = args.pad
    task.update(kh=kh, kw=kw, sy=sy, sx=sx, py=py, px=px)
    c, h, w = args.shape
    return _run(args, task, f"{args.op} pool {kh}x{kw} stride {sy},{sx} pad {py},{px} on "
                f"{c}x{h}x{w} {args.in_fmt}->{args.out_fmt}")


def cmd_eltwise(args):
    from npu_model import planar as pl
    task = _base_task(args, 0, pl.ELT_OPS[args.op])
    task.update(bcast=pl.BCASTS[args.bcast], scale=_f32(args.scale), bias=_f32(args.bias),
                scalar=_f32(args.scalar))
    c, h, w = args.shape
    return _run(args, task, f"eltwise {args.op} (B broadcast {args.bcast}) on {c}x{h}x{w} "
                f"{args.in_fmt}->{args.out_fmt}")


def cmd_reduce(args):
    from npu_model import planar as pl
    from npu_spec.planar import Axis
    task = _base_task(args, 2, pl.RED_OPS[args.op])
    c, h, w = args.shape
    if args.axis == "channel" and args.post != "none":
        raise CLIError("--axis channel has no post function (--post none)", status=2)
    n = pl.reduction_count((c, h, w), args.axis)
    scale = int(pl.recip_count(n)) if args.mean else _f32(args.scale)
    task.update(pre=pl.ELT_OPS[args.pre], post=pl.POST_FNS[args.post],
                axis=Axis[args.axis.upper()], scale=scale)
    what = "mean" if args.mean else args.op
    return _run(args, task, f"reduce {what} (pre {args.pre}, post {args.post}) per "
                f"{args.axis} on {c}x{h}x{w} {args.in_fmt}->{args.out_fmt}")


def add_sim_commands(subparsers):
    from npu_model import planar as pl
    from npu_spec.planar import Axis, EltOp

    p = subparsers.add_parser(
        "pool", help="pooling through the planar engine",
        description="Max, min or average pooling (average divides by the valid elements) of "
        "a random tensor through the RTL planar engine and the golden model.")
    _common(p)
    p.add_argument("--op", choices=tuple(pl.POOL_OPS), default="max")
    p.add_argument("--window", type=positive, nargs=2, default=(2, 2), metavar=("KH", "KW"))
    p.add_argument("--stride", type=positive, nargs=2, default=(2, 2), metavar=("SY", "SX"))
    p.add_argument("--pad", type=int, nargs=2, default=(0, 0), metavar=("PY", "PX"))
    p.set_defaults(func=cmd_pool)

    e = subparsers.add_parser(
        "eltwise", help="elementwise operation through the planar engine",
        description="Unary, binary or ternary elementwise operation (operand B optionally "
        "broadcast) on random tensors through the RTL planar engine and the golden model.")
    _common(e)
    e.add_argument("--op", choices=tuple(pl.ELT_OPS), default="add")
    e.add_argument("--bcast", choices=tuple(pl.BCASTS), default="none",
                   help="broadcast of operand B (binary and ternary ops)")
    e.add_argument("--scale", default="1.0", help="gain s of gain_bias (default 1.0)")
    e.add_argument("--bias", default="0.0", help="bias b of gain_bias (default 0.0)")
    e.add_argument("--scalar", default="2.0", help="B for --bcast scalar (default 2.0)")
    e.set_defaults(func=cmd_eltwise)

    r = subparsers.add_parser(
        "reduce", help="reduction through the planar engine",
        description="Sum, max or min over each channel plane or the whole tensor (through "
        "the reduction tree and retention registers, then scale and post-processor), or across "
        "the channels of every pixel (an accumulator plane in the H ring, then scale).")
    _common(r)
    r.add_argument("--op", choices=tuple(pl.RED_OPS), default="sum")
    r.add_argument("--pre", choices=tuple(op.name.lower() for op in EltOp
                                          if op <= EltOp.SQUARE), default="copy")
    r.add_argument("--post", choices=tuple(pl.POST_FNS), default="none")
    r.add_argument("--axis", choices=tuple(a.name.lower() for a in Axis), default="plane",
                   help="plane: one result per channel; tensor: one result; channel: one "
                   "result per pixel, across the channels (default plane)")
    r.add_argument("--scale", default="1.0", help="multiplier of the result (default 1.0)")
    r.add_argument("--mean", action="store_true", help="scale by 1/N (a mean)")
    r.set_defaults(func=cmd_reduce)
