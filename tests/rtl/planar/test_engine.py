# amaranth: UnusedElaboratable=no
"""The planar engine RTL against the golden model, bit for bit, with random stalls, through
the engine bench (:mod:`npu_sim.planar`); its engine interface (start, done, error, CYCLES,
STATUS, abort)."""

import numpy as np
import pytest
from amaranth.hdl import Fragment

from npu.planar.control import setup_cycles
from npu.planar.engine import PlanarEngine
from npu.planar.geometry import Geometry
from npu.planar.layouts import config_layout
from npu_model import planar as pl
from npu_sim import planar as ps
from npu_sim.streams import seeded_rng, stream_put
from npu_spec.config import NPUConfig, preset
from npu_spec.planar import (
    INT8_CONST_LIMIT,
    INT8_ELT_OPS,
    PLANAR_ENGINE,
    TASK_FIELDS,
    EltOp,
    PlanarError,
    make_task,
    output_beats,
    task_writes,
)
from tests.rtl.planar.test_control import wild_task
from tests.support.csr import csr_read
from tests.support.planar import run


def sweep(config, jobs, *, seed, stall, plane_depth=1024):
    lanes = config.planar_lanes ** 2
    results = ps.run_tasks(config, jobs, seed=seed, stall=stall, plane_depth=plane_depth)
    for (task, a, b, c), (got, cycles, err) in zip(jobs, results):
        assert err == ps.task_error(task, config, plane_depth), task
        if err:
            assert got is None
            continue
        exp = ps.golden(task, a, b, c, lanes=lanes)
        assert got is not None, task
        bad = ps.compare(exp, got, task["out_fmt"])
        assert bad.size == 0, (task, np.asarray(exp).reshape(-1)[bad[:6]],
                               np.asarray(got).reshape(-1)[bad[:6]])
    return results


def reject_cycles(config, plane_depth=1024):
    """The most cycles a rejected task takes from start to done: the start's register
    (``docs/planar.md``), its sizes and check (:func:`npu.planar.control.setup_cycles`) and
    the cycle that ends it."""
    return 1 + setup_cycles(Geometry.of(config, plane_depth)) + 1


def random_jobs(config, seed, n, modes=(None,), max_dim=9):
    rng = np.random.default_rng(seed)
    jobs = []
    for k in range(n):
        task = ps.random_task(rng, config, modes[k % len(modes)], max_dim=max_dim)
        jobs.append((task, *ps.random_operands(rng, task)))
    return jobs


def test_register_fields_match_config_layout():
    members = config_layout().members
    assert set(TASK_FIELDS) == set(members)
    for reg in PLANAR_ENGINE.registers:
        for f in reg.fields:
            if f.name in members:
                assert f.width == members[f.name].width
    writes = dict(task_writes(make_task(mode=1, kh=3, py=2, scale=0x40000000)))
    window = PLANAR_ENGINE.decode(PLANAR_ENGINE.address("WINDOW"),
                                  writes[PLANAR_ENGINE.address("WINDOW")])
    assert window["kh"] == 3 and window["py"] == 2


def test_one_lane_all_modes():
    """P = 1: every elementwise op, pooling op and reduction in one simulation."""
    cfg = NPUConfig(planar_lanes=1)
    rng = np.random.default_rng(1)
    jobs = []
    for op in range(14):
        t = ps.random_task(rng, cfg, "eltwise", max_dim=5)
        t["op"] = op
        t["bcast"] = [0, 1, 2, 3, 4][op % 5] if op >= 6 else 0
        jobs.append((t, *ps.random_operands(rng, t)))
    jobs += random_jobs(cfg, 2, 6, modes=("pool",), max_dim=7)
    jobs += random_jobs(cfg, 3, 5, modes=("reduce",), max_dim=7)
    sweep(cfg, jobs, seed=1, stall=0.25)


