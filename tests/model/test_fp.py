"""Tests of the bit-exact number formats in ``npu_model.fp``.

Every result is checked against a reference that does not share code with the model:

* numpy's float32 / float16 arithmetic and casts (the host FPU, round to nearest even),
* softfloatpy, a binding of Berkeley SoftFloat 3 (per scalar, so on smaller samples),
* exact rational arithmetic with Python ints and :class:`fractions.Fraction`,
* float64 arithmetic where it is provably exact (binary16 products).

NaN results of the references are mapped to the canonical NaNs before comparing bit patterns,
so the model's NaN canonicalisation is checked too.
"""

import struct
from fractions import Fraction

import numpy as np
import pytest
import softfloatpy as sf
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_model import fp

F32_MAX = 0x7F7FFFFF  # largest finite binary32
F32_INF = 0x7F800000
F16_INF = 0x7C00
NEG = 0x80000000


# --------------------------------------------------------------------------------------------
# helpers


def assert_bits_equal(got, want, *inputs, fmt="08x"):
    """Fail with the first mismatches printed in hex (inputs, got, want)."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    bad = np.flatnonzero(got.ravel() != want.ravel())
    if bad.size:
        lines = [f"{bad.size} of {got.size} results differ; first ones:"]
        for i in bad[:10]:
            ins = " ".join(format(int(np.asarray(x).ravel()[i]), fmt) for x in inputs)
            g, w = int(got.ravel()[i]), int(want.ravel()[i])
            lines.append(f"  in {ins}: got {g:{fmt}} want {w:{fmt}}")
        pytest.fail("\n".join(lines))


def canon32(f):
    """Bits of a float32 array with every NaN replaced by the canonical NaN."""
    bits = np.asarray(f, dtype=np.float32).view(np.uint32).copy()
    bits[np.isnan(f)] = fp.F32_QNAN
    return bits


def canon16(f):
    bits = np.asarray(f, dtype=np.float16).view(np.uint16).copy()
    bits[np.isnan(f)] = fp.F16_QNAN
    return bits


def as_f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def f32_mix(rng, n):
    """Random binary32 patterns drawn from the interesting classes."""
    sign = rng.integers(0, 2, n, dtype=np.int64) << 31
    cls = rng.integers(0, 9, n)
    e = rng.integers(0, 256, n, dtype=np.int64)
    frac = rng.integers(0, 1 << 23, n, dtype=np.int64)
    # sparse fractions (only a few leading bits) make exact ties in sums likely
    sparse = frac & ~((1 << rng.integers(8, 24, n, dtype=np.int64)) - 1) & 0x7FFFFF
    e = np.select(
        [cls == 1, cls == 2, cls == 3, cls == 4, cls == 5, cls == 6],
        [0, 0, 255, 255, 254, rng.integers(1, 3, n)],
        e,
    )
    frac = np.select(
        [cls == 2, cls == 3, cls == 4, cls == 5, cls == 7],
        [0, 0, np.maximum(frac, 1), 0x7FFFFF - (frac & 0xF), sparse],
        frac,
    )
    e = np.where(cls == 8, rng.integers(100, 155, n), e)  # around 1.0
    return (sign | (e << 23) | frac).astype(np.uint32)


def f32_pairs(rng, n):
    """Operand pairs biased towards the hard cases of addition."""
    a = f32_mix(rng, n).astype(np.int64)
    b = f32_mix(rng, n).astype(np.int64)
    mode = rng.integers(0, 7, n)
    ea = (a >> 23) & 0xFF
    eb_close = np.clip(ea + rng.integers(-27, 28, n), 0, 254)
    b_close = (b & ~(0xFF << 23)) | (eb_close << 23)
    b_neg = a ^ NEG  # exact cancellation
    delta = rng.integers(-3, 4, n)
    b_near = ((a ^ NEG) + delta) & 0xFFFFFFFF  # massive cancellation, crosses exponents
    eb_tie = np.clip(ea - rng.integers(23, 26, n), 0, 254)
    b_tie = (b & NEG) | (eb_tie << 23) | (b & rng.choice([0, 1, 0x400000, 0x7FFFFF], n))
    b_same = a  # doubling, overflow at max finite
    b = np.select(
        [mode == 1, mode == 2, mode == 3, mode == 4, mode == 5],
        [b_close, b_neg, b_near, b_tie, b_same],
        b,
    )
    return a.astype(np.uint32), b.astype(np.uint32)


def sf32(bits):
    return sf.Float32.from_bytes(int(bits).to_bytes(4, "big"))


def sf16(bits):
    return sf.Float16.from_bytes(int(bits).to_bytes(2, "big"))


def sf_bits32(x):
    return fp.F32_QNAN if sf.f32_is_nan(x) else int.from_bytes(x.to_bytes(), "big")


def sf_bits16(x):
    return fp.F16_QNAN if sf.f16_is_nan(x) else int.from_bytes(x.to_bytes(), "big")


@pytest.fixture
def softfloat_rne():
    old = sf.get_rounding_mode()
    sf.set_rounding_mode(sf.RoundingMode.NEAR_EVEN)
    yield
    sf.set_rounding_mode(old)


def py_f32(bits):
    """Exact Python float value of a binary32 pattern."""
    return struct.unpack(">f", int(bits).to_bytes(4, "big"))[0]


def ref_round_f32(sign, sig, exp):
    """Reference rounding of (-1)**sign * sig * 2**exp to binary32 with exact rationals."""
    if sig == 0:
        return sign << 31
    value = Fraction(sig) * Fraction(2) ** exp
    e = sig.bit_length() - 1 + exp  # 2**e <= value < 2**(e+1)
    q = max(e - 23, -149)  # weight of the last kept bit
    scaled = value / Fraction(2) ** q
    n = scaled.numerator // scaled.denominator
    r = scaled - n
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and n % 2 == 1):
        n += 1
    if n == 1 << 24:
        n, q = 1 << 23, q + 1
    if n < 1 << 23:  # subnormal (or zero after rounding)
        assert q == -149
        bits = n
    else:
        biased = q + 23 + 127
        bits = F32_INF if biased >= 255 else (biased << 23) | (n - (1 << 23))
    return (sign << 31) | bits


# --------------------------------------------------------------------------------------------
# f32_add


def _numpy_add(a, b):
    with np.errstate(all="ignore"):
        return canon32(as_f32(a) + as_f32(b))


def test_f32_add_uniform_vs_numpy():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 1 << 32, 1_000_000, dtype=np.uint32)
    b = rng.integers(0, 1 << 32, 1_000_000, dtype=np.uint32)
    assert_bits_equal(fp.f32_add(a, b), _numpy_add(a, b), a, b)


def test_f32_add_corner_mix_vs_numpy():
    rng = np.random.default_rng(2)
    a, b = f32_pairs(rng, 1_000_000)
    got = fp.f32_add(a, b)
    want = _numpy_add(a, b)
    assert_bits_equal(got, want, a, b)
    # the sample really covers the classes it is meant to
    fa, fb, fr = as_f32(a), as_f32(b), as_f32(want)
    assert np.count_nonzero((want == 0) & (fa != 0)) > 10_000  # exact cancellation
    assert np.count_nonzero(want == NEG) > 1_000  # -0 + -0
    assert np.count_nonzero(((want & 0x7F800000) == 0) & ((want & 0x7FFFFF) != 0)) > 10_000
    assert np.count_nonzero(np.isinf(fr) & np.isfinite(fa) & np.isfinite(fb)) > 1_000
    assert np.count_nonzero(want == fp.F32_QNAN) > 10_000
    # round-to-nearest ties: sum exactly halfway (checked in float64 where the sum is exact)
    with np.errstate(all="ignore"):
        exact = fa.astype(np.float64) + fb.astype(np.float64)
        lo = np.nextafter(fr, np.float32(-np.inf)).astype(np.float64)
        hi = np.nextafter(fr, np.float32(np.inf)).astype(np.float64)
        fr64 = fr.astype(np.float64)
        tie = np.isfinite(exact) & ((exact - lo == fr64 - exact) | (hi - exact == exact - fr64))
    assert np.count_nonzero(tie & (exact != fr64)) > 5_000


def test_f32_add_vs_softfloat(softfloat_rne):
    rng = np.random.default_rng(3)
    a, b = f32_pairs(rng, 40_000)
    want = np.array([sf_bits32(sf.f32_add(sf32(x), sf32(y))) for x, y in zip(a, b)], np.uint32)
    assert_bits_equal(fp.f32_add(a, b), want, a, b)


@settings(max_examples=1500, deadline=None, database=None)
@given(st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF))
def test_f32_add_hypothesis_vs_softfloat(a, b):
    old = sf.get_rounding_mode()
    sf.set_rounding_mode(sf.RoundingMode.NEAR_EVEN)
    try:
        want = sf_bits32(sf.f32_add(sf32(a), sf32(b)))
    finally:
        sf.set_rounding_mode(old)
    assert int(fp.f32_add(a, b)) == want
    assert int(fp.f32_add(b, a)) == want


@pytest.mark.parametrize(
    "a, b, want",
    [
        (0x80000000, 0x80000000, 0x80000000),  # -0 + -0 = -0
        (0x80000000, 0x00000000, 0x00000000),  # -0 + +0 = +0
        (0xBF800000, 0x3F800000, 0x00000000),  # -1 + 1 = +0
        (0x00000001, 0x80000001, 0x00000000),  # subnormal cancellation
        (0x00000001, 0x00000001, 0x00000002),  # subnormal + subnormal, no flush
        (0x007FFFFF, 0x00000001, 0x00800000),  # subnormal sum reaches the normal range
        (F32_INF, 0xFF800000, fp.F32_QNAN),  # inf - inf
        (0xFF800000, 0x3F800000, 0xFF800000),
        (0x7F800001, 0x3F800000, fp.F32_QNAN),  # signalling NaN in, canonical NaN out
        (0xFFC12345, 0xFF800000, fp.F32_QNAN),
        (F32_MAX, F32_MAX, F32_INF),
        (F32_MAX, 0x73000000, F32_INF),  # + half an ulp of FLT_MAX (2**103): tie, odd -> inf
        (F32_MAX, 0x72FFFFFF, F32_MAX),  # just below half an ulp
        (0x3F800000, 0x33800000, 0x3F800000),  # 1 + 2**-24: tie, 1 is even
        (0x3F800001, 0x33800000, 0x3F800002),  # tie, odd rounds up
        (0x3F800000, 0x33800001, 0x3F800001),  # just above the tie
    ],
)
def test_f32_add_ieee_cases(a, b, want):
    assert int(fp.f32_add(a, b)) == want
    assert int(fp.f32_add(b, a)) == want


# --------------------------------------------------------------------------------------------
# f32_mul and f16 products


def test_f32_mul_vs_numpy():
    rng = np.random.default_rng(4)
    n = 500_000
    a = np.concatenate([rng.integers(0, 1 << 32, n, dtype=np.uint32), f32_mix(rng, n)])
    b = np.concatenate([rng.integers(0, 1 << 32, n, dtype=np.uint32), f32_mix(rng, n)])
    # exponent pairs near the overflow and underflow thresholds of the product
    ea = (a.astype(np.int64) >> 23) & 0xFF
    target = rng.choice([-24, -23, 0, 1, 2, 127 + 127, 127 + 128], a.size)
    eb = np.clip(target - ea + 127, 1, 254)
    b = np.where(rng.random(a.size) < 0.5, b, (b & 0x807FFFFF) | (eb << 23).astype(np.uint32))
    with np.errstate(all="ignore"):
        want = canon32(as_f32(a) * as_f32(b))
    assert_bits_equal(fp.f32_mul(a, b), want, a, b)
    wf = as_f32(want)
    assert np.count_nonzero(((want & 0x7F800000) == 0) & ((want & 0x7FFFFF) != 0)) > 10_000
    assert np.count_nonzero(np.isinf(wf) & np.isfinite(as_f32(a)) & np.isfinite(as_f32(b))) > 10_000


def test_f32_mul_vs_softfloat(softfloat_rne):
    rng = np.random.default_rng(5)
    a = f32_mix(rng, 20_000)
    b = f32_mix(rng, 20_000)
    want = np.array([sf_bits32(sf.f32_mul(sf32(x), sf32(y))) for x, y in zip(a, b)], np.uint32)
    assert_bits_equal(fp.f32_mul(a, b), want, a, b)


def _f16_product_reference(a, b):
    """Exact product via float64 (22-bit significand, exponent inside binary32's normal range)."""
    with np.errstate(all="ignore"):
        p64 = a.view(np.float16).astype(np.float64) * b.view(np.float16).astype(np.float64)
        p32 = p64.astype(np.float32)
    finite = np.isfinite(p64)
    assert np.array_equal(p32[finite].astype(np.float64), p64[finite])  # really exact
    return canon32(p32)


def test_f16_products_random_exact():
    rng = np.random.default_rng(6)
    a = rng.integers(0, 1 << 16, 1_000_000, dtype=np.uint16)
    b = rng.integers(0, 1 << 16, 1_000_000, dtype=np.uint16)
    assert_bits_equal(fp.f16_mul_f32(a, b), _f16_product_reference(a, b), a, b)


def test_f16_products_all_subnormal_pairs_exact():
    sub = np.arange(1, 0x400, dtype=np.uint16)
    a, b = (x.ravel() for x in np.meshgrid(sub, sub))
    rng = np.random.default_rng(7)
    a = a | (rng.integers(0, 2, a.size, dtype=np.uint16) << 15)
    b = b | (rng.integers(0, 2, b.size, dtype=np.uint16) << 15)
    got = fp.f16_mul_f32(a, b)
    assert_bits_equal(got, _f16_product_reference(a, b), a, b)
    assert np.all((got & 0x7F800000) != 0)  # the smallest product 2**-48 is a normal binary32


def test_f16_products_specials():
    specials = np.array(
        [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x7C00,
         0xFC00, 0x7C01, 0x7E00, 0xFE00, 0x7FFF],
        np.uint16,
    )
    a, b = (x.ravel() for x in np.meshgrid(specials, specials))
    assert_bits_equal(fp.f16_mul_f32(a, b), _f16_product_reference(a, b), a, b)


# --------------------------------------------------------------------------------------------
# f32_pack


def _tie_cases(rng, n):
    """(sign, sig, exp) whose value is exactly halfway between two binary32 values (or +-1)."""
    q = rng.integers(-149, 105, n)
    nn = np.where(q == -149, rng.integers(0, 1 << 24, n), rng.integers(1 << 23, 1 << 24, n))
    j = rng.integers(0, 36, n)
    sig = ((2 * nn + 1) << j) + rng.choice([-1, 0, 0, 1], n)
    return rng.integers(0, 2, n), sig, q - 1 - j


def test_f32_pack_vs_fractions():
    rng = np.random.default_rng(8)
    n = 6_000
    length = rng.integers(0, 63, n)
    sig_rand = rng.integers(0, 1 << 62, n, dtype=np.int64) >> (62 - length)
    exp_rand = rng.integers(-300, 200, n)
    s_tie, sig_tie, exp_tie = _tie_cases(rng, n)
    sign = np.concatenate([rng.integers(0, 2, n), s_tie])
    sig = np.concatenate([sig_rand, sig_tie])
    exp = np.concatenate([exp_rand, exp_tie])
    want = np.array(
        [ref_round_f32(int(s), int(m), int(e)) for s, m, e in zip(sign, sig, exp)], np.uint32
    )
    assert_bits_equal(fp.f32_pack(sign, sig, exp), want, sign, sig, exp)


def test_f32_pack_vs_float64_cast():
    # sig < 2**53 and a moderate exp make sig * 2**exp exact in float64; the cast to float32
    # is then the only rounding.
    rng = np.random.default_rng(9)
    n = 500_000
    sig = rng.integers(0, 1 << 53, n, dtype=np.int64) >> rng.integers(0, 54, n)
    exp = rng.integers(-260, 150, n)
    s_tie, sig_tie, exp_tie = _tie_cases(rng, n)
    keep = sig_tie < (1 << 53)
    sign = np.concatenate([rng.integers(0, 2, n), s_tie[keep]])
    sig = np.concatenate([sig, sig_tie[keep]])
    exp = np.concatenate([exp, exp_tie[keep]])
    with np.errstate(all="ignore"):
        v = np.ldexp(sig.astype(np.float64), exp)
        v = np.where(sign == 1, -v, v)
        want = v.astype(np.float32).view(np.uint32)
    assert_bits_equal(fp.f32_pack(sign, sig, exp), want, sign, sig, exp, fmt="x")


@settings(max_examples=1000, deadline=None, database=None)
@given(st.integers(0, 1), st.integers(0, (1 << 62) - 1), st.integers(-400, 300))
def test_f32_pack_hypothesis(sign, sig, exp):
    assert int(fp.f32_pack(sign, sig, exp)) == ref_round_f32(sign, sig, exp)


def test_f32_pack_extreme_exponents_and_arguments():
    assert int(fp.f32_pack(0, 1, 10**15)) == F32_INF
    assert int(fp.f32_pack(1, 1, 10**15)) == F32_INF | NEG
    assert int(fp.f32_pack(1, (1 << 62) - 1, -(10**15))) == NEG
    assert int(fp.f32_pack(0, 0, 10**15)) == 0
    assert int(fp.f32_pack(0, 1, -150)) == 0  # 2**-150 is a tie between 0 and 2**-149
    assert int(fp.f32_pack(0, 3, -151)) == 1  # 0.75 * 2**-149
    with pytest.raises(ValueError, match="sig"):
        fp.f32_pack(0, 1 << 62, 0)
    with pytest.raises(ValueError, match="-1"):
        fp.f32_pack(0, -1, 0)
    with pytest.raises(ValueError, match="sign"):
        fp.f32_pack(2, 1, 0)
    with pytest.raises(TypeError):
        fp.f32_pack(0, np.array([1.5]), 0)


# --------------------------------------------------------------------------------------------
# conversions


def test_f16_to_f32_exhaustive_vs_numpy_and_softfloat():
    h = np.arange(1 << 16, dtype=np.uint16)
    got = fp.f16_to_f32(h)
    assert_bits_equal(got, canon32(h.view(np.float16).astype(np.float32)), h, fmt="04x")
    want = np.array([sf_bits32(sf.f16_to_f32(sf16(x))) for x in h], np.uint32)
    assert_bits_equal(got, want, h, fmt="04x")


def test_int8_to_f32_exhaustive():
    x = np.arange(-128, 128, dtype=np.int64).astype(np.int8)
    assert_bits_equal(fp.int8_to_f32(x), x.astype(np.float32).view(np.uint32), x, fmt="d")
    with pytest.raises(ValueError, match="128"):
        fp.int8_to_f32(128)


def _f16_neighbourhoods():
    """Binary32 patterns at, around and halfway between all finite binary16 values."""
    h = np.arange(0, 0x7C00, dtype=np.uint16)
    v = h.view(np.float16).astype(np.float64)
    nxt = np.append(v[1:], 65536.0)  # the value after 65504 would be 2**16
    mid = ((v + nxt) / 2).astype(np.float32)  # exact: at most 12 significant bits
    exact = v.astype(np.float32)
    base = np.concatenate([mid.view(np.uint32), exact.view(np.uint32)]).astype(np.int64)
    near = np.concatenate([base + d for d in (-1, 0, 1)])
    near = near[(near >= 0) & (near < F32_INF)]
    return np.concatenate([near, near | NEG]).astype(np.uint32)


def test_f32_to_f16_neighbourhoods_vs_numpy():
    a = _f16_neighbourhoods()
    with np.errstate(all="ignore"):
        want = canon16(as_f32(a).astype(np.float16))
    assert_bits_equal(fp.f32_to_f16(a), want, a)


def test_f32_to_f16_random_vs_numpy():
    rng = np.random.default_rng(10)
    a = np.concatenate([rng.integers(0, 1 << 32, 500_000, dtype=np.uint32), f32_mix(rng, 500_000)])
    # exponents around the binary16 range (2**-26 .. 2**16)
    e = rng.integers(127 - 26, 127 + 17, a.size).astype(np.uint32)
    a = np.where(rng.random(a.size) < 0.5, a, (a & 0x807FFFFF) | (e << 23))
    with np.errstate(all="ignore"):
        want = canon16(as_f32(a).astype(np.float16))
    assert_bits_equal(fp.f32_to_f16(a), want, a)


def test_f32_to_f16_vs_softfloat(softfloat_rne):
    rng = np.random.default_rng(11)
    a = np.concatenate([rng.choice(_f16_neighbourhoods(), 30_000), f32_mix(rng, 10_000)])
    want = np.array([sf_bits16(sf.f32_to_f16(sf32(x))) for x in a], np.uint16)
    assert_bits_equal(fp.f32_to_f16(a), want, a)


@pytest.mark.parametrize(
    "value, want",
    [
        (65504.0, 0x7BFF),  # largest binary16
        (65519.99609375, 0x7BFF),  # just below the overflow threshold (65520 - 2**-8)
        (65520.0, 0x7C00),  # halfway to 2**16: ties to even -> infinity
        (-65520.0, 0xFC00),
        (2.0**-24, 0x0001),  # smallest subnormal
        (2.0**-25, 0x0000),  # tie between 0 and 2**-24: even is 0
        (-(2.0**-25), 0x8000),  # underflow keeps the sign
        (2.0**-25 * (1 + 2.0**-23), 0x0001),  # just above the tie
        (3 * 2.0**-25, 0x0002),  # tie between 1 and 2 ulps: even is 2
        (1 + 2.0**-11, 0x3C00),  # tie at 1.0: even
        (1 + 3 * 2.0**-11, 0x3C02),  # tie: odd neighbour rounds up
        (2.0**-14 - 2.0**-25, 0x0400),  # subnormal rounding up to the smallest normal
    ],
)
def test_f32_to_f16_ieee_cases(value, want):
    assert int(fp.f32_to_f16(fp.f32_bits(value))) == want


def test_f32_to_f16_nan_and_inf():
    a = np.array([0x7F800001, 0xFFC00000, 0x7FFFFFFF, F32_INF, 0xFF800000, 0x00000001], np.uint32)
    want = np.array([fp.F16_QNAN, fp.F16_QNAN, fp.F16_QNAN, 0x7C00, 0xFC00, 0], np.uint16)
    assert_bits_equal(fp.f32_to_f16(a), want, a)


# --------------------------------------------------------------------------------------------
# max, min, cmp


def test_f32_max_min_cmp_vs_reference():
    rng = np.random.default_rng(12)
    a, b = f32_pairs(rng, 300_000)
    zeros = np.array([0, NEG], np.uint32)
    a = np.concatenate([a, np.repeat(zeros, 2), a[:1000]])
    b = np.concatenate([b, np.tile(zeros, 2), a[:1000]])  # +-0 combinations, equal operands
    with np.errstate(invalid="ignore"):  # signalling NaNs
        fa = as_f32(a).astype(np.float64)
        fb = as_f32(b).astype(np.float64)
    nan = np.isnan(fa) | np.isnan(fb)
    neg_a, neg_b = np.signbit(fa), np.signbit(fb)
    ref_max = np.where(fa > fb, a, np.where(fb > fa, b, np.where(neg_a & ~neg_b, b, a)))
    ref_min = np.where(fa < fb, a, np.where(fb < fa, b, np.where(~neg_a & neg_b, b, a)))
    ref_max = np.where(nan, fp.F32_QNAN, ref_max).astype(np.uint32)
    ref_min = np.where(nan, fp.F32_QNAN, ref_min).astype(np.uint32)
    ref_cmp = ((fa > fb).astype(np.int8) - (fa < fb).astype(np.int8)).astype(np.int8)
    assert_bits_equal(fp.f32_max(a, b), ref_max, a, b)
    assert_bits_equal(fp.f32_min(a, b), ref_min, a, b)
    assert_bits_equal(fp.f32_cmp(a, b), ref_cmp, a, b, fmt="d")
    assert int(fp.f32_max(NEG, 0)) == 0 and int(fp.f32_max(0, NEG)) == 0
    assert int(fp.f32_min(NEG, 0)) == NEG and int(fp.f32_min(0, NEG)) == NEG
    assert int(fp.f32_cmp(NEG, 0)) == 0
    assert int(fp.f32_max(0x7F800001, F32_INF)) == fp.F32_QNAN


# --------------------------------------------------------------------------------------------
# float -> int8


def _ref_f32_to_int8(bits):
    v = py_f32(bits)
    if v != v:
        return 0
    if v in (float("inf"), float("-inf")):
        return 127 if v > 0 else -128
    return min(max(round(Fraction(v)), -128), 127)  # Fraction rounds half to even


def test_f32_to_int8_vs_fractions():
    rng = np.random.default_rng(13)
    halves = (rng.integers(-300, 300, 5_000) * 0.5).astype(np.float32).view(np.uint32)
    near = (rng.uniform(-130, 130, 5_000)).astype(np.float32).view(np.uint32)
    a = np.concatenate([halves, near, f32_mix(rng, 5_000)])
    want = np.array([_ref_f32_to_int8(x) for x in a], np.int8)
    assert_bits_equal(fp.f32_to_int8(a), want, a)


def test_f32_to_int8_vs_numpy_rint():
    rng = np.random.default_rng(14)
    a = np.concatenate([rng.integers(0, 1 << 32, 500_000, dtype=np.uint32), f32_mix(rng, 500_000)])
    e = rng.integers(100, 136, a.size).astype(np.uint32)  # magnitudes 2**-27 .. 2**8
    a = np.where(rng.random(a.size) < 0.5, a, (a & 0x807FFFFF) | (e << 23))
    with np.errstate(all="ignore"):
        f = as_f32(a).astype(np.float64)
        want = np.clip(np.nan_to_num(np.rint(f), nan=0.0, posinf=127, neginf=-128), -128, 127)
    assert_bits_equal(fp.f32_to_int8(a), want.astype(np.int8), a)


@pytest.mark.parametrize(
    "value, want",
    [(0.5, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (-2.5, -2), (126.5, 126), (127.5, 127),
     (-127.5, -128), (-128.5, -128), (1e30, 127), (-1e30, -128), (0.49999997, 0), (2.0**-149, 0)],
)
def test_f32_to_int8_cases(value, want):
    assert int(fp.f32_to_int8(fp.f32_bits(value))) == want


# --------------------------------------------------------------------------------------------
# int32 rescale and wrap

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def ref_rescale(x, m, s, zp=0, qmin=-128, qmax=127):
    """TOSA RESCALE with Python ints (arbitrary precision, >> floors)."""
    return min(max(((x * m + (1 << (s - 1))) >> s) + zp, qmin), qmax)


def test_rescale_vs_python_ints():
    rng = np.random.default_rng(15)
    n = 40_000
    x = np.select(
        [rng.random(n) < 0.2, rng.random(n) < 0.2],
        [rng.choice([INT32_MIN, INT32_MIN + 1, -1, 0, 1, INT32_MAX - 1, INT32_MAX], n),
         rng.integers(-5000, 5000, n)],
        rng.integers(INT32_MIN, INT32_MAX, n, endpoint=True),
    )
    m = np.where(rng.random(n) < 0.2, rng.choice([0, 1, 1 << 30, INT32_MAX], n),
                 rng.integers(0, INT32_MAX, n, endpoint=True))
    s = np.where(rng.random(n) < 0.2, rng.choice([2, 62], n), rng.integers(2, 63, n))
    zp = rng.integers(-200, 200, n)
    for qmin, qmax in [(-128, 127), (INT32_MIN, INT32_MAX), (0, 255)]:
        want = np.array(
            [ref_rescale(*map(int, t), qmin, qmax) for t in zip(x, m, s, zp)], np.int32
        )
        got = fp.rescale_int32(x.astype(np.int32), m, s, zp, qmin, qmax)
        assert_bits_equal(got, want, x, m, s, zp, fmt="d")


def test_rescale_ties_round_half_up():
    # x * 2**k with x odd and shift k + 1 is exactly halfway: rounds toward +inf
    rng = np.random.default_rng(16)
    k = rng.integers(1, 31, 10_000)
    x = rng.integers(-(1 << 20), 1 << 20, 10_000) * 2 + 1
    got = fp.rescale_int32(x.astype(np.int32), 1 << k, k + 1, 0, INT32_MIN, INT32_MAX)
    want = np.array([Fraction(int(v), 2) + Fraction(1, 2) for v in x])  # x/2 rounded up
    assert np.array_equal(got, np.array([int(w) for w in want]))
    assert int(fp.rescale_int32(10, 1, 2)) == 3  # 2.5 -> 3
    assert int(fp.rescale_int32(-10, 1, 2)) == -2  # -2.5 -> -2
    assert int(fp.rescale_int32(-6, 1, 2)) == -1  # -1.5 -> -1


def test_rescale_extremes():
    big = fp.rescale_int32(np.array([INT32_MIN, INT32_MAX], np.int32), INT32_MAX, 62, 0,
                           INT32_MIN, INT32_MAX)
    assert big.tolist() == [ref_rescale(INT32_MIN, INT32_MAX, 62, 0, INT32_MIN, INT32_MAX),
                            ref_rescale(INT32_MAX, INT32_MAX, 62, 0, INT32_MIN, INT32_MAX)]
    small = fp.rescale_int32(np.array([INT32_MIN, INT32_MAX], np.int32), INT32_MAX, 2, 0,
                             INT32_MIN, INT32_MAX)
    assert small.tolist() == [INT32_MIN, INT32_MAX]  # 2**60 saturates
    assert fp.rescale_int32(np.array([INT32_MAX]), INT32_MAX, 2, INT32_MAX, INT32_MIN,
                            INT32_MAX).tolist() == [INT32_MAX]
    assert fp.rescale_int32(np.array([1000]), 1 << 30, 31, 3).tolist() == [127]
    assert fp.rescale_int32(1000, 1 << 30, 31, 3).dtype == np.int32


def test_rescale_per_channel_broadcast():
    rng = np.random.default_rng(17)
    x = rng.integers(-(1 << 20), 1 << 20, (50, 8))
    m = rng.integers(1 << 29, 1 << 31, 8)
    s = rng.integers(30, 40, 8)
    got = fp.rescale_int32(x, m, s, 5)
    want = [[ref_rescale(int(x[i, c]), int(m[c]), int(s[c]), 5) for c in range(8)]
            for i in range(50)]
    assert got.tolist() == want


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(shift=1), "shift.*1"),
        (dict(shift=63), "shift.*63"),
        (dict(multiplier=-1), "multiplier.*-1"),
        (dict(multiplier=1 << 31), "multiplier.*2147483648"),
        (dict(x=1 << 31), "x.*2147483648"),
        (dict(zero_point=-(1 << 31) - 1), "zero_point"),
        (dict(qmin=5, qmax=4), "qmin"),
        (dict(qmax=1 << 40), "qmax"),
    ],
)
def test_rescale_rejects_bad_arguments(kwargs, match):
    args = dict(x=1, multiplier=1 << 30, shift=31)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        fp.rescale_int32(**args)


