"""Bit-exact number formats of the NPU: binary16, binary32, int8, int32 and the rescale.

This module is the specification that the RTL datapaths must match bit for bit (see
``docs/formats.md``). Every function works on raw bit patterns held in numpy arrays:

* binary16 values are ``np.uint16`` bit patterns,
* binary32 values are ``np.uint32`` bit patterns,
* integers are ``np.int8`` / ``np.int32`` arrays.

Scalars are accepted wherever arrays are; results are always ``np.ndarray`` (0-d for scalar
inputs). Binary operations broadcast their operands like numpy ufuncs.

Floating-point results are computed with explicit integer arithmetic on ``np.int64`` arrays, never
with the host's floating-point unit, so the results do not depend on FPU modes (flush-to-zero,
denormals-are-zero, rounding direction) or on compiler choices. The only rounding primitive is
:func:`f32_pack` (and its binary16 twin used by :func:`f32_to_f16`): every operation first
computes its exact result (or an exact-enough result with a sticky bit) as
``(-1)**sign * sig * 2**exp`` and then rounds it once, to nearest with ties to even (RNE).

Rules shared by all functions:

* IEEE 754 semantics including subnormal inputs and outputs (no flushing), signed zeros and
  infinities; overflow rounds to infinity (the only rounding mode is RNE).
* Every NaN result is the canonical quiet NaN, :data:`F16_QNAN` (0x7E00) or :data:`F32_QNAN`
  (0x7FC00000), whatever the NaN operands were (signalling or quiet, any payload or sign).

This module never imports Amaranth.
"""

import numpy as np

from npu_spec.formats import F16_POS_INF, F16_QNAN, F32_POS_INF, F32_QNAN

__all__ = [
    "F16_QNAN",
    "F32_QNAN",
    "f16_bits",
    "f16_mul_f32",
    "f16_to_f32",
    "f16_value",
    "f32_add",
    "f32_add_product",
    "f32_bits",
    "f32_cmp",
    "f32_max",
    "f32_min",
    "f32_mul",
    "f32_pack",
    "f32_to_f16",
    "f32_to_int8",
    "f32_value",
    "int8_to_f32",
    "int32_wrap",
    "mac_operand",
    "rescale_int32",
]

_F16_INF = F16_POS_INF
_F32_INF = F32_POS_INF

# Largest significand accepted by the rounding primitive (exclusive).
_SIG_LIMIT = 1 << 62
# Exponents beyond this magnitude give zero or infinity for any sig < 2**62; clipping them
# keeps every intermediate well inside int64.
_EXP_CLIP = 4096


# --------------------------------------------------------------------------------------------
# argument conversion


def _as_int(x, name, lo, hi):
    """Return ``x`` as an int64 array after checking it is integral and within ``[lo, hi]``.

    Parameters
    ----------
    x : array_like
        Integer scalar or array (bool, any numpy integer dtype or Python ints).
    name : str
        Argument name used in error messages.
    lo, hi : int
        Inclusive bounds; ``hi`` must be below ``2**63``.

    Returns
    -------
    numpy.ndarray
        ``np.int64`` array of the same shape.

    Raises
    ------
    TypeError
        If ``x`` is not integral (for example a float array).
    ValueError
        If a value lies outside ``[lo, hi]``; the message names the argument and the value.
    """
    arr = np.asarray(x)
    if arr.dtype == np.bool_:
        arr = arr.astype(np.int64)
    if arr.dtype.kind == "O":
        flat = arr.ravel().tolist()
        for v in flat:
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise TypeError(f"{name} must be integers, got {v!r}")
            if not lo <= int(v) <= hi:
                raise ValueError(f"{name} must be in [{lo}, {hi}], got {int(v)}")
        return np.array([int(v) for v in flat], dtype=np.int64).reshape(arr.shape)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and lo <= 0 and hi >= (1 << (8 * arr.dtype.itemsize)) - 1:
        return arr.astype(np.int64)     # every value of the dtype is in range
    if arr.size:
        mn = int(arr.min())
        mx = int(arr.max())
        if mn < lo:
            raise ValueError(f"{name} must be in [{lo}, {hi}], got {mn}")
        if mx > hi:
            raise ValueError(f"{name} must be in [{lo}, {hi}], got {mx}")
    return arr.astype(np.int64)


