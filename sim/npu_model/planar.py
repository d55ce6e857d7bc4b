"""Golden model of the planar engine: elementwise, pooling and reduction modes.

Every function works on raw number patterns (``np.int8`` for INT8, ``np.uint16`` binary16 bit
patterns for FP16) and computes in binary32 with the bit-exact integer arithmetic of
:mod:`npu_model.fp`, in exactly the order of operations the RTL uses (``docs/planar.md``,
"Golden contract"). Tensors are ``(C, H, W)``.

The contract, in short:

* The first format converter widens every input exactly to binary32; the second one narrows the
  binary32 result to the output format (binary16 RNE; int8 RNE with saturation, NaN -> 0).
* Elementwise: one binary32 operation per mode (two for gain-bias and the ternary modes, in the
  order written), see :data:`ELT_OPS`.
* Pooling is separable: each window row is folded over ``kx`` (horizontal filter), then the
  window's row results are folded over ``ky`` (vertical filter); both folds run over the valid
  (non-padding) elements only, in increasing order, starting from the identity (``-0`` for
  sums, ``-inf``/``+inf`` for max/min). The average multiplies the sum by ``recip(n)``, the
  correctly rounded binary32 reciprocal of the number ``n`` of valid elements.
* Reduction: the plane is cut into beats of ``lanes`` elements (each row into
  ``ceil(W / lanes)`` beats, missing lanes hold the identity); each beat goes through a pairwise
  tree (lane ``2i`` with lane ``2i + 1``, level by level); beat ``k`` of a group is folded into
  retention register ``k mod RETAIN``; the registers are combined as
  ``op(op(r0, r1), r2)``; the result is multiplied by ``scale`` and passed through the
  post-processor function (square root, reciprocal, reciprocal square root).

This module never imports Amaranth.
"""

import math

import numpy as np

from npu_spec import planar as spec
from npu_spec.formats import F32_NEG_INF, F32_NEG_ZERO, F32_ONE, F32_POS_INF

from . import fp

__all__ = [
    "BCASTS",
    "ELT_ARITY",
    "ELT_OPS",
    "F32_NEG_ZERO",
    "F32_ONE",
    "FMT_FP16",
    "FMT_INT8",
    "POOL_OPS",
    "POST_FNS",
    "RED_OPS",
    "RETAIN",
    "broadcast_operand",
    "eltwise",
    "fold_channels",
    "lane_op",
    "f32_recip",
    "f32_rsqrt",
    "f32_sqrt",
    "from_f32",
    "mean",
    "pool",
    "pool_columns",
    "pool_divisors",
    "pool_rows",
    "pool_shape",
    "recip_count",
    "reduce",
    "reduce_beats",
    "reduce_tree",
    "reduction_count",
    "to_f32",
    "variance",
]

FMT_INT8 = spec.Fmt.INT8
FMT_FP16 = spec.Fmt.FP16



def _names(codes):
    return {member.name.lower(): member.value for member in codes}


#: Elementwise operation codes by name (:class:`npu_spec.planar.EltOp`).
ELT_OPS = _names(spec.EltOp)
#: Number of stream operands of each elementwise operation.
ELT_ARITY = {op.name.lower(): arity for op, arity in spec.ELT_ARITY.items()}
#: Pooling operation codes.
POOL_OPS = _names(spec.PoolOp)
#: Reduction operation codes.
RED_OPS = _names(spec.RedOp)
#: Post-processor functions (reduction mode).
POST_FNS = _names(spec.PostFn)
#: Broadcast kinds of operand B.
BCASTS = _names(spec.Bcast)

#: Retention registers of the reduction (one per cycle of the accumulator's latency).
RETAIN = spec.RETAIN


# --------------------------------------------------------------------------------------------
# format converters


def to_f32(x, fmt):
    """First format converter: INT8 values or binary16 bits to binary32 bits (exact)."""
    if fmt == FMT_INT8:
        return fp.int8_to_f32(np.asarray(x).astype(np.int64))
    if fmt == FMT_FP16:
        return fp.f16_to_f32(np.asarray(x).astype(np.int64))
    raise ValueError(f"format must be FMT_INT8 or FMT_FP16, not {fmt!r}")


