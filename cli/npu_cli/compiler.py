"""``npu compile`` and ``npu run``: ONNX models on the NPU (``docs/compiler.md``).

``npu compile MODEL.onnx --preset P --format fp16|int8|mixed [--calibration FILE.npz|DIR]
[--palette BITS] [--prune FRACTION] -o PROG`` prints the plan, one line per layer (with each
layer's kernel encoding and bytes raw -> encoded) and the kernel total; ``npu run
MODEL.onnx|PROG --backend golden|rtl|board|golden,rtl --input NAME=FILE --output OUT.npz
[--check] [--json] [--timeline FILE.png]`` runs it (``board``: ``--device /dev/ttyUSBn [--baud B]
[--timeout S]``, ``docs/boards.md``). ``npu run A B ... --priority 0,1 --after 0,5`` runs
several programs on one NPU, each on its own queue (``docs/compiler.md``, "Several programs").
"""

import json
from functools import partial

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
                             palette=args.palette, prune=args.prune,
                             switch_points=args.switch_points, cores=args.cores,
                             chain=not args.no_chain)
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
        hows = [r["how"]] if r.get("how") else []
        if r.get("cores", 1) > 1:
            hows.append(f"{r['cores']} cores")
        how = f"  [{'; '.join(hows)}]" if hows else ""
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
    if len(meta.get("schedule_estimates") or {}) > 1:
        print("schedule chosen by estimated cycles: " + ", ".join(
            f"{s} {c:,}" for s, c in meta["schedule_estimates"].items()) +
            f"; kept {meta['schedule']}")
    if meta.get("switch_points"):
        print(f"switch points: {len(meta['switch_points'])} (after tasks "
              f"{_short_list(meta['switch_points'])})")
    elif "switch_points" in meta:
        print("switch points: none")
    print(f"{len(compiled.plan)} layers, {prog.queues[0].tasks} tasks, "
          f"{len(prog.memory)} bytes of system memory, compiled in {compiled.seconds:.2f} s")
    if args.output:
        prog.save(args.output)
        say(f"wrote {args.output}")
    return 0


def _short_list(items, n=12):
    text = ", ".join(str(i) for i in items[:n])
    return text + (f", ... ({len(items)} in all)" if len(items) > n else "")


def _load_program(args, inputs, say, path=None):
    """``(program, model path or None, plan)``."""
    from npu_spec.program import ProgramError, load
    path = path or args.model
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
    if args.more:
        return _run_several(args, say)
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
            results[b] = _run_backend(partial(run, prog, inputs, b), say, board, args)
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
    _add_estimate(summary, prog, plan, total)
    if main.trace_overflow:
        summary["trace_overflow"] = True
    if main.counters:
        summary["counters"] = main.counters
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
    if args.timeline:
        _timeline(args.timeline, main, prog.queues[0].tasks, say)
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
        else:
            util = summary.get("mac_utilization_estimate")
            print(f"cycles (timing model estimate): {summary['cycles_estimate']}"
                  + ("" if util is None else f", MAC utilization {util:.2%}"))
        if main.trace_overflow:
            print("trace: the NPU's trace buffer overflowed; per-layer cycles are incomplete")
        _print_counters(main.counters)
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


def _timeline(path, result, total, say, title=""):
    """Draw ``result``'s engine activity (``--timeline``): from the trace's cycles on the
    RTL and the board, from the task order on the golden backend."""
    from npu_runtime.timeline import draw, intervals, order_intervals
    if result.tasks:
        lanes, unit = intervals(result.tasks), "cycles"
    else:
        lanes, unit = order_intervals(result.order), "order"
    shown = sum(len(lanes[e]) for e in ("NE", "PE", "DMA"))
    try:
        draw(lanes, path, title=title or f"{result.backend}: {shown} of {total} tasks", unit=unit)
    except ImportError:
        raise CLIError("npu run: --timeline needs matplotlib (pip install -e '.[plot]')",
                       status=2) from None
    except OSError as e:
        raise CLIError(f"npu run: cannot write {path}: {e.strerror}", status=2) from None
    if shown < total:
        say(f"the timeline shows the first {shown} of {total} tasks (the RTL's trace buffer "
            f"keeps the first 64 entries, two a task)")
    say(f"wrote {path}")


def _int_list(text, n, option, low, high, default):
    """``--priority`` / ``--after``: ``n`` integers from ``low`` to ``high``, one per
    program."""
    if text is None:
        return [default] * n
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) != n or not all(low <= v <= high for v in values):
        raise CLIError(f"npu run: {option} takes {n} comma-separated integers from {low} to "
                       f"{high} (one per program), not {text!r}", status=2)
    return values


def _split_inputs(args, n):
    """``--input [K:]NAME=FILE`` of a run of ``n`` programs: ``[(program index or None,
    name, path)]`` (no ``K:``: every program with an input NAME)."""
    out = []
    for name, path in args.input or []:
        k, sep, rest = name.partition(":")
        if sep and k.isdigit():
            if int(k) >= n:
                raise CLIError(f"npu run: --input {name}=...: there are {n} programs "
                               f"(0 to {n - 1})", status=2)
            out.append((int(k), rest, path))
        else:
            out.append((None, name, path))
    return out


