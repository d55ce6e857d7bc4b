# amaranth: UnusedElaboratable=no
"""The RTL neural engine (on the engine bench with its data side) against the golden model,
bit for bit; its error codes against the specification's layer rules; an abort."""

import numpy as np
import pytest

from npu.neural.engine import EngineError, NeuralEngine, engine_geometry
from npu_fpga.toolenv import apply_tool_env
from npu_model.conv import ConvLayer, fc_as_conv
from npu_sim.conv import golden_output, layer_fields, random_case, run_rtl, run_rtl_many
from npu_spec.config import preset
from npu_spec.neural import NEURAL_ENGINE, core_base, layer_error, layer_writes

SMALL = preset("small")
ICEBREAKER = preset("icebreaker")


@pytest.fixture(autouse=True)
def _tools():
    apply_tool_env()


def _check(cases, results, config=SMALL):
    for i, (case, (got, stats)) in enumerate(zip(cases, results)):
        exp, _ = golden_output(case, config)
        assert not stats["error"], (i, case.layer, stats)
        bad = np.argwhere(exp != got)
        assert bad.size == 0, (i, case.layer, f"{len(bad)} outputs differ, first at "
                               f"{tuple(bad[0])}: golden {exp[tuple(bad[0])]:#06x} rtl "
                               f"{got[tuple(bad[0])]:#06x}")
        assert stats["cycles"] > 0 and 0 < stats["mac_active"] <= stats["cycles"]


# Non-power-of-two shapes, shapes smaller than a work unit, strides 1-2, padding, dilation,
# groups and depthwise, every format, every kernel encoding, sparsity 0-90%, activations.
QUICK = [
    (dict(channels=3, height=7, width=9, out_channels=5, kh=3, kw=3, pad=1, fmt="int8"),
     dict(activation="relu")),
    (dict(channels=4, height=9, width=9, out_channels=6, kh=3, kw=3, stride=2, pad=1,
          fmt="fp16"), dict(activation="leaky")),
    (dict(channels=8, height=6, width=6, out_channels=8, kh=3, kw=3, pad=1, groups=8,
          fmt="int8"), dict(sparsity=0.3)),
    (dict(channels=6, height=6, width=10, out_channels=12, kh=3, kw=3, pad=2, dilation=2,
          groups=3, fmt="f16i8"), dict(activation="sigmoid")),
    (dict(channels=5, height=5, width=5, out_channels=9, kh=1, kw=1, fmt="i8f16"), {}),
    (dict(channels=4, height=6, width=6, out_channels=8, kh=3, kw=3, pad=1, fmt="fp16"),
     dict(sparsity=0.7, palette_bits=4, activation="gelu")),
    (dict(channels=4, height=5, width=6, out_channels=8, kh=3, kw=3, pad=1, fmt="int8"),
     dict(palette_bits=2, sparse=False, activation="clamp")),
    (dict(channels=3, height=2, width=3, out_channels=3, kh=2, kw=2, fmt="fp16"),
     dict(activation="tanh", stochastic=True)),
    (dict(channels=3, height=5, width=5, out_channels=3, kh=5, kw=5, pad=2, fmt="int8"),
     dict(sparsity=0.9)),
]


def test_layers_verilator_with_stalls():
    cases = [random_case(SMALL, ConvLayer(**la), seed=100 + i, **kw)
             for i, (la, kw) in enumerate(QUICK)]
    results = run_rtl_many([dict(case=c, stall=0.25) for c in cases], SMALL,
                           backend="verilator", stall=0.25, seed=3)
    _check(cases, results)


def test_fully_connected_both_mappings():
    cases = [random_case(SMALL, fc_as_conv(40, 21, 3, "int8", "weights"), seed=5),
             random_case(SMALL, fc_as_conv(24, 10, 5, "fp16", "batch"), seed=6)]
    _check(cases, run_rtl_many([dict(case=c) for c in cases], SMALL, backend="verilator"))


