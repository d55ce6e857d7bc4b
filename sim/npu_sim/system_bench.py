"""System benchmarks (``npu bench system``; figures in ``docs/system.md``).

* ``conv_pool``: a 3x3 conv 16 -> 16 on 16x16 followed by a 2x2 max pool, the conv's output
  streamed to the planar engine through a flow-controlled ring of ``slots`` slots (0: a plain
  dataset, the pool waiting for the conv's end). Figures: the conv's engine cycles in a
  program of the conv alone, the compute span (conv start to pool end) and the whole program
  (first task start to last end, DMA of input, kernels and output included), and their
  ratios to the conv alone.
* ``double_buffered``: the same conv with its input and output in system memory at a given
  latency, tiled into bands of output rows: the input rows of band ``k + 1`` load and the
  output of band ``k - 1`` stores while band ``k`` computes. The input sits in the buffer with
  an explicit zero border (the buffer starts zeroed), so each band is a conv without padding
  over a view of it. Figures: the whole program against the untiled conv's engine cycles.
* ``speed``: simulated cycles per second of the system simulation, and a warm run's start-up.
"""

import resource
import time

import numpy as np

from npu_model.builder import Dataset, ProgramBuilder
from npu_model.system import run_program

from .programs import int_params
from .system import compare, rtl_run

__all__ = ["conv_pool", "double_buffered"]


def _layer(rng, c=16, k=16):
    w = rng.integers(-128, 128, (k, c, 3, 3)).astype(np.int8)
    return w, int_params(rng, k, 9 * c)


def _spans(trace):
    """``{task_id: (engine, start, end)}`` of a single-queue trace."""
    spans = {}
    for task_id, engine, end, _, _, cycle in trace:
        if end:
            spans[task_id] = (engine, spans[task_id][1], cycle)
        else:
            spans[task_id] = (engine, cycle, None)
    return spans


def _run(program, latency, progress):
    golden = run_program(program)
    rtl = rtl_run(program, backend="verilator", latency=latency, progress=progress)
    summary = compare(program, golden, rtl)
    return summary, _spans(rtl["trace"]), rtl


def conv_pool(config, *, latency=4, seed=1, slots=2, progress=None):
    def program(pool):
        rng = np.random.default_rng(seed)
        b = ProgramBuilder(config)
        x = rng.integers(-128, 128, (16, 16, 16)).astype(np.int8)
        xd = b.load(b.input("x", x))
        w, params = _layer(rng)
        k = b.dma_kernels(0, b.kernels(w, **params))
        y = b.conv(xd, k, pad=1, slots=slots if pool else 0)
        if pool:
            y = b.max_pool(y, 2)
        b.store(y, b.output("y", y.shape))
        return b.build()

    # The conv alone: its engine-only cycles.
    ref_summary, ref_spans, _ = _run(program(False), latency, progress)
    conv = ref_spans[2][2] - ref_spans[2][1]
    summary, spans, _ = _run(program(True), latency, progress)
    compute = spans[3][2] - spans[2][1]
    whole = max(s[2] for s in spans.values()) - min(s[1] for s in spans.values())
    return {"match": summary["match"] and ref_summary["match"], "conv_cycles": conv,
            "chained_conv_cycles": spans[2][2] - spans[2][1],
            "pool_cycles": spans[3][2] - spans[3][1],
            "pool_after_conv_end": spans[3][2] - spans[2][2], "compute_span": compute,
            "program_cycles": whole, "compute_ratio": round(compute / conv, 4),
            "program_ratio": round(whole / conv, 4), "slots": slots, "latency": latency}


