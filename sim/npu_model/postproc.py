"""Golden model of the neural engine's post-processor (``docs/postproc.md``).

The post-processor turns one MAC result beat (``lanes`` accumulators of one output channel
slot) into one output beat (``lanes`` binary16 codes or int8 values). This module is the
specification the RTL (``npu.neural.postproc``) matches bit for bit:

* :func:`postprocess` processes one beat, in the exact order of operations of the hardware;
* :func:`pwl_tables` gives the piecewise-linear tables of sigmoid, tanh, GELU and exp (of
  ``min(x, 0)``, for softmax);
* :func:`lfsr_init` / :func:`lfsr_advance` define the stochastic-rounding generator;
* :func:`run_stream` models the parameter banks: a list of parameter groups and a list of
  result beats give the output beats.

Every float operation goes through :mod:`npu_model.fp` (integer arithmetic, RNE, canonical
NaN). This module never imports Amaranth.
"""

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from npu_spec.mac import MacFormat
from npu_spec.postproc import (
    INT_ACTS,
    LFSR_BITS,
    LFSR_LANE_CONST,
    LFSR_STEPS,
    LFSR_TAPS,
    PWL_EMIN,
    PWL_FUNCS,
    PWL_OCTAVES,
    PWL_SUBSEGMENTS,
    PWL_TABLES,
    Act,
    postproc_error,
)

from . import fp

__all__ = [
    "FMT_F16I8",
    "INT_ACTS",
    "FMT_FP16",
    "FMT_I8F16",
    "FMT_INT8",
    "LFSR_BITS",
    "LFSR_LANE_CONST",
    "LFSR_STEPS",
    "LFSR_TAPS",
    "PWL_EMIN",
    "PWL_ERROR_BOUND",
    "PWL_ERROR_BOUND_F16",
    "PWL_FUNCS",
    "PWL_OCTAVES",
    "PWL_RANGE",
    "PWL_SUBSEGMENTS",
    "Act",
    "PostprocConfig",
    "beat_error",
    "fit_pwl_tables",
    "f32_to_f16_stochastic",
    "f32_to_int_rne",
    "int_rescale",
    "lfsr_advance",
    "lfsr_init",
    "lfsr_step",
    "postprocess",
    "pwl",
    "pwl_max_error",
    "pwl_reference",
    "pwl_segment",
    "pwl_segment_interval",
    "pwl_tables",
    "run_stream",
]

#: MAC formats (:class:`npu_spec.mac.MacFormat`).
FMT_INT8, FMT_FP16, FMT_I8F16, FMT_F16I8 = (MacFormat.INT8, MacFormat.FP16, MacFormat.I8F16,
                                            MacFormat.F16I8)
#: ``|x| >= PWL_RANGE`` (and infinities) is the tail: the asymptote.
PWL_RANGE = 2.0 ** (PWL_EMIN + PWL_OCTAVES)
#: Stated bound on ``|pwl(x) - f(x)|`` (binary32 result against float64) over every finite
#: binary16 ``x``; ``pwl_max_error`` measures it and the tests check it.
PWL_ERROR_BOUND = {"sigmoid": 4.0e-4, "tanh": 6.0e-4, "gelu": 1.1e-3, "exp": 1.3e-3}
#: The same bound after rounding the result to binary16 (RNE), as for fp16 outputs.
PWL_ERROR_BOUND_F16 = {"sigmoid": 6.0e-4, "tanh": 9.0e-4, "gelu": 1.4e-3, "exp": 1.6e-3}

