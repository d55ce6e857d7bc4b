"""Running compiled programs: inputs in, outputs out, on the golden model or the RTL.

``run(program, inputs, backend)`` writes the inputs (float arrays, converted to binary16)
into the program's memory image, runs it and reads every output back in its ONNX shape as
float32. ``reference(model, inputs)`` runs onnxruntime on the same inputs; ``compare`` gives
the per-output errors. ``run_jobs([Job(program, inputs, priority, after), ...], backend)``
runs several programs on one NPU, each on its own queue, a later and more urgent one
preempting the running one at its switch points (``docs/compiler.md``, "Several programs").
"""

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from npu_compiler.compile import io_metadata
from npu_compiler.graph import CompileError
from npu_model.system import read_tensor, run_program, write_tensor
from npu_spec.engine import Engine
from npu_spec.taskman import COUNTERS

__all__ = ["BACKENDS", "Job", "JobsResult", "RunResult", "compare", "place", "read_input_file",
           "reference", "run", "run_jobs", "session"]

BACKENDS = ("golden", "rtl", "board")


@dataclass
class RunResult:
    """Outputs by ONNX name (float32 arrays), the raw memory, cycles (RTL only), the
    per-task trace ``[(task, engine, start cycle, end cycle, error, queue)]`` (RTL and board
    only; drained while the program runs, so it holds every task unless ``trace_overflow``:
    the NPU's trace buffer was full and dropped entries) and ``order``,
    ``[(queue, task, engine)]`` in the order the tasks started (both backends; on the RTL as
    far as the trace reaches). ``counters``: the task manager's performance counters by name
    (``npu_spec.taskman.COUNTERS``) at the end of the run (RTL and board; of the last item of a
    batch)."""
    outputs: dict
    memory: bytes
    backend: str
    cycles: int = None
    tasks: list = field(default_factory=list)
    order: list = field(default_factory=list)
    trace_overflow: bool = False
    counters: dict = field(default_factory=dict)


def _tensor(program, name):
    for t in program.tensors:
        if t.name == name:
            return t
    raise CompileError(f"the program has no tensor {name!r}")


def prepare(program, inputs):
    """The program with ``inputs`` (name -> array) written into its memory image."""
    ins, _ = io_metadata(program)
    mem = np.zeros(max(len(program.memory), 1), np.uint8)
    mem[:len(program.memory)] = np.frombuffer(program.memory, np.uint8)
    end = len(program.memory)
    for spec in ins:
        name = spec["name"]
        if name not in inputs:
            raise CompileError(f"no value for input {name!r} (shape "
                               f"{'x'.join(map(str, spec['shape']))})")
        x = np.asarray(inputs[name])
        if x.dtype.kind not in "fiu":
            raise CompileError(f"input {name!r} has dtype {x.dtype}; a number array is needed")
        if x.dtype.kind != np.dtype(spec["dtype"]).kind:
            raise CompileError(f"input {name!r} has dtype {x.dtype}; the model takes "
                               f"{spec['dtype']}")
        if tuple(x.shape) != tuple(spec["shape"]):
            raise CompileError(f"input {name!r} has shape {'x'.join(map(str, x.shape))}; the "
                               f"program takes {'x'.join(map(str, spec['shape']))}")
        t = _tensor(program, spec["tensor"])
        lo, hi = t.extent
        if hi > len(mem):
            mem = np.concatenate([mem, np.zeros(hi - len(mem), np.uint8)])
        end = max(end, hi)
        if spec.get("format") == "int8":
            codes = _int8_codes(x, spec)
        else:
            codes = x.astype(np.float32).astype(np.float16).view(np.uint16)
        write_tensor(mem, t, codes.reshape(t.shape))
    return dataclasses.replace(program, memory=mem[:end].tobytes())


