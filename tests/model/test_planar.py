"""The planar engine's golden model against independent references (numpy float32/float64).

numpy's float32 arithmetic is IEEE binary32 with round-to-nearest-even, so every single
binary32 operation of the model must agree with it bit for bit (NaNs compared as a class); whole
modes are checked against float64 within the bounds stated in docs/planar.md.
"""

import numpy as np
import pytest

from npu_model import fp
from npu_model import planar as pl

I8, F16 = pl.FMT_INT8, pl.FMT_FP16


def rand_input(rng, shape, fmt, specials=False):
    if fmt == I8:
        return rng.integers(-128, 128, shape).astype(np.int8)
    v = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 30.0, 3000.0], shape))
    h = v.astype(np.float16).view(np.uint16)
    if specials:
        h = h.copy().reshape(-1)
        sp = np.array([0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x83FF, 0x7BFF],
                      dtype=np.uint16)
        idx = rng.choice(h.size, min(h.size, 8), replace=False)
        h[idx] = sp[:idx.size]
        h = h.reshape(shape)
    return h


def as_f32(x, fmt):
    return (x.astype(np.float32) if fmt == I8
            else x.view(np.float16).astype(np.float32))


def out_of(y32, fmt):
    """Second converter by numpy: binary32 values to int8 (RNE, saturate, NaN->0) or f16."""
    if fmt == F16:
        return y32.astype(np.float16).view(np.uint16)
    with np.errstate(invalid="ignore"):
        r = np.rint(y32.astype(np.float64))
        r = np.where(np.isnan(r), 0, np.clip(r, -128, 127))
    return r.astype(np.int8)


def same(got, exp, fmt):
    if fmt == F16:
        g = got.view(np.float16)
        e = exp.view(np.float16)
        return np.array_equal(np.isnan(g), np.isnan(e)) and np.array_equal(
            got[~np.isnan(g)], exp[~np.isnan(e)])
    return np.array_equal(got, exp)


NUMPY_ELT = {
    "copy": lambda a, b, c, s, t: a,
    "relu": lambda a, b, c, s, t: np.where(np.isnan(a), a, np.maximum(a, np.float32(0))),
    "abs": lambda a, b, c, s, t: np.abs(a),
    "neg": lambda a, b, c, s, t: -a,
    "square": lambda a, b, c, s, t: a * a,
    "gain_bias": lambda a, b, c, s, t: a * s + t,
    "add": lambda a, b, c, s, t: a + b,
    "sub": lambda a, b, c, s, t: a - b,
    "mul": lambda a, b, c, s, t: a * b,
    "max": lambda a, b, c, s, t: np.maximum(a, b),
    "min": lambda a, b, c, s, t: np.minimum(a, b),
    "cmp": lambda a, b, c, s, t: np.sign(np.where(np.isnan(a - b), 0, a - b)).astype(np.float32),
    "fma": lambda a, b, c, s, t: a + b * c,
    "addmul": lambda a, b, c, s, t: (a + b) * c,
}


@pytest.mark.parametrize("op", list(pl.ELT_OPS))
@pytest.mark.parametrize("fmts", [(I8, I8), (I8, F16), (F16, F16), (F16, I8)])
def test_eltwise_vs_numpy_float32(op, fmts):
    in_fmt, out_fmt = fmts
    rng = np.random.default_rng(pl.ELT_OPS[op] * 7 + in_fmt * 2 + out_fmt)
    shape = (3, 5, 7)
    a, b, c = (rand_input(rng, shape, in_fmt, specials=True) for _ in range(3))
    s, t = np.float32(-0.375), np.float32(1.5)
    got = pl.eltwise(op, a, b, c, in_fmt=in_fmt, out_fmt=out_fmt,
                     scale=int(fp.f32_bits(s)), bias=int(fp.f32_bits(t)))
    with np.errstate(all="ignore"):
        y = NUMPY_ELT[op](as_f32(a, in_fmt), as_f32(b, in_fmt), as_f32(c, in_fmt), s, t)
        exp = out_of(np.asarray(y, dtype=np.float32), out_fmt)
    assert same(got, exp, out_fmt)


@pytest.mark.parametrize("kind", ["scalar", "channel", "row", "column"])
def test_broadcast(kind):
    rng = np.random.default_rng(3)
    shape = (3, 4, 5)
    a = rand_input(rng, shape, I8)
    n = {"scalar": 1, "channel": 3, "row": 5, "column": 4}[kind]
    b = rand_input(rng, (n,), I8)
    full = {"scalar": lambda: np.full(shape, 7), "channel": lambda: b.reshape(3, 1, 1),
            "row": lambda: b.reshape(1, 1, 5), "column": lambda: b.reshape(1, 4, 1)}[kind]()
    got = pl.eltwise("sub", a, b, in_fmt=I8, out_fmt=F16, bcast=pl.BCASTS[kind],
                     scalar=int(fp.f32_bits(7.0)))
    exp = (a.astype(np.float64) - full).astype(np.float16).view(np.uint16)
    assert np.array_equal(got, np.broadcast_to(exp, shape))


