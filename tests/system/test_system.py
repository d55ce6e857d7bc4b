"""The whole NPU (``npu.top.NPUTop``) running programs from system memory, on the Verilator
system simulation, against the golden system model (``npu_model.system``): final system
memory byte for byte, every queue's status and the exception."""

import numpy as np
import pytest

from npu_model.builder import ProgramBuilder
from npu_model.system import run_program
from npu_sim.programs import int_params, random_program
from npu_sim.system import compare, rtl_run
from npu_spec import dma
from npu_spec.config import PRESETS
from npu_spec.engine import Engine
from npu_spec.taskman import Cause

CFG = PRESETS["small"]
LATENCY = 4


def _int8(rng, shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


_params = int_params


def check(program, *, stall=0.0, seed=0, watchdog=None, expect_retired=False):
    """Run ``program`` on the golden model and the RTL; assert they agree; the summary."""
    golden = run_program(program)
    kwargs = {} if watchdog is None else {"watchdog": watchdog}
    rtl = rtl_run(program, backend="verilator", latency=LATENCY, stall=stall, seed=seed,
                  **kwargs)
    summary = compare(program, golden, rtl)
    assert summary["memory_match"], summary["first_differences"]
    assert summary["match"], summary
    assert any(q.retired for q in golden.queues) == expect_retired
    # Every task that ran left a start and an end (an abort is an end) in the trace.
    assert summary["trace_entries"] == 2 * len(golden.tasks)
    return summary, golden, rtl


def test_conv_relu_pool_through_the_buffer():
    rng = np.random.default_rng(1)
    x = _int8(rng, (4, 10, 12))
    b = ProgramBuilder(CFG)
    xd = b.load(b.input("x", x))
    p = b.conv_relu_pool(xd, _int8(rng, (8, 4, 3, 3)), pad=1, **_params(rng, 8, 36))
    b.store(p, b.output("y", p.shape))
    summary, golden, _ = check(b.build(), stall=0.1, seed=1)
    assert summary["ne_busy_cycles"] > 0 and summary["pe_busy_cycles"] > 0
    assert golden.queues[0].completed == 6


def test_residual_block():
    rng = np.random.default_rng(2)
    x = _int8(rng, (8, 8, 8))
    b = ProgramBuilder(CFG)
    xd = b.load(b.input("x", x))
    k1 = b.dma_kernels(0, b.kernels(_int8(rng, (8, 8, 3, 3)), **_params(rng, 8, 72)))
    k2 = b.dma_kernels(0, b.kernels(_int8(rng, (8, 8, 3, 3)), **_params(rng, 8, 72)))
    h = b.conv(xd, k1, pad=1, act="relu")
    h = b.conv(h, k2, pad=1)
    out = b.relu(b.add(h, xd))
    b.store(out, b.output("y", out.shape))
    check(b.build())


def test_dma_outside_the_window_is_an_engine_error():
    rng = np.random.default_rng(3)
    x = _int8(rng, (2, 4, 4))
    b = ProgramBuilder(CFG, base=64)
    xd = b.load(b.input("x", x))
    limit = CFG.mem_kib * 1024 - 4 * 64
    b.dma(dma.make_transfer(dir=dma.DmaDir.BUF_TO_MEM, fmt=dma.DmaFormat.HALF,
                            mem_addr=limit, buf_addr=xd.addr, sizes=[1], mem_strides=[0],
                            buf_strides=[0]))
    b.store(xd, b.output("y", x.shape))
    program = b.build()
    summary, golden, rtl = check(program, expect_retired=True)
    q = golden.queues[0]
    assert (q.cause, q.engine, q.code) == (Cause.ENGINE, Engine.DMA, dma.DmaError.WINDOW)
    assert summary["error_code"] == Cause.ENGINE
    # Nothing outside the failing task's output changed: memory equals the initial image.
    assert rtl["memory"] == program.memory[:len(rtl["memory"])]


@pytest.mark.parametrize("seed", range(2))
def test_random_programs(seed):
    check(random_program(CFG, 4, seed), stall=0.2, seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["fp16", "mixed"])
def test_formats(fmt):
    for seed in range(3):
        check(random_program(CFG, 4, 100 + seed, fmt=fmt), seed=seed)


@pytest.mark.slow
def test_depthwise_then_pointwise_and_fully_connected():
    rng = np.random.default_rng(4)
    x = _int8(rng, (8, 9, 9))
    b = ProgramBuilder(CFG)
    xd = b.load(b.input("x", x))
    dw = b.dma_kernels(0, b.kernels(_int8(rng, (8, 1, 3, 3)), groups=8, **_params(rng, 8, 9)))
    h = b.conv(xd, dw, pad=1, act="relu")
    pw = b.dma_kernels(0, b.kernels(_int8(rng, (16, 8, 1, 1)), **_params(rng, 16, 8)))
    h = b.conv(h, pw)
    fc = b.dma_kernels(0, b.kernels(_int8(rng, (10, 16, 9, 9)), **_params(rng, 10, 1296)))
    y = b.conv(h, fc)
    b.store(y, b.output("y", y.shape))
    check(b.build(), stall=0.3, seed=4)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(200))