def _int8_codes(x, spec):
    """The int8 codes of input ``x``: a float input quantized with the input's scale and
    zero point (round half to even, saturating, as ``QuantizeLinear``); an int8 input as it
    is, a uint8 input less 128 (the buffer's int8 domain, ``docs/quantization.md``)."""
    from npu_compiler.quant import quantize
    if spec.get("dtype") == "uint8":
        return (x.astype(np.int16) - 128).astype(np.int8)
    if spec.get("dtype") == "int8":
        return x.astype(np.int8)
    return quantize(x.astype(np.float32), spec["scale"], spec.get("zero_point") or 0)


def _from_int8(codes, spec):
    """An output's value from its int8 codes: dequantized ``(q - zero point) * scale`` in
    float32 for a float output, the codes (plus 128 for uint8) for an integer output."""
    if spec.get("dtype") == "uint8":
        return (codes.astype(np.int16) + 128).astype(np.uint8)
    if spec.get("dtype") == "int8":
        return codes.copy()
    zp = np.float32(spec.get("zero_point") or 0)
    return (codes.astype(np.float32) - zp) * np.float32(spec["scale"])


def _outputs(program, memory):
    """The graph outputs: read from the NPU's memory, then (``--fallback host``) the host
    part's."""
    _, outs = io_metadata(program)
    result = {}
    for spec in outs:
        t = _tensor(program, spec["tensor"])
        codes = read_tensor(memory, t)
        if spec.get("format") == "int8":
            value = _from_int8(codes.view(np.int8), spec)
        else:
            value = codes.view(np.float16).astype(np.float32)
        result[spec["name"]] = value.reshape(spec["shape"])
    meta = program.metadata["compiler"]
    if meta.get("host"):
        from npu_compiler.host import run_host
        result.update(run_host(meta["host"], result))
    names = meta.get("graph_outputs", list(result))
    return {name: result[name] for name in names}


def _batch(program, inputs):
    """The batch of ``inputs`` when they hold several items of a program compiled for one
    (every input of rank 2 or more with the same leading size), else 1."""
    ins, _ = io_metadata(program)
    sizes = set()
    for spec in ins:
        x = inputs.get(spec["name"])
        if x is not None and np.ndim(x) >= 2 and len(spec["shape"]) >= 2 \
                and spec["shape"][0] == 1 and tuple(np.shape(x)[1:]) == tuple(spec["shape"][1:]):
            sizes.add(np.shape(x)[0])
    return sizes.pop() if len(sizes) == 1 else 1


def run(program, inputs, backend="golden", *, latency=4, progress=None, board=None,
        board_timeout=60.0):
    """Run ``program`` with ``inputs`` on ``backend``; a :class:`RunResult`. A batch of
    several items (the program compiled for one) runs item by item; outputs, cycles and
    tasks are joined. An engine error or a retired queue is a ``RuntimeError``.

    ``backend="board"`` runs on a board through ``board``, a
    :class:`npu_sim.uart_host.BridgeClient` (:func:`npu_sim.board_host.run_on_board`, which
    waits at most ``board_timeout`` seconds for the NPU to finish)."""
    n = _batch(program, inputs)
    extra = {"board": board, "board_timeout": board_timeout}
    if n > 1:
        parts = [_run_one(program, {k: (np.asarray(v)[i:i + 1] if np.ndim(v) >= 2 else v)
                                    for k, v in inputs.items()}, backend, latency, progress,
                          **extra)
                 for i in range(n)]
        outs = {k: np.concatenate([p.outputs[k] for p in parts]) for k in parts[0].outputs}
        cycles = None if parts[0].cycles is None else sum(p.cycles for p in parts)
        return RunResult(outs, parts[-1].memory, backend, cycles, parts[0].tasks,
                         parts[0].order,
                         trace_overflow=any(p.trace_overflow for p in parts),
                         counters=parts[-1].counters)
    return _run_one(program, inputs, backend, latency, progress, **extra)


