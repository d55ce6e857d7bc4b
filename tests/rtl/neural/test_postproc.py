# amaranth: UnusedElaboratable=no
"""Post-processor RTL (npu.neural.postproc) against the golden model (npu_model.postproc),
bit for bit, with random stalls on the result, parameter and output streams."""

import numpy as np
import pytest
from amaranth.hdl import Fragment

from npu.neural.postproc import PostProcessor, pipeline_latency, postproc_config_layout
from npu.neural.postproc_seq import post_processor
from npu_model import fp
from npu_model import postproc as gm
from npu_model.postproc import Act, PostprocConfig
from npu_sim.streams import run_simulation, seeded_rng, stream_get, stream_put
from npu_spec.config import NPUConfig, preset

F32_ONE = 0x3F800000


# --------------------------------------------------------------------------------------------
# packing


def pack(layout, values):
    """Pack a dict of field values (ints, nested dicts or lists for arrays) into an int."""
    word = 0
    for name, field in layout:
        v = values.get(name, 0)
        shape = field.shape
        if hasattr(shape, "elem_shape"):          # ArrayLayout
            w = shape.elem_shape.width if hasattr(shape.elem_shape, "width") else \
                int(shape.elem_shape)
            sub = 0
            for k, x in enumerate(v):
                sub |= (int(x) & ((1 << w) - 1)) << (k * w)
            v = sub
        word |= (int(v) & ((1 << field.width) - 1)) << field.offset
    return word


def unpack_out(layout, word, lanes):
    slot_f = layout["slot"]
    slot = (word >> slot_f.offset) & ((1 << slot_f.width) - 1)
    off = layout["values"].offset
    return slot, np.array([(word >> (off + 16 * i)) & 0xFFFF for i in range(lanes)], np.uint16)


def cfg_word(cfg):
    return pack(postproc_config_layout(), {
        "out_fp16": int(cfg.out_fp16), "act": int(cfg.act), "stochastic": int(cfg.stochastic),
        "zero_point": int(cfg.zero_point), "lo": cfg.lo, "hi": cfg.hi, "alpha": cfg.alpha,
        "seed": cfg.seed})


# --------------------------------------------------------------------------------------------
# random stimuli


def rand_f32(rng, n, center=False):
    """binary32 patterns: ordinary, near 1, zeros, subnormals, huge, inf, NaN."""
    cls = rng.choice(8, size=n, p=[0.35, 0.25, 0.08, 0.08, 0.08, 0.06, 0.05, 0.05])
    sign = rng.integers(0, 2, n).astype(np.int64) << 31
    frac = rng.integers(0, 1 << 23, n).astype(np.int64)
    exp = np.select([cls == 0, cls == 1, cls == 2, cls == 3, cls == 4, cls == 5, cls == 6],
                    [rng.integers(100, 160, n), rng.integers(120, 131, n), 0, 0,
                     rng.integers(230, 255, n), 255, 255], rng.integers(0, 256, n))
    if center:
        exp = np.where(cls < 2, rng.integers(119, 132, n), exp)
    frac = np.where((cls == 2) | (cls == 5), 0, frac)
    frac = np.where(cls == 6, frac | 1, frac)
    return (sign | (exp << 23) | frac).astype(np.uint32)


def rand_int32(rng, n):
    cls = rng.choice(3, size=n, p=[0.6, 0.25, 0.15])
    small = rng.integers(-100000, 100000, n)
    edge = rng.choice([-(1 << 31), (1 << 31) - 1, 0, -1, 1], n)
    full = rng.integers(-(1 << 31), 1 << 31, n)
    return np.select([cls == 0, cls == 1], [small, edge], full).astype(np.int64) & 0xFFFFFFFF


def rand_int_params(rng):
    c = rng.random()
    if c < 0.7:
        return int(rng.integers(1 << 29, 1 << 31)), int(rng.integers(28, 40))
    if c < 0.8:
        return int(rng.integers(0, 1 << 32)), int(rng.integers(0, 64))   # any pattern
    return int(rng.choice([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF])), \
        int(rng.choice([0, 1, 2, 31, 62, 63]))


def rand_float_scale(rng):
    c = rng.random()
    if c < 0.75:
        return int(fp.f32_bits(np.float32(rng.choice([-1, 1]) * 2.0 ** rng.uniform(-6, 4))))
    return int(rand_f32(rng, 1)[0])