@dataclass(frozen=True)
class PostprocConfig:
    """Layer configuration (the RTL's ``postproc_config_layout``).

    ``lo``, ``hi`` and ``alpha`` are bit patterns: binary32 on the float path; for int32
    accumulators ``lo`` and ``hi`` are int8 values in bits 0-7 (output units, after the zero
    point). ``zero_point`` is a signed int8. ``seed`` is the 32-bit LFSR seed.
    """
    out_fp16: bool = False
    act: int = Act.NONE
    zero_point: int = 0
    lo: int = 0
    hi: int = 0
    alpha: int = 0
    stochastic: bool = False
    seed: int = 1

    def __post_init__(self):
        if not -128 <= int(self.zero_point) <= 127:
            raise ValueError(f"zero_point must be int8, got {self.zero_point}")
        for name in ("lo", "hi", "alpha", "seed"):
            if not 0 <= int(getattr(self, name)) <= 0xFFFFFFFF:
                raise ValueError(f"{name} must be a 32-bit pattern, got {getattr(self, name)}")
        if not 0 <= int(self.act) <= 15:
            raise ValueError(f"act must be a 4-bit code, got {self.act}")


# --------------------------------------------------------------------------------------------
# LFSR


def lfsr_step(state):
    """One step of the Galois LFSR (right shift, feedback mask :data:`LFSR_TAPS`)."""
    s = np.asarray(state, dtype=np.uint64)
    lsb = s & np.uint64(1)
    return np.asarray((s >> np.uint64(1)) ^ (lsb * np.uint64(LFSR_TAPS)), dtype=np.uint64)


def lfsr_advance(state):
    """The state after one result beat (:data:`LFSR_STEPS` steps), per lane."""
    s = np.asarray(state, dtype=np.uint64)
    for _ in range(LFSR_STEPS):
        s = lfsr_step(s)
    return np.asarray(s.astype(np.uint32))


def lfsr_init(seed, lanes):
    """Per-lane LFSR states loaded from ``seed`` (a zero state becomes the lane constant)."""
    c = np.array([(LFSR_LANE_CONST * (i + 1)) & 0xFFFFFFFF for i in range(lanes)],
                 dtype=np.uint64)
    s = np.uint64(int(seed) & 0xFFFFFFFF) ^ c
    return np.asarray(np.where(s == 0, c, s).astype(np.uint32))


# --------------------------------------------------------------------------------------------
# conversions


def f32_to_f16_stochastic(a, rnd):
    """binary32 -> binary16 with stochastic rounding.

    The magnitude is truncated to 13 bits below the binary16 LSB (``t``), ``rnd`` (13 bits) is
    added and the sum is truncated at the LSB: ``m = (t + rnd) >> 13``. Results of ``2**16``
    or more are infinity, NaN is 0x7E00, zeros and infinities keep their sign.
    """
    a = np.asarray(a).astype(np.int64)
    rnd = np.asarray(rnd).astype(np.int64) & 0x1FFF
    sign = (a >> 31) & 1
    e = (a >> 23) & 0xFF
    frac = a & 0x7FFFFF
    sig = np.where(e == 0, frac, frac | 0x800000)
    ee = np.maximum(e, 1)
    d = np.clip(113 - ee, 0, 31)
    t = sig >> d
    base = np.maximum(ee - 113, 0) << 10
    bits = base + ((t + rnd) >> 13)
    bits = np.minimum(bits, 0x7C00)
    bits = np.where((e == 0xFF) & (frac == 0), 0x7C00, bits)
    bits = bits | (sign << 15)
    bits = np.where((e == 0xFF) & (frac != 0), fp.F16_QNAN, bits)
    return np.asarray(bits.astype(np.uint16))


def f32_to_int_rne(a, lo=-256, hi=255):
    """binary32 -> integer, round half to even, clamp to ``[lo, hi]``; NaN gives 0."""
    a = np.asarray(a).astype(np.int64)
    sign = (a >> 31) & 1
    e = (a >> 23) & 0xFF
    frac = a & 0x7FFFFF
    sig = np.where(e == 0, frac, frac | 0x800000)
    exp = np.where(e == 0, -149, e - 150)
    big = exp >= 0  # |x| >= 2**23: beyond any clamp used here
    rsh = np.clip(-exp, 0, 30)
    m = sig >> rsh
    rem = sig & ((np.int64(1) << rsh) - 1)
    half = (np.int64(1) << rsh) >> 1
    up = (rsh > 0) & ((rem > half) | ((rem == half) & ((m & 1) == 1)))
    mag = np.where(big, 1 << 30, m + up)
    val = np.clip(np.where(sign == 1, -mag, mag), lo, hi)
    val = np.where((e == 0xFF) & (frac != 0), 0, val)
    return val