def test_random_programs_slow(seed):
    check(random_program(CFG, 6, 1000 + seed), stall=(seed % 4) / 8, seed=seed)


# ---- bad input: the failing queue retires with the documented status, the other runs -------

def _network(queue, priority, rng, *, base, buffer_from=0, kernel_from=0, config=CFG):
    """A conv -> relu -> pool network on queue ``queue``; returns the builder and the input."""
    b = ProgramBuilder(config, queue=queue, priority=priority, network=queue, base=base,
                       buffer_from=buffer_from, kernel_from=kernel_from)
    x = _int8(rng, (4, 8, 8))
    xd = b.load(b.input("x", x))
    p = b.conv_relu_pool(xd, _int8(rng, (8, 4, 3, 3)), pad=1, **_params(rng, 8, 36))
    b.store(p, b.output("y", p.shape))
    return b


def _two_queues(spoil, rng):
    """Queue 0 (higher priority, runs first) spoiled by ``spoil(builder)``, queue 1 intact."""
    from npu_model.builder import combine
    a = _network(0, 2, rng, base=0)
    spoil(a)
    b = _network(1, 1, rng, base=CFG.mem_kib * 128, buffer_from=16384, kernel_from=2048)
    return combine([a.build(), b.build()])


def _planar_task(builder):
    return next(t for t in builder.tasks if t.engine == Engine.PLANAR)


def _bad_mode(builder):
    """The first planar task's MODE gets mode 3 (no such mode): PlanarError.BAD_MODE."""
    from npu_spec.planar import PLANAR_ENGINE
    task = _planar_task(builder)
    addr = PLANAR_ENGINE.base + PLANAR_ENGINE["MODE"].offset
    task.writes = [(a, (w & ~0x3) | 3 if a == addr else w) for a, w in task.writes]


def _short_operand(builder):
    """The first planar task's operand A is one plane short: the engine waits forever."""
    from npu_spec.dataproc import pe_port_base
    task = _planar_task(builder)
    shape1 = pe_port_base("A") + 2
    task.writes = [(a, w - 1 if a == shape1 else w) for a, w in task.writes]


