"""Golden post-processor (npu_model.postproc) against independent references: Python integers
and fractions for the rescale and the roundings, numpy float32/float16 for the float path,
float64 math for the piecewise-linear functions, statistics for stochastic rounding."""

import math
from fractions import Fraction

import numpy as np
import pytest

from npu_model import fp
from npu_model import postproc as gm
from npu_model.postproc import Act, PostprocConfig

LANES = 64


def f32(x):
    return int(fp.f32_bits(np.float32(x)))


def rand_f32(rng, n):
    cls = rng.choice(6, size=n, p=[0.5, 0.2, 0.1, 0.08, 0.06, 0.06])
    sign = rng.integers(0, 2, n).astype(np.int64) << 31
    frac = rng.integers(0, 1 << 23, n).astype(np.int64)
    exp = np.select([cls == 0, cls == 1, cls == 2, cls == 3, cls == 4],
                    [rng.integers(110, 145, n), rng.integers(0, 256, n), 0, 255, 255],
                    rng.integers(100, 110, n))
    frac = np.where(cls == 3, 0, frac)
    frac = np.where(cls == 4, frac | 1, frac)
    return (sign | (exp << 23) | frac).astype(np.uint32)


def canon16(h):
    """Map numpy float16 results to bit patterns with canonical NaN."""
    bits = np.asarray(h, np.float16).view(np.uint16)
    nan = np.isnan(np.asarray(h, np.float16))
    return np.where(nan, fp.F16_QNAN, bits).astype(np.uint16)


