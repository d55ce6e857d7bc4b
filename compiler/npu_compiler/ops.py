"""One lowering function per ONNX operator (:data:`LOWER`), on a
:class:`~npu_compiler.lower.Lowering`."""

import numpy as np

from npu_model.builder import Dataset
from npu_spec import planar as planar_spec

from .frontend import activation
from .graph import CompileError
from .lower import MAX_DIM, PLANE_DEPTH, MView, _flat_shape, _TooBig

__all__ = ["LOWER"]

LOWER = {}


def lowers(*ops):
    def deco(fn):
        for op in ops:
            LOWER[op] = fn
        return fn
    return deco


def _unsupported(node, why):
    raise CompileError(f"{node}: {why}")


def _sub(ds, c0, c1, h0=0, h1=None, w0=0, w1=None):
    """A view of dataset ``ds``: channels ``c0..c1``, rows ``h0..h1``, columns ``w0..w1``."""
    c, h, w = ds.shape
    h1 = h if h1 is None else h1
    w1 = w if w1 is None else w1
    return Dataset(ds.addr + c0 * ds.cstride + h0 * ds.rstride + w0, (c1 - c0, h1 - h0, w1 - w0),
                   ds.fmt, cstride=ds.cstride, rstride=ds.rstride)


def _boxes(shape3, budget):
    """``(c0, c1, h0, h1)`` chunks of a ``(C, H, W)`` tensor with at most ``budget``
    elements each (whole planes when they fit, else bands of rows)."""
    c, h, w = shape3
    if w > budget:
        raise CompileError(f"a row of {w} elements does not fit the buffer")
    plane = h * w
    if plane <= budget:
        step = max(1, min(c, budget // plane, MAX_DIM))
        for c0 in range(0, c, step):
            yield c0, min(c, c0 + step), 0, h
    else:
        rows = max(1, min(budget // w, MAX_DIM))
        for c0 in range(c):
            for h0 in range(0, h, rows):
                yield c0, c0 + 1, h0, min(h, h0 + rows)


def _view3(mv, c0, c1, h0, h1):
    return mv.slice(0, c0, c1).slice(1, h0, h1)


def _flat3(mv):
    """A dense view as ``(1, H, W)`` (or ``(C, H, W)`` with ``H`` limited) for elementwise
    work."""
    n = mv.size
    hw = _flat_shape(n)
    if hw is None:
        raise CompileError(f"a tensor of {n} elements has no flat shape")
    return mv.reshape((1,) + hw)


# ---- aliases and copies ----------------------------------------------------------------------


@lowers("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
def _alias(lw, node):
    lw._alias(node.outputs[0], lw.view(node.inputs[0]))
    lw._count("alias")


def copy(lw, src, dst):
    """Copy memory view ``src`` into ``dst`` (same shape, any strides) through the buffer,
    in chunks along the outer dimensions."""
    if src.size == 0:
        return
    budget = lw.buf_size
    if src.size <= budget:
        ds = lw.buffer((1, 1, src.size))
        lw.load_any(src, ds)
        lw.store_any(ds, dst)
        lw.release(ds)
        return
    axis = next(k for k, n in enumerate(src.shape) if n > 1)
    inner = src.size // src.shape[axis]
    step = max(1, budget // inner)
    for a in range(0, src.shape[axis], step):
        b = min(src.shape[axis], a + step)
        copy(lw, src.slice(axis, a, b), dst.slice(axis, a, b))


@lowers("Transpose")
def _transpose(lw, node):
    x = lw.view(node.inputs[0])
    perm = node.attr("perm", list(reversed(range(len(x.shape)))))
    out = lw._output_tensor(node.outputs[0])
    copy(lw, x.permute(perm), out)


@lowers("Concat")
def _concat(lw, node):
    out = lw._output_tensor(node.outputs[0])
    axis = node.attr("axis") % len(out.shape)
    off = 0
    for name in node.inputs:
        if not name:
            continue
        x = lw.view(name)
        n = x.shape[axis]
        if n:
            copy(lw, x, out.slice(axis, off, off + n))
        off += n


def _ints(lw, node, k, attr):
    if len(node.inputs) > k and node.inputs[k]:
        c = lw.g.const(node.inputs[k])
        if c is None:
            _unsupported(node, f"input {k} ({attr}) must be a constant")
        return [int(v) for v in np.asarray(c).reshape(-1)]
    v = node.attr(attr)
    return None if v is None else [int(x) for x in v]


@lowers("Slice")
def _slice(lw, node):
    x = lw.view(node.inputs[0])
    starts = _ints(lw, node, 1, "starts")
    ends = _ints(lw, node, 2, "ends")
    axes = _ints(lw, node, 3, "axes") or list(range(len(starts)))
    steps = _ints(lw, node, 4, "steps") or [1] * len(starts)
    v = x
    for a, s, e, st in zip(axes, starts, ends, steps):
        a %= len(x.shape)
        n = x.shape[a]
        if st <= 0:
            _unsupported(node, "negative slice steps are not supported")
        s = min(max(s + n if s < 0 else s, 0), n)
        e = min(max(e + n if e < 0 else e, 0), n)
        v = v.slice(a, s, max(s, e), st)
    out = lw._output_tensor(node.outputs[0])
    copy(lw, v, out)


@lowers("Pad")
def _pad(lw, node):
    mode = node.attr("mode", "constant")
    if mode != "constant":
        _unsupported(node, f"Pad mode {mode!r} is not supported (constant only)")
    x = lw.view(node.inputs[0])
    pads = _ints(lw, node, 1, "pads")
    value = node.attr("value", 0.0)
    if len(node.inputs) > 2 and node.inputs[2]:
        value = float(np.asarray(lw.g.const(node.inputs[2])).reshape(-1)[0])
    r = len(x.shape)
    axes = _ints(lw, node, 3, "axes") or list(range(r))
    begin, end = [0] * r, [0] * r
    for k, a in enumerate(axes):
        begin[a % r], end[a % r] = pads[k], pads[k + len(axes)]
    name = node.outputs[0]
    shape = lw.g.shapes[name]
    role = "output" if name in lw.g.outputs else "scratch"
    init = None if value == 0 else np.full(shape, np.float16(value)).view(np.uint16)
    out = lw._new_tensor(name, shape, role, init)
    lw.views[name] = out
    src, dst = x, out
    for a in range(r):
        lo, hi = begin[a], end[a]
        s0 = max(0, -lo)
        s1 = x.shape[a] - max(0, -hi)
        src = src.slice(a, s0, s1)
        dst = dst.slice(a, max(0, lo), max(0, lo) + (s1 - s0))
    copy(lw, src, dst)


# ---- neural engine: convolution and its relatives ---------------------------------------------


def _conv_geometry(node, x_shape, w_shape):
    nd = len(w_shape) - 2
    if nd not in (1, 2):
        _unsupported(node, f"{nd}-D convolution is not supported (1-D and 2-D are)")
    k = list(w_shape[2:])
    strides = list(node.attr("strides", [1] * nd))
    dil = list(node.attr("dilations", [1] * nd))
    pads = list(node.attr("pads", [0] * (2 * nd)))
    auto = node.attr("auto_pad", "NOTSET")
    spatial = list(x_shape[2:])
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * nd)
        for i in range(nd):
            out = -(-spatial[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (k[i] - 1) * dil[i] + 1 - spatial[i])
            small, big = total // 2, total - total // 2
            pads[i], pads[i + nd] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    if nd == 1:
        k, strides, dil = [1] + k, strides * 2, dil * 2
        pads = [0, pads[0], 0, pads[1]]
        spatial = [1] + spatial
    return k, strides, dil, pads, spatial


def _band_rows(lw, oh, fy, s, dkh, per_in_row, per_out_row, fixed=0):
    """Desired output rows per band so that a band's datasets fit the buffer."""
    budget = lw.buf_size - fixed
    for r in range(oh, 0, -1):
        ne = (r - 1) * fy + 1
        rows_in = (ne - 1) * s + dkh
        if rows_in * per_in_row + ne * per_out_row <= budget:
            return r
        if r > 64:
            # Bisect quickly for tall layers.
            lo, hi = 1, r
            while lo < hi:
                mid = (lo + hi + 1) // 2
                ne = (mid - 1) * fy + 1
                if ((ne - 1) * s + dkh) * per_in_row + ne * per_out_row <= budget:
                    lo = mid
                else:
                    hi = mid - 1
            ne = (lo - 1) * fy + 1
            if ((ne - 1) * s + dkh) * per_in_row + ne * per_out_row <= budget:
                return lo
            return 0
    return 0


def windowed(lw, node, x3, out3, *, kh, kw, s, fy, fx, dil, pads, fill, native, engine,
             k_out, out_factor=1, sxe=None, require_native=False):
    """A windowed layer (convolution or pooling) of ``x3`` ``(C, H, W)`` into ``out3``
    ``(K, OH, OW)``: the engine runs at stride ``s`` (the result is subsampled by ``fy``,
    ``fx`` on the way out), ``pads`` ``(top, left, bottom, right)``. ``native``: the engine's
    own padding argument when the whole layer fits and the pads allow it, else None
    (explicit padding with ``fill`` in the buffer). ``engine(src, pad, dst)`` adds the
    engine tasks and returns the dataset to store."""
    c, h, w = x3.shape
    k, oh, ow = out3.shape
    t, left, b, r = pads
    dkh, dkw = (kh - 1) * dil + 1, (kw - 1) * dil + 1
    sxe = s if sxe is None else sxe
    wp = w + left + r
    owe = (wp - dkw) // sxe + 1
    per_in_row = c * wp
    per_out_row = k_out * owe * out_factor
    whole_in = c * h * w
    ohe_native = None
    deferred = lw.deferred(node)
    if native is not None and not deferred:
        py, px = native if isinstance(native, tuple) else (native, native)
        ohe_native = (h + 2 * py - dkh) // s + 1
        owe_native = (w + 2 * px - dkw) // sxe + 1
        if whole_in + ohe_native * owe_native * k_out * out_factor <= lw.buf_size:
            src = lw.buffer((c, h, w))
            lw.load3(x3, src)
            res = engine(src, native, (ohe_native, owe_native))
            lw.store3(_sub(res, 0, k, 0, (oh - 1) * fy + 1, 0, (ow - 1) * fx + 1), out3,
                      xstep=fx, ystep=fy)
            lw.release(src)
            lw._release_all()
            return
    if require_native:
        _unsupported(node, "average pooling with count_include_pad=0 and padding needs the "
                           "whole layer in the buffer")
    rows = _band_rows(lw, oh, fy, s, dkh, per_in_row, per_out_row,
                      lw.buf_size - lw.band_budget(node))
    if rows == 0 and deferred:
        rows = _band_rows(lw, oh, fy, s, dkh, per_in_row, per_out_row)
    if rows == 0:
        _unsupported(node, f"one output row ({per_in_row} input and {per_out_row} output "
                           f"elements per row, kernel {kh}x{kw}) does not fit the "
                           f"{lw.buf_size}-element buffer")

    def bands(first, end):
        """Output rows ``first .. end - 1``, in bands that fit the buffer."""
        for r0 in range(first, end, rows):
            r1 = min(end, r0 + rows)
            ne = (r1 - 1 - r0) * fy + 1
            p0 = r0 * fy * s
            rows_in = (ne - 1) * s + dkh
            src = lw.buffer((c, rows_in, wp))
            i0, i1 = max(0, p0 - t), min(h, p0 + rows_in - t)
            padded = left or r or p0 - t < 0 or p0 + rows_in - t > h
            if padded:
                lw.fill(src, fill)
            if i1 > i0:
                dst = _sub(src, 0, c, i0 + t - p0, i1 + t - p0, left, left + w)
                lw.load3(x3.slice(1, i0, i1), dst)
            res = engine(src, 0, (ne, owe))
            lw.store3(_sub(res, 0, k, 0, ne, 0, (ow - 1) * fx + 1), out3.slice(1, r0, r1),
                      xstep=fx, ystep=fy)
            lw.release(src)
            lw._release_all()

    if deferred:
        deferred(bands)
    else:
        bands(0, oh)


def conv_engine(lw, node, w, bias, scale, groups, s, dil, act):
    """``engine(src, pad, (oh, ow))`` of :func:`windowed` for a convolution: splits output
    channels over the kernel memory, input channels over the input buffer's rows (partial
    sums added on the planar engine, the activation after the sum)."""
    k, icpg, kh, kw = w.shape

    def engine(src, pad, oshape):
        oh, ow = oshape
        dst = lw.buffer((k, oh, ow))
        lw._temps.append(dst)
        if groups == 1:
            chunk = max(1, lw.buffer_rows // kh)
            if icpg <= chunk:
                _conv_kchunks(lw, src, w, bias, scale, 1, dst, s, pad, dil, act)
                return dst
            # Partial sums over chunks of input channels.
            tmp = lw.buffer((k, oh, ow))
            lw._temps.append(tmp)
            for i, c0 in enumerate(range(0, icpg, chunk)):
                c1 = min(icpg, c0 + chunk)
                part = _sub(src, c0, c1)
                target = dst if i == 0 else tmp
                _conv_kchunks(lw, part, w[:, c0:c1], bias if i == 0 else np.zeros(k),
                              scale, 1, target, s, pad, dil, None)
                if i:
                    lw.planar(dst, tmp, out=dst, mode="eltwise", op="add")
            return _apply_act(lw, dst, act)
        # Grouped / depthwise: chunks of whole groups.
        ocpg = k // groups
        if icpg * kh > lw.buffer_rows:
            _unsupported(node, f"a group of {icpg} input channels x {kh} kernel rows exceeds "
                               f"the input buffer's {lw.buffer_rows} rows")
        step = groups
        while lw.kernels(w[:step * ocpg], 0, 1, step).words > lw.kmem_words:
            if step == 1:
                _unsupported(node, "one group's kernels exceed the kernel memory")
            step = max(1, step // 2)
        for g0 in range(0, groups, step):
            g1 = min(groups, g0 + step)
            lw.conv_task(_sub(src, g0 * icpg, g1 * icpg), w[g0 * ocpg:g1 * ocpg],
                         bias[g0 * ocpg:g1 * ocpg], _sl(scale, g0 * ocpg, g1 * ocpg),
                         g1 - g0, _sub(dst, g0 * ocpg, g1 * ocpg), stride=s, pad=pad,
                         dilation=dil, act=act)
        return dst
    return engine


def _sl(scale, a, b):
    scale = np.asarray(scale)
    return scale if scale.ndim == 0 else scale[a:b]


def _conv_kchunks(lw, src, w, bias, scale, groups, dst, s, pad, dil, act):
    k = w.shape[0]
    step = k
    while True:
        try:
            for k0 in range(0, k, step):
                k1 = min(k, k0 + step)
                lw.conv_task(src, w[k0:k1], bias[k0:k1], _sl(scale, k0, k1), groups,
                             _sub(dst, k0, k1), stride=s, pad=pad, dilation=dil, act=act)
            return
        except _TooBig:
            if step == 1:
                raise CompileError(f"{lw._step}: one output channel's kernel exceeds the "
                                   f"kernel memory") from None
            step = max(1, -(-step // 2))


def _apply_act(lw, ds, act):
    """``act`` on dataset ``ds``: ReLU on the planar engine in place, the others through the
    post-processor (a depthwise 1x1 convolution of weight 1)."""
    if not act:
        return ds
    if act.get("act") == "relu":
        lw.planar(ds, out=ds, mode="eltwise", op="relu")
        return ds
    c = ds.shape[0]
    out = lw.buffer(ds.shape)
    lw._temps.append(out)
    lw.conv_task(ds, np.ones((c, 1, 1, 1), np.float32), np.zeros(c), 1.0, c, out, act=act)
    return out


def _act_of(node):
    return dict(node.fused) if node.fused else None


@lowers("Conv")
def _conv(lw, node):
    g = lw.g
    w = g.const(node.inputs[1])
    if w is None:
        _unsupported(node, "the weights must be a constant")
    x_shape = g.shapes[node.inputs[0]]
    if x_shape[0] != 1:
        _unsupported(node, f"batch {x_shape[0]}: compile with batch 1 (the runtime runs a "
                           f"batch item by item)")
    k_, strides, dil, pads, spatial = _conv_geometry(node, x_shape, w.shape)
    w = lw.pruned(np.asarray(w, np.float32).reshape(w.shape[:2] + tuple(k_)))
    k = w.shape[0]
    bias = (np.asarray(g.const(node.inputs[2]), np.float32)
            if len(node.inputs) > 2 and node.inputs[2] else np.zeros(k, np.float32))
    groups = node.attr("group", 1)
    kh, kw = k_
    if kh > 16 or kw > 16:
        _unsupported(node, f"kernel {kh}x{kw} is larger than the engine's 16x16")
    if dil[0] != dil[1] or dil[0] > 7:
        _unsupported(node, f"dilations {dil} (equal and at most 7 are supported)")
    sy, sx = strides
    s = sy if sy == sx and sy <= 7 else 1
    fy, fx = sy // s, sx // s
    c = w.shape[1] * groups
    x3 = lw.view(node.inputs[0]).reshape((c,) + tuple(spatial))
    out_shape = g.shapes[node.outputs[0]]
    out = lw._output_tensor(node.outputs[0])
    out3 = out.reshape((k,) + tuple(out_shape[2:]) if len(out_shape) == 4
                       else (k, 1, out_shape[2]))
    t, left, b, r = pads
    native = t if (t == left == b == r and t <= 15) else None
    factor = 2 if groups == 1 and w.shape[1] > max(1, lw.buffer_rows // kh) else 1
    if node.fused and node.fused.get("act") not in (None, "relu") and factor == 2:
        factor = 3
    dkh = (kh - 1) * dil[0] + 1
    owe = (x3.shape[2] + left + r - (kw - 1) * dil[0] - 1) // s + 1
    step = (k if groups != 1 else
            _channel_step(lw, node, k, c * dkh * (x3.shape[2] + left + r), owe * factor))
    for k0 in range(0, k, step):
        k1 = min(k, k0 + step)
        engine = conv_engine(lw, node, w[k0:k1], bias[k0:k1], 1.0, groups, s, dil[0],
                             _act_of(node))
        with lw.model_weights():
            windowed(lw, node, x3, out3.slice(0, k0, k1), kh=kh, kw=kw, s=s, fy=fy, fx=fx,
                     dil=dil[0], pads=pads, fill=0.0, native=native, engine=engine,
                     k_out=k1 - k0, out_factor=factor)


def _channel_step(lw, node, k, fixed, per_channel):
    """Channels per part of a layer whose one output row takes ``fixed`` elements plus
    ``per_channel`` for each of its ``k`` channels, so that a row fits the band budget
    (:meth:`~npu_compiler.lower.Lowering.band_budget`): all ``k`` when they fit or when no
    budget applies."""
    budget = lw.band_budget(node)
    if budget >= lw.buf_size or fixed + k * per_channel <= budget:
        return k
    return max(1, (budget - fixed) // per_channel)


def _fc(lw, node, x_view, w_kn, bias, out_view, act):
    """``out (M, N) = x (M, K) @ w (K, N) + bias`` as a 1x1 convolution over ``(K, 1, M)``."""
    m, kk = x_view.shape
    n = w_kn.shape[1]
    x3 = MView(x_view.addr, (kk, 1, m), (x_view.strides[1], 0, x_view.strides[0]))
    out3 = MView(out_view.addr, (n, 1, m), (out_view.strides[1], 0, out_view.strides[0]))
    w = lw.pruned(np.ascontiguousarray(w_kn.T).reshape(n, kk, 1, 1).astype(np.float32))
    engine = conv_engine(lw, node, w, np.asarray(bias, np.float32), 1.0, 1, 1, 1, act)
    factor = 2 if kk > lw.buffer_rows else 1
    with lw.model_weights():
        windowed(lw, node, x3, out3, kh=1, kw=1, s=1, fy=1, fx=1, dil=1, pads=(0, 0, 0, 0),
                 fill=0.0, native=0, engine=engine, k_out=n, out_factor=factor + 1)


def _matrix(mv):
    """A dense view as a matrix ``(M, K)`` (leading dimensions merged)."""
    if len(mv.shape) == 1:
        return mv.reshape((1, mv.shape[0]))
    return mv.reshape((int(np.prod(mv.shape[:-1])), mv.shape[-1]))


@lowers("Gemm")
def _gemm(lw, node):
    g = lw.g
    a_name, b_name = node.inputs[0], node.inputs[1]
    bmat = g.const(b_name)
    if bmat is None or g.const(a_name) is not None:
        _unsupported(node, "Gemm needs a constant B and a tensor A")
    if node.attr("transA", 0):
        x = lw.view(a_name)
        x = x.permute((1, 0))
    else:
        x = lw.view(a_name)
    bmat = np.asarray(bmat, np.float64)
    if node.attr("transB", 0):
        bmat = bmat.T
    bmat = bmat * node.attr("alpha", 1.0)
    n = bmat.shape[1]
    bias = np.zeros(n)
    if len(node.inputs) > 2 and node.inputs[2]:
        cval = g.const(node.inputs[2])
        if cval is None:
            _unsupported(node, "the C input must be a constant")
        cval = np.asarray(cval, np.float64) * node.attr("beta", 1.0)
        if cval.size not in (1, n) or (cval.ndim == 2 and cval.shape[0] != 1):
            if x.shape[0] != 1:
                _unsupported(node, f"a C of shape {cval.shape} (a vector of {n} is supported)")
        bias = np.broadcast_to(cval.reshape(-1), (n,)) if cval.size in (1, n) else \
            cval.reshape(-1)
    out = lw._output_tensor(node.outputs[0])
    _fc(lw, node, x, bmat, bias, _matrix(out), _act_of(node))


@lowers("MatMul")
def _matmul(lw, node):
    g = lw.g
    a, b = node.inputs
    ca, cb = g.const(a), g.const(b)
    out = lw._output_tensor(node.outputs[0])
    if cb is not None and ca is None:
        cb = np.asarray(cb, np.float64)
        if cb.ndim > 2:
            _unsupported(node, "a batched constant B is not supported")
        w = cb.reshape(-1, 1) if cb.ndim == 1 else cb
        _fc(lw, node, _matrix(lw.view(a)), w, np.zeros(w.shape[1]),
            out.reshape((int(np.prod(out.shape)) // w.shape[1], w.shape[1])), None)
        return
    if ca is not None and cb is None and np.ndim(ca) == 2 and len(g.shapes[b]) == 2:
        # out (M, N) = A (M, K) @ X (K, N): X is K channels of N columns.
        x = lw.view(b)
        ca = np.asarray(ca, np.float32)
        m, kk = ca.shape
        x3 = x.reshape((kk, 1, x.shape[1]))
        out3 = out.reshape((m, 1, out.shape[1]))
        engine = conv_engine(lw, node, ca.reshape(m, kk, 1, 1), np.zeros(m, np.float32), 1.0,
                             1, 1, 1, None)
        windowed(lw, node, x3, out3, kh=1, kw=1, s=1, fy=1, fx=1, dil=1, pads=(0, 0, 0, 0),
                 fill=0.0, native=0, engine=engine, k_out=m, out_factor=2)
        return
    _unsupported(node, "MatMul of two tensors is not supported (one operand must be constant)")


def _chan3(lw, mv, shape):
    """A view ``(C, H, W)`` of a tensor whose channels are axis 1 (``(N=1, C, ...)``) or of
    a vector ``(C,)``."""
    shape = tuple(shape)
    if len(shape) >= 2 and shape[0] == 1:
        c = shape[1]
        rest = int(np.prod(shape[2:]))
        hw = _flat_shape(rest) if rest > 1 else (1, 1)
        return mv.reshape((c,) + hw)
    if len(shape) >= 2:
        # Several items: (C, N, S) with the items as rows.
        n, c = shape[:2]
        rest = int(np.prod(shape[2:]))
        if rest > MAX_DIM:
            return None
        return MView(mv.addr, (c, n, rest), (rest * 2, c * rest * 2, 2))
    return None


def affine(lw, node, x_name, out_name, mul, add, act=None, weight=None):
    """``out = act(x * mul + add)`` with per-channel ``mul``, ``add`` (channels: axis 1) on
    the neural engine: a depthwise 1x1 convolution with scale ``mul`` and bias
    ``add / mul`` (weight ``weight`` instead of 1 when given)."""
    shape = lw.g.shapes[x_name]
    x3 = _chan3(lw, lw.view(x_name), shape)
    out = lw._output_tensor(out_name)
    out3 = _chan3(lw, out, shape)
    if x3 is None:
        _unsupported(node, f"a per-channel operation on shape {shape}")
    c = x3.shape[0]
    mul = np.broadcast_to(np.asarray(mul, np.float64), (c,))
    add = np.broadcast_to(np.asarray(add, np.float64), (c,))
    if weight is None and np.all(mul != 0) and np.all(np.isfinite(mul)):
        w = np.ones((c, 1, 1, 1), np.float32)
        bias, scale = add / mul, mul
    else:
        w = mul.reshape(c, 1, 1, 1).astype(np.float32)
        bias, scale = add, 1.0
    engine = conv_engine(lw, node, w, np.asarray(bias, np.float32),
                         np.asarray(scale, np.float32), c, 1, 1, act)
    windowed(lw, node, x3, out3, kh=1, kw=1, s=1, fy=1, fx=1, dil=1, pads=(0, 0, 0, 0),
             fill=0.0, native=0, engine=engine, k_out=c)


@lowers("BatchNormalization")
def _batchnorm(lw, node):
    gamma, beta, mean, var = (np.asarray(lw.g.const(x), np.float64) for x in node.inputs[1:5])
    a = gamma / np.sqrt(var + node.attr("epsilon", 1e-5))
    affine(lw, node, node.inputs[0], node.outputs[0], a, beta - mean * a)


def act_map(lw, node, act, x_name=None, out_name=None, mul=1.0, add=0.0):
    """An activation on the neural engine's post-processor over the whole tensor."""
    x_name = x_name or node.inputs[0]
    out_name = out_name or node.outputs[0]
    shape = lw.g.shapes[x_name]
    x = lw.view(x_name)
    out = lw._output_tensor(out_name)
    x3 = _chan3(lw, x, shape) if len(shape) >= 3 and shape[0] == 1 else None
    if x3 is None or max(x3.shape) > MAX_DIM:
        x3, out3 = _flat3(x), _flat3(out)
    else:
        out3 = _chan3(lw, out, shape)
    c = x3.shape[0]
    engine = conv_engine(lw, node, np.ones((c, 1, 1, 1), np.float32),
                         np.full(c, add / mul if mul else add, np.float32),
                         np.float32(mul), c, 1, 1, act)
    windowed(lw, node, x3, out3, kh=1, kw=1, s=1, fy=1, fx=1, dil=1, pads=(0, 0, 0, 0),
             fill=0.0, native=0, engine=engine, k_out=c)


@lowers("Clip", "LeakyRelu", "Sigmoid", "Tanh", "Gelu")
def _activation(lw, node):
    act = activation(lw.g, node)
    if act is None:
        if node.op == "Gelu":
            act = {"act": "gelu"}
        else:
            _unsupported(node, "Clip bounds must be constants")
    act_map(lw, node, act)


@lowers("HardSigmoid")
def _hardsigmoid(lw, node):
    alpha, beta = node.attr("alpha", 0.2), node.attr("beta", 0.5)
    act_map(lw, node, {"act": "clamp", "lo": 0.0, "hi": 1.0}, mul=alpha, add=beta)


@lowers("HardSwish")
def _hardswish(lw, node):
    tmp = node.outputs[0] + ":hsig"
    lw.g.shapes[tmp] = lw.g.shapes[node.outputs[0]]
    act_map(lw, node, {"act": "clamp", "lo": 0.0, "hi": 1.0}, out_name=tmp, mul=1 / 6, add=0.5)
    elementwise(lw, node, "mul", lw.view(node.inputs[0]), lw.view(tmp),
                lw._output_tensor(node.outputs[0]))


# ---- planar engine ---------------------------------------------------------------------------


def elementwise(lw, node, op, a, b, out, **fields):
    """``out = op(a, b)`` (``b`` None: unary) on equal-shaped dense views, in flat chunks."""
    a3, o3 = _flat3(a), _flat3(out)
    b3 = _flat3(b) if b is not None else None
    n_ops = 3 if b is not None else 2
    for c0, c1, h0, h1 in _boxes(o3.shape, lw.buf_size // n_ops):
        da = lw.buffer((c1 - c0, h1 - h0, o3.shape[2]))
        lw.load3(_view3(a3, c0, c1, h0, h1), da)
        db = None
        if b3 is not None:
            db = lw.buffer(da.shape)
            lw.load3(_view3(b3, c0, c1, h0, h1), db)
        lw.planar(da, db, out=da, mode="eltwise", op=op, **fields)
        lw.store3(da, _view3(o3, c0, c1, h0, h1))
        lw.release(da)
        if db is not None:
            lw.release(db)


@lowers("Relu", "Abs", "Neg")
def _unary(lw, node):
    elementwise(lw, node, node.op.lower(), lw.view(node.inputs[0]), None,
                lw._output_tensor(node.outputs[0]))


def _bcast_pattern(out_shape, small_shape):
    """``(P, M, Q)``: the output seen as three blocks, the small operand varying only over
    the middle one; None if it varies over two separate blocks."""
    r = len(out_shape)
    s = (1,) * (r - len(small_shape)) + tuple(small_shape)
    mask = [s[i] != 1 and out_shape[i] != 1 for i in range(r)]
    idx = [i for i in range(r) if mask[i]]
    if not idx:
        return (1, 1, int(np.prod(out_shape)))
    lo, hi = idx[0], idx[-1]
    if any(not mask[i] and out_shape[i] != 1 for i in range(lo, hi + 1)):
        return None
    return (int(np.prod(out_shape[:lo])), int(np.prod(out_shape[lo:hi + 1])),
            int(np.prod(out_shape[hi + 1:])))


def bcast_layout(node, pqm):
    """``(kind, shape3, vec_range)`` of a broadcast over the ``(P, M, Q)`` view ``pqm``
    (:func:`_bcast_pattern`): the planar broadcast kind, the ``(C, H, W)`` view of the full
    operand it runs on and ``vec_range(c0, c1, h0, h1)``, the part of the vector a box of that
    view reads."""
    p, m, q = pqm
    if m > PLANE_DEPTH:
        _unsupported(node, f"a broadcast vector of {m} elements (at most {PLANE_DEPTH})")
    if p == 1 and m == 1:
        kind, shape3 = "channel", (1,) + _flat_shape(q)
        vec_range = lambda c0, c1, h0, h1: (0, 1)  # noqa: E731
    elif q == 1:
        kind, shape3 = "row", (1, p, m)
        vec_range = lambda c0, c1, h0, h1: (0, m)  # noqa: E731
    elif p == 1:
        hw = _flat_shape(q)
        kind, shape3 = "channel", (m,) + hw
        vec_range = lambda c0, c1, h0, h1: (c0, c1)  # noqa: E731
    else:
        kind, shape3 = "column", (p, m, q)
        vec_range = lambda c0, c1, h0, h1: (0, m)  # noqa: E731
    if max(shape3) > MAX_DIM:
        _unsupported(node, f"broadcast over a {shape3} view (dimensions at most {MAX_DIM})")
    return kind, shape3, vec_range


def broadcast_op(lw, node, op, full, vec, out, pqm, swap_neg=False, engine=None,
                 per_element=1):
    """``out = op(full, vec broadcast)`` with the planar engine's vector broadcast, in boxes
    of the full operand; ``engine(da, dv, kind)``, when given, computes a box (datasets of the
    lowering's element format) in place of the one ``op`` task and returns its result, using
    ``per_element`` buffer elements for each of the box's."""
    kind, shape3, vec_range = bcast_layout(node, pqm)
    f3 = full.reshape(shape3, lw.elem)
    o3 = out.reshape(shape3, lw.elem)
    v1 = vec.reshape((vec.size,), lw.elem)
    # The vector's part and the box (the int8 engine's tasks all run in place).
    budget = ((lw.buf_size - PLANE_DEPTH) // 2 if engine is None
              else (lw.buf_size - pqm[1]) // per_element)
    boxes = list(_boxes(shape3, budget))
    if kind == "column" and any(b[2] != 0 or b[3] != shape3[1] for b in boxes):
        _unsupported(node, "a column broadcast over planes larger than the buffer")
    for c0, c1, h0, h1 in boxes:
        da = lw.buffer((c1 - c0, h1 - h0, shape3[2]))
        lw.load3(_view3(f3, c0, c1, h0, h1), da)
        v0, v1_ = vec_range(c0, c1, h0, h1)
        dv = lw.buffer((1, 1, v1_ - v0))
        lw.load_any(v1.slice(0, v0, v1_), dv)
        if engine is not None:
            res = engine(da, dv, kind)
        else:
            res = lw.planar(da, dv, out=da, mode="eltwise", op=op, bcast=kind)
        if swap_neg:
            lw.planar(res, out=res, mode="eltwise", op="neg")
        lw.store3(res, _view3(o3, c0, c1, h0, h1))
        lw.release(da, dv)


def _scalar_op(lw, node, op, x, value, out, reverse=False):
    fields = {}
    if op == "div":
        op, value = "mul", 1.0 / value
    if reverse and op == "sub":
        op, fields = "gain_bias", {"scale": -1.0, "bias": float(value)}
        elementwise(lw, node, op, x, None, out, **fields)
        return
    elementwise(lw, node, op, x, None, out, bcast="scalar", scalar=float(value))


@lowers("Sum")
def _nary_sum(lw, node):
    _nary(lw, node, "Add")


def _nary(lw, node, op):
    """``Sum``, ``Max``, ``Min`` of any number of inputs: pairwise, left to right, through
    scratch tensors."""
    from .graph import Node
    ins = [i for i in node.inputs if i]
    out = node.outputs[0]
    if len(ins) == 1:
        _alias(lw, Node("Identity", node.name, ins, [out]))
        return
    acc = ins[0]
    for k, name in enumerate(ins[1:]):
        last = k == len(ins) - 2
        dst = out if last else f"{out}:{node.op}{k}"
        if not last:
            lw.g.shapes[dst] = tuple(np.broadcast_shapes(lw.g.shapes[acc], lw.g.shapes[name]))
            lw.g.dtypes[dst] = np.dtype(np.float32)
        _binary(lw, Node(op, node.name, [acc, name], [dst]))
        acc = dst


@lowers("Add", "Sub", "Mul", "Div", "Max", "Min")
def _binary(lw, node):
    if node.op in ("Max", "Min") and len(node.inputs) != 2:
        _nary(lw, node, node.op)
        return
    g = lw.g
    a, b = node.inputs
    op = node.op.lower()
    oshape = tuple(g.shapes[node.outputs[0]])
    ca, cb = g.const(a), g.const(b)
    if ca is not None or cb is not None:
        reverse = ca is not None
        xname, c = (b, ca) if reverse else (a, cb)
        c = np.asarray(c, np.float64)
        if tuple(g.shapes[xname]) != oshape:
            _unsupported(node, "the tensor operand must have the output's shape")
        x = lw.view(xname)
        if c.size == 1:
            v = float(c.reshape(-1)[0])
            if op == "div" and reverse:
                _unsupported(node, "division by a tensor is not supported")
            _scalar_op(lw, node, op, x, v, lw._output_tensor(node.outputs[0]), reverse)
            return
        cr = c.reshape((1,) * (len(oshape) - c.ndim) + c.shape)
        ce = np.broadcast_to(cr, oshape)
        per_channel = (len(oshape) >= 2 and (oshape[0] == 1 or len(oshape) == 2)
                       and cr.shape[0] == 1 and op in ("add", "sub", "mul", "div")
                       and all(n == 1 for n in cr.shape[2:]))
        if per_channel and not (op == "div" and reverse):
            vec = np.broadcast_to(cr.reshape(-1), (oshape[1],)).astype(np.float64)
            mul, add = np.ones_like(vec), np.zeros_like(vec)
            if op == "add":
                add = vec
            elif op == "mul":
                mul = vec
            elif op == "div":
                mul = 1.0 / vec
            elif reverse:
                mul, add = -np.ones_like(vec), vec
            else:
                add = -vec
            affine(lw, node, xname, node.outputs[0], mul, add,
                   weight=True if reverse and op == "sub" else None)
            return
        if op == "div":
            if reverse:
                _unsupported(node, "division by a tensor is not supported")
            op, ce = "mul", 1.0 / ce
        key = f"{node.name}:{'a' if reverse else 'b'}"
        cv = lw._const_tensor(key, np.asarray(ce, np.float32)).reshape(oshape)
        out = lw._output_tensor(node.outputs[0])
        if reverse and op == "sub":
            elementwise(lw, node, "sub", cv, x, out)
        else:
            elementwise(lw, node, op, x, cv, out)
        return
    sa, sb = tuple(g.shapes[a]), tuple(g.shapes[b])
    out = lw._output_tensor(node.outputs[0])
    if sa == sb == oshape:
        if op == "div":
            _unsupported(node, "division of two tensors is not supported")
        elementwise(lw, node, op, lw.view(a), lw.view(b), out)
        return
    if op == "div":
        _unsupported(node, "division by a tensor is not supported")
    if sa == oshape:
        full, vec, neg = a, b, False
    elif sb == oshape:
        full, vec, neg = b, a, op == "sub"
    else:
        _unsupported(node, f"broadcast of {sa} and {sb} with neither the output's shape")
    pqm = _bcast_pattern(oshape, g.shapes[vec])
    if pqm is None:
        _unsupported(node, f"broadcast of {g.shapes[vec]} over {oshape}")
    broadcast_op(lw, node, op, lw.view(full), lw.view(vec), out, pqm, swap_neg=neg)


@lowers("PRelu")
def _prelu(lw, node):
    slope = lw.g.const(node.inputs[1])
    if slope is None:
        _unsupported(node, "the slope must be a constant")
    slope = np.asarray(slope, np.float64)
    if slope.size == 1:
        act_map(lw, node, {"act": "leaky", "alpha": float(slope.reshape(-1)[0])})
        return
    oshape = tuple(lw.g.shapes[node.outputs[0]])
    x = lw.view(node.inputs[0])
    out = lw._output_tensor(node.outputs[0])
    try:
        se = np.broadcast_to(slope.reshape((1,) * (len(oshape) - slope.ndim) + slope.shape),
                             oshape)
    except ValueError:
        if slope.size != oshape[1]:
            raise CompileError(f"{node}: slope {slope.shape} does not broadcast to "
                               f"{oshape}") from None
        # A per-channel slope (channels on axis 1), as older exporters write it.
        se = np.broadcast_to(slope.reshape((1, -1) + (1,) * (len(oshape) - 2)), oshape)
    cv = lw._const_tensor(f"{node.name}:slope", se.astype(np.float32)).reshape(oshape)
    # out = relu(x) + slope * (x - relu(x)), three planar tasks per chunk.
    a3, o3, s3 = _flat3(x), _flat3(out), _flat3(cv)
    for c0, c1, h0, h1 in _boxes(o3.shape, lw.buf_size // 3):
        shape = (c1 - c0, h1 - h0, o3.shape[2])
        dx, dp, ds = lw.buffer(shape), lw.buffer(shape), lw.buffer(shape)
        lw.load3(_view3(a3, c0, c1, h0, h1), dx)
        lw.load3(_view3(s3, c0, c1, h0, h1), ds)
        lw.planar(dx, out=dp, mode="eltwise", op="relu")
        lw.planar(dx, dp, out=dx, mode="eltwise", op="sub")
        lw.planar(dp, ds, dx, out=dp, mode="eltwise", op="fma")
        lw.store3(dp, _view3(o3, c0, c1, h0, h1))
        lw.release(dx, dp, ds)


def _pool_attrs(node, x_shape):
    k = list(node.attr("kernel_shape"))
    nd = len(k)
    if nd not in (1, 2):
        _unsupported(node, f"{nd}-D pooling is not supported")
    if any(d != 1 for d in node.attr("dilations", [1] * nd)):
        _unsupported(node, "dilated pooling is not supported")
    fake = type("N", (), {"attr": lambda self, key, d=None: {
        "strides": node.attr("strides", [1] * nd), "dilations": [1] * nd,
        "pads": node.attr("pads", [0] * (2 * nd)),
        "auto_pad": node.attr("auto_pad", "NOTSET")}.get(key, d)})()
    return _conv_geometry(fake, x_shape, (1, 1) + tuple(k))


def pool_band(lw, src, pad, *, op, window, stride, fmt, planar, fail):
    """One pooling task of a band: ``src`` (channels, rows, columns) pooled by the planar
    engine with padding ``pad`` (one number or (rows, columns)) into a new buffer dataset of
    ``lw`` (a temporary), through ``planar`` (the lowering's planar-task call); ``fail(why)``
    when the rows do not fit the engine's line buffer. Returns the dataset."""
    (kh, kw), (sy, sx) = window, stride
    py, px = pad if isinstance(pad, tuple) else (pad, pad)
    cc, hh, ww = src.shape
    dst = lw.buffer((cc, (hh + 2 * py - kh) // sy + 1, (ww + 2 * px - kw) // sx + 1))
    lw._temps.append(dst)
    task = planar_spec.make_task(mode="pool", op=op, kh=kh, kw=kw, sy=sy, sx=sx, py=py, px=px,
                                 channels=cc, height=hh, width=ww, in_fmt=fmt, out_fmt=fmt)
    if not planar_spec.pool_fits(task, lw.cfg):
        fail(f"rows of {ww} elements do not fit the planar engine's line buffer")
    planar(src, out=dst, mode="pool", op=op, kh=kh, kw=kw, sy=sy, sx=sx, py=py, px=px)
    return dst


@lowers("MaxPool", "AveragePool")
def _pool(lw, node):
    g = lw.g
    if len([o for o in node.outputs if o]) > 1:
        _unsupported(node, "MaxPool indices output is not supported")
    x_shape = g.shapes[node.inputs[0]]
    (kh, kw), (sy, sx), _, pads, spatial = _pool_attrs(node, x_shape)
    out_shape = g.shapes[node.outputs[0]]
    c = x_shape[1]
    if x_shape[0] != 1:
        _unsupported(node, "batch must be 1")
    h, w = spatial
    oh, ow = (out_shape[2], out_shape[3]) if len(out_shape) == 4 else (1, out_shape[2])
    t, left, b, r = pads
    # ceil_mode: extra rows/columns at the bottom/right.
    b = max(b, (oh - 1) * sy + kh - h - t)
    r = max(r, (ow - 1) * sx + kw - w - left)
    is_max = node.op == "MaxPool"
    include = bool(node.attr("count_include_pad", 0))
    if kh > planar_spec.MAX_WINDOW or kw > planar_spec.MAX_WINDOW:
        _unsupported(node, f"window {kh}x{kw} (at most {planar_spec.MAX_WINDOW})")
    if not is_max and not include and (b != t or r != left):
        if (b, r) != tuple(pads[2:]):
            _unsupported(node, "average pooling with ceil_mode and count_include_pad=0")
        _unsupported(node, "average pooling with asymmetric padding and count_include_pad=0")
    native = (t, left) if (t == b and left == r and t < kh and left < kw
                           and (is_max or not include or t == left == 0)) else None
    if native is None and not is_max and not include:
        _unsupported(node, "average pooling with padding not smaller than the window")
    x3 = lw.view(node.inputs[0]).reshape((c, h, w))
    out = lw._output_tensor(node.outputs[0])
    out3 = out.reshape((c, oh, ow))
    op = "max" if is_max else "avg"

    def engine(src, pad, oshape):
        return pool_band(lw, src, pad, op=op, window=(kh, kw), stride=(sy, sx),
                         fmt=planar_spec.Fmt.FP16, planar=lw.planar,
                         fail=lambda why: _unsupported(node, why))

    if not native and max(x3.shape) > MAX_DIM:
        _unsupported(node, "a plane dimension above 4095")
    wp = w + left + r
    step = _channel_step(lw, node, c, 0, kh * wp + ((wp - kw) // sx + 1))
    for c0 in range(0, c, step):
        c1 = min(c, c0 + step)
        windowed(lw, node, x3.slice(0, c0, c1), out3.slice(0, c0, c1), kh=kh, kw=kw, s=sy,
                 fy=1, fx=1, dil=1, pads=(t, left, b, r), fill=-np.inf if is_max else 0.0,
                 native=native, engine=engine, k_out=c1 - c0, sxe=sx,
                 require_native=not is_max and not include and (t or left))


def reduce(lw, node, view, kept, red, op, scale=1.0, pre=None, post=None):
    """Reduce ``view`` (dense raster order: ``kept`` outer elements, ``red`` inner) into
    ``kept`` results stored densely into the output."""
    out = lw._output_tensor(node.outputs[0])
    hw = _flat_shape(red)
    if hw is None or kept > MAX_DIM * 64:
        _unsupported(node, f"a reduction of {red} elements")
    fields = {"mode": "reduce", "op": op, "axis": "plane", "scale": float(scale)}
    if pre:
        fields["pre"] = pre
    if post:
        fields["post"] = post
    per = max(1, min(MAX_DIM, (lw.buf_size - 64) // (red + 1)))
    if red + 1 > lw.buf_size:
        _unsupported(node, f"a reduction over {red} elements larger than the buffer")
    axis0 = view.shape[0] if (view.shape and kept > 1) else 1
    if kept > 1 and kept % axis0:
        _unsupported(node, "the reduction does not fit the buffer")
    kept_per_a = kept // axis0
    step = axis0 if kept <= per else max(1, per // kept_per_a)
    if kept_per_a > per:
        _unsupported(node, "the reduction does not fit the buffer")
    outv = out.reshape((kept,))
    for a0 in range(0, axis0, step):
        a1 = min(axis0, a0 + step)
        part = view.slice(0, a0, a1) if axis0 > 1 else view
        n = (a1 - a0) * kept_per_a
        ds = lw.buffer((n,) + hw)
        lw.load_any(part, ds)
        dst = lw.buffer((n, 1, 1))
        lw.planar(ds, out=dst, **fields)
        lw.store_any(dst, outv.slice(0, a0 * kept_per_a, a1 * kept_per_a))
        lw.release(ds, dst)


@lowers("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(lw, node):
    shape = lw.g.shapes[node.inputs[0]]
    if shape[0] != 1:
        _unsupported(node, "batch must be 1")
    c = shape[1]
    red = int(np.prod(shape[2:]))
    x = lw.view(node.inputs[0]).reshape((c, red))
    if node.op == "GlobalAveragePool":
        reduce(lw, node, x, c, red, "sum", scale=_recip(red))
    else:
        reduce(lw, node, x, c, red, "max")


def _recip(n):
    return float(np.float32(1.0) / np.float32(n))


@lowers("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL1",
        "ReduceL2")
def _reduce(lw, node):
    shape = tuple(lw.g.shapes[node.inputs[0]])
    r = len(shape)
    axes = _ints(lw, node, 1, "axes")
    if axes is None or not axes:
        if node.attr("noop_with_empty_axes", 0):
            _alias(lw, node)
            return
        axes = list(range(r))
    axes = sorted({a % r for a in axes})
    keep = [i for i in range(r) if i not in axes]
    x = lw.view(node.inputs[0])
    v = x.permute(keep + axes)
    kept = int(np.prod([shape[i] for i in keep])) if keep else 1
    red = int(np.prod([shape[i] for i in axes]))
    op = {"ReduceMax": "max", "ReduceMin": "min"}.get(node.op, "sum")
    scale = _recip(red) if node.op == "ReduceMean" else 1.0
    pre = {"ReduceSumSquare": "square", "ReduceL2": "square", "ReduceL1": "abs"}.get(node.op)
    post = "sqrt" if node.op == "ReduceL2" else None
    reduce(lw, node, v, kept, red, op, scale, pre, post)


def _scratch(lw, node, tag, shape):
    """A binary16 tensor of ``shape`` in system memory for a step inside ``node``."""
    name = f"{node.outputs[0]}:{tag}"
    lw.g.shapes[name] = tuple(shape)
    lw.g.dtypes[name] = np.dtype(np.float32)
    return name


def _reduce_keepdims(lw, node, x_name, axes, out_name, op, post=None):
    """Reduce ``x_name`` over ``axes`` into ``out_name`` (its shape with ones there)."""
    from .graph import Node
    shape = tuple(lw.g.shapes[x_name])
    keep = [i for i in range(len(shape)) if i not in axes]
    kept = int(np.prod([shape[i] for i in keep])) if keep else 1
    red = int(np.prod([shape[i] for i in axes]))
    view = lw.view(x_name).permute(keep + list(axes))
    reduce(lw, Node(node.op, node.name, [x_name], [out_name]), view, kept, red, op, post=post)


def _softmax_steps(lw, node, x, axes, out):
    """The five steps of a softmax of ``x`` over ``axes`` into ``out`` (tensor names)."""
    from .graph import Node
    shape = tuple(lw.g.shapes[x])
    small = tuple(1 if i in axes else n for i, n in enumerate(shape))
    m = _scratch(lw, node, "max", small)
    d = _scratch(lw, node, "sub", shape)
    e = _scratch(lw, node, "exp", shape)
    s = _scratch(lw, node, "recip", small)
    _reduce_keepdims(lw, node, x, axes, m, "max")
    _binary(lw, Node("Sub", node.name, [x, m], [d]))
    act_map(lw, node, {"act": "exp"}, x_name=d, out_name=e)
    _reduce_keepdims(lw, node, e, axes, s, "sum", post="recip")
    _binary(lw, Node("Mul", node.name, [e, s], [out]))


@lowers("Softmax")
def _softmax(lw, node):
    """``exp(x - max) * (1 / sum exp(x - max))`` over the softmax axes (opset 13: ``axis``,
    default -1; before: every axis from ``axis``, default 1): a max reduction (PE), the
    subtraction with the maximum broadcast (PE), the post-processor's exp of a non-positive
    value (NE, a depthwise 1x1 convolution of weight 1), a sum reduction with the
    reciprocal as its post function (PE), the multiplication with the reciprocal broadcast
    (PE). Every intermediate is binary16 in memory. When the maxima do not form one block of
    the planar broadcast, the softmax axes are moved last by a DMA copy first and the result
    copied back (``docs/compiler.md``, "Softmax")."""
    x, out = node.inputs[0], node.outputs[0]
    shape = tuple(lw.g.shapes[x])
    r = len(shape)
    axis = node.attr("axis", -1 if lw.g.opset >= 13 else 1)
    if not -r <= axis < r:
        _unsupported(node, f"axis {axis} outside a rank-{r} tensor")
    axes = [axis % r] if lw.g.opset >= 13 else list(range(axis % r, r))
    small = tuple(1 if i in axes else n for i, n in enumerate(shape))
    perm = [i for i in range(r) if i not in axes] + axes
    pqm = _bcast_pattern(shape, small)
    direct = pqm is not None
    if not direct:
        shape_t = [shape[p] for p in perm]
        pqm = _bcast_pattern(shape_t, [1 if i >= r - len(axes) else n
                                       for i, n in enumerate(shape_t)])
    if pqm[1] > PLANE_DEPTH:
        _unsupported(node, f"a softmax with {pqm[1]} maxima to broadcast (the planar "
                           f"engine's vector holds at most {PLANE_DEPTH})")
    if direct:
        _softmax_steps(lw, node, x, axes, out)
        return
    xt = _scratch(lw, node, "in_t", [shape[p] for p in perm])
    yt = _scratch(lw, node, "out_t", [shape[p] for p in perm])
    copy(lw, lw.view(x).permute(perm), lw._output_tensor(xt))
    _softmax_steps(lw, node, xt, list(range(r - len(axes), r)), yt)
    copy(lw, lw.view(yt).permute([int(p) for p in np.argsort(perm)]), lw._output_tensor(out))