def test_four_lanes_mixed():
    """P = 2 (four lanes, a two-level tree): random tasks with shapes smaller and larger than a
    beat, a 7x7 padded average, a mean (scale = recip(N)) and a reciprocal L2 norm
    (pre = square, post = rsqrt)."""
    cfg = NPUConfig(planar_lanes=2)
    jobs = random_jobs(cfg, 4, 6, modes=("eltwise", "pool", "reduce"), max_dim=7)
    t = ps.make_task(mode=1, op=2, in_fmt=1, out_fmt=1, channels=1, height=9, width=9,
                     kh=7, kw=7, sy=2, sx=2, py=3, px=3)
    jobs.append((t, *ps.random_operands(np.random.default_rng(5), t)))
    x = np.random.default_rng(8).integers(-128, 128, (3, 5, 6)).astype(np.int8)
    mean = ps.make_task(mode=2, op=0, out_fmt=1, channels=3, height=5, width=6,
                        scale=int(pl.recip_count(30)))
    rnorm = ps.make_task(mode=2, op=0, pre=4, post=3, out_fmt=1, channels=3, height=5,
                         width=6)
    jobs += [(mean, x, None, None), (rnorm, x, None, None)]
    res = sweep(cfg, jobs, seed=2, stall=0.3)
    m = res[-2][0].reshape(-1).view(np.float16).astype(np.float64)
    assert np.allclose(m, x.reshape(3, -1).mean(axis=1), rtol=1e-3, atol=1e-3)
    r = res[-1][0].reshape(-1).view(np.float16).astype(np.float64)
    ref = 1 / np.sqrt((x.reshape(3, -1).astype(np.float64) ** 2).sum(axis=1))
    assert np.allclose(r, ref, rtol=1e-3)


def test_pool_streams_through_small_rings():
    """Pooling streams rows through the line buffer ring and the H ring: with
    plane_depth = 64 on four lanes (ring of 68 elements, H ring of 16 words) planes far larger
    than the rings run, strides 1-15 (even ones included: every bank is read once per step),
    groups that span output rows, FP16 averages, random stalls; a task one row too wide for
    the ring is rejected."""
    cfg = NPUConfig(planar_lanes=2)
    depth = 64

    def pt(**fields):
        return ps.make_task(mode=1, **fields)

    tasks = [
        pt(op=2, in_fmt=1, out_fmt=1, channels=2, height=21, width=13, kh=2, kw=2, sy=2,
           sx=2),
        pt(op=0, channels=3, height=17, width=8, kh=3, kw=3, sy=1, sx=1, py=1, px=1),
        pt(op=2, in_fmt=1, out_fmt=1, channels=1, height=12, width=21, kh=3, kw=4, sy=2,
           sx=4, py=2, px=3),
        pt(op=1, in_fmt=1, out_fmt=0, channels=2, height=9, width=21, kh=2, kw=3, sy=5,
           sx=15, py=1, px=1),
        pt(op=2, channels=1, height=11, width=11, kh=7, kw=7, sy=2, sx=3, py=3, px=3),
        pt(op=0, in_fmt=1, out_fmt=1, channels=2, height=16, width=3, kh=8, kw=2, sy=1,
           sx=1, py=4, px=1),
    ]
    rng = np.random.default_rng(40)
    jobs = []
    for t in tasks:
        assert ps.task_error(t, cfg, depth) == 0, t
        assert t["channels"] * t["height"] * t["width"] > 68 or t["height"] * t["width"] > 68
        jobs.append((t, *ps.random_operands(rng, t)))
    too_wide = ps.make_task(mode=1, op=0, channels=1, height=4, width=22, kh=2, kw=2, sy=2,
                            sx=2)
    assert ps.task_error(too_wide, cfg, depth) == PlanarError.BAD_SHAPE
    fits = ps.make_task(mode=1, op=0, channels=1, height=4, width=21, kh=2, kw=2, sy=2, sx=2)
    assert ps.task_error(fits, cfg, depth) == 0
    jobs.insert(2, (too_wide, None, None, None))
    jobs.append((fits, *ps.random_operands(rng, fits)))
    # The fold order shows in the result: in the window [[2^15, 2^-10], [-2^15, 2^-10]] the row
    # sums cancel to 0, while a row-major fold keeps the last 2^-10 (average 2^-12).
    order = ps.make_task(mode=1, op=2, in_fmt=1, out_fmt=1, channels=1, height=4, width=8,
                         kh=2, kw=2, sy=2, sx=2)
    x = np.tile(np.array([[0x7800, 0x1400], [0xF800, 0x1400]], dtype=np.uint16), (2, 4))
    jobs.append((order, x[None], None, None))
    results = sweep(cfg, jobs, seed=41, stall=0.3, plane_depth=depth)
    assert np.all(results[-1][0] == 0)