def test_every_work_unit_shape():
    layer = ConvLayer(3, 9, 11, 9, 3, 3, pad=1, fmt="int8")
    max_rows = engine_geometry(SMALL)[0]
    shapes = [w for w in range(5) if SMALL.macs >> w <= max_rows]
    assert shapes == [2, 3, 4]         # 4x4, 8x2, 16x1
    cases = [random_case(SMALL, layer, seed=7, log2w=w) for w in shapes]
    _check(cases, run_rtl_many([dict(case=c, stall=0.1) for c in cases], SMALL,
                               backend="verilator"))


def test_every_stride():
    """Strides 1 to 7 (the input buffer keeps each row in the stride's order), with dilation
    and padding, int8 and fp16, against the golden model."""
    cases = []
    for s in range(1, 8):
        d = 1 + s % 3
        layer = ConvLayer(2, 3 * s + 4, 4 * s + 5, 3, 2, 3, stride=s, dilation=d, pad=s % 2,
                          fmt="int8" if s % 2 else "fp16")
        cases.append(random_case(SMALL, layer, seed=200 + s))
        assert int(layer_error(layer_fields(cases[-1]), SMALL)) == EngineError.NONE.value
    _check(cases, run_rtl_many([dict(case=c, stall=0.1) for c in cases], SMALL,
                               backend="verilator"))


@pytest.mark.slow
def test_ulx3s_every_stride_on_every_shape_that_takes_it():
    """The ``ulx3s`` core builds its stride order for strides 1 to 4 only (no shape's halo
    row takes more) and its shifter for the rotations each column is read at
    (``npu_spec.neural.shift_beats``): each stride on the shapes that take it, with dilation
    and the widest offsets, int8 and fp16, against the golden model. Slow: a Verilator
    build."""
    config = preset("ulx3s")
    layers = [  # (log2w, layer)
        (5, ConvLayer(2, 3, 36, 3, 1, 1, fmt="int8")),
        (4, ConvLayer(2, 5, 40, 3, 2, 2, stride=2, fmt="fp16")),
        (4, ConvLayer(2, 4, 32, 3, 1, 3, dilation=7, pad=1, fmt="int8")),
        (3, ConvLayer(2, 12, 30, 3, 3, 3, stride=3, dilation=5, pad=1, fmt="fp16")),
        (3, ConvLayer(2, 9, 34, 3, 2, 2, stride=4, dilation=3, fmt="int8")),
        (3, ConvLayer(2, 7, 20, 3, 1, 3, stride=2, dilation=7, pad=1, fmt="int8")),
        (3, ConvLayer(2, 6, 34, 3, 1, 4, dilation=7, fmt="fp16")),
    ]
    cases = [random_case(config, layer, seed=300 + i, log2w=lw)
             for i, (lw, layer) in enumerate(layers)]
    for case in cases:
        assert int(layer_error(layer_fields(case), config)) == EngineError.NONE.value
    _check(cases, run_rtl_many([dict(case=c, stall=0.1) for c in cases], config,
                               backend="verilator"), config)


def test_bad_programs_set_error_and_the_next_layer_runs():
    good = random_case(SMALL, ConvLayer(2, 5, 5, 3, 3, 3, pad=1, fmt="int8"), seed=9)
    wide = random_case(SMALL, ConvLayer(2, 5, 40, 3, 3, 3, stride=2, fmt="int8"), seed=9,
                       log2w=4)                              # halo 33 > 32 values
    deep = random_case(SMALL, ConvLayer(90, 3, 3, 2, 3, 3, fmt="int8"), seed=9)
    body_words = len(good.groups_enc[0].body) // 4
    runs = [
        dict(case=good, overrides={"OUT_SIZE": dict(out_h=0, out_w=5)}),
        dict(case=good, overrides={"KERNEL": dict(kh=17, kw=3, stride=1, dilation=1, pad=1)}),
        dict(case=wide),
        dict(case=deep),
        dict(case=good, kernel_patch={3: body_words - 1}),      # short kernel body
        dict(case=good, overrides={"POST_CTRL": 12 << 4}),       # no such activation
        dict(case=good, stall=1.0),                              # data never arrives
        dict(case=good),
    ]
    results = run_rtl_many(runs, SMALL, backend="verilator")
    codes = [stats["error_code"] for _, stats in results]
    assert codes == [EngineError.SHAPE.value, EngineError.KERNEL.value, EngineError.HALO.value,
                     EngineError.BUFFER.value, EngineError.EXTRACT.value,
                     EngineError.POSTPROC.value, EngineError.TIMEOUT.value, 0]
    assert all(stats["error"] for _, stats in results[:-1])
    assert all(not stats["busy"] for _, stats in results)
    _check([good], results[-1:])