def test_int32_wrap():
    rng = np.random.default_rng(18)
    x = rng.integers(-(1 << 62), 1 << 62, 100_000)
    want = np.array([((int(v) + (1 << 31)) % (1 << 32)) - (1 << 31) for v in x], np.int32)
    assert_bits_equal(fp.int32_wrap(x), want, x, fmt="d")
    assert fp.int32_wrap(np.array([1 << 64, -(1 << 70) - 1], dtype=object)).tolist() == [0, -1]
    assert fp.int32_wrap(np.array([2**64 - 1], np.uint64)).tolist() == [-1]
    # INT8 MAC accumulation: wrapping the exact sum equals numpy's wrapping int32 accumulator
    a = rng.integers(-128, 128, (64, 4096)).astype(np.int8)
    b = np.full((64, 4096), -128, np.int8)
    acc = np.zeros(64, np.int32)
    for k in range(0, 4096, 512):
        prod = a[:, k:k + 512].astype(np.int32) * b[:, k:k + 512] * 128
        acc += prod.sum(axis=1, dtype=np.int32)
    exact = [sum(int(p) * -128 * 128 for p in row) for row in a]
    assert fp.int32_wrap(np.array(exact, dtype=object)).tolist() == acc.tolist()
    with pytest.raises(TypeError):
        fp.int32_wrap(np.array([1.0]))