def int_rescale(acc, scale, shift):
    """The exact TOSA rescale ``(acc * scale + round) >> shift`` in Python integers.

    ``acc`` and ``scale`` are int32 (``scale`` as a two's-complement bit pattern), ``shift``
    0..63; ``round`` is ``2**(shift - 1)`` (0 for shift 0); ``>>`` floors (round half up).
    """
    scale = int(scale) & 0xFFFFFFFF
    scale = scale - (1 << 32) if scale >> 31 else scale
    rnd = (1 << (int(shift) - 1)) if int(shift) else 0
    return [(int(a) * scale + rnd) >> int(shift) for a in acc]


def _rescale_lanes(acc, scale, shift):
    """:func:`int_rescale` on int64 arrays, exactly: ``scale`` (32-bit patterns) and ``shift``
    (0..63) are scalars or one per lane.

    ``acc * scale`` needs up to 63 bits and adding the rounding term could overflow int64, so
    the shift is split: for ``shift >= 2``, ``(p + 2**(shift-1)) >> shift`` equals
    ``((p >> 1) + 2**(shift-2)) >> (shift-1)`` (both floor; the rounding term is even).
    """
    scale = np.asarray(scale).astype(np.int64) & 0xFFFFFFFF
    scale = np.where(scale >> 31, scale - (1 << 32), scale)
    shift = np.asarray(shift).astype(np.int64)
    p = np.asarray(acc).astype(np.int64) * scale
    one = np.int64(1)
    split = ((p >> 1) + (one << np.maximum(shift - 2, 0))) >> np.maximum(shift - 1, 0)
    low = (p + np.where(shift == 1, 1, 0)) >> shift        # shift 0 or 1: no overflow
    return np.where(shift >= 2, split, low)


# --------------------------------------------------------------------------------------------
# piecewise-linear table


def pwl_reference(name, x):
    """float64 reference of ``name`` (sigmoid, tanh, exact erf GELU, ``exp(min(x, 0))``) at
    float64 ``x``."""
    x = np.asarray(x, dtype=np.float64)
    if name == "sigmoid":
        return 0.5 * (1.0 + np.tanh(0.5 * x))
    if name == "tanh":
        return np.tanh(x)
    if name == "gelu":
        erf = np.vectorize(math.erf, otypes=[np.float64])
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    if name == "exp":
        return np.exp(np.minimum(x, 0.0))
    raise ValueError(f"unknown function {name!r}")


def pwl_segment(x):
    """Table index (0..127) of binary32 ``x``: ``sign << 6 | octave << 3 | fraction[22:20]``.

    ``octave`` is 0 for ``|x| < 2**PWL_EMIN`` (core), 7 for ``|x| >= PWL_RANGE`` (tail,
    including infinities and NaN), else ``E - (127 + PWL_EMIN) + 1`` for biased exponent E.
    """
    x = np.asarray(x).astype(np.int64)
    s = (x >> 31) & 1
    e = (x >> 23) & 0xFF
    e0 = 127 + PWL_EMIN
    octave = np.where(e < e0, 0, np.where(e >= e0 + PWL_OCTAVES, 7, e - e0 + 1))
    return (s << 6) | (octave << 3) | ((x >> 20) & 7)


def pwl_segment_interval(index):
    """``(lo, hi)`` magnitudes of segment ``index`` (``hi`` is ``inf`` for the tail)."""
    octave = (index >> 3) & 7
    sub = index & 7
    if octave == 0:
        return 0.0, 2.0 ** PWL_EMIN
    if octave == 7:
        return PWL_RANGE, math.inf
    w = 2.0 ** (PWL_EMIN + octave - 1)
    return w * (1 + sub / 8), w * (1 + (sub + 1) / 8)


