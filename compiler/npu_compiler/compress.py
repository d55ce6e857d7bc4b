"""Kernel compression: the encoding of each layer's kernels (``docs/compiler.md``,
section "Kernel compression"; the format is ``docs/kernel_format.md``).

By default the choice is lossless: of raw, sparse, palettized and sparse + palettized (with
the smallest palette width that holds every group's distinct coefficients exactly), the one
with the fewest kernel-memory bytes. The extractor skips zero coefficients in every encoding,
so every choice gives the MAC array the same beats in the same order: outputs are bit for bit
those of the raw encoding.

Two lossy steps, for users who want smaller models, change the weights first:

* :func:`prune` (``--prune FRACTION``): magnitude pruning of one layer's float weights;
* :func:`palettize` (``--palette BITS``): the coefficients of one kernel blob replaced by the
  nearest of ``2**BITS`` levels found by k-means (``npu_model.kernel_codec.build_palette``).
"""

from dataclasses import dataclass

import numpy as np

from npu_model.builder import KernelBlob
from npu_model.kernel_codec import PALETTE_BITS, build_palette, is_zero
from npu_model.kernel_codec import encode as kernel_encode
from npu_spec.kernel import CHUNK, encoding_accepted
from npu_spec.mac import MacFormat

from .graph import CompileError

__all__ = ["Choice", "Compression", "choices", "encode_kernels", "encoding_sizes", "palettize",
           "prune"]


@dataclass(frozen=True)
class Compression:
    """The lossy options: ``palette`` index bits (None: off), ``prune`` fraction of zeros
    (None: off). The default compresses losslessly only; ``raw`` stores every kernel raw
    (the reference the lossless choice is compared with)."""
    palette: int = None
    prune: float = None
    raw: bool = False

    def __post_init__(self):
        if self.palette is not None and self.palette not in PALETTE_BITS[1:]:
            raise CompileError(f"--palette must be one of "
                               f"{', '.join(map(str, PALETTE_BITS[1:]))} (the extractor's "
                               f"index widths), not {self.palette!r}")
        if self.prune is not None and not 0.0 <= self.prune < 1.0:
            raise CompileError(f"--prune must be a fraction in [0, 1), not {self.prune!r}")


def prune(weights, fraction):
    """``weights`` (floats) with the ``round(fraction * size)`` smallest in magnitude set to
    zero (ties broken by position, so exactly that many are zeroed; weights already zero are
    among the smallest)."""
    w = np.array(weights, np.float32)
    n = int(round(fraction * w.size))
    if n:
        flat = w.reshape(-1)
        order = np.argsort(np.abs(flat), kind="stable")
        flat[order[:n]] = 0
    return w


def palettize(codes, bits, coef_fp16):
    """``codes`` (int8 values, or binary16 codes as uint16) with every coefficient replaced
    by the nearest of at most ``2**bits`` levels (k-means over the values of the whole array,
    centres rounded to the format; an exact zero kept when there are zeros). Lossless when
    there are no more than ``2**bits`` distinct codes."""
    codes = np.asarray(codes)
    try:
        pal = build_palette(codes, bits, coef_fp16)
    except ValueError as e:
        raise CompileError(f"--palette: {e}") from None
    values = _values(codes.ravel(), coef_fp16)
    levels = _values(pal, coef_fp16)
    out = np.empty(values.shape, np.int64)
    for i in range(0, len(values), 1 << 16):      # bounded memory for large layers
        v = values[i:i + (1 << 16)]
        out[i:i + len(v)] = pal[np.argmin(np.abs(v[:, None] - levels[None, :]), axis=1)]
    return _from_codes(out, coef_fp16).reshape(codes.shape)


def _values(codes, coef_fp16):
    codes = np.asarray(codes).astype(np.int64) & 0xFFFF
    if coef_fp16:
        return codes.astype(np.uint16).view(np.float16).astype(np.float64)
    return (codes & 0xFF).astype(np.uint8).view(np.int8).astype(np.float64)


def _from_codes(codes, coef_fp16):
    codes = np.asarray(codes, np.int64) & 0xFFFF
    if coef_fp16:
        return codes.astype(np.uint16)
    return (codes & 0xFF).astype(np.uint8).view(np.int8)


def _scan(group):
    """A group ``[ocg, icg, kh, kw]`` in the body's scan order (output channel fastest)."""
    return np.ascontiguousarray(np.transpose(group, (1, 2, 3, 0))).reshape(-1)