def _bits32(a, name="a"):
    """Binary32 bit patterns as int64 (validated to ``[0, 2**32)``)."""
    return _as_int(a, name, 0, 0xFFFFFFFF)


def _bits16(a, name="a"):
    """Binary16 bit patterns as int64 (validated to ``[0, 2**16)``)."""
    return _as_int(a, name, 0, 0xFFFF)


# --------------------------------------------------------------------------------------------
# decoding and the rounding primitive


def _fields(bits, exp_bits, frac_bits):
    """Decode int64 patterns of an IEEE binary format with ``exp_bits`` exponent and
    ``frac_bits`` fraction bits: ``(sign, sig, exp, is_nan, is_inf)``; for finite values the
    value is ``(-1)**sign * sig * 2**exp`` exactly, with ``sig < 2**(frac_bits + 1)``."""
    emax = (1 << exp_bits) - 1
    bias = emax >> 1
    sign = (bits >> (exp_bits + frac_bits)) & 1
    e = (bits >> frac_bits) & emax
    frac = bits & ((1 << frac_bits) - 1)
    sub = e == 0
    sig = np.where(sub, frac, frac | (1 << frac_bits))
    exp = np.where(sub, 1 - bias - frac_bits, e - bias - frac_bits)
    is_nan = (e == emax) & (frac != 0)
    is_inf = (e == emax) & (frac == 0)
    return sign, sig, exp, is_nan, is_inf


def _f32_fields(bits):
    """Decode int64 binary32 patterns (:func:`_fields`, ``sig < 2**24``)."""
    return _fields(bits, 8, 23)


def _f16_fields(bits):
    """Decode int64 binary16 patterns (:func:`_fields`, ``sig < 2**11``)."""
    return _fields(bits, 5, 10)


# 2**0 .. 2**62: the number of them at or below v is v's bit length.
_POWERS = np.int64(1) << np.arange(63, dtype=np.int64)


def _bit_length(v):
    """Vectorised ``int.bit_length`` of a non-negative int64 array below ``2**63``."""
    return np.searchsorted(_POWERS, v, side="right").astype(np.int64)


def _round_pack(sign, sig, exp, p, qmin, inf_bits, width):
    """Round ``(-1)**sign * sig * 2**exp`` to nearest-even in a binary format.

    Parameters
    ----------
    sign, sig, exp : numpy.ndarray
        int64 arrays of one shape; ``0 <= sig < 2**62``.
    p : int
        Significand precision including the hidden bit (24 for binary32, 11 for binary16).
    qmin : int
        Exponent of the least significant bit of a subnormal (-149 or -24).
    inf_bits : int
        Bit pattern of +infinity.
    width : int
        Total width (32 or 16).

    Returns
    -------
    numpy.ndarray
        int64 bit patterns.
    """
    exp = np.minimum(np.maximum(exp, -_EXP_CLIP), _EXP_CLIP)
    length = _bit_length(sig)
    e = exp + length - 1  # exponent of the leading one
    q = np.maximum(e - (p - 1), qmin)  # exponent of the result's least significant bit
    shift = q - exp  # > 0: bits to drop; <= 0: exact, shift left
    lsh = np.minimum(np.maximum(-shift, 0), p)
    rsh = np.minimum(np.maximum(shift, 0), 62)
    exact = sig << lsh
    m = sig >> rsh
    rem = sig & ((np.int64(1) << rsh) - 1)
    half = (np.int64(1) << rsh) >> 1
    up = (shift > 0) & (shift <= 62) & ((rem > half) | ((rem == half) & ((m & 1) == 1)))
    m = np.where(shift <= 0, exact, m + up)
    # m is the significand with the hidden bit (or a subnormal's fraction). A carry out of the
    # significand (m == 2**p) moves into the exponent field, as does a subnormal rounding up to
    # the smallest normal: the encoding below is monotonic in (q, m).
    bits = ((q - qmin) << (p - 1)) + m
    bits = np.where(bits >= inf_bits, inf_bits, bits)
    bits = np.where(sig == 0, 0, bits)
    return bits | (sign << (width - 1))


