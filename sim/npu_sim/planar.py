"""Planar engine runs: random tasks, stream packing, the Amaranth runner and the comparison.

A *task* is a dict of the register fields (:func:`npu_spec.planar.make_task`). Operands are
numpy arrays in the task's input format (``np.int8`` values or ``np.uint16`` binary16 bits):
``a`` is ``(C, H, W)``; ``b`` is ``(C, H, W)`` or the broadcast vector; ``c`` is ``(C, H, W)``.
The task rules, the beat counts and the order of the streams are the specification's
(:mod:`npu_spec.planar`); this module packs arrays into beats and back and runs the RTL.
"""

import numpy as np
from npu_model import planar as pl
from npu_spec.planar import (
    Axis,
    Bcast,
    Fmt,
    Mode,
    TASK_FIELDS,
    make_task,
    operand_beats,
    output_beats,
    output_shape,
    task_error,
    vector_length,
)

__all__ = [
    "compare",
    "from_beats",
    "golden",
    "input_streams",
    "make_task",
    "random_operands",
    "random_task",
    "run_amaranth",
    "run_tasks",
    "run_verilator",
    "task_error",
    "to_beats",
]


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
    return t


def compare(expected, got, fmt):
    """Indices (flat) where ``got`` differs from ``expected``, NaNs compared as a class."""
    e = np.asarray(expected).reshape(-1)
    g = np.asarray(got).reshape(-1)
    if fmt == Fmt.FP16:
        e = e.astype(np.uint16)
        g = g.astype(np.uint16)
    return np.nonzero(e != g)[0]


def run_tasks(config, jobs, *, seed=1, stall=0.2, vcd=None, plane_depth=1024):
    """Run tasks one after the other through the RTL in the Amaranth simulator.

    ``jobs`` is a list of ``(task, a, b, c)``. Every stream (A, B, C in, results out) has
    random stalls of probability ``stall``. Beats are sent only for tasks that
    :func:`task_error` accepts. Returns a list of ``(output array or None, cycles, error)``;
    cycles count from ``start`` to ``done``.
    """
    from amaranth.sim import Simulator
    from npu.planar.engine import PlanarEngine

    from npu_sim.streams import seeded_rng, stream_get, stream_put

    dut = PlanarEngine(config, plane_depth=plane_depth)
    lanes = dut.lanes
    plan = []
    for task, a, b, c in jobs:
        if task_error(task, config, plane_depth):
            plan.append(({"a": [], "b": [], "c": []}, 0))
        else:
            plan.append((input_streams(task, a, b, c, lanes), output_beats(task, lanes)))
    results = []
    state = {"task": -1}
    outs = [[] for _ in jobs]

    def producer(name):
        async def tb(ctx):
            rng = seeded_rng(seed, name)
            port = getattr(dut, name)
            for k, (streams, _) in enumerate(plan):
                while state["task"] < k:
                    await ctx.tick()
                for word in streams[name]:
                    await stream_put(ctx, port, word, rng, stall)
        return tb

    async def consumer(ctx):
        rng = seeded_rng(seed, "out")
        for k, (_, n_out) in enumerate(plan):
            while state["task"] < k:
                await ctx.tick()
            for _ in range(n_out):
                outs[k].append(await stream_get(ctx, dut.out, rng, stall))

    async def control(ctx):
        for k, (task, *_rest) in enumerate(jobs):
            for f in TASK_FIELDS:
                ctx.set(getattr(dut.cfg, f), task[f])
            ctx.set(dut.start, 1)
            state["task"] = k
            await ctx.tick()
            ctx.set(dut.start, 0)
            cycles = 1
            n_in = len(plan[k][0]["a"]) + plan[k][1]
            limit = 20_000 + 200 * n_in * (1 + int(stall * 10))
            while not ctx.get(dut.done):
                await ctx.tick()
                cycles += 1
                if cycles > limit:
                    raise RuntimeError(f"planar engine did not finish task {k} in {limit} "
                                       f"cycles")
            err = ctx.get(dut.error)
            results.append((cycles, int(getattr(err, "value", err))))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(control)
    sim.add_testbench(consumer, background=True)
    # Producers run in the background: a rejected task's beats are never sent.
    for s in ("a", "b", "c"):
        sim.add_testbench(producer(s), background=True)
    if vcd:
        with sim.write_vcd(str(vcd)):
            sim.run()
    else:
        sim.run()
    done = []
    for k, (task, *_rest) in enumerate(jobs):
        cycles, err = results[k]
        if err or len(outs[k]) != plan[k][1]:
            done.append((None, cycles, err))
        else:
            done.append((from_beats(outs[k], output_shape(task), lanes,
                                    task["out_fmt"]), cycles, err))
    return done


def run_amaranth(config, task, a, b=None, c=None, **kwargs):
    """One task through :func:`run_tasks`; returns ``(output or None, cycles, error)``."""
    return run_tasks(config, [(task, a, b, c)], **kwargs)[0]


def run_verilator(config, jobs, *, seed=1, stall=0.2, plane_depth=1024, progress=None):
    """Run tasks through the engine compiled with Verilator (:mod:`npu_sim.planar_bench`).

    Same ``jobs`` and result format as :func:`run_tasks`. Stalls (probability ``stall``) hit
    the serialised command stream and the result stream.
    """
    from .planar_bench import PlanarBench

    from .verilator import StreamBench

    dut = PlanarBench(config, plane_depth=plane_depth)
    lanes = dut.lanes
    from npu_spec.planar import PLANAR_ENGINE, task_writes
    words = []
    plan = []
    width = dut.cmd.payload.shape().size - 3

    def cmd(tag, value):
        return tag | (value << 3)

    for task, a, b, c in jobs:
        for addr, value in task_writes(task):
            words.append(cmd(0, value | ((addr - PLANAR_ENGINE.base) << 32)))
        words.append(cmd(1, 0))
        if task_error(task, config, plane_depth):
            plan.append(0)
            continue
        streams = input_streams(task, a, b, c, lanes)
        n_b_first = len(streams["b"]) if (task["mode"] == 0 and task["bcast"] >= 2) else 0
        words += [cmd(3, w) for w in streams["b"][:n_b_first]]
        rest_b = streams["b"][n_b_first:]
        for k, wa in enumerate(streams["a"]):
            words.append(cmd(2, wa))
            if rest_b:
                words.append(cmd(3, rest_b[k]))
            if streams["c"]:
                words.append(cmd(4, streams["c"][k]))
        plan.append(output_beats(task, lanes))
    expected = sum(plan) + len(plan)
    bench = StreamBench(dut, in_name="cmd", out_name="res", progress=progress)
    outs, _stats = bench.run(words, expected, stall=stall, seed=seed,
                            max_cycles=100_000 + 400 * (len(words) + expected))
    results = []
    k = 0
    mask = (1 << width) - 1
    for (task, *_rest), n in zip(jobs, plan):
        beats = []
        while k < len(outs) and outs[k] & 1 == 0:
            beats.append((outs[k] >> 1) & mask)
            k += 1
        if k >= len(outs):
            raise RuntimeError("planar bench: missing status beat (the engine stalled)")
        status = outs[k] >> 1
        k += 1
        err, cycles = status & 0xFF, (status >> 8) & 0xFFFF_FFFF
        if err or len(beats) != n:
            results.append((None, cycles, err))
        else:
            results.append((from_beats(beats, output_shape(task), lanes,
                                       task["out_fmt"]), cycles, err))
    return results