# --------------------------------------------------------------------------------------------
# helpers and argument handling


def test_helpers_and_scalars():
    assert int(fp.f32_bits(1.0)) == 0x3F800000
    assert int(fp.f16_bits(-2.0)) == 0xC000
    assert fp.f32_value(0x40490FDB) == np.float32(np.pi)
    assert fp.f16_value(0x3C00) == np.float16(1)
    r = fp.f32_add(0x3F800000, 0x3F800000)
    assert isinstance(r, np.ndarray) and r.dtype == np.uint32 and r.shape == ()
    assert int(r) == 0x40000000
    assert fp.f32_to_f16([0x3F800000]).dtype == np.uint16
    assert fp.f32_cmp(0x3F800000, np.zeros((2, 3), np.uint32)).shape == (2, 3)
    assert fp.f32_add(np.uint32(1), np.zeros(4, np.uint32)).shape == (4,)
    with pytest.raises(TypeError):
        fp.f32_add(np.float32(1.0), 0)
    with pytest.raises(ValueError, match="-1"):
        fp.f32_add(-1, 0)
    with pytest.raises(ValueError, match="65536"):
        fp.f16_to_f32(65536)


def test_model_does_not_use_the_fpu_or_amaranth():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(fp))
    imports = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imports |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imports == {"numpy", "npu_spec.formats"}
    # host floating point appears only in the four helpers that convert to and from it
    helpers = {"f32_bits", "f32_value", "f16_bits", "f16_value"}
    floaty = {"float16", "float32", "float64", "longdouble", "half", "single", "double",
              "frexp", "ldexp", "floor", "rint", "round"}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name not in helpers:
            for sub in ast.walk(node):
                assert not (isinstance(sub, ast.Attribute) and sub.attr in floaty), node.name
                assert not (isinstance(sub, ast.Name) and sub.id == "float"), node.name
                is_float = isinstance(sub, ast.Constant) and isinstance(sub.value, float)
                assert not is_float, node.name
                assert not isinstance(sub, ast.Div), node.name


