"""``compile_model``: an ONNX model in, a :class:`Compiled` program out."""

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from npu_model.builder import BuildError

from .compress import Compression
from .cores import check_cores
from .frontend import load_graph
from .graph import CompileError
from .lower import lower

__all__ = ["FORMATS", "SCHEDULE_CHOICES", "SWITCH_POINTS", "Compiled", "choose_schedule",
           "compile_model", "io_metadata"]

#: Where ``--switch-points`` puts task-switch points (``compile_model``).
SWITCH_POINTS = ("safe", "layers", "none")

#: Values of ``--schedule``: ``auto`` compiles under both schedules of
#: :data:`npu_compiler.depthfirst.SCHEDULES` and keeps the program the timing model
#: (:mod:`npu_model.timing`) estimates faster (:func:`choose_schedule`); the others force one.
SCHEDULE_CHOICES = ("auto", "depth-first", "layer")

#: Formats of ``--format``: ``int8`` needs calibration inputs; ``mixed`` is binary16
#: activations with int8 weights (per-channel scales folded into the post-processor).
FORMATS = ("fp16", "int8", "mixed")


@dataclass
class Compiled:
    """A compiled model: the program (its metadata carries ``compiler``: format, inputs and
    outputs with ONNX names and shapes, the per-layer plan), the plan rows and the graph."""
    program: object
    plan: list
    graph: object
    seconds: float


def io_metadata(program):
    """``(inputs, outputs)``: the ``compiler`` metadata's lists (dicts with ``name``,
    ``tensor``, ``shape``, ``dtype``)."""
    meta = program.metadata.get("compiler")
    if not meta:
        raise CompileError("the program was not made by npu compile (no input/output "
                           "metadata)")
    return meta["inputs"], meta["outputs"]


def _plain(row):
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in row.items()}