def _pack32(sign, sig, exp):
    return _round_pack(sign, sig, exp, 24, -149, _F32_INF, 32)


def _pack16(sign, sig, exp):
    return _round_pack(sign, sig, exp, 11, -24, _F16_INF, 16)


def _u32(bits):
    return np.asarray(np.asarray(bits).astype(np.uint32))


def _u16(bits):
    return np.asarray(np.asarray(bits).astype(np.uint16))


# --------------------------------------------------------------------------------------------
# public API


def f32_pack(sign, sig, exp):
    """Round ``(-1)**sign * sig * 2**exp`` to binary32, to nearest with ties to even.

    This is the general rounding primitive of the model: every binary32 result is an exact
    value passed through this function once.

    Parameters
    ----------
    sign : array_like of int or bool
        0 (or False) for positive, 1 (or True) for negative.
    sig : array_like of int
        Non-negative integer significand, ``0 <= sig < 2**62``.
    exp : array_like of int
        Power of two scaling ``sig`` (any int64; very large magnitudes saturate to infinity or
        round to zero).

    Returns
    -------
    numpy.ndarray of numpy.uint32
        Binary32 bit patterns, shape of the broadcast inputs. Results below the normal range
        are subnormal (rounded at ``2**-149``); results that round to ``2**128`` or more become
        infinity; a zero result (``sig == 0`` or underflow) keeps ``sign``.

    Raises
    ------
    TypeError
        If an argument is not integral.
    ValueError
        If ``sign`` is not 0/1 or ``sig`` is outside ``[0, 2**62)``.
    """
    sign = _as_int(sign, "sign", 0, 1)
    sig = _as_int(sig, "sig", 0, _SIG_LIMIT - 1)
    exp = _as_int(exp, "exp", -(1 << 63), (1 << 63) - 1)
    sign, sig, exp = np.broadcast_arrays(sign, sig, exp)
    return _u32(_pack32(sign, sig, exp))


def f16_to_f32(h):
    """Widen binary16 to binary32 exactly.

    Parameters
    ----------
    h : array_like of int
        Binary16 bit patterns (``np.uint16`` or integers in ``[0, 0xFFFF]``).

    Returns
    -------
    numpy.ndarray of numpy.uint32
        Binary32 bit patterns of the same values. Binary16 subnormals become normal binary32
        numbers, infinities and signed zeros are kept, every NaN becomes :data:`F32_QNAN`.
    """
    h = _bits16(h, "h")
    sign, sig, exp, is_nan, is_inf = _f16_fields(h)
    bits = _pack32(sign, sig, exp)
    bits = np.where(is_inf, (sign << 31) | _F32_INF, bits)
    bits = np.where(is_nan, F32_QNAN, bits)
    return _u32(bits)


def int8_to_f32(x):
    """Convert int8 values to binary32 exactly.

    Parameters
    ----------
    x : array_like of int
        Integers in ``[-128, 127]`` (normally an ``np.int8`` array).

    Returns
    -------
    numpy.ndarray of numpy.uint32
        Binary32 bit patterns; 0 becomes +0.
    """
    x = _as_int(x, "x", -128, 127)
    return _u32(_pack32((x < 0).astype(np.int64), np.abs(x), np.zeros_like(x)))


def f32_mul(a, b):
    """Multiply binary32 values, rounding the product once to nearest-even.

    Parameters
    ----------
    a, b : array_like of int
        Binary32 bit patterns (broadcast together).

    Returns
    -------
    numpy.ndarray of numpy.uint32
        Bit patterns of ``a * b``. The sign of a zero or infinite result is the exclusive or of
        the operand signs; ``inf * 0`` and any NaN operand give :data:`F32_QNAN`.
    """
    a, b = np.broadcast_arrays(_bits32(a, "a"), _bits32(b, "b"))
    sa, ma, ea, na, ia = _f32_fields(a)
    sb, mb, eb, nb, ib = _f32_fields(b)
    sign = sa ^ sb
    bits = _pack32(sign, ma * mb, ea + eb)
    inf = ia | ib
    bits = np.where(inf, (sign << 31) | _F32_INF, bits)
    nan = na | nb | (ia & (mb == 0)) | (ib & (ma == 0))
    bits = np.where(nan, F32_QNAN, bits)
    return _u32(bits)