# --------------------------------------------------------------------------------------------
# f32_add_product: the MAC step with an exact product


def mac_operands(rng, n, kind):
    """Binary32 patterns of random binary16 codes (every class: zeros, subnormals, normals up
    to 65504, infinities, NaNs) or int8 values, as the MAC array widens them."""
    if kind == "int8":
        return fp.int8_to_f32(rng.integers(-128, 128, n).astype(np.int8))
    codes = rng.integers(0, 1 << 16, n, dtype=np.int64)
    cls = rng.integers(0, 6, n)
    sign = codes & 0x8000
    codes = np.select([cls == 1, cls == 2, cls == 3, cls == 4],
                      [sign, sign | (codes & 0x3FF), sign | 0x7C00, sign | 0x7BFF], codes)
    return fp.f16_to_f32(codes.astype(np.uint16))


def mac_accumulators(rng, prod):
    """Accumulators for products ``prod`` (binary32 bits): random classes, values of nearby
    exponents, exact and near cancellation, and halfway cases."""
    n = prod.size
    p = prod.astype(np.int64)
    mix = f32_mix(rng, n).astype(np.int64)
    ep = (p >> 23) & 0xFF
    close = (mix & ~(0xFF << 23)) | (np.clip(ep + rng.integers(-26, 27, n), 0, 254) << 23)
    cancel = ((p ^ NEG) + rng.integers(-2, 3, n)) & 0xFFFFFFFF
    tie = (mix & NEG) | (np.clip(ep + rng.integers(23, 26, n), 0, 254) << 23)
    mode = rng.integers(0, 4, n)
    return np.select([mode == 1, mode == 2, mode == 3], [close, cancel, tie], mix
                     ).astype(np.uint32)