def pool_ref(x, op, kh, kw, sy, sx, py, px):
    """float64 pooling that ignores padding (count_include_pad=False)."""
    C, H, W = x.shape
    OH, OW = pl.pool_shape(H, W, kh, kw, sy, sx, py, px)
    out = np.zeros((C, OH, OW))
    for oy in range(OH):
        for ox in range(OW):
            y0, x0 = oy * sy - py, ox * sx - px
            win = x[:, max(y0, 0):min(y0 + kh, H), max(x0, 0):min(x0 + kw, W)]
            out[:, oy, ox] = {"max": np.max, "min": np.min, "avg": np.mean}[op](win, axis=(1, 2))
    return out


@pytest.mark.parametrize("op", ["max", "min", "avg"])
@pytest.mark.parametrize("win", [(2, 2, 2, 2, 0, 0), (3, 3, 1, 1, 1, 1), (3, 2, 2, 1, 2, 1),
                                 (7, 7, 2, 3, 3, 0), (1, 1, 1, 1, 0, 0), (5, 9, 1, 1, 0, 0)])
def test_pool_vs_float64(op, win):
    rng = np.random.default_rng(sum(win))
    x = rand_input(rng, (2, 9, 11), I8)
    got16 = pl.pool(x, op, *win, in_fmt=I8, out_fmt=F16)
    ref = pool_ref(x.astype(np.float64), op, *win)
    got = got16.view(np.float16).astype(np.float64)
    if op == "avg":
        # sum exact, times recip(n) (two binary32 roundings), then one binary16 rounding:
        # within 1 ulp of binary16 of the exact mean.
        ulp = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)
        assert np.all(np.abs(got - ref) <= ulp)
        got8 = pl.pool(x, op, *win, in_fmt=I8, out_fmt=I8).astype(np.float64)
        assert np.all(np.abs(got8 - np.clip(np.rint(ref), -128, 127)) <= 1)
        frac = np.abs(ref - np.floor(ref) - 0.5)
        clear = frac > 1e-5  # away from a tie the double rounding cannot change the int8
        assert np.array_equal(got8[clear], np.rint(ref)[clear])
    else:
        assert np.array_equal(got, ref)


def test_pool_fp16_float32_order():
    """FP16 average pooling equals float32 sums of each window row (kx order), summed over the
    window's rows (ky order), times float32 recip(n)."""
    rng = np.random.default_rng(5)
    x = rand_input(rng, (1, 6, 7), F16)
    got = pl.pool(x, "avg", 3, 3, 1, 2, 1, 1, in_fmt=F16, out_fmt=F16)
    xf = x.view(np.float16).astype(np.float32)[0]
    exp = np.zeros((6, 4), dtype=np.float32)
    for oy in range(6):
        for ox in range(4):
            acc, n = np.float32(-0.0), 0
            for ky in range(3):
                iy = oy - 1 + ky
                if not 0 <= iy < 6:
                    continue
                row = np.float32(-0.0)
                for kx in range(3):
                    ix = ox * 2 - 1 + kx
                    if 0 <= ix < 7:
                        row, n = np.float32(row + xf[iy, ix]), n + 1
                acc = np.float32(acc + row)
            exp[oy, ox] = acc * np.float32(1.0 / n)
    assert same(got[0], exp.astype(np.float16).view(np.uint16), F16)
    # The order matters for binary16 inputs: a row-major fold differs somewhere here.
    flat = np.zeros((6, 4), dtype=np.float32)
    for oy in range(6):
        for ox in range(4):
            acc, n = np.float32(-0.0), 0
            for ky in range(3):
                for kx in range(3):
                    iy, ix = oy - 1 + ky, ox * 2 - 1 + kx
                    if 0 <= iy < 6 and 0 <= ix < 7:
                        acc, n = np.float32(acc + xf[iy, ix]), n + 1
            flat[oy, ox] = acc * np.float32(1.0 / n)
    assert not np.array_equal(flat.view(np.uint32), exp.view(np.uint32))