# Extra low-order bits kept by f32_add below the larger operand's least significant bit: the
# guard, round and sticky bits of a hardware adder. Any value >= 3 gives the same results; 2 is
# not enough, and 3 needs the sticky bit (the f32_add tests detect both mistakes).
_ADD_GUARD = 3


def f32_add(a, b):
    """Add binary32 values, rounding the sum once to nearest-even.

    Parameters
    ----------
    a, b : array_like of int
        Binary32 bit patterns (broadcast together).

    Returns
    -------
    numpy.ndarray of numpy.uint32
        Bit patterns of ``a + b``. Subnormal operands and results are kept (no flushing);
        overflow gives infinity; ``inf + -inf`` and any NaN operand give :data:`F32_QNAN`. An
        exact zero sum is +0 unless both operands are -0 (so ``x + (-x)`` is +0).

    Notes
    -----
    The operand with the smaller exponent is shifted right to align with the other one, keeping
    three extra low-order bits (guard, round, sticky); the bits shifted out are ORed into the
    lowest bit ("sticky jamming"). This preserves the rounding decision: when bits are lost the
    exponents differ by at least 2, so the sum loses at most one leading bit to cancellation and
    the half-ulp position of the result stays above the jammed bit. The signed sum is then
    rounded by the same primitive as :func:`f32_pack`.
    """
    a, b = np.broadcast_arrays(_bits32(a, "a"), _bits32(b, "b"))
    return _u32(_add_fields(_f32_fields(a), _f32_fields(b)))


def _add_fields(fa, fb):
    """The binary32 sum (int64 bits) of two values given as decoded fields (:func:`_fields`)
    with significands below ``2**24``, normalised as binary32 decodes them."""
    sa, ma, ea, na, ia = fa
    sb, mb, eb, nb, ib = fb
    swap = eb > ea
    s_hi = np.where(swap, sb, sa)
    m_hi = np.where(swap, mb, ma)
    e_hi = np.where(swap, eb, ea)
    s_lo = np.where(swap, sa, sb)
    m_lo = np.where(swap, ma, mb)
    e_lo = np.where(swap, ea, eb)
    d = np.minimum(e_hi - e_lo, 62)
    big = m_hi << _ADD_GUARD
    small_full = m_lo << _ADD_GUARD
    small = small_full >> d
    sticky = (small_full & ((np.int64(1) << d) - 1)) != 0
    small = small | sticky
    total = np.where(s_hi == 1, -big, big) + np.where(s_lo == 1, -small, small)
    sign = np.where(total == 0, s_hi & s_lo, (total < 0).astype(np.int64))
    bits = _pack32(sign, np.abs(total), e_hi - _ADD_GUARD)
    bits = np.where(ia, (sa << 31) | _F32_INF, bits)
    bits = np.where(ib, (sb << 31) | _F32_INF, bits)
    nan = na | nb | (ia & ib & (sa != sb))
    return np.where(nan, F32_QNAN, bits)


# Exponent range (of the least significant bit of a 24-bit significand) of the binary32 values
# that binary16 and int8 values widen to: 2**-24 (the smallest binary16 subnormal) to 65504.
_MAC_EXP_MIN = -24 - 23
_MAC_EXP_MAX = 15 - 23