def random_layer(config, cfg, n_groups, rng, fmts=None, center=False):
    """Parameter groups and result beats for a random layer."""
    lanes, slots = config.macs, config.acc_slots
    if fmts is None:
        fmts = []
        if config.has_int8:
            fmts.append(gm.FMT_INT8)
        if config.has_fp16:
            fmts.append(gm.FMT_FP16)
        if config.has_mixed:
            fmts += [gm.FMT_I8F16, gm.FMT_F16I8]
    groups, results = [], []
    for _ in range(n_groups):
        ocg = int(rng.integers(1, slots + 1))
        fmt = int(rng.choice(fmts))
        group = []
        for s in range(ocg):
            if fmt == gm.FMT_INT8:
                scale, shift = rand_int_params(rng)
            else:
                scale, shift = rand_float_scale(rng), int(rng.integers(0, 64))
            group.append((s, scale, shift))
        groups.append(group)
        for s in rng.permutation(ocg):
            acc = rand_int32(rng, lanes) if fmt == gm.FMT_INT8 else rand_f32(rng, lanes, center)
            results.append((fmt, int(s), acc))
    return groups, results


# --------------------------------------------------------------------------------------------
# running


def run_rtl(config, layers, *, seed=0, stall=0.3, stalls=None, lanes_per_cycle=None):
    """Run ``layers`` (a list of ``(cfg, groups, results)``) one after the other through one
    simulation. Before each layer the configuration is set, the LFSRs are loaded and the error
    flag is cleared. Returns, per layer, the outputs and the error flag after each output."""
    dut = post_processor(config, lanes_per_cycle)
    lanes = config.macs
    p_layout = dut.params.payload.shape()
    r_layout = dut.res.payload.shape()
    o_layout = dut.out.payload.shape()
    s_par, s_res, s_out = stalls if stalls is not None else (stall, stall, stall)
    outs = [[] for _ in layers]
    errs = [[] for _ in layers]
    started = []

    async def wait_start(ctx, k):
        while len(started) <= k:
            await ctx.tick()

    async def control(ctx):
        for k, (cfg, _, results) in enumerate(layers):
            while k and len(outs[k - 1]) < len(layers[k - 1][2]):
                await ctx.tick()
            ctx.set(dut.cfg.as_value(), cfg_word(cfg))
            ctx.set(dut.lfsr_load, 1)
            ctx.set(dut.error_clear, 1)
            await ctx.tick()
            ctx.set(dut.lfsr_load, 0)
            ctx.set(dut.error_clear, 0)
            started.append(k)

    async def params(ctx):
        rng = seeded_rng(seed, "params")
        for k, (_, groups, _) in enumerate(layers):
            await wait_start(ctx, k)
            for group in groups:
                for j, (slot, scale, shift) in enumerate(group):
                    word = pack(p_layout, {"slot": slot, "bias": rng.getrandbits(32),
                                           "scale": scale, "shift": shift,
                                           "group_last": j == len(group) - 1})
                    await stream_put(ctx, dut.params, word, rng, s_par)

    async def res(ctx):
        rng = seeded_rng(seed, "res")
        for k, (_, _, results) in enumerate(layers):
            await wait_start(ctx, k)
            for fmt, slot, acc in results:
                word = pack(r_layout, {"fmt": fmt, "slot": slot, "acc": list(acc)})
                await stream_put(ctx, dut.res, word, rng, s_res)

    async def out(ctx):
        rng = seeded_rng(seed, "out")
        for k, (_, _, results) in enumerate(layers):
            for _ in range(len(results)):
                word = await stream_get(ctx, dut.out, rng, s_out)
                outs[k].append(unpack_out(o_layout, word, lanes))
                errs[k].append(ctx.get(dut.error))

    run_simulation(dut, [control, params, res, out])
    return outs, errs


