"""``npu compile`` and ``npu run``: ONNX models on the NPU (``docs/compiler.md``).

``npu compile MODEL.onnx --preset P --format fp16|int8|mixed [--calibration FILE.npz|DIR]
[--palette BITS] [--prune FRACTION] -o PROG`` prints the plan, one line per layer (with each
layer's kernel encoding and bytes raw -> encoded) and the kernel total; ``npu run
MODEL.onnx|PROG --backend golden|rtl|board|golden,rtl --input NAME=FILE --output OUT.npz
[--check] [--json]`` runs it (``board``: ``--device /dev/ttyUSBn [--baud B] [--timeout S]``,
``docs/boards.md``).
"""

import json

from npu_cli.util import CLIError, positive, preset_arg, progress

__all__ = ["add_commands"]

#: ``--check``: an output whose rel_err exceeds this starts the search for the first layer
#: that departs (the tests' tolerance, docs/compiler.md "Tolerances").
CHECK_TOL = 3e-3


def _shape_arg(text):
    import argparse
    name, sep, dims = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=1x3x48x192, not {text!r}") from None


def _input_arg(text):
    import argparse
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE, not {text!r}")
    return name, path


def _config(args):
    import dataclasses
    if args.mem_kib is None:
        return args.preset
    return dataclasses.replace(args.preset, mem_kib=args.mem_kib)


def _compile(path, args, shapes, say):
    from npu_compiler.compile import compile_model
    from npu_compiler.graph import CompileError
    from npu_runtime.runtime import session
    say(f"compiling {path} for {args.preset.name} ({args.format})")
    try:
        return compile_model(path, _config(args), fmt=args.format, shapes=shapes,
                             fallback=args.fallback, calibration=args.calibration,
                             evaluator=session, schedule=args.schedule,
                             palette=args.palette, prune=args.prune)
    except CompileError as e:
        raise CLIError(str(e), status=2) from None


def _plan_lines(plan):
    lines = []
    for i, r in enumerate(plan):
        ins = " ".join("x".join(map(str, s)) for s in r["in"]) or "-"
        outs = " ".join("x".join(map(str, s)) for s in r["out"]) or "-"
        kern = (f" kernels {r['kernel_encoding']} {r.get('kernel_raw_bytes', 0)} -> "
                f"{r['kernel_bytes']} B" if r["kernel_bytes"] else "")
        buf = f"  buffer {r['buffer_peak']}" if r.get("buffer_peak") is not None else ""
        how = f"  [{r['how']}]" if r.get("how") else ""
        lines.append(f"{i:3d} {r['op']:<18} {ins} -> {outs}  {r['engine']:<3} "
                     f"tasks {r['tasks']}{kern}{buf}{how}  ({r['node']})")
    return lines


def cmd_compile(args):
    say = progress(False)
    compiled = _compile(args.model, args, dict(args.shape or []), say)
    for line in _plan_lines(compiled.plan):
        print(line)
    raw = sum(r.get("kernel_raw_bytes", 0) for r in compiled.plan)
    packed = sum(r["kernel_bytes"] for r in compiled.plan)
    if raw:
        print(f"kernels: {raw} bytes raw -> {packed} bytes ({packed / raw:.1%})")
    prog = compiled.program
    meta = prog.metadata.get("compiler", {})
    if "buffer_peak" in meta:
        from npu_spec.dataproc import buffer_elements
        print(f"buffer peak {meta['buffer_peak']} of {buffer_elements(prog.config)} elements "
              f"(schedule {meta['schedule']})")
    print(f"{len(compiled.plan)} layers, {prog.queues[0].tasks} tasks, "
          f"{len(prog.memory)} bytes of system memory, compiled in {compiled.seconds:.2f} s")
    if args.output:
        prog.save(args.output)
        say(f"wrote {args.output}")
    return 0


def _load_program(args, inputs, say):
    """``(program, model path or None, plan)``."""
    from npu_spec.program import ProgramError, load
    path = args.model
    if path.endswith(".onnx") or not _is_zip(path):
        shapes = dict(args.shape or [])
        for name, arr in inputs.items():
            shapes.setdefault(name, arr.shape)
        compiled = _compile(path, args, shapes, say)
        return compiled.program, path, compiled.plan
    try:
        prog = load(path)
    except ProgramError as e:
        raise CLIError(str(e), status=2) from None
    return prog, None, prog.metadata.get("compiler", {}).get("plan", [])