def _trace_tasks(trace):
    """``[(task, engine name, start, end, error, queue)]`` from trace entries ``(task_id,
    engine, end, error, queue, cycle)``; a task that ended with an error is a
    ``RuntimeError``."""
    starts = {}
    tasks = []
    for task_id, engine, end, error, queue, cycle in trace:
        if not end:
            starts[(queue, task_id, engine)] = cycle
        else:
            tasks.append((task_id, Engine(engine).name,
                          starts.get((queue, task_id, engine), cycle), cycle, error, queue))
            if error:
                raise RuntimeError(f"task {task_id} on {Engine(engine).name} ended with "
                                   f"error {error}")
    return tasks


def _run_one(program, inputs, backend, latency, progress, board=None, board_timeout=60.0):
    prog = prepare(program, inputs)
    if backend == "golden":
        res = run_program(prog)
        _raise_retired(res.queues)
        return RunResult(_outputs(prog, res.memory), res.memory, backend,
                         order=_golden_order(res))
    if backend == "rtl":
        from npu_fpga.toolenv import apply_tool_env
        from npu_sim.system import rtl_run
        apply_tool_env()
        res = rtl_run(prog, backend="verilator", latency=latency, progress=progress,
                      dump_bytes=prog.config.mem_kib * 1024)
        tasks = _trace_tasks(res["trace"])
        return RunResult(_outputs(prog, res["memory"]), res["memory"], backend,
                         res["cycles"], tasks, _trace_order(res["trace"]),
                         trace_overflow=res["trace_overflow"], counters=_counters(res))
    if backend == "board":
        if board is None:
            raise CompileError("the board backend needs a device (--device /dev/ttyUSBn)")
        res = _board_run(board, prog, board_timeout, progress)
        tasks = _trace_tasks(res["trace"])
        return RunResult(_outputs(prog, res["memory"]), res["memory"], backend,
                         res["cycles"], tasks, _trace_order(res["trace"]),
                         trace_overflow=res["trace_overflow"], counters=_counters(res))
    raise CompileError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")


#: Byte alignment of programs placed one after another in system memory (``place``).
PLACE_ALIGN = 256


@dataclass
class Job:
    """A program to run beside others (:func:`run_jobs`): its inputs (name -> array, one
    item), its queue's priority (0-15, higher runs first) and when the host pushes it:
    ``after`` tasks (of all programs) have completed (0: at the start)."""
    program: object
    inputs: dict
    priority: int = 0
    after: int = 0


@dataclass
class JobsResult:
    """What :func:`run_jobs` leaves: one :class:`RunResult` per job (its outputs; its own
    tasks in ``tasks``), the whole run's ``cycles`` (RTL), ``tasks`` (the trace of every
    queue, entries as in :class:`RunResult`, RTL), ``order`` (``[(queue, task, engine
    name)]`` in the order tasks started) and ``switches`` (``[(queue left, after its task,
    queue taken)]``), ``counters`` (the performance counters at the end, RTL and board) and
    ``trace_overflow``. Job ``k`` ran on queue ``k``."""
    results: list
    backend: str
    cycles: int = None
    tasks: list = field(default_factory=list)
    order: list = field(default_factory=list)
    switches: list = field(default_factory=list)
    counters: dict = field(default_factory=dict)
    trace_overflow: bool = False