def check(config, layers, **kw):
    """Compare every layer with the golden model; returns per layer (got, want_err, errs)."""
    got_all, errs_all = run_rtl(config, layers, **kw)
    report = []
    for (cfg, groups, results), got, errs in zip(layers, got_all, errs_all):
        want, want_err, _ = gm.run_stream(groups, results, cfg, config.macs, config.formats)
        assert len(got) == len(want)
        for k, ((gs, gv), (ws, wv)) in enumerate(zip(got, want)):
            fmt, _, acc = results[k]
            assert gs == ws, f"beat {k}: slot {gs} != {ws}"
            bad = np.nonzero(gv != wv)[0]
            assert not len(bad), (
                f"beat {k} fmt {fmt} {cfg}: lanes {bad[:4].tolist()} acc "
                f"{[hex(int(acc[i])) for i in bad[:4]]} got "
                f"{[hex(int(gv[i])) for i in bad[:4]]} want "
                f"{[hex(int(wv[i])) for i in bad[:4]]}")
        # The sticky flag after each output: set once a bad beat has been accepted (all beats
        # up to this output have been).
        assert errs[-1] == any(want_err)
        for k, e in enumerate(errs):
            if any(want_err[:k + 1]):
                assert e == 1, f"error flag not set after beat {k}"
        report.append((got, want_err, errs))
    return report




def f32(x):
    return int(fp.f32_bits(np.float32(x)))


# --------------------------------------------------------------------------------------------
# tests

#: Every format, few lanes: the simulator builds it quickly.
TINY = NPUConfig(macs=2, acc_slots=3)


def activation_layers(config, rng, groups_per_layer=2):
    """One layer per (activation, output format), plus stochastic rounding and the int path."""
    layers = []
    for act in Act:
        for out_fp16 in (True, False):
            cfg = PostprocConfig(out_fp16=out_fp16, act=act,
                                 zero_point=int(rng.integers(-128, 128)),
                                 lo=f32(rng.uniform(-4, 0)), hi=f32(rng.uniform(0.5, 8)),
                                 alpha=f32(rng.uniform(-1, 1)), seed=int(rng.integers(1 << 32)))
            fmts = [gm.FMT_FP16, gm.FMT_I8F16, gm.FMT_F16I8]
            groups, results = random_layer(config, cfg, groups_per_layer, rng, fmts=fmts,
                                           center=act >= Act.SIGMOID)
            layers.append((cfg, groups, results))
    for seed in (0xACE1, 0):
        cfg = PostprocConfig(out_fp16=True, act=Act.NONE, stochastic=True, seed=seed)
        layers.append((cfg, *random_layer(config, cfg, groups_per_layer, rng, fmts=[1])))
    for act in (Act.NONE, Act.RELU, Act.CLAMP):
        cfg = PostprocConfig(act=act, zero_point=int(rng.integers(-128, 128)),
                             lo=int(rng.integers(0, 256)), hi=int(rng.integers(0, 256)))
        layers.append((cfg, *random_layer(config, cfg, groups_per_layer + 1, rng, fmts=[0])))
    return layers


def test_every_activation_and_format():
    """Each activation with binary16 and int8 outputs, stochastic rounding, the int32 path
    (TOSA rescale with any multiplier and shift 0..63), in one simulation."""
    rng = np.random.default_rng(1)
    check(TINY, activation_layers(TINY, rng), seed=1)


def exp_inputs(rng):
    """Inputs for exp: a value in every segment of the negative side (core, the 48
    sub-segments of octaves 1..6, tail), segment boundaries, zeros, subnormals, positives,
    infinities and NaN."""
    edges = [-(2.0 ** e) * (1 + k / 8) for e in range(-3, 3) for k in range(8)] + [-8.0]
    inside = [v - rng.uniform(0, 2.0 ** np.floor(np.log2(-v)) / 8) for v in edges]
    values = edges + inside + [-1e-3, -1e-30, -20.0, -1e30, 0.5, 3.0, 70000.0, 1e-40, -1e-40]
    bits = [f32(v) for v in values]
    bits += [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFA00000]
    bits = np.array(bits, np.uint32)
    return bits[rng.permutation(len(bits))]


def test_exp_every_segment():
    """exp (Act.EXP) bit for bit against the model on every segment of the negative side and
    the specials, binary16 and int8 outputs, with scale 1 and with a negative scale."""
    rng = np.random.default_rng(14)
    acc = exp_inputs(rng)
    lanes = TINY.macs
    acc = np.concatenate([acc, np.zeros(-len(acc) % lanes, np.uint32)])
    layers = []
    for out_fp16, scale in ((True, F32_ONE), (True, f32(-0.75)), (False, F32_ONE)):
        cfg = PostprocConfig(out_fp16=out_fp16, act=Act.EXP)
        groups, results = [], []
        for k in range(0, len(acc), lanes):
            groups.append([(0, scale, 0)])
            results.append((gm.FMT_FP16, 0, acc[k:k + lanes]))
        layers.append((cfg, groups, results))
    report = check(TINY, layers, seed=14)
    # Not vacuous: exp of the negative inputs spans (0, 1].
    got = np.concatenate([v for _, v in report[0][0]])
    vals = fp.f16_value(got)
    assert np.nanmin(vals) == 0.0 and np.nanmax(vals) == 1.0 and len(np.unique(got)) > 60