def _is_zip(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError as e:
        raise CLIError(f"cannot read {path}: {e.strerror}", status=2) from None


def cmd_run(args):
    import numpy as np

    from npu_compiler.graph import CompileError
    from npu_runtime.runtime import compare, read_input_file, reference, run

    say = progress(args.json)
    try:
        inputs = {name: read_input_file(path, name) for name, path in (args.input or [])}
    except CompileError as e:
        raise CLIError(str(e), status=2) from None
    backends = [b.strip() for b in args.backend.split(",")]
    for b in backends:
        if b not in ("golden", "rtl", "board"):
            raise CLIError(f"npu run: unknown backend {b!r} (golden, rtl, board)", status=2)
    if "board" in backends and not args.device:
        raise CLIError("npu run: --backend board needs --device (e.g. /dev/ttyUSB1)", status=2)
    prog, model, plan = _load_program(args, inputs, say)
    if args.check and model is None:
        raise CLIError("npu run: --check needs the ONNX model, not a program file", status=2)
    results = {}
    board = _open_board(args) if "board" in backends else None
    try:
        for b in backends:
            say(f"running on {b}")
            results[b] = _run_backend(run, prog, inputs, b, say, board, args)
    finally:
        if board is not None:
            board.close()
    main = results[backends[-1]]
    summary = {"backend": backends[-1], "outputs": {n: {"shape": list(v.shape)}
                                                    for n, v in main.outputs.items()},
               "cycles": main.cycles, "layers": _layers(plan, main, prog.config.macs)}
    total = sum(r.get("macs") or 0 for r in plan)
    if main.cycles and total:
        summary["mac_utilization"] = round(total / (main.cycles * prog.config.macs), 4)
    if main.trace_overflow:
        summary["trace_overflow"] = True
    status = 0
    if len(backends) > 1:
        same = all(np.array_equal(results[backends[0]].outputs[n].view(np.uint32),
                                  r.outputs[n].view(np.uint32))
                   for r in results.values() for n in r.outputs)
        summary["bit_exact"] = bool(same)
        # The final system memory too, over the extent every backend read back.
        n = min(len(r.memory) for r in results.values())
        first = results[backends[0]].memory[:n]
        summary["memory_bit_exact"] = all(r.memory[:n] == first for r in results.values())
        summary["memory_bytes_compared"] = n
        if not (same and summary["memory_bit_exact"]):
            status = 1
    if args.check:
        try:
            ref = reference(model, inputs)
        except Exception as e:
            raise CLIError(f"npu run: onnxruntime failed: {str(e).splitlines()[0]}") from None
        for name, m in compare(main.outputs, ref).items():
            summary["outputs"][name].update(m)
        worst = max((o.get("rel_err", 0.0) for o in summary["outputs"].values()), default=0)
        # int8, mixed and lossy compression: the errors are quantization's
        if worst > CHECK_TOL and args.format == "fp16" and not (args.palette or args.prune):
            from npu_runtime.runtime import first_departure
            say("an output departs from onnxruntime: looking for the first layer")
            found = first_departure(model, _config(args), inputs, rel_tol=CHECK_TOL,
                                    shapes=dict(args.shape or []) or None)
            if found:
                summary["first_departure"] = dict(zip(("node", "op", "tensor", "rel_err"),
                                                      found))
    if args.output:
        np.savez(args.output, **main.outputs)
        say(f"wrote {args.output}")
    if args.json:
        print(json.dumps(summary))
    else:
        for name, o in summary["outputs"].items():
            extra = "".join(f" {k} {o[k]:.4g}" for k in ("max_abs_err", "rel_err", "cosine")
                            if k in o)
            print(f"{name}: shape {'x'.join(map(str, o['shape']))}{extra}")
        if main.cycles is not None:
            _print_layers(summary["layers"])
            util = summary.get("mac_utilization")
            print(f"cycles: {main.cycles}" + ("" if util is None else
                                               f", MAC utilization {util:.2%}"))
        if main.trace_overflow:
            print("trace: the NPU's trace buffer overflowed; per-layer cycles are incomplete")
        if "first_departure" in summary:
            d = summary["first_departure"]
            print(f"first departure from onnxruntime: node {d['node']} ({d['op']}), tensor "
                  f"{d['tensor']}, rel_err {d['rel_err']:.4g}")
        if "bit_exact" in summary:
            print(f"{' and '.join(backends)} agree bit for bit: "
                  f"{'yes' if summary['bit_exact'] else 'NO'} (outputs), "
                  f"{'yes' if summary['memory_bit_exact'] else 'NO'} (memory, "
                  f"{summary['memory_bytes_compared']:,} bytes)")
    return status


def _open_board(args):
    """The :class:`BridgeClient` of ``--device`` (one-line errors: 2 for a device that does
    not exist, 1 when it cannot be opened)."""
    import os

    from npu_sim.uart_host import BridgeClient, BridgeError
    if not os.path.exists(args.device):
        raise CLIError(f"npu run: no such device {args.device} (is the board plugged in? "
                       f"ls /dev/ttyUSB*)", status=2)
    try:
        return BridgeClient.open(args.device, args.baud, timeout=2.0)
    except BridgeError as e:
        raise CLIError(f"npu run: {e}") from None


def _run_backend(run, prog, inputs, backend, say, board, args):
    """One backend's run; errors as one line (2: bad input or a board built for another
    configuration; 1: the run failed, timed out or the bridge misbehaved)."""
    from npu_compiler.graph import CompileError
    from npu_sim.board_host import BoardConfigError
    from npu_sim.uart_host import BridgeError
    try:
        return run(prog, inputs, backend, progress=say, board=board,
                   board_timeout=args.timeout)
    except (CompileError, BoardConfigError) as e:
        raise CLIError(f"npu run: {e}", status=2) from None
    except (RuntimeError, BridgeError) as e:
        raise CLIError(f"npu run: {e}", status=1) from None


def _layers(plan, result, macs):
    """Per layer: op, engine, cycles (from the RTL trace: first start to last end of its
    tasks) and MAC utilization when known."""
    by_task = {t[0]: t for t in result.tasks}
    layers = []
    for r in plan:
        row = {"op": r["op"], "node": r["node"], "engine": r["engine"], "cycles": None,
               "utilization": None}
        ts = [by_task[i] for i in range(r["first_task"], r["last_task"] + 1) if i in by_task]
        if ts:
            row["cycles"] = max(t[3] for t in ts) - min(t[2] for t in ts)
            ne = sum(t[3] - t[2] for t in ts if t[1] == "NEURAL")
            if ne and r.get("macs"):
                row["utilization"] = round(r["macs"] / (ne * macs), 4)
        layers.append(row)
    return layers


def _print_layers(layers):
    """The per-layer table of a run with a trace."""
    print(f"{'layer':>5}  {'op':<20} {'engine':<7} {'cycles':>10} {'MAC util':>8}")
    for k, row in enumerate(layers):
        cycles = "-" if row["cycles"] is None else f"{row['cycles']:,}"
        util = "" if row["utilization"] is None else f"{row['utilization']:.1%}"
        print(f"{k:>5}  {row['op']:<20} {row['engine']:<7} {cycles:>10} {util:>8}")


def _timeout_arg(text):
    import argparse
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, not {text!r}")
    return value


def _compile_options(p, *, for_onnx=""):
    """The options of compiling a model, shared by ``npu compile`` and ``npu run``
    (``for_onnx``: a note that they apply only when the model is an ONNX file)."""
    from npu_compiler.compile import FORMATS
    from npu_spec.config import PRESETS
    p.add_argument("--preset", type=preset_arg, default="small",
                   help=f"one of {', '.join(PRESETS)} (default small{for_onnx})")
    p.add_argument("--format", default="fp16", choices=FORMATS,
                   help=f"number format: fp16, int8 (needs --calibration unless the model is "
                        f"quantized: QDQ, QLinearConv...) or mixed (binary16 activations, int8 "
                        f"weights){for_onnx}; default fp16")
    p.add_argument("--calibration", metavar="FILE.npz|DIR",
                   help="int8: sample inputs for the activation ranges (.npz with a key per "
                        "input, or a directory of .npy/.npz/.pb files)")
    p.add_argument("--palette", type=int, metavar="BITS",
                   help="lossy: palettize each layer's weights to 2^BITS levels (k-means; BITS "
                        "1, 2, 4, 6 or 8)")
    p.add_argument("--prune", type=float, metavar="FRACTION",
                   help="lossy: set that fraction of each layer's weights, the smallest in "
                        "magnitude, to zero")
    p.add_argument("--fallback", choices=("host",),
                   help="run the operators the NPU cannot run (and what follows them) on the "
                        "host after the program")
    p.add_argument("--mem-kib", type=positive, metavar="KIB",
                   help="system memory of the build (default: the preset's)")
    p.add_argument("--shape", type=_shape_arg, action="append",
                   help="NAME=1x3x48x192: the shape of an input with dynamic dimensions")
    from npu_compiler.depthfirst import SCHEDULES
    p.add_argument("--schedule", default=SCHEDULES[0], choices=SCHEDULES,
                   help="chains of layers that do not fit the buffer: depth-first bands "
                        "(default) or layer by layer (fp16; docs/scheduling.md)")


def add_commands(sub):
    from npu_spec.bridge import DEFAULT_BAUD

    c = sub.add_parser("compile", help="compile an ONNX model into a program file",
                       description="Compile an ONNX model; prints one line per layer.")
    c.add_argument("model", metavar="MODEL.onnx")
    _compile_options(c)
    c.add_argument("-o", "--output", metavar="PROG", help="write the program file")
    c.set_defaults(func=cmd_compile)

    r = sub.add_parser("run", help="run an ONNX model or a program on a backend",
                       description="Run a model (compiled first) or a program file.")
    r.add_argument("model", metavar="MODEL.onnx|PROG")
    _compile_options(r, for_onnx=", for .onnx")
    r.add_argument("--backend", default="golden",
                   help="golden, rtl, board, or a list such as golden,board (compared bit for "
                        "bit)")
    r.add_argument("--device", metavar="/dev/ttyUSBn",
                   help="board: the serial port of the board's UART bridge")
    r.add_argument("--baud", type=positive, default=DEFAULT_BAUD,
                   help=f"board: baud rate of the bridge (default {DEFAULT_BAUD})")
    r.add_argument("--timeout", type=_timeout_arg, default=60.0, metavar="SECONDS",
                   help="board: wait at most this long for the program to finish (default 60)")
    r.add_argument("--input", type=_input_arg, action="append",
                   help="NAME=FILE (.npy, .npz with key NAME, or TensorProto .pb)")
    r.add_argument("--output", metavar="OUT.npz", help="write every graph output")
    r.add_argument("--check", action="store_true",
                   help="compare with onnxruntime (max_abs_err, rel_err, cosine)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=cmd_run)