@pytest.mark.parametrize("case", ["decode", "engine", "timeout", "window"])
def test_bad_input_retires_one_queue(case):
    from npu_spec.planar import PlanarError
    rng = np.random.default_rng(7)
    if case == "decode":
        program = _two_queues(lambda b: None, rng)
        head = program.queue(0).head
        memory = bytearray(program.memory)
        memory[4 * head:4 * head + 1] = b"\x00"          # descriptor 0's magic
        from dataclasses import replace
        program = replace(program, memory=bytes(memory))
    else:
        spoil = {"engine": _bad_mode, "timeout": _short_operand,
                 "window": lambda b: b.dma(dma.make_transfer(
                     dir=dma.DmaDir.BUF_TO_MEM, fmt=dma.DmaFormat.INT8,
                     mem_addr=CFG.mem_kib * 1024, buf_addr=0, sizes=[1], mem_strides=[0],
                     buf_strides=[0]))}[case]
        program = _two_queues(spoil, rng)
    summary, golden, rtl = check(program, watchdog=20_000, expect_retired=True)
    q0, q1 = golden.queue(0), golden.queue(1)
    expected = {"decode": (Cause.DECODE, None, 0),
                "engine": (Cause.ENGINE, Engine.PLANAR, PlanarError.BAD_MODE),
                "timeout": (Cause.TIMEOUT, Engine.PLANAR, 0),
                "window": (Cause.ENGINE, Engine.DMA, dma.DmaError.WINDOW)}[case]
    assert q0.retired and (q0.cause, q0.engine, q0.code) == expected
    assert not q1.retired and q1.completed == 6
    assert summary["error_code"] == expected[0]
    if case != "window":            # (there the failing task comes after the store)
        # The failing queue's output was never stored: it still holds its initial zeros.
        y0 = program.tensor("q0/y")
        assert not any(rtl["memory"][y0.addr:y0.extent[1]])


def fig15_program(config=CFG):
    """Network A (queue 0) switches out after its conv; network B (queue 1, higher
    priority) is pushed once two tasks have run (``late={1: 2}``)."""
    from npu_model.builder import combine
    rng = np.random.default_rng(8)
    a = ProgramBuilder(config, queue=0, priority=1, network=0, base=0)
    x = _int8(rng, (4, 8, 8))
    xd = a.load(a.input("x", x))
    k = a.dma_kernels(0, a.kernels(_int8(rng, (8, 4, 3, 3)), **_params(rng, 8, 36)))
    y = a.conv(xd, k, pad=1, tse=True, dpc=True, tsr=True)          # T2: the switch point
    r = a.relu(y, spc=True, spl=True)                               # T3: resumes
    p = a.max_pool(r, 2)
    a.store(p, a.output("y", p.shape))
    # B in the upper half of the memory, the buffer and the kernel memory.
    b = _network(1, 5, rng, base=config.mem_kib * 128, buffer_from=config.buffer_kib * 256,
                 kernel_from=config.kernel_kib * 128, config=config)
    return combine([a.build(), b.build()])


@pytest.mark.parametrize("preset", ["small", "icebreaker"])
def test_fig15_preemption_with_real_engines(preset):
    """Seed 000 FIG. 15: a higher-priority network arrives while a network runs; the running
    one switches out after its TSE/TSR task, the new one runs to its end, the first resumes
    (SPC/SPL). Both networks' outputs equal the golden model's runs without a switch. Also on
    the ``icebreaker`` preset (the lean task manager: one task at a time)."""
    program = fig15_program(PRESETS[preset])
    golden = run_program(program)
    rtl = rtl_run(program, backend="verilator", latency=LATENCY, late={1: 2})
    summary = compare(program, golden, rtl)
    assert summary["match"], summary
    assert rtl["registers"]["SWITCHES"] == 1
    # B's six tasks ran between A's conv and A's relu.
    starts = [(q, t) for t, _, end, _, q, _ in rtl["trace"] if not end]
    assert starts == [(0, 0), (0, 1), (0, 2)] + [(1, i) for i in range(6)] + \
        [(0, 3), (0, 4), (0, 5)]
    if PRESETS[preset].taskman_impl == "lean":
        # One task at a time: every start is followed by its own end.
        assert [(end, q, t) for t, _, end, _, q, _ in rtl["trace"]] == \
            [(e, q, t) for q, t in starts for e in (0, 1)]


def test_lean_task_manager_runs_a_network():
    """The ``icebreaker`` preset's NPU (lean task manager) runs a conv -> relu -> pool network
    with memory stalls: memory byte for byte and queue status equal the golden model's."""
    rng = np.random.default_rng(11)
    b = _network(0, 1, rng, base=0, config=PRESETS["icebreaker"])
    summary, golden, _ = check(b.build(), stall=0.1, seed=2)
    assert golden.queues[0].completed == 6