def mac_operand(a):
    """Decode MAC operands for :func:`f32_add_product`.

    Parameters
    ----------
    a : array_like of int
        Binary32 bit patterns of binary16 or int8 values (the output of :func:`f16_to_f32` or
        :func:`int8_to_f32`): at most 11 significant bits and a finite magnitude between
        ``2**-24`` and 65504, or zero, infinity or NaN.

    Returns
    -------
    tuple of numpy.ndarray
        The fields ``(sign, sig, exp, is_nan, is_inf)`` as int64 / bool arrays of ``a``'s
        shape; slice them alike to take a window.

    Raises
    ------
    ValueError
        If a finite nonzero value has more than 11 significant bits or lies outside that range
        (its products would not be exact in binary32).
    """
    sign, sig, exp, is_nan, is_inf = _f32_fields(_bits32(a, "a"))
    finite = (sig != 0) & ~is_nan & ~is_inf
    bad = finite & (((sig & 0x1FFF) != 0) | (exp < _MAC_EXP_MIN) | (exp > _MAC_EXP_MAX))
    if bad.any():
        raise ValueError("MAC operands must be binary16 or int8 values widened to binary32")
    return sign, sig, exp, is_nan, is_inf


def f32_add_product(acc, a, b):
    """``f32_add(acc, f32_mul(a, b))`` bit for bit, for operands of :func:`mac_operand`.

    The product of two binary16 or int8 values is exact in binary32 (at most 22 significant
    bits, magnitude between ``2**-48`` and ``2**32``), so it is formed exactly from the
    operands' fields and added with the one rounding of :func:`f32_add`, without packing and
    decoding the product in between.

    Parameters
    ----------
    acc : array_like of int
        Binary32 bit patterns of the accumulators.
    a, b : tuple of numpy.ndarray
        Decoded operands (:func:`mac_operand`), broadcast with ``acc``.

    Returns
    -------
    numpy.ndarray of numpy.uint32
        The rounded sums, shape of the broadcast inputs.
    """
    sa, ma, ea, na, ia = a
    sb, mb, eb, nb, ib = b
    sign = sa ^ sb
    # Both significands are normalised (2**23 <= m < 2**24, 13 or more trailing zeros), so
    # the product has 2**46 <= m < 2**48 and 26 or more trailing zeros: shifting its leading
    # one to bit 23 drops only zeros.
    prod = ma * mb
    top = (prod >> 47).astype(np.int64)
    sig = prod >> (23 + top)
    exp = np.where(prod == 0, -149, ea + eb + 23 + top)     # a zero decodes at 2**-149
    nan = na | nb | (ia & (mb == 0)) | (ib & (ma == 0))
    inf = (ia | ib) & ~nan
    acc = _bits32(acc, "acc")
    return _u32(_add_fields(_f32_fields(acc), (sign, sig, exp, nan, inf)))


def _order_key(bits, signed_zero):
    """Integer key ordered like the binary32 values (NaNs excluded by the caller).

    With ``signed_zero`` -0 sorts just below +0, otherwise both zeros share the key 0.
    """
    mag = bits & 0x7FFFFFFF
    neg = (bits >> 31) == 1
    return np.where(neg, -mag - (1 if signed_zero else 0), mag)


def _select(a, b, take_a):
    a, b = np.broadcast_arrays(_bits32(a, "a"), _bits32(b, "b"))
    nan = _f32_fields(a)[3] | _f32_fields(b)[3]
    bits = np.where(take_a(_order_key(a, True), _order_key(b, True)), a, b)
    return _u32(np.where(nan, F32_QNAN, bits))


def f32_max(a, b):
    """Maximum of binary32 values (bit patterns, broadcast together), as ``numpy.uint32``.

    -0 counts as less than +0; if either operand is NaN the result is :data:`F32_QNAN`.
    """
    return _select(a, b, np.greater_equal)


def f32_min(a, b):
    """Minimum of binary32 values (bit patterns, broadcast together), as ``numpy.uint32``.

    -0 counts as less than +0; if either operand is NaN the result is :data:`F32_QNAN`.
    """
    return _select(a, b, np.less_equal)