def compile_model(source, config, *, fmt="fp16", shapes=None, name=None, batch_one="auto",
                  fallback=None, calibration=None, evaluator=None, schedule="depth-first",
                  palette=None, prune=None, raw_kernels=False, switch_points="safe",
                  cores=None, chain=True):
    """Compile an ONNX model (path, bytes or ``ModelProto``) for ``config``.

    ``shapes`` gives concrete shapes for inputs with dynamic dimensions; ``batch_one``
    (``"auto"``, True, False) compiles a leading batch dimension as 1 (the runtime runs the
    items one by one, :func:`npu_compiler.frontend.load_graph`). ``fallback="host"`` runs
    the operators the NPU cannot run, and what depends on them, on the host after the
    program (:mod:`npu_compiler.host`). Raises
    :class:`CompileError` (one line) for anything the compiler cannot take.

    A quantized model (``QuantizeLinear`` / ``DequantizeLinear``, ``QLinearConv``...,
    :mod:`npu_compiler.qdq`) compiles with ``fmt="int8"`` and its own scales, without
    ``calibration``. Otherwise ``fmt="int8"`` needs ``calibration``: an ``.npz`` file or a directory
    (:func:`npu_compiler.int8.calibration_samples`) or a dict ``{input name: [N, ...]
    array}``; ``evaluator`` runs the float model for it (:func:`npu_compiler.int8.calibrate`;
    ``npu_runtime.runtime.session`` uses onnxruntime); :mod:`npu_compiler.int8`.
    ``fmt="mixed"``: binary16 activations, int8 weights (:func:`npu_compiler.lower.
    mixed_weights`).

    Kernels get the smallest lossless encoding (``raw_kernels``: all raw); ``palette`` (index
    bits) and ``prune`` (a fraction) make the weights smaller first, lossily
    (:mod:`npu_compiler.compress`).

    ``schedule`` (``"depth-first"`` or ``"layer"``) is how chains of layers that do not fit
    the buffer run (:mod:`npu_compiler.depthfirst`; in int8, the layers of a network lowered
    with its activations in system memory, :mod:`npu_compiler.int8mem`); ``"auto"`` takes the
    one of the two with fewer estimated cycles (:func:`choose_schedule`).

    ``switch_points`` (one of :data:`SWITCH_POINTS`): ``"safe"`` (the default) marks every
    task boundary where no on-chip state is live as a point where a higher-priority network
    may preempt this one (:meth:`npu_model.builder.ProgramBuilder.place_switch_points`;
    ``docs/compiler.md``, "Task-switch flags"); ``"layers"`` also makes every int8 layer's end
    such a point by storing and reloading the activations that stay in the buffer;
    ``"none"`` places none. The program's ``metadata.compiler.switch_points`` lists them.

    ``cores``: how many of the configuration's neural-engine cores a layer's output channels
    are split over (None: all; :mod:`npu_compiler.cores`). ``chain``: runs of convs and
    planar layers (pool, ReLU, add), each read by the next alone, keep their intermediates
    in the buffer, the planar engine reading a conv's output while the neural engine writes
    it (:mod:`npu_compiler.chain`; binary16 activations).
    """
    if switch_points not in SWITCH_POINTS:
        raise CompileError(f"switch_points must be one of {', '.join(SWITCH_POINTS)}, not "
                           f"{switch_points!r}")
    if fmt not in FORMATS:
        raise CompileError(f"format {fmt!r} is not supported yet (supported: "
                           f"{', '.join(FORMATS)})")
    if schedule == "auto":
        return choose_schedule(source, config, fmt=fmt, shapes=shapes, name=name,
                               batch_one=batch_one, fallback=fallback,
                               calibration=calibration, evaluator=evaluator, palette=palette,
                               prune=prune, raw_kernels=raw_kernels,
                               switch_points=switch_points, cores=cores, chain=chain)
    if schedule not in SCHEDULE_CHOICES:
        raise CompileError(f"schedule must be one of {', '.join(SCHEDULE_CHOICES)}, not "
                           f"{schedule!r}")
    t0 = time.perf_counter()
    check_cores(config, cores)
    compression = Compression(palette=palette, prune=prune, raw=raw_kernels)
    if fallback not in (None, "host"):
        raise CompileError(f"fallback must be 'host' or none, not {fallback!r}")
    from .frontend import read_model
    from .qdq import FOREIGN_OPS, prepare, quantized_node
    model = read_model(source)
    quantized = quantized_node(model)
    if quantized and fmt != "int8":
        raise CompileError(f"node {quantized} makes this a quantized model: compile it with "
                           f"--format int8 (it runs with its own scales)")
    if quantized:
        if calibration is not None:
            raise CompileError(f"node {quantized}: the model is quantized and carries its own "
                               f"scales; --calibration is for float models")
        if fallback:
            raise CompileError("--fallback host is not supported with --format int8")
        graph = load_graph(prepare(model), shapes, batch_one, keep=("DequantizeLinear",),
                           foreign=FOREIGN_OPS)
        return _compile_qdq(graph, config, name, t0, switch_points, cores, schedule)
    graph = load_graph(source, shapes, batch_one)
    if fmt == "int8":
        return _compile_int8(source, graph, config, calibration, name, fallback, t0,
                             evaluator, compression, switch_points, cores, chain, schedule)
    if calibration is not None:
        raise CompileError("--calibration is for --format int8")
    graph_outputs = list(graph.outputs)
    host = None
    if fallback == "host":
        from .host import split_host
        from .ops import LOWER
        host = split_host(graph, set(LOWER))
    try:
        lw = lower(graph, config, name=name or graph.name, schedule=schedule, fmt=fmt,
                   compression=compression, cores=cores, chain=chain)
        points = lw.b.place_switch_points() if switch_points != "none" else []
        program = lw.b.build(name or graph.name or "")
    except BuildError as e:
        raise CompileError(str(e)) from None
    tensors = {t.name: t for t in program.tensors}

    def entry(name, role):
        tname = name if name in tensors and tensors[name].role == role else f"{name}:out"
        t = tensors[tname]
        return {"name": name, "tensor": tname, "shape": list(graph.shapes[name]),
                "dtype": np.dtype(graph.dtypes.get(name, np.float32)).name,
                "format": t.format, "addr": t.addr}

    meta = dict(program.metadata)
    meta["compiler"] = {
        "format": fmt,
        "batch": graph.batch,
        "inputs": [entry(n, "input") for n in graph.inputs],
        "outputs": [entry(n, "output") for n in graph.outputs],
        "plan": [_plain(r) for r in lw.plan],
        "graph_outputs": graph_outputs,
        "schedule": schedule,
        "buffer_peak": max((t.buffer for t in lw.b.tasks), default=0),
        "switch_points": points,
    }
    if host:
        meta["compiler"]["host"] = host
    program = dataclasses.replace(program, metadata=meta)
    plan = [_plain(r) for r in lw.plan]
    for node in (host or {}).get("nodes", []):
        op, _, name = node.partition(" (")
        plan.append({"node": name.rstrip(")"), "op": op, "engine": "host", "tasks": 0,
                     "in": [], "out": [], "kernel_bytes": 0, "kernel_raw_bytes": 0,
                     "kernel_encoding": "",
                     "first_task": 0, "last_task": -1})
    return Compiled(program, plan, graph, time.perf_counter() - t0)


def _has_bands(compiled):
    """Whether some layer of ``compiled`` runs in the bands of a depth-first segment (without
    one, the layer-by-layer schedule gives the same program)."""
    return any(", bands of " in (row.get("how") or "") for row in compiled.plan)