@pytest.mark.parametrize("kinds", [("fp16", "fp16"), ("fp16", "int8"), ("int8", "fp16"),
                                   ("int8", "int8")])
def test_f32_add_product_equals_add_of_mul(kinds):
    """The fused step against the two-step definition and against numpy's float32, on large
    samples of every operand class (the model's MAC contract, docs/formats.md)."""
    rng = np.random.default_rng(11)
    n = 400_000
    a, b = mac_operands(rng, n, kinds[0]), mac_operands(rng, n, kinds[1])
    prod = fp.f32_mul(a, b)
    acc = mac_accumulators(rng, prod)
    got = fp.f32_add_product(acc, fp.mac_operand(a), fp.mac_operand(b))
    assert_bits_equal(got, fp.f32_add(acc, prod), acc, a, b)
    with np.errstate(all="ignore"):
        want = canon32(as_f32(acc) + as_f32(a) * as_f32(b))
    assert_bits_equal(got, want, acc, a, b)
    # the sample covers the hard cases: exact cancellation, subnormal and NaN results
    assert np.count_nonzero((got & 0x7FFFFFFF) == 0) > 1_000
    assert np.count_nonzero(((got & 0x7F800000) == 0) & ((got & 0x7FFFFF) != 0)) > 100
    assert np.count_nonzero(got == fp.F32_QNAN) > 1_000