def _pad4(n):
    return -(-n // 4) * 4


def encoding_sizes(group, coef_fp16, bits, *, sparse):
    """``(header, body)`` bytes, word-padded, of one kernel group ``[ocg, icg, kh, kw]``
    encoded with ``bits``-bit palette indices (0: raw values), dense or ``sparse``
    (``docs/kernel_format.md``, "Sizes")."""
    e = 2 if coef_fp16 else 1
    flat = _scan(np.asarray(group))
    p = flat.size
    header = _pad4(12 * group.shape[0] + ((e << bits) if bits else 0))
    if sparse:
        nz = ~is_zero(flat, coef_fp16)
        per_chunk = np.add.reduceat(nz.astype(np.int64), np.arange(0, p, CHUNK))
        items = (per_chunk * bits + 7) // 8 if bits else per_chunk * e
        return header, _pad4(-(-p // CHUNK) + int(items.sum()))
    if bits:
        sizes = np.minimum(CHUNK, p - np.arange(0, p, CHUNK))
        return header, _pad4(int(((sizes * bits + 7) // 8).sum()))
    return header, _pad4(p * e)


@dataclass(frozen=True)
class Choice:
    """An encoding of a blob: ``sparse``, ``palette`` bits (0: none), ``bytes`` of its
    groups' parts."""
    sparse: bool
    palette: int
    bytes: int

    def name(self, fmt):
        kind = "+".join((["sparse"] if self.sparse else [])
                        + ([f"palette{self.palette}"] if self.palette else [])) or "raw"
        return f"{kind} {'fp16' if MacFormat(fmt).coef_fp16 else 'int8'}"


def _groups(codes, slots):
    return [codes[base:base + slots] for base in range(0, codes.shape[0], slots)]


def _distinct(group, coef_fp16, sparse):
    """The distinct codes a palette of ``group`` must hold (only nonzero ones when
    ``sparse``: a sparse body indexes only the nonzero coefficients)."""
    c = group.astype(np.int64).ravel() & 0xFFFF
    if sparse:
        c = c[~is_zero(c, coef_fp16)]
    return np.unique(c)


def _exact_bits(groups, coef_fp16, sparse):
    """The smallest palette width whose 2**bits entries hold every group's distinct
    coefficients; None when none does."""
    most = max(len(_distinct(g, coef_fp16, sparse)) for g in groups)
    return next((b for b in PALETTE_BITS[1:] if most <= 1 << b), None)


def choices(codes, fmt, slots, extract="full"):
    """Every lossless :class:`Choice` for ``codes`` ``[K, C, KH, KW]`` in MAC format ``fmt``
    split into groups of ``slots`` output channels, smallest first (ties: sparse first, as
    it skips zero coefficients in fewer extractor cycles; then raw before palettized).
    Encodings the ``extract`` build of the kernel extractor does not decode
    (``npu_spec.kernel.encoding_accepted``) are left out; raw always stays (the program
    builder refuses it with a clear error where the build cannot run it)."""
    coef_fp16 = MacFormat(fmt).coef_fp16
    groups = _groups(codes, slots)
    has_zero = any(bool(is_zero(g.astype(np.int64), coef_fp16).any()) for g in groups)
    out = []
    for sparse in ((False, True) if has_zero else (False,)):
        bits_options = [0]
        bits = _exact_bits(groups, coef_fp16, sparse)
        if bits is not None:
            bits_options.append(bits)
        for bits in bits_options:
            total = sum(sum(encoding_sizes(g, coef_fp16, bits, sparse=sparse)) for g in groups)
            if encoding_accepted(extract, coef_fp16=coef_fp16, sparse=sparse, palette=bits) \
                    or not (sparse or bits):
                out.append(Choice(sparse, bits, total))
    return sorted(out, key=lambda c: (c.bytes, not c.sparse, c.palette))


def encode_kernels(codes, *, fmt, bias, scale, shift=0, groups=1, slots, palette_bits=None,
                   raw=False, name=None, extract="full"):
    """``(blob, raw_bytes, choice)``: ``codes`` ``[K, C / groups, KH, KW]`` (int8 values, or
    binary16 codes) encoded as the smallest lossless :class:`Choice` after palettizing to
    ``palette_bits`` levels when given (lossy), with per-channel ``bias``, ``scale``,
    ``shift`` (32-bit patterns, as ``ProgramBuilder.kernels``). ``raw_bytes`` is the
    kernel-memory size of the raw encoding of the weights as given (before any palettizing),
    for the report (``raw``: keep that encoding); the blob's is ``4 * blob.words``. Only
    encodings the ``extract`` build decodes are chosen (:func:`choices`)."""
    fmt = MacFormat(fmt)
    codes = np.asarray(codes)
    raw_bytes = next(c.bytes for c in choices(codes, fmt, slots)
                     if not c.sparse and not c.palette)
    if palette_bits:
        codes = palettize(codes, palette_bits, fmt.coef_fp16)
    options = choices(codes, fmt, slots, extract)
    best = next(c for c in options if not c.sparse and not c.palette) if raw else options[0]
    k = codes.shape[0]
    bias, scale, shift = (np.broadcast_to(np.asarray(v, np.int64), (k,))
                          for v in (bias, scale, shift))
    encoded = []
    for base in range(0, k, slots):
        sl = slice(base, min(k, base + slots))
        pal = None
        if best.palette:
            pal = _distinct(codes[sl], fmt.coef_fp16, best.sparse)
            pal = _from_codes(np.concatenate([pal, np.zeros((1 << best.palette) - len(pal),
                                                            np.int64)]), fmt.coef_fp16)
        g = kernel_encode(codes[sl], coef_fp16=fmt.coef_fp16, sparse=best.sparse,
                          palette_bits=best.palette, bias=bias[sl], scale=scale[sl],
                          shift=shift[sl], palette=pal)
        want = codes[sl].astype(np.int64) & 0xFFFF
        got = g.weights.astype(np.int64) & 0xFFFF
        zero = is_zero(want, fmt.coef_fp16)
        if not np.array_equal(np.where(zero, 0, want), np.where(zero, 0, got)):
            raise AssertionError("a lossless kernel encoding changed a weight")
        encoded.append(g)
    blob = KernelBlob(tuple(encoded), int(fmt), codes.shape, groups, name)
    table = 4 * blob.words - best.bytes      # the group table: the same in every encoding
    return blob, raw_bytes + table, best