def test_wide_pool_filters():
    """planar_pool_beats = 3 (filters of 3 L lanes, results leaving the queue as up to three
    output beats each): random tasks of every mode with stalls, and pooling streamed through
    small rings (rows wider and narrower than a filter word, strides 1 to 15)."""
    cfg = NPUConfig(planar_lanes=2, planar_pool_beats=3)
    jobs = random_jobs(cfg, 60, 6, modes=("pool", "eltwise", "pool", "reduce"), max_dim=9)
    t = ps.make_task(mode=1, op=2, in_fmt=1, out_fmt=1, channels=2, height=9, width=30,
                     kh=3, kw=3, sy=1, sx=1, py=1, px=1)
    jobs.append((t, *ps.random_operands(np.random.default_rng(61), t)))
    sweep(cfg, jobs, seed=6, stall=0.3)
    depth = 64
    tasks = [
        ps.make_task(mode=1, op=0, channels=3, height=17, width=8, kh=3, kw=3, sy=1, sx=1,
                     py=1, px=1),
        ps.make_task(mode=1, op=2, in_fmt=1, out_fmt=1, channels=1, height=12, width=21,
                     kh=3, kw=4, sy=2, sx=4, py=2, px=3),
        ps.make_task(mode=1, op=1, channels=2, height=9, width=21, kh=2, kw=3, sy=5, sx=15,
                     py=1, px=1),
        ps.make_task(mode=1, op=2, channels=1, height=11, width=12, kh=7, kw=7, sy=2, sx=1,
                     py=3, px=3),
        ps.make_task(mode=1, op=0, in_fmt=1, out_fmt=1, channels=2, height=9, width=21, kh=2,
                     kw=3, sy=1, sx=1, px=1),
    ]
    assert all(ps.task_error(t, cfg, depth) == 0 for t in tasks)
    rng = np.random.default_rng(62)
    sweep(cfg, [(t, *ps.random_operands(rng, t)) for t in tasks], seed=63, stall=0.3,
          plane_depth=depth)


def test_errors_never_hang():
    """Bad codes and impossible shapes set the error status, consume nothing, and the next
    task still runs."""
    cfg = NPUConfig(planar_lanes=1, formats=("int8",))
    rng = np.random.default_rng(6)
    bad = [
        ps.make_task(mode=3, channels=1, height=2, width=2),
        ps.make_task(mode=0, op=14, channels=1, height=2, width=2),
        ps.make_task(mode=0, op=6, bcast=5, channels=1, height=2, width=2),
        ps.make_task(mode=1, op=3, channels=1, height=2, width=2),
        ps.make_task(mode=2, op=0, pre=5, channels=1, height=2, width=2),
        ps.make_task(mode=0, op=0, channels=0, height=2, width=2),
        ps.make_task(mode=1, op=0, channels=1, height=40, width=400, kh=2, kw=2),
        ps.make_task(mode=0, op=6, bcast=3, channels=1, height=1, width=2000),
        ps.make_task(mode=1, op=0, channels=1, height=4, width=4, kh=2, kw=2, py=2),
        ps.make_task(mode=1, op=0, channels=1, height=2, width=4, kh=5, kw=2, py=1),
        ps.make_task(mode=1, op=0, channels=1, height=4, width=4, kh=9, kw=2, py=3),
        ps.make_task(mode=1, op=0, channels=1, height=4, width=4, kh=2, kw=2, sy=0),
        ps.make_task(mode=0, op=0, in_fmt=1, channels=1, height=2, width=2),
        ps.make_task(mode=2, op=0, axis=3, channels=1, height=2, width=2),
        ps.make_task(mode=2, op=0, axis=2, post=1, channels=2, height=2, width=2),
        # one beat more than the accumulator plane (the H ring: 1024 words on one lane)
        ps.make_task(mode=2, op=0, axis=2, channels=2, height=32, width=33),
    ]
    jobs = []
    for t in bad:
        assert ps.task_error(t, cfg) != 0, t
        jobs.append((t, None, None, None))
    good = ps.random_task(rng, cfg, "pool")
    jobs.append((good, *ps.random_operands(rng, good)))
    results = sweep(cfg, jobs, seed=3, stall=0.2)
    assert all(cycles <= reject_cycles(cfg) for _, cycles, _ in results[:-1])
    # codes, formats and windows are rejected before the sizes' products, as before them
    # (the start's register, go to the check, the check, the end)
    assert all(cycles <= 4 for _, cycles, _ in results[:5])
    assert results[-1][2] == 0