def test_pool_max_min_any_order():
    """Max and min do not depend on the fold order: the separable fold equals a direct
    row-major fold over each window, NaN, infinities and signed zeros included."""
    rng = np.random.default_rng(9)
    x = rand_input(rng, (2, 7, 9), F16)
    flat = x.reshape(-1)
    flat[::11] = np.array([0x8000, 0x0000, 0x7E01, 0xFC00, 0x7C00], dtype=np.uint16)[
        np.arange(flat[::11].size) % 5]
    X = pl.to_f32(x, F16)
    for op, fold, ident in (("max", fp.f32_max, pl.F32_NEG_INF), ("min", fp.f32_min,
                                                                   pl.F32_POS_INF)):
        got = pl.pool(x, op, 3, 2, 2, 1, 1, 1, in_fmt=F16, out_fmt=F16)
        OH, OW = pl.pool_shape(7, 9, 3, 2, 2, 1, 1, 1)
        exp = np.zeros((2, OH, OW), dtype=np.uint32)
        for oy in range(OH):
            for ox in range(OW):
                acc = np.full(2, ident, dtype=np.uint32)
                for ky in range(3):
                    for kx in range(2):
                        iy, ix = oy * 2 - 1 + ky, ox - 1 + kx
                        if 0 <= iy < 7 and 0 <= ix < 9:
                            acc = fold(acc, X[:, iy, ix]).astype(np.uint32)
                exp[:, oy, ox] = acc
        assert np.array_equal(got, pl.from_f32(exp, F16))


def test_pool_torch_if_available():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    x = rand_input(rng, (3, 8, 10), I8)
    got = pl.pool(x, "avg", 3, 3, 2, 2, 1, 1, in_fmt=I8, out_fmt=F16).view(np.float16)
    t = torch.nn.functional.avg_pool2d(torch.tensor(x, dtype=torch.float64)[None], 3, 2, 1,
                                       count_include_pad=False)[0].numpy()
    assert np.all(np.abs(got.astype(np.float64) - t) <= np.spacing(np.abs(t).astype(np.float16)))


def test_pool_bad_window():
    with pytest.raises(ValueError):
        pl.pool_shape(4, 4, 2, 2, 1, 1, 2, 0)
    with pytest.raises(ValueError):
        pl.pool_shape(2, 4, 5, 2, 1, 1, 1, 0)


@pytest.mark.parametrize("lanes", [1, 4, 16])
@pytest.mark.parametrize("shape", [(2, 3, 3), (3, 7, 13), (1, 16, 16)])
def test_reduce_int8_exact(lanes, shape):
    rng = np.random.default_rng(lanes + sum(shape))
    x = rand_input(rng, shape, I8)
    xi = x.astype(np.int64)
    s = pl.reduce(x, "sum", lanes=lanes, out_fmt=F16).view(np.float16)
    assert np.array_equal(s, xi.sum(axis=(1, 2)).astype(np.float16))
    mx = pl.reduce(x, "max", lanes=lanes)
    assert np.array_equal(mx, xi.max(axis=(1, 2)))
    mn = pl.reduce(x, "min", lanes=lanes, axis="tensor")
    assert np.array_equal(mn, [xi.min()])
    sq = pl.reduce(x, "sum", lanes=lanes, pre="square", out_fmt=F16).view(np.float16)
    with np.errstate(over="ignore"):
        assert np.array_equal(sq, (xi ** 2).sum(axis=(1, 2)).astype(np.float16))


def test_reduce_tree_order_fp16():
    """FP16 sums follow the documented order: tree per beat, 3 retention registers."""
    rng = np.random.default_rng(11)
    x = rand_input(rng, (2, 5, 6), F16)
    got = pl.reduce(x, "sum", lanes=4, in_fmt=F16, out_fmt=F16)
    xf = np.full((2, 5, 8), np.float32(-0.0), dtype=np.float32)
    xf[:, :, :6] = x.view(np.float16).astype(np.float32)
    beats = xf.reshape(2, 10, 4)
    t = (beats[..., 0] + beats[..., 1]) + (beats[..., 2] + beats[..., 3])
    regs = np.full((2, 3), np.float32(-0.0), dtype=np.float32)
    for k in range(10):
        regs[:, k % 3] += t[:, k]
    exp = (regs[:, 0] + regs[:, 1]) + regs[:, 2]
    assert same(got, exp.astype(np.float16).view(np.uint16), F16)
    ref = x.view(np.float16).astype(np.float64).sum(axis=(1, 2))
    assert np.allclose(got.view(np.float16).astype(np.float64), ref, rtol=2e-3, atol=1e-3)


