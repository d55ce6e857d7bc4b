"""Shared helpers for the planar engine's unit tests: operands, tasks, sizes, simulation."""

import numpy as np
from amaranth.sim import Simulator

from npu_spec.planar import Mode, make_task

__all__ = ["f32_classes", "pool_sizes", "pool_task", "run", "set_task"]


def f32_classes(rng, n):
    """``n`` binary32 patterns of every class (normal, subnormal, zero, infinity, NaN, values
    near the binary16 and INT8 boundaries), then fixed special values."""
    e = rng.choice([0, 1, 2, 100, 112, 113, 120, 126, 127, 128, 140, 142, 143, 150, 200, 254,
                    255], n).astype(np.uint32)
    e = np.where(rng.random(n) < 0.5, rng.integers(0, 256, n), e).astype(np.uint32)
    f = rng.integers(0, 1 << 23, n).astype(np.uint32)
    f = np.where(rng.random(n) < 0.3, f & 0x7FE000, f).astype(np.uint32)  # ties for binary16
    s = rng.integers(0, 2, n).astype(np.uint32)
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 1,
                        0x3F000000, 0x3FC00000, 0x40200000, 0xBF000000, 0x42FF0000, 0x42FE0000,
                        0xC3008000, 0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001],
                       dtype=np.uint32)
    return np.concatenate([(s << 31) | (e << 23) | f, special])


def run(dut, *testbenches, background=(), vcd=None):
    """Simulate ``dut`` with the async testbenches (the last ones ``background``)."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for tb in testbenches:
        sim.add_testbench(tb)
    for tb in background:
        sim.add_testbench(tb, background=True)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


def set_task(ctx, port, task):
    """Drive a ``config_layout()`` port with the fields of ``task``."""
    for name, value in task.items():
        ctx.set(getattr(port, name), int(value))


def pool_task(rng, *, max_dim=9, op=None):
    """A random valid pooling task (shape, window, stride, padding)."""
    c = int(rng.integers(1, 4))
    h = int(rng.integers(1, max_dim + 1))
    w = int(rng.integers(1, max_dim + 1))
    kh = int(rng.integers(1, min(8, h + 2) + 1))
    kw = int(rng.integers(1, min(8, w + 2) + 1))
    py = min(int(rng.integers(0, min(kh, 3))), kh - 1)
    px = min(int(rng.integers(0, min(kw, 3))), kw - 1)
    kh, kw = min(kh, h + 2 * py), min(kw, w + 2 * px)
    py, px = min(py, kh - 1), min(px, kw - 1)
    return make_task(mode=Mode.POOL, op=int(rng.integers(0, 3)) if op is None else op,
                     channels=c, height=h, width=w, kh=kh, kw=kw,
                     sy=int(rng.integers(1, 4)), sx=int(rng.integers(1, 4)), py=py, px=px)


def pool_sizes(task, lanes, filter_lanes):
    """The sizes (``sizes_layout()`` fields) of a pooling task, from the specification's
    formulas: ``OW = (W + 2 px - kw) // sx + 1``, ``owb = ceil(OW / FL)``."""
    c, h, w = task["channels"], task["height"], task["width"]
    ow = (w + 2 * task["px"] - task["kw"]) // task["sx"] + 1
    owb = -(-ow // filter_lanes)
    wb = -(-w // lanes)
    return {"wb": wb, "beats_plane": h * wb, "beats_group": h * wb, "rows": c * h,
            "owb": owb, "h_owb": h * owb, "kh_owb": task["kh"] * owb,
            "sy_owb": task["sy"] * owb, "py_owb": task["py"] * owb,
            "step_cols": task["sx"] * filter_lanes, "beat_cols": task["sx"] * lanes}