def f32_cmp(a, b):
    """Three-way comparison of binary32 values.

    Parameters
    ----------
    a, b : array_like of int
        Binary32 bit patterns (broadcast together).

    Returns
    -------
    numpy.ndarray of numpy.int8
        +1 where ``a > b``, -1 where ``a < b``, 0 where they are equal (+0 equals -0) or
        unordered (either is NaN).
    """
    a, b = np.broadcast_arrays(_bits32(a, "a"), _bits32(b, "b"))
    nan = _f32_fields(a)[3] | _f32_fields(b)[3]
    res = np.sign(_order_key(a, False) - _order_key(b, False))
    return np.asarray(np.where(nan, 0, res).astype(np.int8))


def f32_to_f16(a):
    """Narrow binary32 to binary16, rounding to nearest-even.

    Parameters
    ----------
    a : array_like of int
        Binary32 bit patterns.

    Returns
    -------
    numpy.ndarray of numpy.uint16
        Binary16 bit patterns. Results below ``2**-14`` are subnormal binary16 (rounded at
        ``2**-24``; values at most ``2**-25`` round to a signed zero); magnitudes of 65520 or
        more (the midpoint between 65504 and ``2**16``) become infinity; NaN becomes
        :data:`F16_QNAN`; zeros and infinities keep their sign.
    """
    a = _bits32(a)
    sign, sig, exp, is_nan, is_inf = _f32_fields(a)
    bits = _pack16(sign, sig, exp)
    bits = np.where(is_inf, (sign << 15) | _F16_INF, bits)
    bits = np.where(is_nan, F16_QNAN, bits)
    return _u16(bits)


def f16_mul_f32(a16, b16):
    """Exact product of two binary16 values as binary32.

    The 11-bit significands give a product of at most 22 bits and the exponent range of the
    product (``2**-48`` to below ``2**32``) lies inside binary32's normal range, so the result
    is never rounded.

    Parameters
    ----------
    a16, b16 : array_like of int
        Binary16 bit patterns (broadcast together).

    Returns
    -------
    numpy.ndarray of numpy.uint32
        Binary32 bit patterns of ``a16 * b16`` (``inf * 0`` and NaN operands give
        :data:`F32_QNAN`).
    """
    return f32_mul(f16_to_f32(a16), f16_to_f32(b16))


def f32_to_int8(a):
    """Convert binary32 to int8, rounding half to even and saturating.

    Parameters
    ----------
    a : array_like of int
        Binary32 bit patterns.

    Returns
    -------
    numpy.ndarray of numpy.int8
        The value rounded to the nearest integer with ties to even (2.5 -> 2, 3.5 -> 4,
        -0.5 -> 0), then clamped to ``[-128, 127]``. NaN gives 0, +inf gives 127 and -inf
        gives -128.

    Notes
    -----
    Rounding happens before saturation, so 127.5 rounds to 128 and saturates to 127, and
    -128.5 rounds to -128.
    """
    a = _bits32(a)
    sign, sig, exp, is_nan, is_inf = _f32_fields(a)
    whole = sig << np.clip(exp, 0, 8)  # exp >= 8 with sig >= 1 is beyond the int8 range
    rsh = np.clip(-exp, 0, 30)  # sig < 2**24, so larger shifts give 0 with rem < half
    m = sig >> rsh
    rem = sig & ((np.int64(1) << rsh) - 1)
    half = (np.int64(1) << rsh) >> 1
    up = (rsh > 0) & ((rem > half) | ((rem == half) & ((m & 1) == 1)))
    mag = np.where(exp >= 0, whole, m + up)
    val = np.clip(np.where(sign == 1, -mag, mag), -128, 127)
    val = np.where(is_inf, np.where(sign == 1, -128, 127), val)
    val = np.where(is_nan, 0, val)
    return np.asarray(val.astype(np.int8))


_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1