def test_reduce_across_channels():
    """Axis ``channel`` (one result per pixel): every op and pre-operation, both formats,
    planes of 1 to 6 beats (fewer than five beats: a beat's accumulator word is still being
    written when the next channel's beat arrives, and the lane pipeline must wait), rows
    narrower and wider than a beat, random stalls; the mean across channels against float64."""
    cfg = NPUConfig(planar_lanes=2)
    rng = np.random.default_rng(50)
    jobs = []
    shapes = [(3, 1, 1), (5, 1, 4), (4, 2, 3), (3, 3, 4), (6, 4, 2), (3, 5, 4), (2, 3, 9),
              (1, 2, 5), (7, 6, 7)]
    for k, (c, h, w) in enumerate(shapes):
        t = ps.make_task(mode=2, axis=2, op=k % 3, pre=k % 5, in_fmt=k % 2,
                         out_fmt=(k // 2) % 2, channels=c, height=h, width=w,
                         scale=int(np.float32([1.0, 0.25, -3.0][k % 3]).view(np.uint32)))
        assert ps.task_error(t, cfg) == 0, t
        jobs.append((t, *ps.random_operands(rng, t)))
    x = rng.integers(-128, 128, (6, 3, 5)).astype(np.int8)
    mean = ps.make_task(mode=2, axis=2, op=0, out_fmt=1, channels=6, height=3, width=5,
                        scale=int(pl.recip_count(6)))
    jobs.append((mean, x, None, None))
    res = sweep(cfg, jobs, seed=51, stall=0.3)
    got = res[-1][0].reshape(3, 5).view(np.float16).astype(np.float64)
    ref = x.astype(np.float64).mean(axis=0)
    # The int8 sum is exact; times recip(6) and rounded to binary16: within one binary16 ulp.
    assert np.all(np.abs(got - ref) <= np.spacing(np.abs(ref).astype(np.float16)))
    assert got.shape == (3, 5)


@pytest.mark.parametrize("share", [2, 4])
def test_shared_lane_units(share):
    """``planar_fp_share``: four lanes on two or one lane's binary32 units (the ``ulx3s``
    build before it went to one lane), bit for bit with random stalls: every elementwise op
    with every broadcast kind,
    average and max pooling, reductions over planes and the tensor with every pre- and
    post-operation, reductions across channels (planes of fewer than five beats too), and a
    beat rate of one every ``share`` cycles."""
    cfg = NPUConfig(planar_lanes=2, planar_fp_share=share)
    rng = np.random.default_rng(60 + share)
    jobs = []
    for op in range(14):
        t = ps.random_task(rng, cfg, "eltwise", max_dim=6)
        t["op"] = op
        t["bcast"] = int(rng.integers(0, 5)) if op >= 6 else 0
        jobs.append((t, *ps.random_operands(rng, t)))
    for op in range(3):
        t = ps.make_task(mode=1, op=op, in_fmt=op % 2, out_fmt=1, channels=2, height=7,
                         width=9, kh=3, kw=3, sy=1 + op % 2, sx=1 + op % 2, py=1, px=1)
        jobs.append((t, *ps.random_operands(rng, t)))
    for k in range(10):
        t = ps.make_task(mode=2, axis=k % 3, op=k % 3, pre=k % 5, post=k % 4, in_fmt=k % 2,
                         out_fmt=1, channels=2 + k % 3, height=1 + k % 4, width=3 + k,
                         scale=int(np.float32([1.0, 0.25, -3.0][k % 3]).view(np.uint32)))
        if ps.task_error(t, cfg):
            t["post"] = 0
        assert ps.task_error(t, cfg) == 0, t
        jobs.append((t, *ps.random_operands(rng, t)))
    res = sweep(cfg, jobs, seed=share, stall=0.3)
    # An unstalled 8 x 16 elementwise task: 32 beats, one every `share` cycles.
    t = ps.make_task(mode=0, op=6, in_fmt=1, out_fmt=1, channels=1, height=8, width=16)
    fast = ps.run_tasks(cfg, [(t, *ps.random_operands(rng, t))], seed=0, stall=0)
    assert 32 * share <= fast[0][1] <= 32 * share + 40, fast[0][1]
    assert res


@pytest.mark.slow
def test_reduce_across_channels_full_plane():
    """The largest accumulator plane (HD = 256 beats on four lanes: 16 rows of 64) at heavy
    output back-pressure, and one column more rejected."""
    cfg = NPUConfig(planar_lanes=2)
    rng = np.random.default_rng(5)
    jobs = []
    for c, h, w in [(2, 16, 64), (3, 16, 61)]:
        t = ps.make_task(mode=2, axis=2, op=0, in_fmt=1, out_fmt=1, channels=c, height=h,
                         width=w)
        jobs.append((t, *ps.random_operands(rng, t)))
    too_big = ps.make_task(mode=2, axis=2, op=0, channels=2, height=16, width=65)
    assert ps.task_error(too_big, cfg) == PlanarError.BAD_SHAPE
    jobs.append((too_big, None, None, None))
    sweep(cfg, jobs, seed=3, stall=0.7)


@pytest.mark.parametrize("p,k", [(1, 1), (2, 1), (1, 4),
                                 pytest.param(4, 1, marks=pytest.mark.slow),
                                 pytest.param(8, 3, marks=pytest.mark.slow)])
def test_elaborates(p, k):
    Fragment.get(PlanarEngine(NPUConfig(planar_lanes=p, planar_pool_beats=k)), None)


def test_rejects_bad_lanes():
    with pytest.raises(ValueError, match="power of two"):
        PlanarEngine(NPUConfig(planar_lanes=3))


@pytest.mark.slow
@pytest.mark.parametrize("p,k,seed", [(1, 1, 10), (2, 1, 11), (2, 1, 12), (4, 1, 13),
                                      (2, 3, 14), (1, 4, 15)])
def test_sweep_big(p, k, seed):
    cfg = NPUConfig(planar_lanes=p, planar_pool_beats=k)
    sweep(cfg, random_jobs(cfg, seed, 40 if p < 4 else 12, max_dim=11), seed=seed, stall=0.3)


@pytest.mark.slow
def test_sweep_ice40():
    cfg = preset("ice40")
    sweep(cfg, random_jobs(cfg, 20, 30), seed=20, stall=0.3)


@pytest.mark.slow
def test_sweep_icebreaker():
    """The ``icebreaker`` preset (int8, the integer build): random tasks, most of them in the
    subset it computes."""
    cfg = preset("icebreaker")
    assert cfg.planar_impl == "int8"
    sweep(cfg, random_jobs(cfg, 21, 40, max_dim=11), seed=21, stall=0.3)


def int8_refused(cfg):
    """Tasks outside the integer build's subset, one of each kind (``int8_supported``)."""
    one, half = 0x3F80_0000, 0x3F00_0000
    t = ps.make_task
    shape = {"channels": 2, "height": 3, "width": 5}
    return [
        t(mode="pool", op="avg", kh=2, kw=2, **shape),
        *(t(mode="eltwise", op=op, **shape) for op in ("square", "mul", "fma", "addmul")),
        t(mode="eltwise", op="gain_bias", scale=half, **shape),
        t(mode="eltwise", op="gain_bias", scale=one, bias=0x3FC0_0000, **shape),
        t(mode="eltwise", op="add", bcast=1, scalar=0x4680_0000, **shape),
        t(mode="reduce", pre=4, scale=one, **shape),
        t(mode="reduce", post=1, scale=one, **shape),
        t(mode="reduce", scale=int(pl.recip_count(15)), **shape),
        t(mode="reduce", axis=1, scale=one, channels=9, height=128, width=128),
        t(mode="reduce", axis=2, scale=one, channels=256, height=1, width=3),
    ]


@pytest.mark.parametrize("p", [1, 2])
def test_int8_build(p):
    """The integer build (``planar_impl="int8"``) against the golden model, bit for bit, with
    random stalls: every elementwise operation it computes with every broadcast kind (integer
    SCALAR and BIAS up to the limit), gain-bias with SCALE 0 and 1, max and min pooling, sums
    and max / min over planes, the tensor and channels with every pre-operation it computes;
    and one task of each kind it does not compute, refused with ``UNSUPPORTED``, the golden
    model's error, consuming nothing; the next task runs."""
    cfg = NPUConfig(planar_lanes=p, formats=("int8",), planar_impl="int8")
    rng = np.random.default_rng(30 + p)
    constants = [int(np.float32(v).view(np.uint32))
                 for v in (0, -3, 127, -128, 300, INT8_CONST_LIMIT - 1, 1 - INT8_CONST_LIMIT)]
    jobs = []
    for op in INT8_ELT_OPS:
        for bcast in range(5) if op >= EltOp.ADD else (0, 0):
            t = ps.random_task(rng, cfg, "eltwise", max_dim=6)
            t.update(op=int(op), bcast=bcast, scale=int(rng.choice([0, 0x3F80_0000])),
                     bias=int(rng.choice(constants)), scalar=int(rng.choice(constants)))
            jobs.append((t, *ps.random_operands(rng, t)))
    for mode in ("pool", "reduce") * 4:
        t = ps.random_task(rng, cfg, mode, max_dim=8)
        ps.int8_subset(rng, t)
        jobs.append((t, *ps.random_operands(rng, t)))
    for t in int8_refused(cfg):
        assert ps.task_error(t, cfg) == PlanarError.UNSUPPORTED, t
        jobs.append((t, None, None, None))
    jobs.append(jobs[0])
    results = sweep(cfg, jobs, seed=p, stall=0.25)
    assert all(cycles <= reject_cycles(cfg) for _, cycles, err in results if err)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["float", "int8"])