def test_f32_add_product_vs_softfloat(softfloat_rne):
    rng = np.random.default_rng(12)
    n = 20_000
    a, b = mac_operands(rng, n, "fp16"), mac_operands(rng, n, "fp16")
    acc = mac_accumulators(rng, fp.f32_mul(a, b))
    want = np.array([sf_bits32(sf.f32_add(sf32(c), sf.f32_mul(sf32(x), sf32(y))))
                     for c, x, y in zip(acc, a, b)], np.uint32)
    got = fp.f32_add_product(acc, fp.mac_operand(a), fp.mac_operand(b))
    assert_bits_equal(got, want, acc, a, b)


def test_f32_add_product_broadcasts_and_specials():
    one, inf, zero = fp.f16_to_f32([0x3C00, 0x7C00, 0x0000])
    ops = fp.mac_operand(np.array([one, inf, zero, inf], np.uint32))
    w = fp.mac_operand(np.array([[one], [zero]], np.uint32))
    acc = np.full((2, 4), 0x8000_0000, np.uint32)                  # -0
    got = fp.f32_add_product(acc, ops, w)
    assert got.shape == (2, 4)
    assert list(got[0]) == [0x3F80_0000, 0x7F80_0000, 0, 0x7F80_0000]   # -0 + +0 is +0
    assert list(got[1]) == [0, fp.F32_QNAN, 0, fp.F32_QNAN]             # inf * 0 is NaN


@pytest.mark.parametrize("bits", [0x3F800001, 0x7F000000, 0x00000001, 0x33000000])
def test_mac_operand_rejects_values_with_inexact_products(bits):
    """More than 11 significant bits, or beyond binary16's range, or a binary32 subnormal."""
    with pytest.raises(ValueError, match="binary16 or int8"):
        fp.mac_operand(np.array([0x3F800000, bits], np.uint32))