def test_reduce_across_channels():
    """Axis ``channel``: INT8 sums, sums of squares, max and min exact; an FP16 sum in channel
    order (a float32 emulation of the accumulator); mean and variance across channels against
    float64; a post function is refused."""
    rng = np.random.default_rng(13)
    x = rand_input(rng, (5, 4, 7), I8)
    xi = x.astype(np.int64)
    s = pl.reduce(x, "sum", lanes=4, axis="channel", out_fmt=F16).view(np.float16)
    assert s.shape == (1, 4, 7)
    assert np.array_equal(s[0], xi.sum(axis=0).astype(np.float16))
    assert np.array_equal(pl.reduce(x, "max", lanes=4, axis="channel")[0], xi.max(axis=0))
    assert np.array_equal(pl.reduce(x, "min", lanes=16, axis="channel")[0], xi.min(axis=0))
    sq = pl.reduce(x, "sum", lanes=1, axis="channel", pre="square", out_fmt=F16)
    assert np.array_equal(sq[0].view(np.float16), (xi ** 2).sum(axis=0).astype(np.float16))
    h = rand_input(rng, (6, 3, 5), F16)
    got = pl.reduce(h, "sum", lanes=4, axis="channel", in_fmt=F16, out_fmt=F16)
    acc = np.full((3, 5), np.float32(-0.0), dtype=np.float32)
    for plane in h.view(np.float16).astype(np.float32):
        acc = acc + plane
    assert same(got[0], acc.astype(np.float16).view(np.uint16), F16)
    m = pl.mean(x, lanes=4, axis="channel", out_fmt=F16)[0].view(np.float16).astype(np.float64)
    ref = xi.mean(axis=0)
    assert np.all(np.abs(m - ref) <= np.spacing(np.abs(ref).astype(np.float16)))
    v = fp.f32_value(pl.variance(x, lanes=4, axis="channel")[0]).astype(np.float64)
    assert np.allclose(v, xi.var(axis=0), rtol=1e-5, atol=1e-3)
    with pytest.raises(ValueError, match="post"):
        pl.reduce(x, "sum", lanes=4, axis="channel", post="sqrt")


def test_mean_variance_vs_float64():
    rng = np.random.default_rng(12)
    x = rand_input(rng, (4, 9, 10), I8)
    xd = x.astype(np.float64).reshape(4, -1)
    m = pl.mean(x, lanes=4, out_fmt=F16).view(np.float16).astype(np.float64)
    assert np.all(np.abs(m - xd.mean(axis=1)) <= np.spacing(np.abs(xd.mean(1)).astype(np.float16)))
    v = fp.f32_value(pl.variance(x, lanes=4)).astype(np.float64)
    # E[x^2] and E[x]^2 are each within a few binary32 ulps; their difference loses at most the
    # ratio E[x^2]/var in relative accuracy (bounded here since |mean| is small against std).
    assert np.allclose(v, xd.var(axis=1), rtol=1e-5)
    std = fp.f32_value(pl.f32_sqrt(pl.variance(x, lanes=4))).astype(np.float64)
    assert np.allclose(std, xd.std(axis=1), rtol=1e-5)


def _classes(rng, n):
    e = rng.integers(0, 256, n).astype(np.uint32)
    f = rng.integers(0, 1 << 23, n).astype(np.uint32)
    s = rng.integers(0, 2, n).astype(np.uint32)
    bits = (s << 31) | (e << 23) | f
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 1, 0x007FFFFF,
                        0x00800000, 0x7F7FFFFF, 0x3F800000, 0x40800000], dtype=np.uint32)
    return np.concatenate([bits, special])


def test_sqrt_correctly_rounded():
    rng = np.random.default_rng(1)
    a = _classes(rng, 4000)
    got = pl.f32_sqrt(a)
    with np.errstate(invalid="ignore"):
        # float64 sqrt is correctly rounded and 53 >= 2*24 + 2, so rounding it to binary32
        # is correctly rounded too (no double-rounding error for square roots).
        exp = np.sqrt(fp.f32_value(a).astype(np.float64)).astype(np.float32).view(np.uint32)
    nan = np.isnan(fp.f32_value(exp))
    assert np.all(got[nan] == fp.F32_QNAN)
    assert np.array_equal(got[~nan], exp[~nan])


def test_recip_correctly_rounded():
    from fractions import Fraction
    rng = np.random.default_rng(2)
    a = _classes(rng, 4000)
    got = pl.f32_recip(a)
    with np.errstate(invalid="ignore"):
        v = fp.f32_value(a).astype(np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        exp = (1.0 / v).astype(np.float32)
    nan = np.isnan(v)
    assert np.all(got[nan] == fp.F32_QNAN)
    g = fp.f32_value(got).astype(np.float64)
    ok = (got == exp.view(np.uint32)) | nan
    # float64 -> float32 double rounding can be off by one ulp; decide those exactly.
    for i in np.nonzero(~ok)[0]:
        exact = 1 / Fraction(float(v[i]))
        cands = [np.float32(g[i]), np.nextafter(np.float32(g[i]), np.float32(np.inf)),
                 np.nextafter(np.float32(g[i]), np.float32(-np.inf))]
        errs = [abs(Fraction(float(c)) - exact) for c in cands]
        assert errs[0] <= min(errs)
    assert np.count_nonzero(~ok) < 10


def test_recip_count_table():
    n = np.arange(1, 300)
    assert np.array_equal(pl.recip_count(n), (1.0 / n).astype(np.float32).view(np.uint32))