def place(programs, align=PLACE_ALIGN):
    """Byte addresses that put ``programs`` one after another in system memory, each at a
    multiple of ``align``; a :class:`CompileError` naming every program's size when they do
    not fit the memory together."""
    bases, end = [], 0
    for p in programs:
        base = -(-end // align) * align
        bases.append(base)
        end = base + len(p.memory)
    size = programs[0].memory_bytes
    if end > size:
        sizes = ", ".join(f"program {k}: {len(p.memory)}" for k, p in enumerate(programs))
        raise CompileError(f"the programs need {end} bytes of system memory together "
                           f"({sizes} bytes, each from a multiple of {align}); the NPU has "
                           f"{size} (mem_kib {programs[0].config.mem_kib}; compile with a "
                           f"larger --mem-kib)")
    return bases


def _check_jobs(jobs):
    from npu_spec.program import check_config
    if not jobs:
        raise CompileError("run_jobs needs at least one job")
    config = jobs[0].program.config
    if len(jobs) > config.task_queues:
        raise CompileError(f"{len(jobs)} programs but the NPU has {config.task_queues} task "
                           f"queues")
    for k, job in enumerate(jobs):
        if len(job.program.queues) != 1:
            raise CompileError(f"program {k} uses {len(job.program.queues)} queues; each "
                               f"program of a shared run must use one")
        if not 0 <= job.priority <= 15:
            raise CompileError(f"program {k}: priority {job.priority} is outside 0-15")
        if job.after < 0:
            raise CompileError(f"program {k}: 'after' must be 0 or more tasks, not "
                               f"{job.after}")
        try:
            check_config(job.program, config)
        except ValueError as e:
            raise CompileError(f"program {k} was built for another configuration than "
                               f"program 0: {e}") from None
        if _batch(job.program, job.inputs) != 1:
            raise CompileError(f"program {k}: several programs run one item each; give "
                               f"inputs of batch 1")
    for k, job in enumerate(jobs):
        before = sum(j.program.queues[0].tasks for j in jobs if j.after < job.after)
        if job.after > before:
            raise CompileError(f"program {k} is to be pushed after {job.after} tasks, but "
                               f"the programs there before it have {before}")


def combined(jobs):
    """``(program, parts)``: one program running every job's program (inputs written) on
    queue ``k`` with its priority, placed by :func:`place`; ``parts`` the relocated
    programs, whose tensors are where the combined run leaves them."""
    from npu_model.builder import BuildError, combine, relocate
    _check_jobs(jobs)
    prepared = [prepare(j.program, j.inputs) for j in jobs]
    bases = place(prepared)
    try:
        parts = [relocate(p, base, queue=k, priority=j.priority)
                 for k, (p, base, j) in enumerate(zip(prepared, bases, jobs))]
        return combine(parts), parts
    except BuildError as e:
        raise CompileError(str(e)) from None


def _board_run(board, program, timeout, progress, late=None):
    """:func:`npu_sim.board_host.run_on_board`'s result; an exception of the NPU (a retired
    queue) is a ``RuntimeError``."""
    from npu_sim.board_host import run_on_board
    from npu_spec.taskman import Cause, task_manager_map
    res = run_on_board(board, program, timeout=timeout, progress=progress, late=late)
    exc = task_manager_map(program.config.task_queues)["EXC_STATUS"].unpack(
        res["registers"]["EXC_STATUS"], strict=False)
    if exc["cause"] != Cause.NONE:
        raise RuntimeError(f"the program stopped on the board: queue {exc['queue']} retired "
                           f"({Cause(exc['cause']).name}, engine {exc['engine']}, code "
                           f"{exc['error_code']})")
    return res


def run_jobs(jobs, backend="golden", *, latency=4, progress=None, board=None,
             board_timeout=60.0):
    """Run several :class:`Job` on one NPU, program ``k`` on queue ``k``: the queue of
    highest priority with work runs, and a program pushed later (``after``) with a higher
    priority takes the NPU at the running program's next switch point (the compiler's
    task-switch flags); the preempted one resumes where it stopped. Returns a
    :class:`JobsResult`; an engine error or a retired queue is a ``RuntimeError``.

    ``backend="board"`` runs them on a board through ``board`` (a
    :class:`npu_sim.uart_host.BridgeClient`): the combined memory image loaded at once, the
    late programs pushed by the host once ``TASKS_RUN`` reaches their ``after``
    (:func:`npu_sim.board_host.run_on_board`, at most ``board_timeout`` seconds)."""
    program, parts = combined(jobs)
    late = {k: j.after for k, j in enumerate(jobs) if j.after}
    if backend == "golden":
        res = run_program(program, arrivals=late)
        _raise_retired(res.queues)
        memory, cycles, tasks = res.memory, None, []
        order = _golden_order(res)
        switches = list(res.switches)
        extra = {}
    elif backend in ("rtl", "board"):
        if backend == "rtl":
            from npu_fpga.toolenv import apply_tool_env
            from npu_sim.system import rtl_run
            apply_tool_env()
            res = rtl_run(program, backend="verilator", latency=latency, progress=progress,
                          dump_bytes=program.memory_bytes, late=late)
        elif board is None:
            raise CompileError("the board backend needs a device (--device /dev/ttyUSBn)")
        else:
            res = _board_run(board, program, board_timeout, progress, late)
        memory, cycles = res["memory"], res["cycles"]
        tasks = _trace_tasks(res["trace"])
        order = _trace_order(res["trace"])
        switches = _switches(res["trace"])
        extra = {"counters": _counters(res), "trace_overflow": res["trace_overflow"]}
    else:
        raise CompileError(f"several programs run on golden, rtl or board, not {backend!r}")
    results = [RunResult(_outputs(part, memory), memory, backend,
                         tasks=[t for t in tasks if t[5] == k],
                         order=[o for o in order if o[0] == k])
               for k, part in enumerate(parts)]
    return JobsResult(results, backend, cycles, tasks, order, switches, **extra)


def _counters(res):
    """The performance counters by name from an RTL or board run's ``registers``."""
    return {name: res["registers"][name] for name, _ in COUNTERS if name in res["registers"]}


def _golden_order(res):
    return [(t.queue, t.task_id, Engine(t.engine).name) for t in res.tasks]


def _trace_order(trace):
    return [(q, t, Engine(e).name) for t, e, end, _, q, _ in trace if not end]


def _raise_retired(queues):
    for q in queues:
        if q.retired:
            raise RuntimeError(f"the program stopped: queue {q.index} retired "
                               f"({q.cause.name}, engine {q.engine}, code {q.code})")


def _switches(trace):
    """``[(queue left, its last task started, queue taken)]`` from an RTL trace: the starts
    of a task of another queue than the previous start's where the queue left starts tasks
    again later (it was preempted; a queue that ends its list hands over without a
    switch)."""
    starts = [(queue, task_id) for task_id, _, end, _, queue, _ in trace if not end]
    out = []
    for k in range(1, len(starts)):
        (q0, t0), (q1, _) = starts[k - 1], starts[k]
        if q1 != q0 and any(q == q0 for q, _ in starts[k:]):
            out.append((q0, t0, q1))
    return out


def session(model):
    """``feeds -> {name: array}`` of every graph output of ``model`` (a ``ModelProto``) on
    onnxruntime: the evaluator ``npu_compiler.compile.compile_model`` calibrates int8 with."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
    except Exception as e:
        raise CompileError(f"onnxruntime cannot run the model for calibration: "
                           f"{str(e).splitlines()[0]}") from None
    names = [o.name for o in sess.get_outputs()]
    return lambda feeds: dict(zip(names, sess.run(None, feeds)))


def reference(model, inputs):
    """onnxruntime's outputs ``{name: array}`` for ``inputs`` (the model as given, or
    converted to a newer opset when onnxruntime refuses it)."""
    import onnx
    import onnxruntime as ort

    from npu_compiler.frontend import TARGET_OPSET, read_model
    m = read_model(model)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(m.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
    except Exception:
        from onnx import version_converter
        m = version_converter.convert_version(m, TARGET_OPSET)
        sess = ort.InferenceSession(m.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
    del onnx
    names = [o.name for o in sess.get_outputs()]
    types = {"tensor(uint8)": np.uint8, "tensor(int8)": np.int8}
    feeds = {i.name: np.asarray(inputs[i.name], types.get(i.type, np.float32))
             for i in sess.get_inputs()}
    ones = {i.name for i in sess.get_inputs() if len(i.shape) >= 2 and i.shape[0] == 1}
    sizes = {len(feeds[n]) for n in ones if feeds[n].ndim >= 2}
    if len(sizes) == 1 and sizes != {1} and len(ones) == len(feeds):
        # A batch for a model of batch 1: item by item, as the runtime runs it.
        parts = [sess.run(None, {n: x[i:i + 1] for n, x in feeds.items()})
                 for i in range(sizes.pop())]
        return {n: np.concatenate([p[k] for p in parts]) for k, n in enumerate(names)}
    return dict(zip(names, sess.run(None, feeds)))


def compare(outputs, ref):
    """Per output: ``max_abs_err``, ``rel_err`` (max |error| / max |reference|) and
    ``cosine`` similarity."""
    result = {}
    for name, y in outputs.items():
        r = np.asarray(ref[name], np.float64).reshape(-1)
        v = np.asarray(y, np.float64).reshape(-1)
        err = np.abs(v - r)
        scale = np.abs(r).max() if r.size else 0.0
        denom = np.linalg.norm(v) * np.linalg.norm(r)
        result[name] = {
            "max_abs_err": float(err.max()) if err.size else 0.0,
            "rel_err": float(err.max() / scale) if scale else float(err.max() if err.size
                                                                     else 0.0),
            "cosine": float(v @ r / denom) if denom else (1.0 if not err.any() else 0.0),
        }
    return result


def read_input_file(path, name):
    """An input array from ``.npy``, ``.npz`` (key ``name``, or its only array) or an ONNX
    ``TensorProto`` ``.pb`` file."""
    p = str(path)
    try:
        if p.endswith(".npz"):
            with np.load(p) as z:
                if name in z.files:
                    return z[name]
                if len(z.files) == 1:
                    return z[z.files[0]]
                raise CompileError(f"{p} has no array {name!r} (it has "
                                   f"{', '.join(z.files)})")
        if p.endswith(".pb"):
            import onnx
            from onnx import numpy_helper
            t = onnx.TensorProto()
            with open(p, "rb") as f:
                t.ParseFromString(f.read())
            return numpy_helper.to_array(t)
        return np.load(p, allow_pickle=False)
    except CompileError:
        raise
    except Exception as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CompileError(f"cannot read input file {p}: {why}") from None


def first_departure(model, config, inputs, *, rel_tol=3e-3, shapes=None):
    """The first tensor, in the model's node order, where the NPU (golden backend) departs
    from onnxruntime by more than ``rel_tol`` (max |error| / max |reference|): ``(node name,
    op, tensor, rel_err)``, or None. Every intermediate tensor is made a graph output (so
    nothing is fused across it) and compared."""
    import onnx
    from onnx import shape_inference

    from npu_compiler.compile import compile_model
    from npu_compiler.frontend import read_model

    m = onnx.ModelProto()
    m.CopyFrom(read_model(model))
    m = shape_inference.infer_shapes(m)
    known = {vi.name: vi for vi in m.graph.value_info}
    outs = {o.name for o in m.graph.output}
    order = []
    for node in m.graph.node:
        for o in node.output:
            if o and o in known and o not in outs:
                m.graph.output.append(known[o])
                outs.add(o)
            order.append((node.name or node.op_type, node.op_type, o))
    shapes = dict(shapes or {})
    for k, v in inputs.items():
        shapes.setdefault(k, np.shape(v))
    compiled = compile_model(m, config, shapes=shapes)
    got = run(compiled.program, inputs).outputs
    ref = reference(m, inputs)
    errors = compare({k: v for k, v in got.items() if k in ref}, ref)
    for name, op, tensor in order:
        e = errors.get(tensor)
        if e is not None and (e["rel_err"] > rel_tol or not np.isfinite(e["rel_err"])):
            return name, op, tensor, e["rel_err"]
    return None