def test_clamp_bounds_in_any_order():
    """ReLU and clamp bit for bit against the model with bounds in either order, equal, of
    either zero sign, infinite or NaN, on inputs at and around the bounds, the zeros, the
    infinities and NaN (the maximum and the minimum are worked out side by side in the RTL)."""
    rng = np.random.default_rng(15)
    nan, inf, minf, mzero = 0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000
    bounds = [(f32(-1.5), f32(2.0)), (f32(2.0), f32(-1.5)), (f32(0.75), f32(0.75)),
              (mzero, 0), (0, mzero), (minf, inf), (inf, minf), (nan, f32(1.0)),
              (f32(-1.0), nan), (f32(-3.0), f32(-2.0))]
    edges = sorted({b for pair in bounds for b in pair if b != nan})
    acc = [0, mzero, inf, minf, nan, 0xFFC00001, f32(1e-40), f32(-1e-40)]
    for b in edges:      # each bound and its neighbours
        acc += [b, (b + 1) & 0xFFFFFFFF, (b - 1) & 0xFFFFFFFF]
    acc += [f32(v) for v in rng.uniform(-4, 4, 24)]
    lanes = TINY.macs
    acc = np.array(acc + [0] * (-len(acc) % lanes), np.uint32)
    layers = []
    for lo, hi in bounds:
        for act in (Act.CLAMP, Act.RELU):
            cfg = PostprocConfig(out_fp16=True, act=act, lo=lo, hi=hi)
            groups = [[(0, F32_ONE, 0)] for _ in range(0, len(acc), lanes)]
            results = [(gm.FMT_FP16, 0, acc[k:k + lanes]) for k in range(0, len(acc), lanes)]
            layers.append((cfg, groups, results))
    report = check(TINY, layers, seed=15)
    # Not vacuous: bounds out of order clamp everything to hi (here -1.5, 0xBE00 in binary16)
    # but the NaNs.
    swapped = np.concatenate([v for _, v in report[2][0]])
    nans = np.count_nonzero(((acc >> 23) & 0xFF == 0xFF) & (acc & 0x7FFFFF != 0))
    assert nans >= 4 and np.count_nonzero(swapped == 0xBE00) == len(acc) - nans


def test_errors_sticky_and_zeros():
    """Unsupported combinations give zeros and set the sticky flag; results still flow; the
    flag stays set over later good beats until cleared; a good layer leaves it clear."""
    rng = np.random.default_rng(2)
    layers = []
    # int32 accumulators with a float-only activation, then good float beats
    cfg = PostprocConfig(act=Act.LEAKY, alpha=f32(0.5))
    g1, r1 = random_layer(TINY, cfg, 1, rng, fmts=[0])
    g2, r2 = random_layer(TINY, cfg, 1, rng, fmts=[1])
    layers.append((cfg, g1 + g2, r1 + r2))
    # int32 accumulators with binary16 output
    cfg = PostprocConfig(out_fp16=True)
    layers.append((cfg, *random_layer(TINY, cfg, 1, rng, fmts=[0])))
    # unknown activation code
    cfg = PostprocConfig(out_fp16=True, act=12)
    layers.append((cfg, *random_layer(TINY, cfg, 1, rng, fmts=[1])))
    # a good layer
    cfg = PostprocConfig(out_fp16=True, act=Act.TANH)
    layers.append((cfg, *random_layer(TINY, cfg, 1, rng, fmts=[1, 0][:1])))
    report = check(TINY, layers, seed=2)
    assert report[0][2][-1] == 1 and report[0][1][0] and not report[0][1][-1]
    for got, want_err, _ in report[1:3]:
        assert all(want_err) and all((v == 0).all() for _, v in got)
    assert not any(report[3][2])


