"""Planar engine runs: random tasks, stream packing, the engine bench runs and the comparison.

A *task* is a dict of the register fields (:func:`npu_spec.planar.make_task`). Operands are
numpy arrays in the task's input format (``np.int8`` values or ``np.uint16`` binary16 bits):
``a`` is ``(C, H, W)``; ``b`` is ``(C, H, W)`` or the broadcast vector; ``c`` is ``(C, H, W)``.
The task rules, the beat counts and the order of the streams are the specification's
(:mod:`npu_spec.planar`); this module packs arrays into beats and back and runs the RTL in the
engine bench (:mod:`npu_sim.engine_bench`), in ``amaranth.sim`` or under Verilator.
"""

import numpy as np

from npu_model import planar as pl
from npu_spec.formats import F32_ONE
from npu_spec.planar import (
    INT8_ELT_OPS,
    LINE_BUFFER_DEPTH,
    PLANAR_ENGINE,
    Axis,
    Bcast,
    EltOp,
    Fmt,
    Mode,
    make_task,
    operand_beats,
    output_beats,
    output_shape,
    task_error,
    task_writes,
    vector_length,
)

__all__ = [
    "OPERANDS",
    "bench_data_width",
    "bench_program",
    "compare",
    "from_beats",
    "golden",
    "input_streams",
    "int8_subset",
    "make_bench",
    "make_task",
    "random_operands",
    "random_task",
    "run_amaranth",
    "run_tasks",
    "run_verilator",
    "task_error",
    "to_beats",
]


#: The operand streams, in the order of the bench's ``LOAD`` selectors.
OPERANDS = ("a", "b", "c")


def _shape(task):
    return task["channels"], task["height"], task["width"]