def test_sweep_verilator(impl):
    """60 random tasks through the Verilator bench (4 lanes, stalls on both bench streams), on
    the binary32 and the integer build."""
    from npu_fpga.toolenv import apply_tool_env
    apply_tool_env()
    cfg = NPUConfig(planar_lanes=2) if impl == "float" else preset("icebreaker")
    jobs = random_jobs(cfg, 30, 60, max_dim=14)
    results = ps.run_verilator(cfg, jobs, seed=30, stall=0.3)
    for (task, a, b, c), (got, _cycles, err) in zip(jobs, results):
        assert err == ps.task_error(task, cfg)
        if not err:
            exp = ps.golden(task, a, b, c, lanes=4)
            assert ps.compare(exp, got, task["out_fmt"]).size == 0, task


def broken_task(rng, config):
    """A valid random task with one field made invalid (the engine rejects it)."""
    while True:
        task = ps.random_task(rng, config, max_dim=4)
        field, value = [("mode", 3), ("op", 15), ("in_fmt", 1), ("out_fmt", 1),
                        ("channels", 0), ("width", 0), ("height", 0), ("axis", 3), ("pre", 9),
                        ("bcast", 6), ("kh", 0), ("kw", 9), ("sx", 0), ("py", 8),
                        ("width", 3000)][int(rng.integers(0, 15))]
        task[field] = value
        if ps.task_error(task, config):
            return task