def rescale_int32(x, multiplier, shift, zero_point=0, qmin=-128, qmax=127):
    """TOSA RESCALE of int32 values with a 32-bit multiplier and a single rounding.

    ``y = clamp(((x * multiplier + 2**(shift - 1)) >> shift) + zero_point, qmin, qmax)``

    where ``>>`` is an arithmetic (flooring) shift, so the rounding is half up (toward +inf):
    2.5 -> 3, -2.5 -> -2. The product and the sum are exact (they need at most 63 bits).

    Parameters
    ----------
    x : array_like of int
        Values in the int32 range (normally the int32 accumulators).
    multiplier : array_like of int
        Fixed-point multiplier in ``[0, 2**31 - 1]``; scalar or broadcastable to ``x`` (for
        example one value per output channel).
    shift : array_like of int
        Right shift in ``[2, 62]``; scalar or broadcastable to ``x``.
    zero_point : array_like of int, optional
        Added after the shift, in the int32 range. Default 0.
    qmin, qmax : int, optional
        Clamp bounds in the int32 range with ``qmin <= qmax``. Default ``[-128, 127]`` (int8).

    Returns
    -------
    numpy.ndarray of numpy.int32
        The rescaled, clamped values (the caller casts to the output type).

    Raises
    ------
    ValueError
        If any argument is out of range; the message names it and the bad value.
    """
    x = _as_int(x, "x", _INT32_MIN, _INT32_MAX)
    multiplier = _as_int(multiplier, "multiplier", 0, _INT32_MAX)
    shift = _as_int(shift, "shift", 2, 62)
    zero_point = _as_int(zero_point, "zero_point", _INT32_MIN, _INT32_MAX)
    for name, v in (("qmin", qmin), ("qmax", qmax)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TypeError(f"{name} must be an integer, got {v!r}")
        if not _INT32_MIN <= int(v) <= _INT32_MAX:
            raise ValueError(f"{name} must be in the int32 range, got {int(v)}")
    if int(qmin) > int(qmax):
        raise ValueError(f"qmin must not exceed qmax, got qmin={int(qmin)} qmax={int(qmax)}")
    # |x * multiplier| <= 2**31 * (2**31 - 1) < 2**62 and the rounding term is at most 2**61,
    # so the int64 sum below cannot overflow.
    acc = x * multiplier + (np.int64(1) << (shift - 1))
    y = (acc >> shift) + zero_point
    return np.asarray(np.clip(y, int(qmin), int(qmax)).astype(np.int32))


def int32_wrap(x):
    """Reduce integers to int32 two's complement (modulo ``2**32``), like int32 overflow.

    Parameters
    ----------
    x : array_like of int
        Integers of any integer dtype, or Python ints of any size.

    Returns
    -------
    numpy.ndarray of numpy.int32
        ``((x + 2**31) mod 2**32) - 2**31``.
    """
    arr = np.asarray(x)
    if arr.dtype.kind == "O":
        flat = arr.ravel().tolist()
        for v in flat:
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise TypeError(f"x must be integers, got {v!r}")
        low = np.array([int(v) & 0xFFFFFFFF for v in flat], dtype=np.int64)
        return np.asarray(low.reshape(arr.shape).astype(np.uint32).view(np.int32))
    if arr.dtype == np.bool_:
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"x must be an integer array, got dtype {arr.dtype}")
    if arr.dtype == np.uint64:
        low = arr & np.uint64(0xFFFFFFFF)
    else:
        low = arr.astype(np.int64) & 0xFFFFFFFF
    return np.asarray(low.astype(np.uint32).view(np.int32))


# --------------------------------------------------------------------------------------------
# host-float helpers (for tests and users; these do use the host's float conversion)


def _host_bits(x, float_type, bits_type):
    return np.asarray(np.asarray(x, dtype=float_type).view(bits_type))


def f32_bits(x):
    """Bit patterns (``numpy.uint32``) of values converted to binary32 by numpy (float64
    inputs are rounded to float32 by numpy, RNE)."""
    return _host_bits(x, np.float32, np.uint32)


def f32_value(bits):
    """Binary32 bit patterns as ``numpy.float32`` values."""
    return np.asarray(_u32(_bits32(bits, "bits")).view(np.float32))


def f16_bits(x):
    """Bit patterns (``numpy.uint16``) of values converted to binary16 by numpy (wider inputs
    are rounded to float16 by numpy, RNE)."""
    return _host_bits(x, np.float16, np.uint16)


def f16_value(bits):
    """Binary16 bit patterns as ``numpy.float16`` values."""
    return np.asarray(_u16(_bits16(bits, "bits")).view(np.float16))