def np32(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


# --------------------------------------------------------------------------------------------
# int32 path


def tosa_reference(acc, scale, shift):
    """floor(acc * scale / 2**shift + 1/2) with exact fractions (round half up)."""
    scale = scale - (1 << 32) if scale >> 31 else scale
    return math.floor(Fraction(acc * scale, 1 << shift) + Fraction(1, 2))


def test_int_rescale_against_fractions_and_fp():
    rng = np.random.default_rng(1)
    for _ in range(400):
        acc = [int(v) for v in rng.integers(-(1 << 31), 1 << 31, 8)] + [-(1 << 31), (1 << 31) - 1]
        scale = int(rng.integers(0, 1 << 32))
        shift = int(rng.integers(0, 64))
        got = gm.int_rescale(acc, scale, shift)
        assert got == [tosa_reference(a, scale, shift) for a in acc]
        # Where the TOSA ranges hold, the existing rescale_int32 agrees (before clamping).
        if scale < (1 << 31) and 2 <= shift <= 62:
            want = fp.rescale_int32(np.array(acc), scale, shift, qmin=-(1 << 31),
                                    qmax=(1 << 31) - 1)
            clipped = np.clip(got, -(1 << 31), (1 << 31) - 1)
            assert (want == clipped).all()


def test_int_rescale_half_up():
    # 5 * 1 / 2 = 2.5 -> 3; -5 / 2 = -2.5 -> -2
    assert gm.int_rescale([5, -5, 3, -3], 1, 1) == [3, -2, 2, -1]


@pytest.mark.parametrize("act", [Act.NONE, Act.RELU, Act.CLAMP])
def test_int_path(act):
    rng = np.random.default_rng(int(act))
    for _ in range(100):
        acc = rng.integers(-(1 << 31), 1 << 31, LANES)
        scale = int(rng.integers(1 << 28, 1 << 31))
        shift = int(rng.integers(25, 45))
        zp = int(rng.integers(-128, 128))
        lo, hi = int(rng.integers(-128, 128)), int(rng.integers(-128, 128))
        cfg = PostprocConfig(act=act, zero_point=zp, lo=lo & 0xFF, hi=hi & 0xFF)
        vals, _ = gm.postprocess(acc.astype(np.int32), gm.FMT_INT8, scale, shift, cfg)
        got = vals.view(np.int16)
        for i in range(LANES):
            y = tosa_reference(int(acc[i]), scale, shift) + zp
            if act == Act.RELU:
                y = max(y, zp)
            elif act == Act.CLAMP:
                y = min(max(y, lo), hi)
            assert got[i] == min(max(y, -128), 127), (i, y)


# --------------------------------------------------------------------------------------------
# float path


def float_reference(x, act, cfg):
    """numpy float32 version of the activations (NaN handled by canonicalising later)."""
    with np.errstate(all="ignore"):
        if act == Act.RELU:
            return np.where(np.isnan(x), x, np.maximum(x, np.float32(0)))
        if act == Act.CLAMP:
            lo, hi = np32(cfg.lo), np32(cfg.hi)
            return np.minimum(np.maximum(x, lo), hi)
        if act == Act.LEAKY:
            return np.where(x < 0, x * np32(cfg.alpha), x)
        if act == Act.ABS:
            return np.abs(x)
    return x


@pytest.mark.parametrize("act", [Act.NONE, Act.RELU, Act.CLAMP, Act.LEAKY, Act.ABS])
@pytest.mark.parametrize("out_fp16", [True, False])
def test_float_path_against_numpy(act, out_fp16):
    rng = np.random.default_rng(10 + int(act))
    for _ in range(60):
        acc = rand_f32(rng, LANES)
        scale = int(rand_f32(rng, 1)[0]) if rng.random() < 0.3 else f32(rng.uniform(-4, 4))
        zp = int(rng.integers(-128, 128))
        cfg = PostprocConfig(out_fp16=out_fp16, act=act, zero_point=zp,
                             lo=f32(rng.uniform(-5, 0)), hi=f32(rng.uniform(0, 5)),
                             alpha=f32(rng.uniform(-1, 1)))
        fmt = int(rng.choice([gm.FMT_FP16, gm.FMT_I8F16, gm.FMT_F16I8]))
        got, _ = gm.postprocess(acc, fmt, scale, 0, cfg)
        with np.errstate(all="ignore"):
            x = np32(acc) * np32(scale)
            y = float_reference(x, act, cfg).astype(np.float32)
            y16 = y.astype(np.float16)
        if out_fp16:
            want = canon16(y16)
            assert (got == want).all(), (got, want)
        else:
            yy = np.asarray(y, np.float64)
            r = np.where(np.isnan(yy), 0, np.clip(np.nan_to_num(yy, posinf=1e9, neginf=-1e9),
                                                  -1000, 1000))
            q = np.clip(np.rint(r) + zp, -128, 127).astype(np.int64)  # rint: half to even
            assert (got.view(np.int16) == q).all()


def test_f32_to_int_rne_against_python_round():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-300, 300, 5000).astype(np.float32),
                        np.arange(-260, 260, 0.5, dtype=np.float32)])
    got = gm.f32_to_int_rne(fp.f32_bits(x))
    want = [min(max(round(float(v)), -256), 255) for v in x]  # round(): half to even
    assert got.tolist() == want


# --------------------------------------------------------------------------------------------
# piecewise-linear functions


def math_reference(name, x):
    if name == "sigmoid":
        return [1.0 / (1.0 + math.exp(-v)) if v > -700 else 0.0 for v in x]
    if name == "tanh":
        return [math.tanh(v) for v in x]
    if name == "exp":
        return [math.exp(min(v, 0.0)) for v in x]
    return [0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x]


@pytest.mark.parametrize("name", gm.PWL_FUNCS)
def test_pwl_error_bound_over_all_binary16(name):
    h = np.arange(1 << 16, dtype=np.uint32)
    h = h[((h >> 10) & 0x1F) != 0x1F]
    x32 = fp.f16_to_f32(h)
    xv = fp.f32_value(x32).astype(np.float64)
    ref = np.array(math_reference(name, xv.tolist()))
    y = gm.pwl(name, x32)
    err = np.abs(fp.f32_value(y).astype(np.float64) - ref)
    assert err.max() <= gm.PWL_ERROR_BOUND[name]
    y16 = fp.f16_value(fp.f32_to_f16(y)).astype(np.float64)
    assert np.abs(y16 - ref).max() <= gm.PWL_ERROR_BOUND_F16[name]
    # The model's own measurement agrees with this one.
    assert gm.pwl_max_error(name)[0] == pytest.approx(err.max(), rel=1e-9)