def test_bank_double_buffering_stalls():
    """Many small groups, heavy random stalls on each stream in turn (the slowest one decides
    the pace): results must use their own group's parameters, looked up by slot."""
    rng = np.random.default_rng(3)
    layers = []
    for fmt in (0, 1):
        cfg = PostprocConfig(out_fp16=bool(fmt), act=Act.NONE)
        layers.append((cfg, *random_layer(TINY, cfg, 5, rng, fmts=[fmt])))
    for k, stalls in enumerate([(0.8, 0.1, 0.1), (0.1, 0.8, 0.1), (0.1, 0.1, 0.8)]):
        check(TINY, layers, seed=30 + k, stalls=stalls)


def test_small_preset():
    config = preset("small")
    rng = np.random.default_rng(4)
    layers = []
    for act, out_fp16, fmts in [(Act.GELU, True, [1, 2, 3]), (Act.CLAMP, False, [0])]:
        cfg = PostprocConfig(out_fp16=out_fp16, act=act, zero_point=5, lo=f32(-1.0),
                             hi=f32(3.0), alpha=f32(0.1), stochastic=out_fp16, seed=77)
        if fmts == [0]:
            cfg = PostprocConfig(act=act, zero_point=5, lo=0xF8, hi=0x60)
        layers.append((cfg, *random_layer(config, cfg, 1, rng, fmts=fmts,
                                          center=act == Act.GELU)))
    check(config, layers, seed=4)


def test_ice40_int8_only():
    """The int8-only build: the int path is exact; fp16 output or float results are errors."""
    config = preset("ice40")
    rng = np.random.default_rng(5)
    layers = []
    for act in (Act.NONE, Act.RELU, Act.CLAMP):
        cfg = PostprocConfig(act=act, zero_point=int(rng.integers(-128, 128)), lo=0xE0,
                             hi=0x30)
        layers.append((cfg, *random_layer(config, cfg, 3, rng)))
    cfg = PostprocConfig(out_fp16=True)
    layers.append((cfg, *random_layer(config, cfg, 1, rng)))
    cfg = PostprocConfig()
    layers.append((cfg, *random_layer(config, cfg, 1, rng, fmts=[1])))
    report = check(config, layers, seed=5)
    for got, want_err, errs in report[3:]:
        assert all(want_err) and errs[-1] == 1 and all((v == 0).all() for _, v in got)


def _run_rate(config, n_groups, param_lead, lanes_per_cycle=None):
    """Results back to back with the output always ready; returns the handshake cycles of
    results and parameters and the cycles with a valid output."""
    cfg = PostprocConfig(out_fp16=True)
    rng = np.random.default_rng(6)
    dut = PostProcessor(config, lanes_per_cycle)
    p_layout, r_layout = dut.params.payload.shape(), dut.res.payload.shape()
    slots = config.acc_slots
    accepted, produced, p_accepted = [], [], []

    async def params(ctx):
        cycle = 0
        for g in range(n_groups):
            for s in range(slots):
                ctx.set(dut.params.valid, 1)
                ctx.set(dut.params.payload.as_value(), pack(p_layout, {
                    "slot": s, "scale": F32_ONE, "group_last": s == slots - 1}))
                while True:
                    _, _, ready = await ctx.tick().sample(dut.params.ready)
                    if ready:
                        p_accepted.append(cycle)
                    cycle += 1
                    if ready:
                        break
        ctx.set(dut.params.valid, 0)

    async def res(ctx):
        cycle = 0
        for _ in range(param_lead):
            await ctx.tick()
            cycle += 1
        for k in range(n_groups * slots):
            ctx.set(dut.res.valid, 1)
            ctx.set(dut.res.payload.as_value(), pack(r_layout, {
                "fmt": 1, "slot": k % slots, "acc": list(rand_f32(rng, config.macs))}))
            while True:
                _, _, ready = await ctx.tick().sample(dut.res.ready)
                if ready:
                    accepted.append(cycle)
                cycle += 1
                if ready:
                    break
        ctx.set(dut.res.valid, 0)

    async def out(ctx):
        ctx.set(dut.out.ready, 1)
        cycle = 0
        while len(produced) < n_groups * slots:
            _, _, valid = await ctx.tick().sample(dut.out.valid)
            if valid:
                produced.append(cycle)
            cycle += 1

    async def control(ctx):
        ctx.set(dut.cfg.as_value(), cfg_word(cfg))

    run_simulation(dut, [control, params, res, out])
    return accepted, p_accepted, produced, dut