def choose_schedule(source, config, **options):
    """Compile ``source`` under the depth-first schedule and, when that made depth-first
    segments, under the layer-by-layer one too; keep the program with fewer cycles by the
    timing model (:func:`npu_model.timing.estimate`; a tie keeps depth first, the smaller
    buffer peak). When only one schedule compiles, that one. The program's ``compiler``
    metadata gets ``schedule`` (the one kept) and ``schedule_estimates`` (cycles by
    schedule). ``options``: those of :func:`compile_model`."""
    from npu_model.timing import estimate
    t0 = time.perf_counter()
    results, error = {}, None
    for schedule in ("depth-first", "layer"):
        try:
            results[schedule] = compile_model(source, config, schedule=schedule, **options)
        except CompileError as e:
            error = error or e
        if schedule in results and not _has_bands(results[schedule]):
            break
    if not results:
        raise error
    cycles = {s: estimate(c.program).cycles for s, c in results.items()} \
        if len(results) > 1 else {s: None for s in results}
    kept = min(results, key=lambda s: (cycles[s] or 0, s != "depth-first"))
    compiled = results[kept]
    meta = dict(compiled.program.metadata)
    meta["compiler"] = dict(meta["compiler"], schedule=kept, schedule_estimates=cycles)
    program = dataclasses.replace(compiled.program, metadata=meta)
    return dataclasses.replace(compiled, program=program, seconds=time.perf_counter() - t0)


def _compile_int8(source, graph, config, calibration, name, fallback, t0, evaluator,
                  compression, switch_points, cores=None, chain=True, schedule="depth-first"):
    from .frontend import read_model
    from .int8 import calibrate, calibration_samples, lower_int8
    if fallback:
        raise CompileError("--fallback host is not supported with --format int8")
    if calibration is None:
        raise CompileError("--format int8 needs --calibration FILE.npz|DIR (sample inputs "
                           "for the activation ranges)")
    if isinstance(calibration, dict):
        samples = {n: [np.asarray(calibration[n])] for n in graph.inputs if n in calibration}
        missing = [n for n in graph.inputs if n not in samples]
        if missing:
            raise CompileError(f"no calibration values for input {missing[0]!r}")
    else:
        samples = calibration_samples(calibration, graph.inputs)
    scales = calibrate(read_model(source), graph, samples, evaluator)
    b, plan, io = lower_int8(graph, config, scales, name=name or graph.name,
                             compression=compression, spill=switch_points == "layers",
                             cores=cores, chain=chain, schedule=schedule)

    def entry(n, t, scale):
        return {"name": n, "tensor": t.name, "shape": list(graph.shapes[n]),
                "dtype": "float32", "format": "int8", "addr": t.addr, "scale": float(scale)}

    return _int8_compiled(b, plan, io, graph, name, t0, entry, switch_points,
                          schedule=schedule)


def _int8_compiled(b, plan, io, graph, name, t0, entry, switch_points, **meta_extra):
    """The :class:`Compiled` of an int8 lowering: the program built from builder ``b``, with
    the input and output entries ``entry(name, tensor, io spec)`` (a graph input is the
    tensor of its name, an output the tensor ``name:q``) and the buffer peak (most buffer
    elements in use by a task) in its compiler metadata."""
    try:
        points = b.place_switch_points() if switch_points != "none" else []
        program = b.build(name or graph.name or "")
    except BuildError as e:
        raise CompileError(str(e)) from None
    tensors = {t.name: t for t in program.tensors}
    meta = dict(program.metadata)
    meta["compiler"] = {
        "format": "int8",
        "switch_points": points,
        **meta_extra,
        "buffer_peak": max((t.buffer for t in b.tasks), default=0),
        "batch": graph.batch,
        "inputs": [entry(n, tensors[n], io["inputs"][n]) for n in graph.inputs],
        "outputs": [entry(n, tensors[n + ":q"], io["outputs"][n]) for n in graph.outputs],
        "plan": [_plain(r) for r in plan],
        "graph_outputs": list(graph.outputs),
    }
    program = dataclasses.replace(program, metadata=meta)
    return Compiled(program, [_plain(r) for r in plan], graph, time.perf_counter() - t0)


def _compile_qdq(graph, config, name, t0, switch_points, cores=None, schedule="depth-first"):
    """A quantized model (:mod:`npu_compiler.qdq`): the model's scales and zero points."""
    from .qdq import lower_qdq
    b, plan, io = lower_qdq(graph, config, name=name or graph.name,
                            spill=switch_points == "layers", cores=cores, schedule=schedule)

    def entry(n, t, spec):
        return {"name": n, "tensor": t.name, "shape": list(graph.shapes[n]),
                "dtype": spec["dtype"], "format": "int8", "addr": t.addr,
                "scale": None if spec["scale"] is None else float(spec["scale"]),
                "zero_point": None if spec["zero_point"] is None else int(spec["zero_point"])}

    return _int8_compiled(b, plan, io, graph, name, t0, entry, switch_points,
                          quantized_model=True, schedule=schedule)