@pytest.mark.parametrize("name", gm.PWL_FUNCS)
def test_pwl_specials(name):
    inf, ninf = 0x7F800000, 0xFF800000
    y = gm.pwl(name, np.array([inf, ninf, 0x7FC00001, 0xFFFFFFFF, 0, 0x80000000, f32(100.0),
                               f32(-100.0)], np.uint32))
    lim = {"sigmoid": (1.0, 0.0), "tanh": (1.0, -1.0), "gelu": (math.inf, -0.0),
           "exp": (1.0, 0.0)}[name]
    v = fp.f32_value(y)
    assert v[0] == lim[0] and v[1] == lim[1]
    assert y[2] == fp.F32_QNAN and y[3] == fp.F32_QNAN
    # The core segments are anchored at f(0): zeros stay exact (0.5, 0, 0, 1).
    assert float(v[4]) == float(v[5]) == math_reference(name, [0.0])[0]
    assert abs(float(v[6]) - math_reference(name, [100.0])[0]) <= 1e-6 * 100
    assert abs(float(v[7]) - math_reference(name, [-100.0])[0]) <= 1e-9


def test_exp_is_exp_of_nonpositive():
    """exp: 1 for every x >= 0 (x > 0 is clamped to 0), and within its bound of math.exp on
    random binary32 inputs (not only binary16 ones), tail included."""
    rng = np.random.default_rng(9)
    pos = fp.f32_bits(rng.uniform(0, 70000, 2000).astype(np.float32))
    assert (gm.pwl("exp", pos) == f32(1.0)).all()
    xs = rng.uniform(-12, 0, 20000).astype(np.float32)
    y = fp.f32_value(gm.pwl("exp", fp.f32_bits(xs))).astype(np.float64)
    ref = np.exp(xs.astype(np.float64))
    assert np.abs(y - ref).max() <= 1.02 * gm.PWL_ERROR_BOUND["exp"]


def test_pwl_segment_intervals():
    """Every binary32 value falls in the interval of its segment."""
    rng = np.random.default_rng(5)
    x = fp.f32_bits(rng.uniform(-20, 20, 20000).astype(np.float32))
    seg = gm.pwl_segment(x)
    xv = np.abs(fp.f32_value(x).astype(np.float64))
    for k, v in zip(seg.tolist(), xv.tolist()):
        lo, hi = gm.pwl_segment_interval(k)
        assert lo <= v < hi
    assert gm.PWL_RANGE == 8.0
    a, b = gm.pwl_tables()["tanh"]
    assert a.shape == b.shape == (128,)


def test_activation_pwl_in_postprocess():
    rng = np.random.default_rng(6)
    acc = fp.f32_bits(rng.uniform(-10, 10, LANES).astype(np.float32))
    for act, name in zip((Act.SIGMOID, Act.TANH, Act.GELU, Act.EXP), gm.PWL_FUNCS, strict=True):
        cfg = PostprocConfig(out_fp16=True, act=act)
        got, _ = gm.postprocess(acc, gm.FMT_FP16, f32(0.5), 0, cfg)
        x = fp.f32_value(fp.f32_mul(acc, f32(0.5))).astype(np.float64)
        ref = np.array(math_reference(name, x.tolist()))
        # PWL error (binary32 inputs lie between the binary16 ones the bound was measured
        # on: 2% margin) plus half a binary16 ulp of the result.
        half_ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(ref), 2.0 ** -14))) - 11)
        err = np.abs(fp.f16_value(got).astype(np.float64) - ref)
        assert (err <= 1.02 * gm.PWL_ERROR_BOUND[name] + half_ulp).all()


# --------------------------------------------------------------------------------------------
# stochastic rounding and the LFSR


def _matmul(a, b):
    """GF(2) 32x32 matrices as lists of column masks: (a @ b) column j = a applied to b[j]."""
    out = []
    for col in b:
        v = 0
        for i in range(32):
            if (col >> i) & 1:
                v ^= a[i]
        out.append(v)
    return out


