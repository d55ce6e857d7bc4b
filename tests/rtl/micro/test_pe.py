# amaranth: UnusedElaboratable=no
"""The micro planar unit against the golden model's planar task (``npu_model.system``), bit
for bit: the whole buffer after the task and the error code."""

import numpy as np
import pytest

from npu.micro.pe import UNSUPPORTED, MicroPlanar
from npu_model.system import run_planar_task
from npu_sim.micro_units import PoolingAsPlanar, run_unit
from npu_spec import dataproc
from npu_spec import planar as spec
from npu_spec.config import preset
from npu_spec.planar import Mode, PlanarError, PoolOp

CONFIG = preset("icebreaker")
BUF = dataproc.buffer_elements(CONFIG)


def golden(buffer, regs, flow=None):
    """``(error code, buffer)`` of the golden model's planar task; ``flow`` what a neural task
    with a flow-controlled output left for it (``(values, dataset)``)."""
    return run_planar_task(CONFIG, regs, buffer, flow)


def rtl(buffer, regs):
    """``(error code, buffer, cycles)`` of the planar unit, after checking that the neural
    unit's pooling mode ends the task the same way (code and whole buffer)."""
    err, buf, cycles = run_unit(MicroPlanar(), buffer, regs, limit=500_000)
    err_n, buf_n, _ = run_unit(PoolingAsPlanar(), buffer, regs, limit=500_000)
    assert err_n == err, "the neural unit's pooling mode ends with another code"
    assert np.array_equal(np.array(buf_n, np.uint16), np.array(buf, np.uint16)), \
        "the neural unit's pooling mode leaves another buffer"
    return err, np.array(buf, np.uint16), cycles


def build(rng, *, c, h, w, kh, kw, sy, sx, py=0, px=0, op=PoolOp.MAX, slots=0, planes=0,
          fields=None, out_shape=None):
    """A random pooling task: ``(buffer, registers, flow)``; ``fields`` overrides task fields,
    ``out_shape`` the output dataset's ``(C, H, W)``."""
    task = {f.name: 0 for reg in spec.TASK_REGISTERS for f in reg.fields}
    task.update(mode=Mode.POOL, op=op, width=w, height=h, channels=c, kh=kh, kw=kw, sy=sy,
                sx=sx, py=py, px=px)
    task.update(fields or {})
    regs = {spec.BASE + reg.offset: reg.pack(strict=False, **{f.name: int(task[f.name])
                                                              for f in reg.fields})
            for reg in spec.TASK_REGISTERS}
    oh = max(1, (h + 2 * py - kh) // max(sy, 1) + 1)
    ow = max(1, (w + 2 * px - kw) // max(sx, 1) + 1)
    rs = w + int(rng.integers(0, 3))
    ds_a = dataproc.make_dataset(int(rng.integers(0, BUF)), (c, h, w), rstride=rs,
                                 cstride=rs * h + int(rng.integers(0, 4)), slots=slots,
                                 planes=planes)
    ds_out = dataproc.make_dataset(int(rng.integers(0, BUF)), out_shape or (c, oh, ow))
    regs.update(dataproc.dataset_writes(dataproc.pe_port_base("A"), ds_a))
    regs.update(dataproc.dataset_writes(dataproc.pe_port_base("OUT"), ds_out))
    buffer = rng.integers(0, 1 << 16, BUF).astype(np.uint16)
    flow = None
    if slots:
        # what the producing neural task wrote: every channel, in its ring plane
        values = rng.integers(0, 1 << 16, (c, h, w)).astype(np.uint16)
        ring = slots * max(1, planes)
        for ch in range(c):
            for y in range(h):
                addr = ds_a["addr"] + (ch % ring) * ds_a["cstride"] + y * rs
                buffer[(addr + np.arange(w)) % BUF] = values[ch, y]
        flow = (values, ds_a)
    return buffer, regs, flow


def check(seed, expect=None, **kw):
    buffer, regs, flow = build(np.random.default_rng(seed), **kw)
    code, want = golden(buffer, regs, flow)
    if expect is not None:
        assert code == expect
    err, got, _ = rtl(buffer, regs)
    assert err == code
    bad = np.nonzero(got != want)[0]
    assert not bad.size, f"{bad.size} elements differ, first at {bad[0]}"
    return code


POOLS = {
    "max_2x2_s2": dict(c=3, h=6, w=6, kh=2, kw=2, sy=2, sx=2),
    "min_3x3_s1_pad": dict(c=2, h=5, w=7, kh=3, kw=3, sy=1, sx=1, py=1, px=1, op=PoolOp.MIN),
    "max_3x2_s2x1_odd": dict(c=5, h=7, w=5, kh=3, kw=2, sy=2, sx=1, py=2, px=1),
    "max_ring": dict(c=6, h=4, w=4, kh=2, kw=2, sy=2, sx=2, slots=2, planes=3),
    "max_1x1": dict(c=1, h=2, w=9, kh=1, kw=1, sy=1, sx=3),
}


@pytest.mark.parametrize("name", POOLS)
def test_pool(name):
    assert check(list(POOLS).index(name), expect=0, **POOLS[name]) == 0


BASE = dict(c=2, h=4, w=4, kh=2, kw=2, sy=2, sx=2)


@pytest.mark.parametrize("fields, expect", [
    (dict(mode=3), PlanarError.BAD_MODE),
    (dict(op=5), PlanarError.BAD_MODE),
    (dict(in_fmt=1), PlanarError.BAD_FORMAT),
    (dict(op=PoolOp.AVG), PlanarError.UNSUPPORTED),
    (dict(channels=0), PlanarError.BAD_SHAPE),
    (dict(width=400, height=400), PlanarError.BAD_SHAPE),
    (dict(kh=9), PlanarError.BAD_WINDOW),
    (dict(sx=0), PlanarError.BAD_WINDOW),
    (dict(py=2), PlanarError.BAD_WINDOW),
    (dict(kw=7), PlanarError.BAD_WINDOW),
])
def test_error(fields, expect):
    """Tasks the golden model rejects: the same code, nothing written."""
    assert check(len(str(fields)), expect=expect, **BASE, fields=fields) == expect


@pytest.mark.parametrize("kw", [
    dict(fields=dict(mode=Mode.ELTWISE)),
    dict(fields=dict(mode=Mode.REDUCE)),
    dict(out_shape=(2, 2, 3)),
    dict(out_shape=(1, 2, 2)),
    dict(slots=1, planes=1),
])
def test_unsupported(kw):
    """What the unit does not do ends with UNSUPPORTED, nothing written."""
    buffer, regs, _ = build(np.random.default_rng(3), **BASE, **kw)
    err, got, _ = rtl(buffer, regs)
    assert err == UNSUPPORTED
    assert np.array_equal(got, buffer)