def double_buffered(config, *, latency=20, bands=8, seed=1, progress=None):
    rng = np.random.default_rng(seed)
    c, h, w = 16, 16, 16
    x = rng.integers(-128, 128, (c, h, w)).astype(np.int8)
    wts, params = _layer(rng)

    # Reference: the untiled conv's engine cycles.
    ref = ProgramBuilder(config)
    xd = ref.load(ref.input("x", x))
    k = ref.dma_kernels(0, ref.kernels(wts, **params))
    yd = ref.conv(xd, k, pad=1)
    ref.store(yd, ref.output("y", yd.shape))
    ref_summary, ref_spans, _ = _run(ref.build(), latency, progress)
    conv = ref_spans[2][2] - ref_spans[2][1]
    reference = ref_summary["match"]

    # Tiled: a zero-bordered input in the buffer, bands of output rows.
    b = ProgramBuilder(config)
    xt = b.input("x", x)
    yt = b.output("y", (c, h, w))
    pw = w + 2
    padded = b.buffer((c, h + 2, pw))
    out = b.buffer((c, h, w))
    rows = h // bands

    def interior(r0, r1):           # input rows r0..r1-1 inside the border
        return Dataset(padded.addr + (r0 + 1) * pw + 1, (c, r1 - r0, w), "int8",
                       cstride=(h + 2) * pw, rstride=pw)

    loaded = 0

    def load_until(r):
        nonlocal loaded
        r = min(r, h)
        if r > loaded:
            b.load_rows(xt, loaded, r, interior(loaded, r))
            loaded = r

    load_until(rows + 1)
    k = b.dma_kernels(0, b.kernels(wts, **params))
    for band in range(bands):
        r0 = band * rows
        src = Dataset(padded.addr + r0 * pw, (c, rows + 2, pw), "int8",
                      cstride=(h + 2) * pw, rstride=pw)
        dst = Dataset(out.addr + r0 * w, (c, rows, w), "int8", cstride=h * w, rstride=w)
        b.conv(src, k, dst)
        load_until(r0 + 2 * rows + 1)
        if band:
            prev = Dataset(out.addr + (r0 - rows) * w, (c, rows, w), "int8", cstride=h * w,
                           rstride=w)
            b.store_rows(prev, yt, r0 - rows)
    last = Dataset(out.addr + (h - rows) * w, (c, rows, w), "int8", cstride=h * w, rstride=w)
    b.store_rows(last, yt, h - rows)
    program = b.build()
    summary, spans, _ = _run(program, latency, progress)
    whole = max(s[2] for s in spans.values()) - min(s[1] for s in spans.values())
    ne = sum(s[2] - s[1] for s in spans.values() if s[0] == 0)
    # The tiled result equals the untiled golden conv (the same numbers, bit for bit).
    tiled_out = np.frombuffer(run_program(program).memory, np.uint8)
    ref_out = np.frombuffer(run_program(ref.build()).memory, np.uint8)
    same = bool(np.array_equal(tiled_out[yt.addr:yt.extent[1]],
                               ref_out[ref.tensors[-1].addr:ref.tensors[-1].extent[1]]))
    return {"match": summary["match"] and reference, "tiled_equals_untiled": same,
            "conv_cycles": conv, "program_cycles": whole, "banded_ne_cycles": ne,
            "ratio": round(whole / conv, 4), "bands": bands, "latency": latency,
            "tasks": len(spans)}


def speed(config, *, latency=4, progress=None, gate_clocks=None):
    """Simulated cycles per second on a long program (four 16-channel 32x32 conv layers):
    per second of wall time (the whole run, build-cache lookup included) and per second of
    the simulation process's CPU time (the figure that does not depend on other jobs on a
    shared machine). ``gate_clocks``: as :func:`npu_sim.system.rtl_run`."""
    rng = np.random.default_rng(3)
    b = ProgramBuilder(config)
    h = b.load(b.input("x", rng.integers(-128, 128, (16, 32, 32)).astype(np.int8)))
    for _ in range(4):
        wts, params = _layer(rng)
        k = b.dma_kernels(0, b.kernels(wts, **params))
        y = b.conv(h, k, pad=1, act="relu")
        b.release(h)
        h = y
    b.store(h, b.output("y", h.shape))
    program = b.build()
    t0 = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    rtl = rtl_run(program, backend="verilator", latency=latency, progress=progress,
                  gate_clocks=gate_clocks)
    wall = time.perf_counter() - t0
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - cpu0
    return {"sim_cycles": rtl["sim_cycles"], "wall_seconds": round(wall, 2),
            "cycles_per_second": int(rtl["sim_cycles"] / wall),
            "sim_cpu_seconds": round(cpu, 2),
            "cycles_per_cpu_second": int(rtl["sim_cycles"] / cpu) if cpu > 0 else None}