_TAILS = {  # (a, b) for (positive, negative) tails
    "sigmoid": ((0.0, 1.0), (0.0, 0.0)),
    "tanh":    ((0.0, 1.0), (0.0, -1.0)),
    "gelu":    ((1.0, -0.0), (0.0, -0.0)),
    "exp":     ((0.0, 1.0), (0.0, 0.0)),
}


@cache
def fit_pwl_tables():
    """Fit the piecewise-linear tables against the float64 references: ``{name: (a_bits,
    b_bits)}`` as :func:`pwl_tables`. The specification's :data:`~npu_spec.postproc.PWL_TABLES`
    holds the result of this fit (a test checks that they agree)."""
    out = {}
    for name in PWL_FUNCS:
        a_bits = np.zeros(128, np.uint32)
        b_bits = np.zeros(128, np.uint32)
        for index in range(128):
            neg = index >> 6
            lo, hi = pwl_segment_interval(index)
            if math.isinf(hi) or (name == "exp" and not neg):
                # Tails hold the asymptote; exp(min(x, 0)) is the constant 1 for every x > 0.
                a, b = _TAILS[name][neg]
            elif lo == 0.0:
                # Core: anchored at f(0) (so pwl(+-0) is exactly 0.5, 0 or 0), slope minimising
                # the largest error (a convex function of the slope: ternary search).
                xs = np.linspace(lo, hi, 513) * (-1.0 if neg else 1.0)
                b = float(pwl_reference(name, 0.0))
                ys = pwl_reference(name, xs) - b
                lo_a, hi_a = -2.0, 2.0
                for _ in range(200):
                    m1, m2 = lo_a + (hi_a - lo_a) / 3, hi_a - (hi_a - lo_a) / 3
                    if np.abs(ys - m1 * xs).max() < np.abs(ys - m2 * xs).max():
                        hi_a = m2
                    else:
                        lo_a = m1
                a = 0.5 * (lo_a + hi_a)
            else:
                # Chord slope, intercept centred on the error over a dense grid: the minimax
                # line for a convex or concave piece, close to it elsewhere.
                xs = np.linspace(lo, hi, 513) * (-1.0 if neg else 1.0)
                ys = pwl_reference(name, xs)
                a = (ys[-1] - ys[0]) / (xs[-1] - xs[0])
                err = ys - a * xs
                b = 0.5 * (err.max() + err.min())
            a_bits[index] = fp.f32_bits(np.float32(a))
            b_bits[index] = fp.f32_bits(np.float32(b))
        a_bits.setflags(write=False)
        b_bits.setflags(write=False)
        out[name] = (a_bits, b_bits)
    return out


@cache
def _tables():
    out = {}
    for name, (a, b) in PWL_TABLES.items():
        a_bits = np.array(a, np.uint32)
        b_bits = np.array(b, np.uint32)
        a_bits.setflags(write=False)
        b_bits.setflags(write=False)
        out[name] = (a_bits, b_bits)
    return out


def pwl_tables():
    """``{name: (a_bits, b_bits)}``: 128 binary32 slopes and intercepts per function, indexed
    by :func:`pwl_segment`, from :data:`npu_spec.postproc.PWL_TABLES`. Tail entries hold the
    asymptote (see :func:`pwl`)."""
    return _tables()