def from_f32(y, fmt):
    """Second format converter: binary32 bits to INT8 values or binary16 bits."""
    if fmt == FMT_INT8:
        return fp.f32_to_int8(y)
    if fmt == FMT_FP16:
        return fp.f32_to_f16(y)
    raise ValueError(f"format must be FMT_INT8 or FMT_FP16, not {fmt!r}")


def _neg(a):
    return (np.asarray(a, dtype=np.uint32) ^ np.uint32(0x8000_0000)).astype(np.uint32)


def _abs(a):
    return (np.asarray(a, dtype=np.uint32) & np.uint32(0x7FFF_FFFF)).astype(np.uint32)


# --------------------------------------------------------------------------------------------
# post-processor: correctly rounded square root and reciprocal


def _fields(bits):
    bits = int(bits)
    sign = bits >> 31
    e = (bits >> 23) & 0xFF
    frac = bits & 0x7FFFFF
    return sign, e, frac


def _sqrt1(bits):
    sign, e, frac = _fields(bits)
    if e == 0xFF:
        return fp.F32_QNAN if frac or sign else F32_POS_INF
    if e == 0 and frac == 0:
        return bits  # sqrt(+-0) = +-0
    if sign:
        return fp.F32_QNAN
    sig = frac | (1 << 23) if e else frac
    exp = (e if e else 1) - 150
    if exp % 2:
        sig, exp = sig << 1, exp - 1
    rad = sig << 60  # even shift: the root has at least 30 bits
    root = math.isqrt(rad)
    sticky = int(root * root != rad)
    return int(fp.f32_pack(0, (root << 1) | sticky, (exp - 60) // 2 - 1))


def _recip1(bits):
    sign, e, frac = _fields(bits)
    if e == 0xFF:
        return fp.F32_QNAN if frac else sign << 31
    if e == 0 and frac == 0:
        return (sign << 31) | F32_POS_INF
    sig = frac | (1 << 23) if e else frac
    exp = (e if e else 1) - 150
    q, r = divmod(1 << 60, sig)
    return int(fp.f32_pack(sign, (q << 1) | int(r != 0), -exp - 61))


def f32_sqrt(a):
    """Correctly rounded (RNE) binary32 square root.

    ``sqrt(-0) = -0``, ``sqrt(+inf) = +inf``; negative numbers, ``-inf`` and NaN give
    :data:`npu_model.fp.F32_QNAN`. Error: at most 0.5 ulp (correct rounding).
    """
    a = np.asarray(a, dtype=np.uint32)
    return np.asarray(np.vectorize(_sqrt1, otypes=[np.uint32])(a) if a.size else a)


def f32_recip(a):
    """Correctly rounded (RNE) binary32 reciprocal ``1 / a``.

    ``1/+-0 = +-inf``, ``1/+-inf = +-0``, NaN gives the canonical NaN; results below the normal
    range are subnormal (rounded once). Error: at most 0.5 ulp (correct rounding).
    """
    a = np.asarray(a, dtype=np.uint32)
    return np.asarray(np.vectorize(_recip1, otypes=[np.uint32])(a) if a.size else a)


def f32_rsqrt(a):
    """``recip(sqrt(a))``: two correctly rounded steps (error below 1.5 ulp)."""
    return f32_recip(f32_sqrt(a))


def recip_count(n):
    """Binary32 bits of ``1/n`` rounded to nearest even (the average's divisor)."""
    return f32_recip(fp.f32_bits(np.asarray(n, dtype=np.float64)))


_POST = {spec.PostFn.NONE: lambda x: np.asarray(x, dtype=np.uint32), spec.PostFn.SQRT: f32_sqrt,
         spec.PostFn.RECIP: f32_recip, spec.PostFn.RSQRT: f32_rsqrt}


# --------------------------------------------------------------------------------------------
# elementwise


def broadcast_operand(b, kind, shape, fmt, scalar=0):
    """Operand B as a full ``(C, H, W)`` binary32 array.

    ``kind`` is a :data:`BCASTS` code: ``none`` (``b`` has the full shape), ``scalar`` (the
    binary32 bits ``scalar``; ``b`` unused), ``channel`` (``b`` has ``C`` elements, one per
    channel), ``row`` (``W`` elements, the same row for every channel and row), ``column``
    (``H`` elements, one per row, for every channel and column).
    """
    c, h, w = shape
    if kind == BCASTS["scalar"]:
        return np.full(shape, scalar, dtype=np.uint32)
    bf = to_f32(b, fmt)
    if kind == BCASTS["none"]:
        return np.broadcast_to(bf.reshape(shape), shape)
    if kind == BCASTS["channel"]:
        return np.broadcast_to(bf.reshape(c, 1, 1), shape)
    if kind == BCASTS["row"]:
        return np.broadcast_to(bf.reshape(1, 1, w), shape)
    if kind == BCASTS["column"]:
        return np.broadcast_to(bf.reshape(1, h, 1), shape)
    raise ValueError(f"unknown broadcast kind {kind!r}")


def lane_op(op, a, b=None, c=None, *, scale=F32_ONE, bias=0):
    """One elementwise operation on binary32 operands (the lane pipeline's work on a beat).

    ``a``, ``b``, ``c`` are binary32 bit patterns (arrays of one shape, or scalars); ``b`` and
    ``c`` only for the binary and ternary operations; ``scale`` and ``bias`` the gain-bias
    constants. Returns the binary32 result (no output rounding): the golden column of the
    table in ``docs/planar.md``.
    """
    code = spec.EltOp(ELT_OPS[op] if isinstance(op, str) else int(op))
    A = np.asarray(a, dtype=np.uint32)
    B = None if b is None else np.asarray(b, dtype=np.uint32)
    C = None if c is None else np.asarray(c, dtype=np.uint32)
    E = spec.EltOp
    if code == E.COPY:
        return A
    if code == E.RELU:
        return fp.f32_max(A, 0)
    if code == E.ABS:
        return _abs(A)
    if code == E.NEG:
        return _neg(A)
    if code == E.SQUARE:
        return fp.f32_mul(A, A)
    if code == E.GAIN_BIAS:
        return fp.f32_add(fp.f32_mul(A, scale), bias)
    if code == E.ADD:
        return fp.f32_add(A, B)
    if code == E.SUB:
        return fp.f32_add(A, _neg(B))
    if code == E.MUL:
        return fp.f32_mul(A, B)
    if code == E.MAX:
        return fp.f32_max(A, B)
    if code == E.MIN:
        return fp.f32_min(A, B)
    if code == E.CMP:
        return fp.f32_bits(fp.f32_cmp(A, B).astype(np.float32))
    if code == E.FMA:
        return fp.f32_add(A, fp.f32_mul(B, C))
    return fp.f32_mul(fp.f32_add(A, B), C)     # ADDMUL


def eltwise(op, a, b=None, c=None, *, in_fmt=FMT_INT8, out_fmt=FMT_INT8, scale=F32_ONE,
            bias=0, bcast=0, scalar=0):
    """Elementwise mode.

    Parameters
    ----------
    op : str or int
        A key or value of :data:`ELT_OPS`.
    a : ndarray
        Operand A, shape ``(C, H, W)`` (INT8 values or binary16 bits, per ``in_fmt``).
    b, c : ndarray or None
        Operands B (possibly broadcast, see :func:`broadcast_operand`) and C (full shape).
    scale, bias : int
        Binary32 bits of the gain-bias constants ``s`` and ``b`` of ``x * s + b``.
    bcast, scalar : int
        Broadcast kind of B and the binary32 bits of a scalar B.

    Returns
    -------
    ndarray
        The result in ``out_fmt``, shape of ``a``.
    """
    code = spec.EltOp(ELT_OPS[op] if isinstance(op, str) else int(op))
    a = np.asarray(a)
    shape = a.shape
    arity = spec.ELT_ARITY[code]
    A = to_f32(a, in_fmt)
    B = broadcast_operand(b, bcast, shape, in_fmt, scalar) if arity >= 2 else None
    C = to_f32(np.asarray(c), in_fmt).reshape(shape) if arity == 3 else None
    return from_f32(lane_op(code, A, B, C, scale=scale, bias=bias), out_fmt)


# --------------------------------------------------------------------------------------------
# pooling


def pool_shape(h, w, kh, kw, sy, sx, py, px):
    """Output ``(OH, OW)`` of a pooling window, or ``ValueError`` if the window is impossible.

    Every window must hold at least one valid element: ``py < kh``, ``px < kw`` and
    ``kh <= H + 2*py``, ``kw <= W + 2*px``; strides are at least 1.
    """
    if min(h, w, kh, kw, sy, sx) < 1 or py < 0 or px < 0:
        raise ValueError("pooling sizes, window and strides must be positive")
    if py >= kh or px >= kw:
        raise ValueError(f"padding ({py}, {px}) must be smaller than the window ({kh}, {kw})")
    if kh > h + 2 * py or kw > w + 2 * px:
        raise ValueError(f"window ({kh}, {kw}) larger than the padded plane")
    return (h + 2 * py - kh) // sy + 1, (w + 2 * px - kw) // sx + 1


def _window_fold(v, axis, n_out, k, stride, pad, fold, ident):
    """One separable filter along ``axis`` of ``v``: output ``o`` is
    ``op(... op(op(I, v[o s - p]), v[o s - p + 1]) ...)`` over the window's valid positions in
    increasing order. Returns the ``n_out`` results along ``axis`` and the count of valid
    positions of each."""
    n = v.shape[axis]
    o = np.arange(n_out)
    shape = [1] * v.ndim
    shape[axis] = n_out
    out_shape = list(v.shape)
    out_shape[axis] = n_out
    acc = np.full(out_shape, ident, dtype=np.uint32)
    count = np.zeros(n_out, dtype=np.int64)
    for j in range(k):
        i = o * stride - pad + j
        valid = (i >= 0) & (i < n)
        val = np.take(v, np.clip(i, 0, n - 1), axis=axis)
        acc = np.where(valid.reshape(shape), fold(acc, val), acc).astype(np.uint32)
        count += valid
    return acc, count


def _pool_fold(op):
    code = spec.PoolOp(POOL_OPS[op] if isinstance(op, str) else int(op))
    P = spec.PoolOp
    ident = {P.MAX: F32_NEG_INF, P.MIN: F32_POS_INF, P.AVG: F32_NEG_ZERO}[code]
    fold = {P.MAX: fp.f32_max, P.MIN: fp.f32_min, P.AVG: fp.f32_add}[code]
    return code, fold, ident


def pool_rows(x, op, kw, sx=1, px=0):
    """The horizontal filter: every input row folded over the window's columns.

    ``x`` is binary32, rows on the last axis; returns the row results (binary32,
    ``(..., OW)``): output column ``ox`` folds the valid columns ``ox sx - px + kx``,
    ``0 <= kx < kw``, in increasing order from the identity.
    """
    _, fold, ident = _pool_fold(op)
    x = np.asarray(x, dtype=np.uint32)
    w = x.shape[-1]
    ow = (w + 2 * px - kw) // sx + 1
    return _window_fold(x, x.ndim - 1, ow, kw, sx, px, fold, ident)[0]


def pool_columns(h, op, kh, sy=1, py=0):
    """The vertical filter: the row results ``h`` (binary32, ``(..., H, OW)``) folded over the
    window's rows, output row ``oy`` the valid rows ``oy sy - py + ky`` in increasing order from
    the identity; returns ``(..., OH, OW)`` (binary32)."""
    _, fold, ident = _pool_fold(op)
    h = np.asarray(h, dtype=np.uint32)
    rows = h.shape[-2]
    oh = (rows + 2 * py - kh) // sy + 1
    return _window_fold(h, h.ndim - 2, oh, kh, sy, py, fold, ident)[0]


def pool_divisors(op, h, w, kh, kw, sy=1, sx=1, py=0, px=0):
    """The multiplier of each pooling output, ``(OH, OW)`` binary32: ``recip(n)`` of the valid
    (non-padding) elements ``n`` of its window for the average, 1.0 for max and min."""
    code, _, _ = _pool_fold(op)
    oh, ow = pool_shape(h, w, kh, kw, sy, sx, py, px)
    rows = _window_fold(np.zeros((h, 1), dtype=np.uint32), 0, oh, kh, sy, py,
                        fp.f32_add, F32_NEG_ZERO)[1]
    cols = _window_fold(np.zeros((1, w), dtype=np.uint32), 1, ow, kw, sx, px,
                        fp.f32_add, F32_NEG_ZERO)[1]
    if code != spec.PoolOp.AVG:
        return np.full((oh, ow), F32_ONE, dtype=np.uint32)
    return recip_count(rows[:, None] * cols[None, :])


def pool(x, op, kh, kw, sy=1, sx=1, py=0, px=0, *, in_fmt=FMT_INT8, out_fmt=FMT_INT8):
    """Pooling mode: max, min or average over ``kh x kw`` windows of every channel.

    Separable: :func:`pool_rows` over every input row, then :func:`pool_columns`, then the
    multiplier of :func:`pool_divisors`. Global pooling is the reduction mode (or a window as
    large as the plane).
    """
    x = np.asarray(x)
    _, H, W = x.shape
    pool_shape(H, W, kh, kw, sy, sx, py, px)
    X = to_f32(x, in_fmt)
    acc = pool_columns(pool_rows(X, op, kw, sx, px), op, kh, sy, py)
    if _pool_fold(op)[0] == spec.PoolOp.AVG:
        acc = fp.f32_mul(acc, pool_divisors(op, H, W, kh, kw, sy, sx, py, px)[None])
    return from_f32(acc, out_fmt)


# --------------------------------------------------------------------------------------------
# reduction


def _tree(vals, fold):
    """Pairwise tree over the last axis (a power of two): lane 2i with lane 2i+1."""
    while vals.shape[-1] > 1:
        vals = fold(vals[..., 0::2], vals[..., 1::2])
    return vals[..., 0]


def reduce_tree(beats, op):
    """The reduction tree of each beat: ``beats`` binary32 ``(..., lanes)`` (a power of two),
    lane ``2i`` with lane ``2i + 1`` level by level; returns ``(...)`` binary32."""
    return _tree(np.asarray(beats, dtype=np.uint32), _red_fold(op)[0])


def reduce(x, op, *, lanes, pre="copy", axis="plane", scale=F32_ONE, post="none",
           in_fmt=FMT_INT8, out_fmt=FMT_INT8):
    """Reduction mode: sum, max or min over each channel's plane, the whole tensor, or across
    the channels of every pixel.

    Parameters
    ----------
    x : ndarray
        ``(C, H, W)`` input.
    op : str or int
        A :data:`RED_OPS` key or code.
    lanes : int
        Elements per beat (the engine's ``P * P``), a power of two; sets the tree shape.
    pre : str
        A unary :data:`ELT_OPS` operation applied to every element first (``square`` for sums
        of squares, ``abs`` for L1 norms).
    axis : str
        ``"plane"`` (one result per channel), ``"tensor"`` (one result) or ``"channel"`` (one
        result per pixel: a ``(1, H, W)`` plane; ``post`` must be ``"none"``).
    scale : int
        Binary32 bits multiplied into the reduced value (``recip(N)`` gives a mean).
    post : str
        A :data:`POST_FNS` key applied last.

    Returns
    -------
    ndarray
        Shape ``(C,)``, ``(1,)`` or ``(1, H, W)`` in ``out_fmt``.
    """
    code = spec.RedOp(RED_OPS[op] if isinstance(op, str) else int(op))
    pre_code = ELT_OPS[pre] if isinstance(pre, str) else int(pre)
    if pre_code > spec.EltOp.SQUARE:
        raise ValueError(f"pre must be one of copy, relu, abs, neg, square, not {pre!r}")
    if lanes < 1 or lanes & (lanes - 1):
        raise ValueError(f"lanes must be a power of two, not {lanes!r}")
    post_code = POST_FNS[post] if isinstance(post, str) else int(post)
    x = np.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"x must have shape (C, H, W), not {x.shape}")
    X = lane_op(pre_code, to_f32(x, in_fmt))
    if axis not in ("plane", "tensor", "channel"):
        raise ValueError(f"axis must be 'plane', 'tensor' or 'channel', not {axis!r}")
    if axis == "channel":
        if post_code != spec.PostFn.NONE:
            raise ValueError("a reduction across channels has no post function")
        return from_f32(_reduce_channels(X, code, scale), out_fmt)
    return from_f32(_reduce_core(X, code, lanes, axis, scale, post_code), out_fmt)


def reduction_count(shape, axis):
    """Elements per result of a reduction of a ``(C, H, W)`` tensor over ``axis``."""
    C, H, W = shape
    return {"plane": H * W, "tensor": C * H * W, "channel": C}[axis]


def mean(x, *, lanes, in_fmt=FMT_INT8, out_fmt=FMT_INT8, axis="plane"):
    """Mean of each plane (tensor, pixel across channels): the sum times ``recip(N)``."""
    n = reduction_count(np.asarray(x).shape, axis)
    return reduce(x, "sum", lanes=lanes, axis=axis, scale=int(recip_count(n)),
                  in_fmt=in_fmt, out_fmt=out_fmt)


def variance(x, *, lanes, in_fmt=FMT_INT8, axis="plane"):
    """Population variance of each plane in binary32 bits, as the engine computes it.

    Two reduction passes give ``m = sum(x) * recip(N)`` and ``q = sum(x*x) * recip(N)`` (binary32
    results, no output rounding), then one fused elementwise pass ``q + m * (-m)`` (the
    ``fma`` mode). The standard deviation is :func:`f32_sqrt` of it.
    """
    s = int(recip_count(reduction_count(np.asarray(x).shape, axis)))
    X = to_f32(x, in_fmt)
    X2 = fp.f32_mul(X, X)
    if axis == "channel":
        m, q = _reduce_channels(X, "sum", s), _reduce_channels(X2, "sum", s)
    else:
        m, q = (_reduce_core(v, "sum", lanes, axis, s, spec.PostFn.NONE) for v in (X, X2))
    return fp.f32_add(q, fp.f32_mul(m, _neg(m)))


def _red_fold(op):
    code = spec.RedOp(RED_OPS[op] if isinstance(op, str) else int(op))
    R = spec.RedOp
    ident = {R.SUM: F32_NEG_ZERO, R.MAX: F32_NEG_INF, R.MIN: F32_POS_INF}[code]
    fold = {R.SUM: fp.f32_add, R.MAX: fp.f32_max, R.MIN: fp.f32_min}[code]
    return fold, ident


def fold_channels(x, op):
    """The channel accumulator: for every pixel, ``acc = op(... op(op(I, x[0]), x[1]) ...,
    x[C-1])`` in channel order (binary32 ``(C, ...)`` in, ``(...)`` out)."""
    fold, ident = _red_fold(op)
    x = np.asarray(x, dtype=np.uint32)
    acc = np.full(x.shape[1:], ident, dtype=np.uint32)
    for plane in x:
        acc = fold(acc, plane).astype(np.uint32)
    return acc


def reduce_beats(beats, op, *, scale=F32_ONE, post="none"):
    """The reduction of one group (a plane, or the tensor) from its beats: ``beats`` is
    binary32 ``(n, lanes)`` (missing lanes hold the identity); each beat through the pairwise
    tree, tree output ``k`` folded into retention register ``k mod RETAIN``, the registers
    combined as ``op(op(r0, r1), r2)``, times ``scale``, then the post function. Returns the
    binary32 result."""
    fold, ident = _red_fold(op)
    post_code = POST_FNS[post] if isinstance(post, str) else int(post)
    trees = _tree(np.asarray(beats, dtype=np.uint32), fold)
    regs = np.full(RETAIN, ident, dtype=np.uint32)
    for k, t in enumerate(np.atleast_1d(trees)):
        regs[k % RETAIN] = fold(regs[k % RETAIN], t)
    r = fold(fold(regs[0], regs[1]), regs[2])
    return np.uint32(_POST[post_code](fp.f32_mul(r, scale)))


def _reduce_channels(X, op, scale):
    """Across channels, per pixel: :func:`fold_channels`, then ``f32_mul(acc, scale)``; shape
    ``(1, H, W)`` (binary32 bits)."""
    return fp.f32_mul(fold_channels(X, op), scale)[None]


def _reduce_core(X, op, lanes, axis, scale, post):
    """The groups' beats (each row in beats of ``lanes``, missing lanes the identity; a group
    is a plane, or the tensor), each through :func:`reduce_beats` (binary32 bits)."""
    _, ident = _red_fold(op)
    C, H, W = X.shape
    wb = -(-W // lanes)
    padded = np.full((C, H, wb * lanes), ident, dtype=np.uint32)
    padded[:, :, :W] = X
    groups = padded.reshape(1 if axis == "tensor" else C, -1, lanes)
    return np.array([reduce_beats(g, op, scale=scale, post=post) for g in groups],
                    dtype=np.uint32)