def test_lfsr_is_maximal_length():
    """The one-step transition matrix has order exactly 2**32 - 1."""
    step = [int(gm.lfsr_step(np.uint64(1 << i))) for i in range(32)]
    ident = [1 << i for i in range(32)]

    def power(e):
        r, base = ident, step
        while e:
            if e & 1:
                r = _matmul(base, r)
            base = _matmul(base, base)
            e >>= 1
        return r

    n = (1 << 32) - 1
    assert power(n) == ident
    for q in (3, 5, 17, 257, 65537):
        assert power(n // q) != ident


def test_lfsr_definition():
    assert int(gm.lfsr_step(np.uint64(1))) == gm.LFSR_TAPS
    assert int(gm.lfsr_step(np.uint64(2))) == 1
    s = np.array([0xDEADBEEF], np.uint32)
    t = s.astype(np.uint64)
    for _ in range(16):
        t = gm.lfsr_step(t)
    assert gm.lfsr_advance(s)[0] == t[0]
    init = gm.lfsr_init(0x9E3779B9, 4)
    assert (init != 0).all() and init[0] == 0x9E3779B9   # zero state replaced


def sr_reference(bits, rnd):
    """Stochastic rounding by exact fractions: truncate |x| to 13 bits below the binary16 LSB,
    add rnd / 2**13 LSB, truncate at the LSB."""
    x = Fraction(float(np.uint32(bits).view(np.float32)))
    if math.isinf(float(np.uint32(bits).view(np.float32))):
        return float(np.uint32(bits).view(np.float32))
    mag = abs(x)
    e = math.floor(math.log2(mag)) if mag else -30
    q = Fraction(2) ** max(e - 10, -24)
    t = math.floor(mag / q * 8192)
    m = (t + rnd) >> 13
    v = m * q
    v = math.inf if v >= 65536 else float(v)
    return -v if x < 0 or (x == 0 and bits >> 31) else v


def test_stochastic_against_fractions():
    rng = np.random.default_rng(8)
    x = fp.f32_bits(np.concatenate([
        rng.uniform(-70000, 70000, 300), rng.uniform(-1, 1, 300) * 2.0 ** -15,
        rng.uniform(-2, 2, 300), [0.0, -0.0, 65504.0, 65519.0, 65535.0, 1e-9]]
    ).astype(np.float32))
    rnd = rng.integers(0, 1 << 13, x.shape[0])
    got = fp.f16_value(gm.f32_to_f16_stochastic(x, rnd)).astype(np.float64)
    for g, b, r in zip(got.tolist(), x.tolist(), rnd.tolist()):
        want = sr_reference(b, r)
        assert g == want and math.copysign(1, g) == math.copysign(1, want), (hex(b), r)
    specials = gm.f32_to_f16_stochastic(np.array([0x7FC00000, 0x7F800001, 0xFF800000]), 0x1FFF)
    assert specials.tolist() == [0x7E00, 0x7E00, 0xFC00]


def test_stochastic_unbiased_and_reproducible():
    x = f32(1.0 + 0.3 * 2 ** -10)      # 0.3 ulp above 1.0
    y = f32(-(2.0 + 0.75 * 2 ** -9))  # 0.75 ulp below -2.0
    cfg = PostprocConfig(out_fp16=True, stochastic=True, seed=12345)
    acc = np.array([x, y] * (LANES // 2), np.uint32)
    state = None
    outs = []
    for _ in range(200):
        v, state = gm.postprocess(acc, gm.FMT_FP16, F32_ONE, 0, cfg, state)
        outs.append(fp.f16_value(v).astype(np.float64))
    outs = np.array(outs)
    mean_x = outs[:, 0::2].mean()
    mean_y = outs[:, 1::2].mean()
    n = outs[:, 0::2].size
    assert abs(mean_x - (1.0 + 0.3 * 2 ** -10)) < 4 * 0.46 * 2 ** -10 / math.sqrt(n)
    assert abs(mean_y + (2.0 + 0.75 * 2 ** -9)) < 4 * 0.44 * 2 ** -9 / math.sqrt(n)
    assert set(np.unique(outs[:, 0::2])) == {1.0, 1.0 + 2 ** -10}
    # reproducible: the same seed gives the same sequence; another seed does not
    state = None
    again = []
    for _ in range(200):
        v, state = gm.postprocess(acc, gm.FMT_FP16, F32_ONE, 0, cfg, state)
        again.append(fp.f16_value(v).astype(np.float64))
    assert (np.array(again) == outs).all()
    other = gm.postprocess(acc, gm.FMT_FP16, F32_ONE, 0,
                           PostprocConfig(out_fp16=True, stochastic=True, seed=99))[0]
    first = gm.postprocess(acc, gm.FMT_FP16, F32_ONE, 0, cfg)[0]
    assert (other != first).any()
    # exactly representable values are never changed
    exact = np.full(LANES, f32(1.5), np.uint32)
    v, _ = gm.postprocess(exact, gm.FMT_FP16, F32_ONE, 0, cfg)
    assert (fp.f16_value(v) == 1.5).all()


F32_ONE = 0x3F800000


# --------------------------------------------------------------------------------------------
# errors and banks


def test_beat_errors():
    all_f = ("int8", "fp16", "mixed")
    assert not gm.beat_error(gm.FMT_INT8, PostprocConfig(act=Act.CLAMP), all_f)
    assert gm.beat_error(gm.FMT_INT8, PostprocConfig(act=Act.LEAKY), all_f)
    assert gm.beat_error(gm.FMT_INT8, PostprocConfig(out_fp16=True), all_f)
    assert not gm.beat_error(gm.FMT_FP16, PostprocConfig(act=Act.EXP), all_f)
    assert gm.beat_error(gm.FMT_FP16, PostprocConfig(act=9), all_f)
    assert gm.beat_error(gm.FMT_INT8, PostprocConfig(act=Act.EXP), all_f)
    assert gm.beat_error(gm.FMT_FP16, PostprocConfig(), ("int8",))
    assert gm.beat_error(gm.FMT_INT8, PostprocConfig(), ("fp16",))
    assert not gm.beat_error(gm.FMT_F16I8, PostprocConfig(act=Act.GELU), all_f)
    v, _ = gm.postprocess(np.ones(4, np.uint32), gm.FMT_INT8, 1 << 30, 30,
                          PostprocConfig(out_fp16=True))
    assert (v == 0).all()


def test_run_stream_uses_own_group():
    cfg = PostprocConfig()
    groups = [[(0, 1 << 30, 30), (1, 1 << 30, 29)], [(0, 1 << 30, 28)]]
    acc = np.full(2, 3, np.int64)
    results = [(0, 1, acc), (0, 0, acc), (0, 0, acc)]
    outs, errs, _ = gm.run_stream(groups, results, cfg, 2)
    assert [o[1].view(np.int16)[0] for o in outs] == [6, 3, 12]
    assert not any(errs)
    with pytest.raises(ValueError):
        gm.run_stream(groups, results + results, cfg, 2)


def test_int_path_per_lane_parameters_and_extremes():
    """One call with a scale and shift per lane equals the Python-integer rescale lane by
    lane, including the extremes where ``acc * scale + round`` needs 64 bits."""
    rng = np.random.default_rng(7)
    n = 4096
    acc = rng.integers(-(1 << 31), 1 << 31, n)
    scale = rng.integers(0, 1 << 32, n)
    shift = rng.integers(0, 64, n)
    acc[:8] = [-(1 << 31)] * 4 + [(1 << 31) - 1] * 4
    scale[:8] = [1 << 31, (1 << 31) - 1, 1 << 31, 0x7FFFFFFF] * 2   # 1 << 31 is -2**31
    shift[:8] = [63, 63, 1, 0, 63, 62, 1, 2]
    zp = -3
    cfg = PostprocConfig(zero_point=zp)
    vals, _ = gm.postprocess(acc.astype(np.int32), gm.FMT_INT8, scale, shift, cfg)
    want = [min(max(tosa_reference(int(a), int(s), int(h)) + zp, -128), 127)
            for a, s, h in zip(acc, scale, shift)]
    assert list(vals.view(np.int16)) == want
    assert len(set(want)) > 100       # the sample spans the output range