def test_errors_match_task_error():
    """Random tasks, valid, with one field broken, and with any field values (codes outside
    their enums, zero and huge sizes, empty windows): the engine's error code is the
    specification's, a rejected task consumes nothing and ends within its check's cycles
    (``reject_cycles``), and the next task runs."""
    cfg = NPUConfig(planar_lanes=1, formats=("int8",))
    rng = np.random.default_rng(9)
    jobs = []
    for k in range(60):
        task = [lambda: ps.random_task(rng, cfg, max_dim=4), lambda: broken_task(rng, cfg),
                lambda: broken_task(rng, cfg), lambda: wild_task(rng)][k % 4]()
        while k % 4 == 3 and not ps.task_error(task, cfg):     # no huge valid tasks
            task = wild_task(rng)
        ok = not ps.task_error(task, cfg)
        jobs.append((task, *(ps.random_operands(rng, task) if ok else (None, None, None))))
    results = sweep(cfg, jobs, seed=9, stall=0.2)
    # UNSUPPORTED is the integer build's (test_int8_build).
    assert {err for _, _, err in results} == set(PlanarError) - {PlanarError.UNSUPPORTED}
    assert all(cycles <= reject_cycles(cfg) for _, cycles, err in results if err)


async def program(ctx, dut, task):
    """The task's register writes on the register-write port, then its start beat."""
    for addr, value in task_writes(task):
        ctx.set(dut.writes.valid, 1)
        ctx.set(dut.writes.payload.addr, addr)
        ctx.set(dut.writes.payload.data, value)
        await ctx.tick().until(dut.writes.ready)
    ctx.set(dut.writes.valid, 0)
    ctx.set(dut.task.start.valid, 1)
    await ctx.tick().until(dut.task.start.ready)
    ctx.set(dut.task.start.valid, 0)