def pwl(name, x):
    """Piecewise-linear ``name`` of binary32 ``x`` (bit patterns), per the table.

    * NaN gives 0x7FC00000;
    * tail (``|x| >= PWL_RANGE`` or infinite): GELU on the positive side gives ``x``, every
      other tail gives the table's ``b`` (1, 0, 1, -1, -0);
    * otherwise ``f32_add(f32_mul(x, a_k), b_k)`` with ``k = pwl_segment(x)``.
    """
    x = np.asarray(x).astype(np.int64)
    a_tab, b_tab = pwl_tables()[name]
    k = pwl_segment(x)
    a = a_tab[k].astype(np.int64)
    b = b_tab[k].astype(np.int64)
    y = fp.f32_add(fp.f32_mul(x, a), b).astype(np.int64)
    tail = ((k >> 3) & 7) == 7
    passthru = (name == "gelu") & ((k >> 6) == 0)
    y = np.where(tail, np.where(passthru, x, b), y)
    nan = ((x >> 23) & 0xFF == 0xFF) & ((x & 0x7FFFFF) != 0)
    y = np.where(nan, fp.F32_QNAN, y)
    return np.asarray(y.astype(np.uint32))


def _all_finite_f16_as_f32():
    h = np.arange(1 << 16, dtype=np.uint32)
    h = h[((h >> 10) & 0x1F) != 0x1F]
    return fp.f16_to_f32(h)


def pwl_max_error(name, after_f16=False):
    """Largest ``|pwl(x) - f(x)|`` over every finite binary16 ``x`` (float64 reference).

    With ``after_f16`` the result is first rounded to binary16 (RNE), as the post-processor
    does for fp16 outputs. Returns ``(error, x_at_max)``.
    """
    x = _all_finite_f16_as_f32()
    y = pwl(name, x)
    if after_f16:
        got = fp.f16_value(fp.f32_to_f16(y)).astype(np.float64)
    else:
        got = fp.f32_value(y).astype(np.float64)
    xv = fp.f32_value(x).astype(np.float64)
    err = np.abs(got - pwl_reference(name, xv))
    i = int(np.argmax(err))
    return float(err[i]), float(xv[i])


# --------------------------------------------------------------------------------------------
# one beat


def _fmt_value(fmt):
    return int(getattr(fmt, "value", fmt))


def beat_error(fmt, cfg, formats=("int8", "fp16", "mixed")):
    """True if a result beat of format ``fmt`` cannot be processed under ``cfg`` by a build
    with ``formats`` (:func:`npu_spec.postproc.postproc_error`). Such beats give zeros and set
    the sticky error."""
    return postproc_error(_fmt_value(fmt) == FMT_INT8, cfg.act, cfg.out_fp16, formats)


def _sext8(v):
    v = int(v) & 0xFF
    return v - 256 if v & 0x80 else v