def _two_core_program(config, cores):
    rng = np.random.default_rng(9)
    x = _int8(rng, (8, 9, 10))
    w = _int8(rng, (16, 8, 3, 3))
    prm = _params(rng, 16, 72)
    b = ProgramBuilder(config)
    xd = b.load(b.input("x", x))
    if cores == 2:
        halves = [b.dma_kernels(i, b.kernels(w[8 * i:8 * i + 8],
                                             **{k: v[8 * i:8 * i + 8] for k, v in prm.items()}))
                  for i in range(2)]
        y = b.conv(xd, halves, pad=1, act="relu")
    else:
        y = b.conv(xd, b.dma_kernels(0, b.kernels(w, **prm)), pad=1, act="relu")
    b.store(y, b.output("y", y.shape))
    return b.build()


def test_two_cores_golden_equals_one_core():
    from npu_model.system import read_tensor
    config = PRESETS["ecp5"]
    outs = []
    for cores in (1, 2):
        program = _two_core_program(config, cores)
        outs.append(read_tensor(run_program(program).memory, program.tensor("y")))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.slow
def test_two_cores_on_one_layer():
    config = PRESETS["ecp5"]
    program = _two_core_program(config, 2)
    golden = run_program(program)
    rtl = rtl_run(program, backend="verilator", latency=LATENCY)
    summary = compare(program, golden, rtl)
    assert summary["match"], summary
    # One neural engine task ran, on both cores.
    assert [e for _, e, end, _, _, _ in rtl["trace"] if not end].count(Engine.NEURAL) == 1


@pytest.mark.slow
def test_ulx3s_one_lane_planar_engine():
    """The ``ulx3s`` preset (a one-lane planar engine, ``planar_lanes=1``, with a one-bank
    line buffer, and a one-lane post-processor): a convolution with ReLU, an average pooling,
    a mean over each plane, a mean across channels, an elementwise product in binary16 and a
    reciprocal square root of a sum of squares, byte for byte with the golden system model."""
    cfg = PRESETS["ulx3s"]
    assert cfg.planar_lanes == 1 and cfg.ne_post_lanes == 1
    rng = np.random.default_rng(15)
    x = _int8(rng, (4, 9, 11))
    b = ProgramBuilder(cfg)
    xd = b.load(b.input("x", x))
    k = b.dma_kernels(0, b.kernels(_int8(rng, (4, 4, 3, 3)), **_params(rng, 4, 36)))
    h = b.conv(xd, k, pad=1, act="relu")
    avg = b.planar(h, mode="pool", op="avg", kh=3, kw=3, sy=2, sx=2, py=1, px=1, out_fmt="fp16")
    means = b.planar(avg, mode="reduce", op="sum", scale=1 / 30)
    across = b.planar(h, mode="reduce", axis="channel", op="sum", scale=0.25, out_fmt="fp16")
    prod = b.planar(avg, avg, mode="eltwise", op="mul")
    rnorm = b.planar(h, mode="reduce", axis="tensor", op="sum", pre="square", post="rsqrt",
                     out_fmt="fp16")
    for name, ds in (("means", means), ("across", across), ("prod", prod), ("rnorm", rnorm)):
        b.store(ds, b.output(name, ds.shape, ds.fmt))
    summary, golden, _ = check(b.build(), stall=0.1, seed=15)
    assert summary["pe_busy_cycles"] > 0 and not golden.queues[0].retired


@pytest.mark.slow
def test_amaranth_backend():
    """The same bench on the Amaranth simulator (small cases): a load and a store."""
    config = CFG.replace(mem_kib=16)
    b = ProgramBuilder(config)
    x = np.arange(-20, 20, dtype=np.int8).reshape(2, 4, 5)
    xd = b.load(b.input("x", x))
    b.store(xd, b.output("y", x.shape))
    program = b.build()
    rtl = rtl_run(program, backend="amaranth", latency=3, stall=0.2)
    summary = compare(program, run_program(program), rtl)
    assert summary["match"], summary
    assert len(rtl["trace"]) == 4