def _run_several(args, say):
    """``npu run A B ...``: the programs on one NPU, program ``k`` on queue ``k``."""
    import numpy as np

    from npu_compiler.compile import io_metadata
    from npu_compiler.graph import CompileError
    from npu_runtime.runtime import Job, read_input_file, run_jobs

    paths = [args.model] + list(args.more)
    n = len(paths)
    backends = [b.strip() for b in args.backend.split(",")]
    for b in backends:
        if b not in ("golden", "rtl", "board"):
            raise CLIError(f"npu run: unknown backend {b!r} (golden, rtl, board)", status=2)
    if "board" in backends and not args.device:
        raise CLIError("npu run: --backend board needs --device (e.g. /dev/ttyUSB1)", status=2)
    if args.check:
        raise CLIError("npu run: --check takes one model; run the models one at a time",
                       status=2)
    prios = _int_list(args.priority, n, "--priority", 0, 15, 0)
    afters = _int_list(args.after, n, "--after", 0, 1 << 20, 0)
    given = _split_inputs(args, n)
    jobs = []
    try:
        files = {(k, name): read_input_file(path, name) for k, name, path in given}
        for k, path in enumerate(paths):
            mine = {name: x for (j, name), x in files.items() if j in (None, k)}
            prog, _, _ = _load_program(args, mine, say, path=path)
            names = {spec["name"] for spec in io_metadata(prog)[0]}
            jobs.append(Job(prog, {m: x for m, x in mine.items() if m in names}, prios[k],
                            afters[k]))
    except CompileError as e:
        raise CLIError(f"npu run: {e}", status=2) from None
    results = {}
    board = _open_board(args) if "board" in backends else None
    try:
        for b in backends:
            say(f"running {n} programs on {b}")
            results[b] = _run_backend(partial(run_jobs, jobs, b), say, board, args)
    finally:
        if board is not None:
            board.close()
    main = results[backends[-1]]
    summary = {"backend": backends[-1], "cycles": main.cycles,
               "switches": [{"from_queue": a, "after_task": t, "to_queue": c}
                            for a, t, c in main.switches],
               "programs": [{"model": path, "queue": k, "priority": prios[k],
                             "after": afters[k], "tasks": jobs[k].program.queues[0].tasks,
                             "outputs": {name: {"shape": list(v.shape)} for name, v
                                         in main.results[k].outputs.items()}}
                            for k, path in enumerate(paths)]}
    if main.counters:
        summary["counters"] = main.counters
    if main.trace_overflow:
        summary["trace_overflow"] = True
    status = 0
    if len(backends) > 1:
        first = results[backends[0]]
        same = all(np.array_equal(first.results[k].outputs[name].view(np.uint32),
                                  r.results[k].outputs[name].view(np.uint32))
                   for r in results.values() for k in range(n)
                   for name in r.results[k].outputs)
        summary["bit_exact"] = bool(same)
        status = 0 if same else 1
    if args.output:
        np.savez(args.output, **{f"{k}/{name}": v for k, r in enumerate(main.results)
                                 for name, v in r.outputs.items()})
        say(f"wrote {args.output}")
    if args.timeline:
        _timeline(args.timeline, main, sum(j.program.queues[0].tasks for j in jobs), say)
    if args.json:
        print(json.dumps(summary))
        return status
    for p in summary["programs"]:
        print(f"program {p['queue']} ({p['model']}): queue {p['queue']}, priority "
              f"{p['priority']}, pushed after {p['after']} tasks, {p['tasks']} tasks")
        for name, o in p["outputs"].items():
            print(f"  {name}: shape {'x'.join(map(str, o['shape']))}")
    for s in summary["switches"]:
        print(f"switch: queue {s['from_queue']} -> queue {s['to_queue']} after its task "
              f"{s['after_task']}")
    if not summary["switches"]:
        print("switches: none")
    if main.cycles is not None:
        print(f"cycles: {main.cycles}")
    _print_counters(main.counters)
    if main.trace_overflow:
        print("trace: the NPU's trace buffer overflowed; tasks and switches are incomplete")
    if "bit_exact" in summary:
        print(f"{' and '.join(backends)} agree bit for bit: "
              f"{'yes' if summary['bit_exact'] else 'NO'}")
    return status


def _print_counters(counters):
    """The performance counters of an RTL or board run, one line."""
    if counters:
        print("counters: " + ", ".join(f"{name} {value:,}" for name, value in counters.items()))


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