def postprocess(acc_values, fmt, params_scale, params_shift, cfg, lfsr_state=None,
                formats=("int8", "fp16", "mixed")):
    """Post-process one result beat.

    Order of operations (``docs/postproc.md``):

    * LFSR: every lane advances :data:`LFSR_STEPS` steps; ``R`` = the new state's low 13 bits.
    * error (:func:`beat_error`): zeros.
    * int32: ``y = (acc * scale + round) >> shift`` (exact, :func:`int_rescale`), ``+ zp``,
      saturate to int8, then ReLU ``max(y, zp)`` or clamp ``min(max(y, lo8), hi8)``.
    * binary32: ``x = f32_mul(acc, scale)``, the activation in binary32, then binary16 (RNE or
      stochastic with ``R``) or int8 (``f32_to_int_rne`` to [-256, 255], ``+ zp``, saturate).

    Parameters
    ----------
    acc_values : array_like
        ``lanes`` accumulators: int32 values (or their 32-bit patterns) for ``FMT_INT8``,
        binary32 bit patterns otherwise.
    fmt : int or MacFormat
        The beat's MAC format.
    params_scale, params_shift : int or array_like
        The slot's parameters (32-bit pattern; shift 0..63), or one per lane.
    cfg : PostprocConfig
    lfsr_state : array_like of uint32, optional
        Per-lane LFSR states before this beat; ``None`` means freshly loaded from ``cfg.seed``.
    formats : tuple of str
        The build's formats (``NPUConfig.formats``).

    Returns
    -------
    (values, new_lfsr_state)
        ``values``: ``np.uint16`` per lane (binary16 code, or int8 sign-extended to 16 bits);
        the LFSR advances once per beat whatever the format.
    """
    acc = np.asarray(acc_values).astype(np.int64) & 0xFFFFFFFF
    lanes = acc.shape[0]
    state = lfsr_init(cfg.seed, lanes) if lfsr_state is None else np.asarray(lfsr_state)
    state = lfsr_advance(state)
    rnd = state.astype(np.int64) & ((1 << LFSR_BITS) - 1)
    if beat_error(fmt, cfg, formats):
        return np.zeros(lanes, np.uint16), state
    act = Act(int(cfg.act))
    zp = int(cfg.zero_point)
    if _fmt_value(fmt) == FMT_INT8:
        signed = np.where(acc >> 31, acc - (1 << 32), acc)
        y = np.minimum(np.maximum(_rescale_lanes(signed, params_scale, params_shift) + zp,
                                  -128), 127)
        if act == Act.RELU:
            y = np.maximum(y, zp)
        elif act == Act.CLAMP:
            y = np.minimum(np.maximum(y, _sext8(cfg.lo)), _sext8(cfg.hi))
        return np.asarray((y & 0xFFFF).astype(np.uint16)), state

    x = fp.f32_mul(acc, np.asarray(params_scale).astype(np.int64) & 0xFFFFFFFF
                   ).astype(np.int64)
    if act == Act.RELU:
        x = fp.f32_max(x, 0)
    elif act == Act.CLAMP:
        x = fp.f32_min(fp.f32_max(x, int(cfg.lo)), int(cfg.hi))
    elif act == Act.LEAKY:
        neg = ((x >> 31) == 1) & ((x & 0x7FFFFFFF) != 0) & ((x & 0x7FFFFFFF) <= 0x7F800000)
        x = np.where(neg, fp.f32_mul(x, int(cfg.alpha)), x)
    elif act == Act.ABS:
        x = x & 0x7FFFFFFF
    elif act in (Act.SIGMOID, Act.TANH, Act.GELU, Act.EXP):
        x = pwl(PWL_FUNCS[act - Act.SIGMOID], x)
    x = np.asarray(x).astype(np.int64)
    if cfg.out_fp16:
        if cfg.stochastic:
            return f32_to_f16_stochastic(x, rnd), state
        return fp.f32_to_f16(x), state
    q = np.clip(f32_to_int_rne(x) + zp, -128, 127)
    return np.asarray((q & 0xFFFF).astype(np.uint16)), state


# --------------------------------------------------------------------------------------------
# stream level: parameter banks


def run_stream(groups, results, cfg, lanes, formats=("int8", "fp16", "mixed"),
               lfsr_state=None):
    """Expected output beats of a layer.

    Parameters
    ----------
    groups : list of list of (slot, scale, shift)
        Parameter beats per group (the last one of each group carries ``group_last``).
    results : list of (fmt, slot, acc_values)
        Result beats in stream order; group ``g`` owns as many consecutive result beats as it
        has parameter beats, and each looks its parameters up by slot in its own group.
    cfg : PostprocConfig

    Returns
    -------
    (outputs, errors, lfsr_state)
        ``outputs``: list of ``(slot, values)``; ``errors``: per beat, whether it set the
        error flag.
    """
    outs, errs = [], []
    state = lfsr_init(cfg.seed, lanes) if lfsr_state is None else lfsr_state
    i = 0
    for group in groups:
        bank = {slot: (scale, shift) for slot, scale, shift in group}
        for _ in range(len(group)):
            if i >= len(results):
                break
            fmt, slot, acc = results[i]
            scale, shift = bank[slot]
            values, state = postprocess(acc, fmt, scale, shift, cfg, state, formats)
            outs.append((slot, values))
            errs.append(beat_error(fmt, cfg, formats))
            i += 1
    if i != len(results):
        raise ValueError("more result beats than parameter beats")
    return outs, errs, state