@pytest.mark.parametrize("config", [TINY, preset("ice40")], ids=["tiny", "ice40"])
def test_full_rate_and_latency(config):
    """Once the first group's parameters are in, one result per cycle: the next group's
    parameters fill the other bank while the current group drains. The output is valid
    `pipeline_latency` cycles after the handshake, one beat per cycle."""
    n_groups = 5
    accepted, p_accepted, produced, dut = _run_rate(config, n_groups, param_lead=0)
    n = n_groups * config.acc_slots
    assert accepted == list(range(accepted[0], accepted[0] + n)), "result stream stalled"
    assert accepted[0] == p_accepted[config.acc_slots - 1] + 1
    assert produced[0] - accepted[0] == pipeline_latency(config) == dut.latency
    assert produced == list(range(produced[0], produced[0] + n))


def test_results_wait_for_params():
    """Results offered long before any parameters wait (nothing taken) and then flow."""
    config = TINY
    rng = np.random.default_rng(7)
    cfg = PostprocConfig(out_fp16=True)
    layers = [(cfg, *random_layer(config, cfg, 3, rng, fmts=[1]))]
    check(config, layers, seed=7, stalls=(0.95, 0.0, 0.0))


def test_folded_lanes():
    """`lanes_per_cycle` below the lane count: the same results, one beat per
    `cycles_per_beat` cycles, same latency for the last sub-beat."""
    config = NPUConfig(macs=4, acc_slots=3)
    rng = np.random.default_rng(8)
    layers = [layer for layer in activation_layers(config, rng, groups_per_layer=1)
              if layer[0].out_fp16 or layer[0].act in (Act.NONE, Act.CLAMP)][::2]
    check(config, layers, seed=8, lanes_per_cycle=1)
    check(preset("ice40"), [(PostprocConfig(act=Act.RELU, zero_point=-3),
                             *random_layer(preset("ice40"), PostprocConfig(), 3, rng))],
          seed=9, lanes_per_cycle=2)
    n_groups = 3
    accepted, _, produced, dut = _run_rate(config, n_groups, 0, lanes_per_cycle=2)
    n = n_groups * config.acc_slots
    assert dut.cycles_per_beat == 2
    assert accepted == list(range(accepted[0], accepted[0] + 2 * n, 2))
    assert produced == [a + dut.latency for a in accepted]


def test_folded_stochastic_rounding():
    """Folded lanes keep each lane's LFSR state in a memory and advance it at the lane's own
    sub-beat: stochastic rounding over several layers (each reloading its seed, one seed 0)
    with several beats per slot equals the model, with random stalls, at 1 and 2 lanes per
    cycle."""
    config = NPUConfig(macs=4, acc_slots=3)
    rng = np.random.default_rng(21)
    layers = []
    for seed in (0xACE1, 0, 0x1234_5678):
        cfg = PostprocConfig(out_fp16=True, act=Act.NONE, stochastic=True, seed=seed)
        layers.append((cfg, *random_layer(config, cfg, 3, rng, fmts=[gm.FMT_FP16])))
    for lanes_per_cycle in (1, 2):
        check(config, layers, seed=21 + lanes_per_cycle, lanes_per_cycle=lanes_per_cycle)


def test_bad_config_rejected():
    with pytest.raises(TypeError, match="NPUConfig"):
        PostProcessor("small")
    with pytest.raises(ValueError, match="lanes_per_cycle"):
        PostProcessor(TINY, 3)


def test_elaborates_fp16_only():
    Fragment.get(PostProcessor(NPUConfig(macs=2, acc_slots=1, formats=("fp16",))), None)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_random_sweep_small_slow(seed):
    """Every activation, both outputs, stochastic rounding and the int path on 16 lanes."""
    rng = np.random.default_rng(100 + seed)
    config = preset("small")
    check(config, activation_layers(config, rng, groups_per_layer=3), seed=seed)


@pytest.mark.slow
def test_fp16_only_build_slow():
    config = NPUConfig(macs=4, acc_slots=2, formats=("fp16",))
    rng = np.random.default_rng(200)
    layers = activation_layers(config, rng)
    check(config, layers, seed=200)