@pytest.mark.parametrize("at_once", [False, True])
def test_abort_then_next_task(at_once):
    """An abort in the middle of a task (the task manager's watchdog) clears the datapath: no
    done for it, STATUS not busy, and the next task runs correctly, its CYCLES equal to the
    cycles from the start taken to done. ``at_once``: the same task starts again in the
    cycle after the abort (its registers unchanged), while the registered flush clears the
    datapath."""
    cfg = NPUConfig(planar_lanes=2, planar_pool_beats=3)
    lanes = 4
    rng = np.random.default_rng(21)
    first = ps.make_task(mode=1, op=2, channels=2, height=9, width=13, kh=3, kw=3, sy=1,
                         sx=1, py=1, px=1)
    second = first if at_once else ps.make_task(mode=0, op="fma", bcast=2, in_fmt=1,
                                                out_fmt=1, channels=3, height=4, width=7)
    operands = [ps.random_operands(rng, t) for t in (first, second)]
    streams = [ps.input_streams(t, *ops, lanes) for t, ops in zip((first, second), operands)]
    dut = PlanarEngine(cfg)
    state = {"task": 0, "dones": [], "outputs": [[], []], "cycles": None, "sent": set()}

    def producer(name):
        async def tb(ctx):
            prng = seeded_rng(3, name)
            # Half of the first task's beats, then (after the abort) all of the second's.
            for word in streams[0][name][:len(streams[0][name]) // 2]:
                await stream_put(ctx, getattr(dut, name), word, prng, 0.2)
            state["sent"].add(name)
            while state["task"] == 0:
                await ctx.tick()
            for word in streams[1][name]:
                await stream_put(ctx, getattr(dut, name), word, prng, 0.2)
        return tb

    async def consumer(ctx):
        crng = seeded_rng(3, "out")
        async for _, _, valid, ready, word, abort in ctx.tick().sample(
                dut.out.valid, dut.out.ready, dut.out.payload.as_value(), dut.task.abort):
            if valid and ready:     # a beat taken in the abort's cycle is the first task's
                state["outputs"][0 if abort else state["task"]].append(word)
            ctx.set(dut.out.ready, crng.random() >= 0.2)

    async def watch(ctx):
        async for _, _, done, error in ctx.tick().sample(dut.task.done, dut.task.error):
            if done:
                state["dones"].append((state["task"], error))

    async def control(ctx):
        await program(ctx, dut, first)
        # The abort comes once half of the operands are in (after the task's sizes).
        while len(state["sent"]) < 3:
            await ctx.tick()
        for _ in range(20):
            await ctx.tick()
        data, _ = await csr_read(ctx, dut.csr, PLANAR_ENGINE["STATUS"].offset)
        assert PLANAR_ENGINE.decode(PLANAR_ENGINE.address("STATUS"), data)["busy"] == 1
        ctx.set(dut.task.abort, 1)
        await ctx.tick()
        ctx.set(dut.task.abort, 0)
        if at_once:
            state["task"] = 1
            ctx.set(dut.task.start.valid, 1)
            assert ctx.get(dut.task.start.ready) and not ctx.get(dut.out.valid)
            await ctx.tick()
            ctx.set(dut.task.start.valid, 0)
        else:
            data, _ = await csr_read(ctx, dut.csr, PLANAR_ENGINE["STATUS"].offset)
            assert PLANAR_ENGINE.decode(PLANAR_ENGINE.address("STATUS"), data)["busy"] == 0
            await ctx.tick().repeat(20)     # the producers stop, the pipeline stays empty
            assert not ctx.get(dut.out.valid)
            state["task"] = 1
            await program(ctx, dut, second)
        cycles = 1
        while not ctx.get(dut.task.done):
            await ctx.tick()
            cycles += 1
        await ctx.tick()
        data, _ = await csr_read(ctx, dut.csr, PLANAR_ENGINE["CYCLES"].offset)
        state["cycles"] = (cycles, data)
        while len(state["outputs"][1]) < output_beats(second, lanes):
            await ctx.tick()

    run(dut, control, producer("a"), producer("b"), producer("c"),
        background=[consumer, watch])
    assert state["dones"] == [(1, 0)]
    cycles, register = state["cycles"]
    assert cycles == register
    got = ps.from_beats(state["outputs"][1], ps.output_shape(second), lanes, 1)
    expected = ps.golden(second, *operands[1], lanes=lanes)
    assert ps.compare(expected, got, 1).size == 0