def test_amaranth_backend_and_missing_format():
    """The same design in amaranth.sim; a format the build leaves out is refused."""
    ice40 = preset("ice40")
    ok = random_case(ice40, ConvLayer(2, 3, 4, 2, 2, 2, fmt="int8"), seed=11)
    fp = random_case(SMALL, ConvLayer(2, 3, 4, 2, 2, 2, fmt="fp16"), seed=11)
    results = run_rtl_many([dict(case=fp), dict(case=ok)], ice40, backend="amaranth",
                           stall=0.2)
    assert results[0][1]["error"] and results[0][1]["error_code"] == EngineError.FORMAT.value
    _check([ok], results[1:], ice40)


def test_dense_3x3_utilization():
    """Cycle counts, not time: a dense 3x3 layer with 16 channels keeps the MACs >= 90% busy."""
    case = random_case(SMALL, ConvLayer(16, 8, 8, 16, 3, 3, pad=1, fmt="int8"), seed=12)
    case.weights[case.weights == 0] = 1
    case.groups_enc.clear()
    case.__post_init__()
    got, stats = run_rtl(case, SMALL, backend="verilator")
    _check([case], [(got, stats)])
    # One MAC cycle per coefficient and work unit, none for anything else.
    h = SMALL.macs // case.width
    units = -(-8 // h) * -(-8 // case.width)
    assert stats["mac_active"] == case.nonzero_weights * units == 16 * 16 * 9 * units
    assert 16 * 8 * 8 * 16 * 9 / (16 * stats["cycles"]) >= 0.9


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_random_sweep(seed):
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(10):
        fmt = ["int8", "fp16", "f16i8", "i8f16"][int(rng.integers(4))]
        groups = int(rng.choice([1, 1, 2, 3]))
        dw = rng.random() < 0.2
        icpg = 1 if dw else int(rng.integers(1, 6))
        ocpg = 1 if dw else int(rng.integers(1, 7))
        if dw:
            groups = int(rng.integers(2, 12))
        k = int(rng.choice([1, 2, 3, 5]))
        stride = int(rng.integers(1, 3))
        dil = int(rng.choice([1, 1, 2]))
        pad = int(rng.integers(0, k))
        span = dil * (k - 1) + 1
        h = int(rng.integers(max(1, span - 2 * pad), 14))
        w = int(rng.integers(max(1, span - 2 * pad), 14))
        layer = ConvLayer(icpg * groups, h, w, ocpg * groups, k, k, stride=stride, pad=pad,
                          dilation=dil, groups=groups, fmt=fmt)
        pal = int(rng.choice([0, 0, 1, 2, 4, 6, 8]))
        sp = float(rng.choice([0.0, 0.3, 0.5, 0.9]))
        act = str(rng.choice(["none", "relu", "clamp"] if fmt == "int8" else
                             ["none", "relu", "leaky", "abs", "sigmoid", "tanh", "gelu"]))
        cases.append(random_case(SMALL, layer, seed=1000 * seed + i, sparsity=sp,
                                 palette_bits=pal, activation=act,
                                 stochastic=bool(rng.random() < 0.3) and fmt != "int8"))
    _check(cases, run_rtl_many([dict(case=c, stall=0.3) for c in cases], SMALL,
                               backend="verilator", stall=0.3, seed=seed))


def _faulty(rng, case):
    """Random faults for ``case``'s registers: ``(overrides, the layer's fields with them)``.
    The faults either stop the layer before its kernels are read (zero sizes, kernel 17, an
    unbuilt work unit, a halo too wide, a group too deep for the buffer) or leave the kernel
    stream well formed (an activation the format lacks or no activation at all, a palette
    width the format does not have)."""
    fields = layer_fields(case)
    changes = {}
    for _ in range(int(rng.integers(1, 3))):
        fault = int(rng.integers(7))
        if fault == 0:
            changes[str(rng.choice(["groups", "icpg", "ocpg", "in_h", "in_w", "out_h", "out_w",
                                    "kh", "kw", "stride", "dilation"]))] = 0
        elif fault == 1:
            changes[str(rng.choice(["kh", "kw"]))] = int(rng.integers(17, 32))
        elif fault == 2:
            changes["log2w"] = int(rng.choice([0, 1, 5, 9, 15]))
        elif fault == 3:
            changes.update(log2w=4, stride=int(rng.integers(3, 8)))
        elif fault == 4:
            changes["icpg"] = 256 // fields["kh"] + int(rng.integers(1, 5))
        elif fault == 5:
            changes["act"] = int(rng.choice([3, 4, 5, 8, 12, 15]))
        else:
            changes["palette"] = int(rng.choice([3, 5, 7, 9, 15]))
    fields.update(changes)
    overrides = {}
    for reg in NEURAL_ENGINE.registers:
        if any(f.name in changes for f in reg.fields):
            word = 0
            for f in reg.fields:
                word |= (fields[f.name] & f.max) << f.offset
            overrides[reg.name] = word      # raw: may hold codes the encoder refuses
    return overrides, fields


def test_error_codes_follow_the_layer_rules():
    """Random bad layers: the engine's code is npu_spec.neural.layer_error's, and a good layer
    after them runs."""
    rng = np.random.default_rng(21)
    good = random_case(SMALL, ConvLayer(2, 5, 6, 3, 3, 3, pad=1, fmt="int8"), seed=22,
                       sparsity=0.3, palette_bits=2, activation="clamp")
    runs, expect = [], []
    while len(runs) < 16:
        overrides, fields = _faulty(rng, good)
        code = layer_error(fields, SMALL)
        if code == EngineError.NONE.value:
            continue
        runs.append(dict(case=good, overrides=overrides))
        expect.append(int(code))
    runs.append(dict(case=good))
    results = run_rtl_many(runs, SMALL, backend="verilator")
    assert [stats["error_code"] for _, stats in results] == expect + [0]
    assert sorted(set(expect)) == [2, 3, 4, 5, 6, 8]    # every code these faults can give
    _check([good], results[-1:])


@pytest.mark.parametrize("delay", [20, pytest.param(90, marks=pytest.mark.slow)])
def test_abort_then_next_layer(delay):
    """An abort ``delay`` cycles into a layer (its rows being loaded, or its commands issued)
    ends it without a done; the next layer runs correctly."""
    from npu_sim.conv import commands, load_commands, parse_run
    from npu_sim.conv_harness import DATA_WIDTH, conv_bench
    from npu_sim.engine_bench import BenchProgram
    from npu_sim.streams import run_simulation, stream_get, stream_put

    first = random_case(SMALL, ConvLayer(4, 6, 6, 10, 3, 3, pad=1, fmt="int8"), seed=31)
    second = random_case(SMALL, ConvLayer(3, 5, 5, 4, 3, 3, pad=1, fmt="fp16"), seed=32,
                         activation="relu")
    bench = conv_bench(SMALL)
    engine = bench.engine
    program = load_commands(first, SMALL, bench, BenchProgram(DATA_WIDTH)).start()
    commands(second, SMALL, bench, program=program)
    responses, dones = [], []

    async def producer(ctx):
        for beat in program.beats:
            await stream_put(ctx, bench.cmd, beat)

    async def consumer(ctx):
        for _ in range(program.expected):
            responses.append(await stream_get(ctx, bench.res))

    async def abort(ctx):
        await ctx.tick().until(engine.task.start.valid & engine.task.start.ready)
        await ctx.tick().repeat(delay)
        assert not dones, "the first layer ended before the abort"
        ctx.set(engine.task.abort, 1)
        await ctx.tick()
        ctx.set(engine.task.abort, 0)

    async def watch(ctx):
        async for _, _, done in ctx.tick().sample(engine.task.done):
            if done:
                dones.append(1)

    run_simulation(bench, [producer, consumer, abort], processes=[watch])
    records = program.parse([int(r) for r in responses])
    assert len(dones) == 1          # the second layer's
    got, stats = parse_run(records, second, SMALL)
    _check([second], [(got, stats)])


def _every_pair(items):
    """A sequence of ``items`` in which every ordered pair (with repeats) follows once: a de
    Bruijn sequence of order 2, made linear."""
    k = len(items)
    seq, a = [], [0] * 3

    def db(t, p):
        if t > 2:
            if 2 % p == 0:
                seq.extend(a[1:p + 1])
        else:
            a[t] = a[t - p]
            db(t + 1, p)
            for j in range(a[t - p] + 1, k):
                a[t] = j
                db(t + 1, t)
    db(1, 1)
    return [items[i] for i in seq + seq[:1]]


def _build_formats(config):
    names = {"int8": ["int8"], "fp16": ["fp16"], "mixed": ["i8f16", "f16i8"]}
    return [f for name in config.formats for f in names[name]]


@pytest.mark.parametrize("kernels", ["dense", "sparse", "mixed"])
def test_consecutive_layers_every_format_pair(kernels):
    """Layers one after the other on one core, every ordered pair of the build's formats, each
    layer's kernels and registers written while the layer before it runs (as the task manager
    does): both layers of each pair bit for bit as the golden model. The shapes are those of a
    system program that failed: a 3x3 stride-2 padded layer (4 -> 8 channels, 2x3 input), then
    a 1x2 layer (8 -> 4 channels, 1x2 input, 1x1 output), alternately."""
    from npu_sim.conv import run_rtl_overlapped

    formats = _every_pair(_build_formats(SMALL))
    pairs = set(zip(formats, formats[1:]))
    assert len(pairs) == len(formats) - 1 == len(_build_formats(SMALL)) ** 2
    shapes = [dict(channels=4, height=2, width=3, out_channels=8, kh=3, kw=3, stride=2, pad=1),
              dict(channels=8, height=1, width=2, out_channels=4, kh=1, kw=2)]
    cases = []
    for i, fmt in enumerate(formats):
        sparse = {"dense": False, "sparse": True, "mixed": i % 3 != 1}[kernels]
        case = random_case(SMALL, ConvLayer(**shapes[i % 2], fmt=fmt), seed=300 + i,
                           sparsity=0.5, sparse=sparse)
        case.kernel_addr = 0 if i % 2 == 0 else 700      # clear of the layer before
        cases.append(case)
    _check(cases, run_rtl_overlapped(cases, SMALL, backend="verilator"))


def _run_with_host_writes(config, cases, pokes):
    """Run ``cases`` one after the other on ``config``'s core through the engine bench, the
    host writing ``pokes`` (``(register offset, word)``) into the core's CSR bus from 10
    cycles after the first start. Returns ``(records of the bench, whether the core was still
    busy after the writes, the CSR error strobes seen in the cycle after each write)``."""
    from amaranth.hdl import Signal

    from npu_sim.conv import commands
    from npu_sim.conv_harness import DATA_WIDTH, ConvDataSide
    from npu_sim.engine_bench import EngineBench
    from npu_sim.streams import run_simulation, stream_get, stream_put

    class HostBench(EngineBench):
        """The engine bench with a host write port into the engine's CSR bus."""
        def __init__(self, engine):
            super().__init__(engine, ConvDataSide(engine), data_width=DATA_WIDTH)
            self.host_en = Signal()
            self.host_addr = Signal(len(engine.csr.addr))
            self.host_data = Signal(32)

        def elaborate(self, platform):
            m = super().elaborate(platform)
            csr = self.engine.csr
            with m.If(self.host_en):
                m.d.comb += [csr.addr.eq(self.host_addr), csr.w_en.eq(1),
                             csr.w_data.eq(self.host_data)]
            return m

    bench = HostBench(NeuralEngine(config))
    engine = bench.engine
    program = None
    for case in cases:
        program, _ = commands(case, config, bench, program=program)
    responses, poked, errors = [], [], []

    async def producer(ctx):
        for beat in program.beats:
            await stream_put(ctx, bench.cmd, beat)

    async def consumer(ctx):
        for _ in range(program.expected):
            responses.append(await stream_get(ctx, bench.res))

    async def host(ctx):
        # Early in the first layer, while its first kernels are decoded.
        await ctx.tick().until(engine.task.start.valid & engine.task.start.ready)
        await ctx.tick().repeat(10)
        for addr, value in pokes:
            ctx.set(bench.host_en, 1)
            ctx.set(bench.host_addr, addr)
            ctx.set(bench.host_data, value)
            await ctx.tick()
            ctx.set(bench.host_en, 0)
            errors.append(ctx.get(engine.csr.error))
        poked.append(ctx.get(bench.active))

    run_simulation(bench, [producer, consumer, host])
    return program.parse([int(r) for r in responses]), poked == [1], errors


def test_writes_while_a_layer_runs_are_for_the_next_layer():
    """The core samples its layer registers at the start: the next layer's registers written
    into the register file while a layer runs (here by the host, whose writes never wait) leave
    the running layer as it was. The layers of a system program that ended with EXTRACT when
    the core read its registers live: an i8f16 3x3 stride-2 layer, then a sparse f16i8 1x2
    layer."""
    from npu_sim.conv import parse_run

    first = random_case(SMALL, ConvLayer(4, 2, 3, 8, 3, 3, stride=2, pad=1, fmt="i8f16"),
                        seed=41)
    second = random_case(SMALL, ConvLayer(8, 1, 2, 4, 1, 2, fmt="f16i8"), seed=42,
                         sparsity=0.5, sparse=True)
    second.kernel_addr = 700
    base = core_base(0)
    pokes = [(addr - base, value) for addr, value in layer_writes(layer_fields(second))]
    records, busy, errors = _run_with_host_writes(SMALL, [first, second], pokes)
    assert busy, "the first layer ended before the writes"
    assert errors == [0] * len(pokes)
    results = [parse_run(records[:5], first, SMALL), parse_run(records[5:], second, SMALL)]
    _check([first, second], results)


def test_lean_control_refuses_host_writes_while_busy():
    """The lean layer control (``ne_control="lean"``, the ``icebreaker`` preset's) reads the
    register file itself: a host write to a layer register while a layer runs is refused with
    the CSR error strobe and changes nothing, so the running layer is bit-exact; the host may
    still write the control registers (no error). The layer clamps, so its int8 bounds come
    from the 8 bits of ``POST_LO`` and ``POST_HI`` the lean register file keeps
    (``npu_spec.neural.core_register_map``). amaranth.sim."""
    from npu_sim.conv import parse_run

    case = random_case(ICEBREAKER, ConvLayer(2, 5, 6, 3, 3, 3, pad=1, fmt="int8"), seed=61,
                       activation="clamp")
    other = dict(layer_fields(case), ocpg=2, out_h=1, kh=1, kw=2, zero_point=5, lo=3)
    base = core_base(0)
    pokes = [(addr - base, value ^ 0x5A5) for addr, value in layer_writes(other)]
    pokes.append((NEURAL_ENGINE["CTRL"].offset, 0))
    records, busy, errors = _run_with_host_writes(ICEBREAKER, [case], pokes)
    assert busy, "the layer ended before the writes"
    assert errors == [1] * (len(pokes) - 1) + [0]
    _check([case], [parse_run(records, case, ICEBREAKER)], ICEBREAKER)


@pytest.mark.slow
def test_lean_ice40_build():
    """The iCE40 build with the dense int8 kernel extractor and the sequential post-processor:
    dense int8 layers are bit-exact; a sparse or palettized kernel ends the layer with EXTRACT,
    as the layer rules (and the golden model's extractor rule) say. Slow: a Verilator build
    of its own (minutes)."""
    lean = preset("ice40").replace(kernel_extract="dense_int8", postproc_impl="sequential")
    cases = [random_case(lean, ConvLayer(3, 6, 7, 5, 3, 3, pad=1, fmt="int8"), seed=31,
                         sparsity=0.3, sparse=False, activation="relu"),
             random_case(lean, ConvLayer(9, 4, 4, 8, 1, 1, fmt="int8"), seed=32,
                         activation="clamp"),
             random_case(lean, ConvLayer(2, 5, 5, 3, 3, 3, fmt="int8"), seed=33,
                         sparsity=0.5),
             random_case(lean, ConvLayer(2, 5, 5, 3, 3, 3, fmt="int8"), seed=34,
                         palette_bits=2, sparse=False)]
    for k, case in enumerate(cases):
        fields = layer_fields(case)
        want = EngineError.NONE if k < 2 else EngineError.EXTRACT
        assert int(layer_error(fields, lean)) == want.value
        assert int(layer_error(fields, preset("ice40"))) == EngineError.NONE.value
    results = run_rtl_many([dict(case=c, stall=0.2) for c in cases], lean,
                           backend="verilator", stall=0.2, seed=5)
    _check(cases[:2], results[:2], lean)
    assert [stats["error_code"] for _, stats in results[2:]] == [EngineError.EXTRACT.value] * 2



def test_icebreaker_core_refuses_what_its_buffer_cannot_hold():
    """The ``icebreaker`` preset's lean core (8-value halo rows, 128 rows a bank, 8 bits a
    buffered value, no result queue, output-channel counters for 1024 channels, work-unit
    counters for outputs of 255 x 255, the lean layer control): a layer whose halo row or
    whose group's rows exceed its input buffer, or with more output channels or columns than
    it counts, which the ``ice40`` core runs, ends with ``HALO``, ``BUFFER`` or ``SHAPE`` as
    ``layer_error`` says; a layer after them is bit-exact. amaranth.sim, small layers."""
    good = random_case(ICEBREAKER, ConvLayer(2, 5, 6, 3, 3, 3, pad=1, fmt="int8"), seed=41,
                       activation="relu")
    wide = random_case(ICEBREAKER, ConvLayer(1, 3, 10, 2, 3, 3, fmt="int8"), seed=42,
                       log2w=3)                             # halo 10 > 8 values
    deep = random_case(ICEBREAKER, ConvLayer(45, 3, 3, 2, 3, 3, fmt="int8"), seed=43)
    # 45 channels x 3 kernel rows = 135 > 128 rows
    many = dict(layer_fields(good), ocpg=1025)              # 1025 > 1024 output channels
    large = dict(layer_fields(good), out_w=256)             # 256 > 255 output columns
    cases = [(wide, EngineError.HALO), (deep, EngineError.BUFFER), (good, EngineError.NONE)]
    for fields, code in [(layer_fields(c), code) for c, code in cases] + [
            (many, EngineError.SHAPE), (large, EngineError.SHAPE)]:
        assert int(layer_error(fields, ICEBREAKER)) == code.value
        assert int(layer_error(fields, preset("ice40"))) == EngineError.NONE.value
    runs = [dict(case=c) for c, _ in cases]
    runs.insert(2, dict(case=good, overrides={"OCPG": dict(ocpg=1025)}))
    out_h = layer_fields(good)["out_h"]
    runs.insert(3, dict(case=good, overrides={"OUT_SIZE": dict(out_h=out_h, out_w=256)}))
    results = run_rtl_many(runs, ICEBREAKER, backend="amaranth", stall=0.2, seed=4)
    assert [stats["error_code"] for _, stats in results] == [
        EngineError.HALO.value, EngineError.BUFFER.value, EngineError.SHAPE.value,
        EngineError.SHAPE.value, 0]
    _check([good], results[-1:], ICEBREAKER)


@pytest.mark.slow
@pytest.mark.parametrize("name, changes", [
    ("icebreaker", {}),
    ("icebreaker", dict(result_queue=2, ne_row_values=16, ne_buffer_rows=64)),
    ("small", dict(result_queue=1, ne_row_values=16, ne_buffer_rows=96)),
    ("ulx3s", {}),
], ids=["icebreaker", "icebreaker-queue2-rows16", "small-queue1", "ulx3s"])
def test_lean_core_fields(name, changes):
    """The lean core's fields (``result_queue``, ``ne_row_values``, ``ne_buffer_rows``; and
    the 8-bit input buffer of int8-only builds) keep every result bit-exact, with stalls;
    ``small`` with a one-entry result queue and a 16-value, 96-row buffer (not a power of two)
    as well; ``ulx3s`` (32-value rows, 13-bit channel counters, a one-lane post-processor,
    the shared-float MAC array) in every format. Slow: a Verilator build per configuration."""
    config = preset(name).replace(**changes)
    fmts = ["int8"] if not config.has_float else ["int8", "fp16", "f16i8"]
    cases = [random_case(config, ConvLayer(3, 7, 9, 10, 3, 3, pad=1, fmt=fmts[0]), seed=51,
                         activation="relu"),
             random_case(config, ConvLayer(8, 6, 6, 8, 3, 3, pad=1, groups=8, fmt=fmts[-1]),
                         seed=52, sparse=False, sparsity=0.2),
             random_case(config, ConvLayer(9, 4, 4, 12, 1, 1, fmt=fmts[0]), seed=53,
                         activation="clamp"),
             random_case(config, fc_as_conv(30, 11, 2, "int8", "weights"), seed=54)]
    for case in cases:
        assert int(layer_error(layer_fields(case), config)) == EngineError.NONE.value
    results = run_rtl_many([dict(case=c, stall=0.2) for c in cases], config,
                           backend="verilator", stall=0.2, seed=6)
    _check(cases, results, config)


@pytest.mark.slow
def test_shared_float_mac_rates():
    """The engine on the shared-float MAC array (`mac_impl="ecp5_shared"`, the ulx3s preset's,
    here 16 lanes and 4 float units): bit-exact in int8 and fp16; int8 keeps the MACs >= 90%
    busy, a float command takes `fp_share` cycles, so fp16 runs at a quarter of the rate."""
    cfg = SMALL.replace(mac_impl="ecp5_shared", fp_share=4)
    cases = []
    for fmt in ("int8", "fp16"):
        case = random_case(cfg, ConvLayer(16, 8, 8, 16, 3, 3, pad=1, fmt=fmt), seed=12)
        if fmt == "int8":
            case.weights[case.weights == 0] = 1
        case.groups_enc.clear()
        case.__post_init__()
        cases.append(case)
    results = run_rtl_many([dict(case=c) for c in cases], cfg, backend="verilator")
    _check(cases, results, cfg)
    h = cfg.macs // cases[0].width
    units = -(-8 // h) * -(-8 // cases[0].width)
    (_, int8), (_, fp16) = results
    commands = [c.nonzero_weights * units for c in cases]
    assert [int8["mac_active"], fp16["mac_active"]] == commands
    assert commands[0] == 16 * 16 * 9 * units and commands[0] / int8["cycles"] >= 0.9
    assert fp16["cycles"] >= cfg.fp_share * commands[1]
    assert commands[1] * cfg.fp_share / fp16["cycles"] >= 0.9
    print(f"int8 {int8['cycles']} cycles for {commands[0]} commands, fp16 {fp16['cycles']} "
          f"cycles for {commands[1]} commands ({cfg.macs} lanes, fp_share {cfg.fp_share})")