def random_operands(rng, task):
    """Random A, B, C for ``task`` (B shaped as its broadcast vector when there is one)."""
    shape = _shape(task)

    def rand(sh):
        if task["in_fmt"] == Fmt.INT8:
            return rng.integers(-128, 128, sh).astype(np.int8)
        v = rng.standard_normal(sh) * rng.choice([0.01, 1.0, 40.0, 2000.0], sh)
        h = v.astype(np.float16).view(np.uint16).copy()
        flat = h.reshape(-1)
        k = max(1, flat.size // 40)
        idx = rng.choice(flat.size, k, replace=False)
        flat[idx] = rng.choice(np.array([0, 0x8000, 0x7C00, 0xFC00, 0x7E01, 0x0001, 0x7BFF],
                                        dtype=np.uint16), k)
        return h

    a = rand(shape)
    n = vector_length(task)
    b = rand((n,)) if n else rand(shape)
    c = rand(shape)
    return a, b, c


def golden(task, a, b=None, c=None, *, lanes):
    """Expected output array of ``task`` from the golden model."""
    mode = task["mode"]
    fmt = {"in_fmt": task["in_fmt"], "out_fmt": task["out_fmt"]}
    if mode == Mode.ELTWISE:
        return pl.eltwise(task["op"], a, b, c, scale=task["scale"], bias=task["bias"],
                          bcast=task["bcast"], scalar=task["scalar"], **fmt)
    if mode == Mode.POOL:
        return pl.pool(a, task["op"], task["kh"], task["kw"], task["sy"], task["sx"],
                       task["py"], task["px"], **fmt)
    return pl.reduce(a, task["op"], lanes=lanes, pre=task["pre"],
                     axis=Axis(task["axis"]).name.lower(), scale=task["scale"],
                     post=task["post"], **fmt)


def _elem16(x):
    x = np.asarray(x)
    if x.dtype == np.int8:
        return x.astype(np.int64) & 0xFF
    return x.astype(np.int64) & 0xFFFF


def to_beats(x, lanes):
    """Beats (ints) of an array whose last axis is a row; rows padded to whole beats."""
    x = np.asarray(x)
    rows = x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(1, -1)
    w = rows.shape[1]
    wb = -(-w // lanes)
    padded = np.zeros((rows.shape[0], wb * lanes), dtype=np.int64)
    padded[:, :w] = _elem16(rows)
    beats = padded.reshape(-1, lanes)
    weights = [1 << (16 * i) for i in range(lanes)]
    return [sum(int(v) * wgt for v, wgt in zip(row, weights)) for row in beats]


def from_beats(beats, shape, lanes, fmt):
    """Array of ``shape`` (rows on the last axis) from output beats."""
    w = shape[-1]
    wb = -(-w // lanes)
    vals = np.array([[(bt >> (16 * i)) & 0xFFFF for i in range(lanes)] for bt in beats],
                    dtype=np.int64).reshape(-1, wb * lanes)[:, :w]
    vals = vals.astype(np.uint16)
    if fmt == Fmt.INT8:
        vals = (vals & 0xFF).astype(np.uint8).view(np.int8)
    return vals.reshape(shape)


def input_streams(task, a, b, c, lanes):
    """Beats per input stream (``a``, ``b``, ``c``) the engine consumes for ``task``, in the
    order of :func:`npu_spec.planar.operand_beats`."""
    counts = operand_beats(task, lanes)
    streams = {"a": to_beats(a, lanes), "b": [], "c": []}
    if counts["b"]:
        vec = task["bcast"] >= Bcast.CHANNEL
        streams["b"] = to_beats(np.asarray(b).reshape(-1) if vec else b, lanes)
    if counts["c"]:
        streams["c"] = to_beats(c, lanes)
    for name, n in counts.items():
        assert len(streams[name]) == n, (name, len(streams[name]), n)
    return streams


def random_task(rng, config, mode=None, *, max_dim=9, formats=None):
    """A random valid task for ``config`` (``mode`` a name or code; random if None)."""
    if mode is None:
        mode = int(rng.integers(0, 3))
    elif isinstance(mode, str):
        mode = Mode[mode.upper()]
    fmts = formats or ([0, 1] if config.has_fp16 else [0])
    t = make_task(mode=mode, in_fmt=rng.choice(fmts), out_fmt=rng.choice(fmts),
                  channels=rng.integers(1, 4), height=rng.integers(1, max_dim + 1),
                  width=rng.integers(1, max_dim + 1))
    if mode == 0:
        t["op"] = int(rng.integers(0, 14))
        t["bcast"] = int(rng.integers(0, 5)) if t["op"] >= 6 else 0
        t["scale"] = int(np.float32(rng.choice([0.5, -1.25, 3.0, 1e-3])).view(np.uint32))
        t["bias"] = int(np.float32(rng.choice([0.0, 1.5, -7.25])).view(np.uint32))
        t["scalar"] = int(np.float32(rng.choice([2.0, -0.75, 100.0])).view(np.uint32))
    elif mode == 1:
        t["op"] = int(rng.integers(0, 3))
        h, w = t["height"], t["width"]
        t["kh"] = int(rng.integers(1, min(8, h + 2) + 1))
        t["kw"] = int(rng.integers(1, min(8, w + 2) + 1))
        t["py"] = int(rng.integers(0, min(t["kh"], 3)))
        t["px"] = int(rng.integers(0, min(t["kw"], 3)))
        t["kh"] = min(t["kh"], h + 2 * t["py"])
        t["kw"] = min(t["kw"], w + 2 * t["px"])
        t["py"] = min(t["py"], t["kh"] - 1)
        t["px"] = min(t["px"], t["kw"] - 1)
        t["sy"] = int(rng.integers(1, 4))
        t["sx"] = int(rng.integers(1, 4))
    else:
        t["op"] = int(rng.integers(0, 3))
        t["pre"] = int(rng.choice([0, 1, 2, 3, 4]))
        t["axis"] = int(rng.integers(0, 3))
        t["post"] = int(rng.integers(0, 4)) if t["axis"] != 2 else 0
        t["scale"] = int(np.float32(rng.choice([1.0, 1 / 3, 0.015625])).view(np.uint32))
    if config.planar_impl == "int8" and rng.random() < 0.85:
        int8_subset(rng, t)
    return t


def int8_subset(rng, t):
    """Narrow random task ``t`` to what the integer build computes
    (:func:`npu_spec.planar.int8_supported`), with small integer constants."""
    if t["mode"] == Mode.ELTWISE:
        t["op"] = int(rng.choice(INT8_ELT_OPS))
        t["bcast"] = int(rng.integers(0, 5)) if t["op"] >= EltOp.ADD else 0
        t["scale"] = int(rng.choice([0, F32_ONE]))
        for name in ("bias", "scalar"):
            t[name] = int(np.float32(rng.choice([0, -0.0, 1, -3, 100, -128, 300, -16383]))
                          .view(np.uint32))
    elif t["mode"] == Mode.POOL:
        t["op"] = int(rng.integers(0, 2))
    else:
        t["pre"] = int(rng.integers(0, EltOp.SQUARE))
        t["post"] = 0
        t["scale"] = F32_ONE


def compare(expected, got, fmt):
    """Indices (flat) where ``got`` differs from ``expected``, NaNs compared as a class."""
    e = np.asarray(expected).reshape(-1)
    g = np.asarray(got).reshape(-1)
    if fmt == Fmt.FP16:
        e = e.astype(np.uint16)
        g = g.astype(np.uint16)
    return np.nonzero(e != g)[0]


def bench_data_width(lanes):
    """Width of the bench's data fields for ``lanes`` lanes: a beat, at least 32 bits."""
    return max(32, 16 * lanes)


def make_bench(config, *, plane_depth=LINE_BUFFER_DEPTH):
    """The planar engine in an :class:`~npu_sim.engine_bench.EngineBench` whose data side feeds
    the operand streams ``a``, ``b``, ``c`` (``LOAD`` with ``sel`` 0, 1, 2) and returns ``out``.
    """
    from npu.planar.engine import PlanarEngine

    from .engine_bench import EngineBench, StreamDataSide

    engine = PlanarEngine(config, plane_depth=plane_depth)
    width = bench_data_width(engine.lanes)
    side = StreamDataSide(list(OPERANDS), "out", 16 * engine.lanes, width)
    return EngineBench(engine, side, data_width=width)


def bench_program(config, jobs, *, stall=0.0, plane_depth=LINE_BUFFER_DEPTH):
    """The :class:`~npu_sim.engine_bench.BenchProgram` that runs ``jobs`` one after the other.

    For each task: ``WRITE`` the task registers (:func:`npu_spec.planar.task_writes`),
    ``START``, ``LOAD`` its operand beats (a broadcast vector on B first, then A, B and C
    interleaved beat by beat; nothing for a rejected task), ``WAIT`` (with its output beats) and
    ``READ`` ``CYCLES``. A ``STALL`` of ``stall`` first holds back the operand streams and the
    result stream at random. Returns the program and the output beats of each task.
    """
    from .engine_bench import BenchProgram

    lanes = config.planar_lanes ** 2
    program = BenchProgram(bench_data_width(lanes)).stall(stall)
    counts = []
    for task, a, b, c in jobs:
        program.writes(task_writes(task)).start()
        if task_error(task, config, plane_depth):
            n_out = 0
        else:
            streams = input_streams(task, a, b, c, lanes)
            vector = task["mode"] == Mode.ELTWISE and task["bcast"] >= Bcast.CHANNEL
            first_b = len(streams["b"]) if vector else 0
            for beat in streams["b"][:first_b]:
                program.load(OPERANDS.index("b"), beat)
            rest_b = streams["b"][first_b:]
            for k, beat in enumerate(streams["a"]):
                program.load(OPERANDS.index("a"), beat)
                if rest_b:
                    program.load(OPERANDS.index("b"), rest_b[k])
                if streams["c"]:
                    program.load(OPERANDS.index("c"), streams["c"][k])
            n_out = output_beats(task, lanes)
        program.wait(outputs=n_out).read(PLANAR_ENGINE.address("CYCLES"))
        counts.append(n_out)
    return program, counts


def _results(config, jobs, records, counts):
    lanes = config.planar_lanes ** 2
    results = []
    for k, ((task, *_rest), n_out) in enumerate(zip(jobs, counts)):
        (kind, err, beats), (_, cycles) = records[2 * k], records[2 * k + 1]
        assert kind == "wait"
        if err or len(beats) != n_out:
            results.append((None, cycles, err))
        else:
            results.append((from_beats(beats, output_shape(task), lanes, task["out_fmt"]),
                            cycles, err))
    return results


def run_tasks(config, jobs, *, seed=1, stall=0.2, vcd=None, plane_depth=LINE_BUFFER_DEPTH):
    """Run tasks one after the other through the engine bench in the Amaranth simulator.

    ``jobs`` is a list of ``(task, a, b, c)``. The command and response streams, every operand
    stream and the result stream have random stalls of probability ``stall``. Beats are sent
    only for tasks that :func:`task_error` accepts. Returns a list of
    ``(output array or None, cycles, error)``; cycles are the engine's ``CYCLES`` (from the
    cycle the start is taken to the cycle of done).
    """
    from .engine_bench import run_bench

    bench = make_bench(config, plane_depth=plane_depth)
    program, counts = bench_program(config, jobs, stall=stall, plane_depth=plane_depth)
    records = run_bench(bench, program, backend="amaranth", stall=stall, seed=seed, vcd=vcd)
    return _results(config, jobs, records, counts)


def run_amaranth(config, task, a, b=None, c=None, **kwargs):
    """One task through :func:`run_tasks`; returns ``(output or None, cycles, error)``."""
    return run_tasks(config, [(task, a, b, c)], **kwargs)[0]


def run_verilator(config, jobs, *, seed=1, stall=0.2, plane_depth=LINE_BUFFER_DEPTH,
                  progress=None):
    """Run tasks through the engine bench compiled with Verilator.

    Same ``jobs``, stalls and result format as :func:`run_tasks`; the bench's Verilog is built
    once per configuration (cached by its hash).
    """
    from .engine_bench import run_bench
    from .verilator import StreamBench

    bench = make_bench(config, plane_depth=plane_depth)
    program, counts = bench_program(config, jobs, stall=stall, plane_depth=plane_depth)
    verilator = StreamBench(bench, in_name="cmd", out_name="res", progress=progress,
                            key=("planar_bench", config, plane_depth))
    records = run_bench(bench, program, backend="verilator", stall=stall, seed=seed,
                        verilator=verilator)
    return _results(config, jobs, records, counts)