def _run_backend(run, say, board, args):
    """One backend's run, ``run(progress=..., board=..., board_timeout=...)`` (a
    ``functools.partial`` of ``npu_runtime.runtime.run`` or ``run_jobs``); errors as one line
    (2: bad input or a board built for another configuration; 1: the run failed, timed out or
    the bridge misbehaved)."""
    from npu_compiler.graph import CompileError
    from npu_sim.board_host import BoardConfigError
    from npu_sim.uart_host import BridgeError
    try:
        return run(progress=say, board=board, board_timeout=args.timeout)
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


def _add_estimate(summary, prog, plan, total):
    """The timing model's figures (``npu_model.timing``): ``cycles_estimate``,
    ``mac_utilization_estimate`` (the plan's MACs over the estimated cycles times every
    core's MACs) and per layer ``cycles_estimate`` and ``utilization_estimate`` (over every
    core's MACs too)."""
    from npu_model.timing import estimate
    est = estimate(prog)
    summary["cycles_estimate"] = est.cycles
    if total:
        summary["mac_utilization_estimate"] = round(
            total / (est.cycles * prog.config.macs * prog.config.cores), 4)
    rows = _layers(plan, _Trace(est.trace()), prog.config.macs * prog.config.cores)
    for layer, row in zip(summary["layers"], rows):
        layer["cycles_estimate"] = row["cycles"]
        layer["utilization_estimate"] = row["utilization"]


class _Trace:
    """A task list in the form ``_layers`` reads (``tasks``: the RTL trace's tuples)."""

    def __init__(self, tasks):
        self.tasks = tasks


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
    p.add_argument("--cores", type=positive, metavar="N",
                   help="split each layer's output channels over N of the preset's neural "
                        "engine cores (default: all of them)")
    p.add_argument("--no-chain", action="store_true",
                   help="store every layer's output to memory instead of keeping runs of "
                        "conv, pool, ReLU and add layers in the buffer, each conv streaming "
                        "into the planar layer after it (fp16, mixed)")
    from npu_compiler.compile import SCHEDULE_CHOICES
    p.add_argument("--schedule", default=SCHEDULE_CHOICES[0], choices=SCHEDULE_CHOICES,
                   help="chains of layers that do not fit the buffer: auto (default: "
                        "depth-first bands or layer by layer, whichever the timing model "
                        "estimates faster), depth-first or layer (docs/scheduling.md)")
    from npu_compiler.compile import SWITCH_POINTS
    p.add_argument("--switch-points", default=SWITCH_POINTS[0], choices=SWITCH_POINTS,
                   help="where a more urgent program may preempt this one: after every task "
                        "with no on-chip state live across it (safe, default), also at every "
                        "int8 layer end by storing and reloading its activations (layers), or "
                        "nowhere (docs/compiler.md, task-switch flags)")


def add_commands(sub):
    from npu_spec.bridge import DEFAULT_BAUD

    c = sub.add_parser("compile", help="compile an ONNX model into a program file",
                       description="Compile an ONNX model; prints one line per layer.")
    c.add_argument("model", metavar="MODEL.onnx")
    _compile_options(c)
    c.add_argument("-o", "--output", metavar="PROG", help="write the program file")
    c.set_defaults(func=cmd_compile)

    r = sub.add_parser("run", help="run an ONNX model or a program on a backend",
                       description="Run a model (compiled first) or a program file. With "
                                   "several, they share one NPU: program K runs on task "
                                   "queue K with --priority's K-th value and is pushed once "
                                   "--after's K-th number of tasks have completed; a more "
                                   "urgent program preempts the running one at its next "
                                   "switch point, and the preempted one resumes after it. "
                                   "Example: npu run big.npu digits.npu --priority 0,1 "
                                   "--after 0,5 --input 0:x=x.npy --input 1:input=d.npy "
                                   "--backend golden,rtl --timeline run.png")
    r.add_argument("model", metavar="MODEL.onnx|PROG")
    r.add_argument("more", nargs="*", metavar="MORE.onnx|PROG",
                   help="more models or programs to run on the same NPU beside the first, "
                        "each on its own queue (golden, rtl and board backends)")
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
                   help="NAME=FILE (.npy, .npz with key NAME, or TensorProto .pb); with "
                        "several programs K:NAME=FILE gives program K's input (plain NAME: "
                        "every program with an input NAME)")
    r.add_argument("--output", metavar="OUT.npz",
                   help="write every graph output (several programs: under K/NAME)")
    r.add_argument("--priority", metavar="P0,P1,...",
                   help="several programs: each queue's priority, 0-15, higher runs first "
                        "(default all 0)")
    r.add_argument("--after", metavar="N0,N1,...",
                   help="several programs: push program K once N_K tasks have completed (0, "
                        "the default: at the start); a later program of higher priority "
                        "preempts the running one")
    r.add_argument("--timeline", metavar="FILE.png",
                   help="draw NE, PE and DMA activity and each queue's tasks over time (RTL: "
                        "cycles from the trace; golden: the task order); needs matplotlib")
    r.add_argument("--check", action="store_true",
                   help="compare with onnxruntime (max_abs_err, rel_err, cosine)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=cmd_run)
