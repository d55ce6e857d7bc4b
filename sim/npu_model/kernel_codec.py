"""Kernel compression format of the neural engine: encoder, decoder and beat model.

The format is specified byte by byte in ``docs/kernel_format.md``. A *kernel group* holds the
kernels of ``ocg`` output channels that the engine accumulates together, each over ``icg``
input channels x ``kh`` x ``kw``. It is stored as two parts, each streamed as 32-bit
little-endian words:

* the **header** (decoded once per group): 12 bytes per output channel (bias, scale, shift,
  reserved, nnz), then the palette if the body is palettized;
* the **body** (decoded once per work unit): the coefficients in scan order (input channel,
  kernel row, kernel column, output channel; output channel fastest), in chunks of 8
  positions, raw or palettized, optionally with a zero bitmap per chunk.

:func:`beats` is the golden model of ``npu.neural.kernel_extract.KernelExtract``: it gives the
coefficient beats exactly as the RTL emits them, and raises :class:`KernelFormatError` with the
RTL's error code on a malformed blob. This module uses numpy only.
"""

from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np

from npu_spec.kernel import (
    CHUNK,
    GROUP_TABLE,
    GROUP_TABLE_WORDS,
    HEADER_CHANNEL_BYTES,
    MAX_ICG,
    MAX_KERNEL,
    PALETTE_BITS,
    KernelError,
    encoding_accepted,
)

__all__ = [
    "CHUNK",
    "ERRORS",
    "HEADER_CHANNEL_BYTES",
    "MAX_ICG",
    "MAX_KERNEL",
    "PALETTE_BITS",
    "Beat",
    "EncodedGroup",
    "HeaderParams",
    "KernelConfig",
    "KernelFormatError",
    "beats",
    "build_palette",
    "compressed_size",
    "decode_group",
    "dense_codes",
    "encode",
    "is_zero",
    "kernel_memory",
    "pack_words",
    "parse_header",
    "reference_beats",
    "word_stream",
]

#: Error codes of the extractor by name (:class:`npu_spec.kernel.KernelError`).
ERRORS = {e.name.lower(): e.value for e in KernelError}


class KernelFormatError(ValueError):
    """A malformed kernel blob; ``code`` is the name of the extractor's error code."""

    def __init__(self, code, message):
        if code not in ERRORS:
            raise ValueError(f"unknown kernel error code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code = code

    @property
    def number(self):
        return ERRORS[self.code]


@dataclass(frozen=True)
class KernelConfig:
    """Static configuration of one kernel group (``npu.neural.layouts.kernel_config_layout``).

    ``palette`` is the index width in bits (0 = raw coefficients).
    """

    coef_fp16: bool
    sparse: bool
    palette: int
    icg: int
    kh: int
    kw: int
    ocg: int

    def as_dict(self):
        """The fields as plain ints, e.g. for ``ctx.set(dut.cfg, cfg.as_dict())``."""
        return {f.name: int(getattr(self, f.name)) for f in fields(self)}

    @property
    def positions(self):
        """Coefficient positions of the group (``ocg * icg * kh * kw``)."""
        return self.ocg * self.icg * self.kh * self.kw

    @property
    def value_bits(self):
        """Bits of one coefficient in the body: the index width, or 8 / 16 for raw."""
        if self.palette:
            return self.palette
        return 16 if self.coef_fp16 else 8

    @property
    def entry_bytes(self):
        """Bytes per palette entry (and per raw coefficient)."""
        return 2 if self.coef_fp16 else 1

    def check(self, slots=None, *, fp16=True, int8=True, extract="full"):
        """Raise ``KernelFormatError("bad_config")`` unless the extractor accepts this group.

        ``slots`` is the accumulator slot count of the build (None: no limit); ``fp16`` and
        ``int8`` say whether the build takes binary16 and int8 coefficients; ``extract`` is the
        extractor build (``NPUConfig.kernel_extract``; ``"dense_int8"`` refuses every encoding
        but dense raw int8, ``npu_spec.kernel.encoding_accepted``).
        """
        problems = []
        if self.palette not in PALETTE_BITS:
            problems.append(f"palette bits {self.palette!r} not in {PALETTE_BITS}")
        if not 1 <= self.icg <= MAX_ICG:
            problems.append(f"icg {self.icg!r} not in [1, {MAX_ICG}]")
        for name in ("kh", "kw"):
            value = getattr(self, name)
            if not 1 <= value <= MAX_KERNEL:
                problems.append(f"{name} {value!r} not in [1, {MAX_KERNEL}]")
        if self.ocg < 1 or (slots is not None and self.ocg > slots):
            problems.append(f"ocg {self.ocg!r} not in [1, {slots}]")
        if self.coef_fp16 and not fp16:
            problems.append("binary16 coefficients in a build without them")
        if not self.coef_fp16 and not int8:
            problems.append("int8 coefficients in a build without them")
        if not encoding_accepted(extract, coef_fp16=self.coef_fp16, sparse=self.sparse,
                                 palette=self.palette):
            problems.append(f"encoding (binary16 {int(self.coef_fp16)}, sparse "
                            f"{int(self.sparse)}, palette {self.palette}) not decoded by the "
                            f"{extract!r} extractor")
        if problems:
            raise KernelFormatError("bad_config", "; ".join(problems))


@dataclass
class HeaderParams:
    """Decoded header: per-channel arrays (length ``ocg``) and the palette.

    ``bias`` and ``scale`` are uint32 bit patterns; ``palette`` holds 16-bit coefficient codes
    (binary16 codes, or int8 values sign-extended to 16 bits), empty if not palettized.
    """

    bias: np.ndarray
    scale: np.ndarray
    shift: np.ndarray
    nnz: np.ndarray
    palette: np.ndarray


class Beat(NamedTuple):
    """One coefficient beat (``npu.neural.layouts.coef_beat_layout``)."""
    coef: int
    slot: int
    ic: int
    ky: int
    kx: int
    first: int
    last: int
    hold: int


@dataclass
class EncodedGroup:
    """Result of :func:`encode`.

    ``weights`` are the *effective* weights ``[ocg, icg, kh, kw]`` (int8 or uint16 binary16
    codes) that the blob encodes: equal to the input unless a palette had to quantize them
    (and, in sparse bodies, binary16 -0 becomes +0). The golden convolution must use these.
    """

    header: bytes
    body: bytes
    config: KernelConfig
    weights: np.ndarray
    palette: np.ndarray
    nnz: np.ndarray


# --- coefficient values -------------------------------------------------------------------

def is_zero(codes, coef_fp16):
    """True where a 16-bit coefficient code is zero (int8 0; binary16 +0 or -0)."""
    codes = np.asarray(codes).astype(np.int64) & 0xFFFF
    if coef_fp16:
        return (codes & 0x7FFF) == 0
    return (codes & 0xFF) == 0


def _codes(weights, coef_fp16):
    """Weights as 16-bit codes (int8 sign-extended), int64 array."""
    w = np.asarray(weights)
    if coef_fp16:
        if w.dtype.kind == "f":
            raise TypeError("binary16 weights must be given as uint16 codes, not floats")
        w = w.astype(np.int64)
        if w.size and (w.min() < 0 or w.max() > 0xFFFF):
            raise ValueError("binary16 codes must be in [0, 0xFFFF]")
        return w
    w = w.astype(np.int64)
    if w.size and (w.min() < -128 or w.max() > 127):
        raise ValueError("int8 weights must be in [-128, 127]")
    return w & 0xFFFF


def _from_codes(codes, coef_fp16):
    codes = np.asarray(codes, np.int64) & 0xFFFF
    if coef_fp16:
        return codes.astype(np.uint16)
    return (codes & 0xFF).astype(np.uint8).view(np.int8)


def _numeric(codes, coef_fp16):
    """Float64 values of 16-bit codes (binary16 via numpy, int8 as integers)."""
    codes = np.asarray(codes, np.int64) & 0xFFFF
    if coef_fp16:
        return codes.astype(np.uint16).view(np.float16).astype(np.float64)
    return ((codes & 0xFF).astype(np.uint8).view(np.int8)).astype(np.float64)


def _to_codes(values, coef_fp16):
    """Float64 values -> 16-bit codes (binary16 round to nearest even; int8 round, clip)."""
    values = np.asarray(values, np.float64)
    if coef_fp16:
        return values.astype(np.float16).view(np.uint16).astype(np.int64)
    return np.clip(np.rint(values), -128, 127).astype(np.int64) & 0xFFFF


# --- palettes -----------------------------------------------------------------------------

def build_palette(weights, bits, coef_fp16, *, iterations=24):
    """A palette of ``2**bits`` codes for ``weights``.

    If the distinct weight codes fit, the palette is those codes in increasing order (padded
    with zeros); the encoding is then exact. Otherwise the codes are quantized: a Lloyd
    (k-means) iteration over the histogram of values, started from evenly spaced levels over
    [min, max], with centres rounded to the coefficient format; zero is kept exactly when
    the weights contain a zero, so pruned weights stay zero (and cost no MAC cycle). Returns
    an int64 array of 16-bit codes.
    """
    if bits not in PALETTE_BITS[1:]:
        raise ValueError(f"palette bits must be one of {PALETTE_BITS[1:]}, not {bits!r}")
    k = 1 << bits
    codes = _codes(weights, coef_fp16).ravel()
    uniq = np.unique(codes)
    if len(uniq) <= k:
        return np.concatenate([uniq, np.zeros(k - len(uniq), np.int64)])
    values = _numeric(codes, coef_fp16)
    if not np.all(np.isfinite(values)):
        raise ValueError("cannot quantize non-finite binary16 weights into a palette")
    levels, counts = np.unique(values, return_counts=True)
    centres = np.linspace(levels[0], levels[-1], k)
    for _ in range(iterations):
        assign = np.argmin(np.abs(levels[:, None] - centres[None, :]), axis=1)
        new = centres.copy()
        for j in range(k):
            sel = assign == j
            if sel.any():
                new[j] = np.average(levels[sel], weights=counts[sel])
        if np.array_equal(new, centres):
            break
        centres = new
    pal = np.unique(_to_codes(centres, coef_fp16))
    has_zero = bool(np.any(is_zero(codes, coef_fp16)))
    if has_zero and not np.any(is_zero(pal, coef_fp16)):
        nearest = int(np.argmin(np.abs(_numeric(pal, coef_fp16))))
        pal[nearest] = 0
        pal = np.unique(pal)
    return np.concatenate([pal, np.zeros(k - len(pal), np.int64)])


def _palette_indices(codes, palette, coef_fp16):
    """Index of each code in ``palette``: an exactly equal entry if any, else the nearest
    value (ties to the lowest index)."""
    codes = np.asarray(codes, np.int64)
    flat = codes.ravel()
    idx = np.empty(flat.shape, np.int64)
    pal_val = _numeric(palette, coef_fp16)
    with np.errstate(invalid="ignore"):
        dist = np.abs(_numeric(flat, coef_fp16)[:, None] - pal_val[None, :])
    dist = np.where(np.isnan(dist), np.inf, dist)
    idx[:] = np.argmin(dist, axis=1)
    palette = np.asarray(palette, np.int64)
    for j in range(len(palette) - 1, -1, -1):     # the lowest equal entry wins
        idx[flat == palette[j]] = j
    return idx.reshape(codes.shape)


# --- bit packing --------------------------------------------------------------------------

class _BitWriter:
    def __init__(self):
        self.out = bytearray()
        self.acc = 0
        self.n = 0

    def bits(self, value, width):
        self.acc |= (int(value) & ((1 << width) - 1)) << self.n
        self.n += width
        while self.n >= 8:
            self.out.append(self.acc & 0xFF)
            self.acc >>= 8
            self.n -= 8

    def align(self):
        if self.n:
            self.bits(0, 8 - self.n)

    def word_align(self):
        self.align()
        while len(self.out) % 4:
            self.out.append(0)


class _BitReader:
    """LSB-first bit reader over a part; raises ``early_end`` when bits run out."""

    def __init__(self, data, part):
        self.data = bytes(data)
        self.pos = 0
        self.part = part

    @property
    def total(self):
        return 8 * len(self.data)

    def bits(self, width):
        if self.pos + width > self.total:
            raise KernelFormatError("early_end", f"{self.part} part ended at bit {self.total}, "
                                                 f"{self.pos + width} needed")
        value = 0
        for k in range(width):
            b = self.pos + k
            value |= ((self.data[b >> 3] >> (b & 7)) & 1) << k
        self.pos += width
        return value

    def align(self):
        self.bits((-self.pos) % 8)

    def finish(self):
        if self.total - self.pos >= 32:
            raise KernelFormatError("trailing", f"{self.part} part has "
                                                f"{(self.total - self.pos) // 32} unused word(s)")


def _pad_words(data):
    data = bytes(data)
    return data + bytes(-len(data) % 4)


def pack_words(data):
    """Bytes of a part -> numpy uint32 words, little-endian, zero padded to a word."""
    return np.frombuffer(_pad_words(data), dtype="<u4").astype(np.uint32)


def kernel_memory(groups, base=0):
    """The kernel-memory words of a layer's :class:`EncodedGroup` list, from word ``base`` on:
    the kernel group table (``npu_spec.kernel.GROUP_TABLE``, one entry of
    ``GROUP_TABLE_WORDS`` words per group), then each group's header part and body part."""
    table, parts = [], []
    start = base + GROUP_TABLE_WORDS * len(groups)
    for group in groups:
        entry = {}
        for part, data in (("header", group.header), ("body", group.body)):
            words = [int(w) for w in pack_words(data)]
            entry[f"{part}_addr"] = start + len(parts)
            entry[f"{part}_words"] = len(words)
            parts += words
        table += [entry[name] for name in GROUP_TABLE]
    return table + parts


def word_stream(data):
    """Bytes of a part -> list of ``(word, last)`` beats of the kernel DMA stream
    (``KERNEL_WORD``); ``last`` is set on the final word."""
    words = [int(w) for w in pack_words(data)]
    return [(w, int(i == len(words) - 1)) for i, w in enumerate(words)]


# --- encoder ------------------------------------------------------------------------------

def _per_channel(values, ocg, name, lo, hi):
    arr = np.broadcast_to(np.asarray(values, dtype=np.int64), (ocg,)).copy()
    if arr.size and (arr.min() < lo or arr.max() > hi):
        raise ValueError(f"{name} must be in [{lo}, {hi}]")
    return arr


def encode(weights, *, coef_fp16, sparse, palette_bits, bias=0, scale=0, shift=0,
           palette=None):
    """Encode one kernel group; returns an :class:`EncodedGroup`.

    ``weights`` is ``[ocg, icg, kh, kw]``: int8 values, or binary16 codes (uint16) when
    ``coef_fp16``. ``bias`` and ``scale`` are per-channel 32-bit patterns (int32 values or
    uint32 bits; a scalar is broadcast), ``shift`` per-channel 0..63. ``palette_bits`` 0 means
    raw coefficients; otherwise ``palette`` (``2**palette_bits`` codes at most, padded with
    zeros) is used, or one is built by :func:`build_palette`. Weights not in the palette are
    replaced by the nearest entry: see ``EncodedGroup.weights``.
    """
    w = np.asarray(weights)
    if w.ndim != 4:
        raise ValueError(f"weights must be [ocg, icg, kh, kw], not shape {w.shape}")
    ocg, icg, kh, kw = w.shape
    cfg = KernelConfig(bool(coef_fp16), bool(sparse), int(palette_bits), icg, kh, kw, ocg)
    cfg.check()
    codes = _codes(w, coef_fp16)
    bias = _per_channel(bias, ocg, "bias", -(1 << 31), (1 << 32) - 1) & 0xFFFF_FFFF
    scale = _per_channel(scale, ocg, "scale", -(1 << 31), (1 << 32) - 1) & 0xFFFF_FFFF
    shift = _per_channel(shift, ocg, "shift", 0, 63)

    # Effective codes and palette indices.
    pal = np.zeros(0, np.int64)
    if cfg.palette:
        k = 1 << cfg.palette
        if palette is None:
            pal = build_palette(w, cfg.palette, coef_fp16)
        else:
            pal = _codes(np.asarray(palette).ravel(), coef_fp16)
            if len(pal) > k:
                raise ValueError(f"palette has {len(pal)} entries, more than 2**{cfg.palette}")
            pal = np.concatenate([pal, np.zeros(k - len(pal), np.int64)])
        index = _palette_indices(codes, pal, coef_fp16)
        eff = pal[index]
        if sparse:
            eff = np.where(is_zero(codes, coef_fp16), 0, eff)
    else:
        index = None
        eff = codes.copy()
    if sparse:
        eff = np.where(is_zero(eff, coef_fp16), 0, eff)
    nonzero = ~is_zero(eff, coef_fp16)
    nnz = nonzero.reshape(ocg, -1).sum(axis=1)
    if nnz.max() > 0xFFFF:
        raise ValueError(f"a channel has {nnz.max()} nonzero coefficients; the header's nnz "
                         f"field holds at most 65535")

    # Header.
    hw = _BitWriter()
    for o in range(ocg):
        hw.bits(bias[o], 32)
        hw.bits(scale[o], 32)
        hw.bits(shift[o], 8)
        hw.bits(0, 8)
        hw.bits(nnz[o], 16)
    for entry in pal:
        hw.bits(entry, 8 * cfg.entry_bytes)
    hw.word_align()

    # Body: scan order ic, ky, kx, oc (oc fastest).
    scan_codes = eff.transpose(1, 2, 3, 0).reshape(-1)
    scan_nz = nonzero.transpose(1, 2, 3, 0).reshape(-1)
    scan_index = index.transpose(1, 2, 3, 0).reshape(-1) if index is not None else None
    bw = _BitWriter()
    for c in range(0, cfg.positions, CHUNK):
        pos = range(c, min(c + CHUNK, cfg.positions))
        if sparse:
            bw.bits(sum(1 << (p - c) for p in pos if scan_nz[p]), 8)
            pos = [p for p in pos if scan_nz[p]]
        for p in pos:
            if scan_index is not None:
                bw.bits(scan_index[p], cfg.palette)
            else:
                bw.bits(scan_codes[p], 8 * cfg.entry_bytes)
        bw.align()
    bw.word_align()
    return EncodedGroup(bytes(hw.out), bytes(bw.out), cfg, _from_codes(eff, coef_fp16),
                        pal, nnz)


def compressed_size(header, body):
    """Bytes streamed for a group: ``(header_bytes, body_bytes)`` rounded up to words."""
    return len(_pad_words(header)), len(_pad_words(body))


# --- decoder ------------------------------------------------------------------------------

def _sext8(v):
    return (v - 256 if v & 0x80 else v) & 0xFFFF


def parse_header(header, config, **build):
    """Decode a header part into :class:`HeaderParams`, checking it as the extractor does.

    ``build`` (``slots``, ``fp16``, ``int8``) describes the extractor's build for the
    configuration check (:meth:`KernelConfig.check`)."""
    config.check(**build)
    r = _BitReader(_pad_words(header), "header")
    ocg = config.ocg
    bias = np.zeros(ocg, np.uint32)
    scale = np.zeros(ocg, np.uint32)
    shift = np.zeros(ocg, np.uint8)
    nnz = np.zeros(ocg, np.int64)
    for o in range(ocg):
        bias[o] = r.bits(32)
        scale[o] = r.bits(32)
        sh, reserved = r.bits(8), r.bits(8)
        if reserved or sh > 63:
            raise KernelFormatError("reserved", f"channel {o}: shift {sh}, reserved {reserved}")
        shift[o] = sh
        nnz[o] = r.bits(16)
    pal = []
    if config.palette:
        for _ in range(1 << config.palette):
            e = r.bits(8 * config.entry_bytes)
            pal.append(e if config.coef_fp16 else _sext8(e))
    r.pos += (-r.pos) % 32
    r.pos = min(r.pos, r.total)
    r.finish()
    return HeaderParams(bias, scale, shift, nnz, np.asarray(pal, np.int64))


def _body_items(body, config, palette):
    """Yield ``(position, code)`` for every coefficient the body carries, in stream order
    (dense bodies: every position; sparse: the bitmap's set positions). Leaves the reader
    at the end of the body's data; returns it via StopIteration.value."""
    r = _BitReader(_pad_words(body), "body")
    total = config.positions
    for c in range(0, total, CHUNK):
        n = min(CHUNK, total - c)
        if config.sparse:
            bitmap = r.bits(8) & ((1 << n) - 1)  # bits beyond the end are ignored
        else:
            bitmap = (1 << n) - 1
        for i in range(n):
            if not bitmap >> i & 1:
                continue
            if config.palette:
                code = int(palette[r.bits(config.palette)])
            elif config.coef_fp16:
                code = r.bits(16)
            else:
                code = _sext8(r.bits(8))
            yield c + i, code
        r.align()
    return r


def _scan_coords(config, p):
    """(oc, ic, ky, kx) of scan position ``p``."""
    oc = p % config.ocg
    p //= config.ocg
    kx = p % config.kw
    p //= config.kw
    ky = p % config.kh
    return oc, p // config.kh, ky, kx


def decode_group(header, body, config):
    """Decode a group: returns ``(params, weights)`` with params a :class:`HeaderParams` and
    weights the dense ``[ocg, icg, kh, kw]`` array (int8, or uint16 binary16 codes). Positions
    a sparse body leaves out decode as zero. Raises :class:`KernelFormatError` as
    :func:`beats` does."""
    params = parse_header(header, config)
    dense = np.zeros((config.ocg, config.icg, config.kh, config.kw), np.int64)
    for _ in beats(header, body, config, _dense=dense, _params=params):
        pass
    return params, _from_codes(dense, config.coef_fp16)


def beats(header, body, config, *, _dense=None, _params=None, **build):
    """The coefficient beats the extractor emits for one replay of ``body``, as a list of
    :class:`Beat`, after the header ``header`` was decoded.

    First a hold beat (``coef`` 0, ``first``, ``last`` and ``hold`` set, at ic = ky = kx = 0)
    for every channel whose header nnz is 0, in slot order; then one beat per nonzero
    coefficient in scan order. Raises :class:`KernelFormatError` in the order the extractor
    detects errors: ``nnz_mismatch`` at the first nonzero beyond a channel's nnz,
    ``early_end`` when the body runs out, ``trailing`` when it has a whole word left over,
    then ``nnz_mismatch`` if a channel got fewer than nnz beats. ``build`` is passed to
    :meth:`KernelConfig.check`.
    """
    config.check(**build)
    params = _params if _params is not None else parse_header(header, config, **build)
    out = []
    count = np.zeros(config.ocg, np.int64)
    for o in range(config.ocg):
        if params.nnz[o] == 0:
            out.append(Beat(0, o, 0, 0, 0, 1, 1, 1))
    gen = _body_items(body, config, params.palette)
    while True:
        try:
            p, code = next(gen)
        except StopIteration as stop:
            reader = stop.value
            break
        oc, ic, ky, kx = _scan_coords(config, p)
        if _dense is not None:
            _dense[oc, ic, ky, kx] = code
        if is_zero(code, config.coef_fp16):
            continue
        if count[oc] >= params.nnz[oc]:
            raise KernelFormatError("nnz_mismatch", f"channel {oc}: more than "
                                                    f"{params.nnz[oc]} nonzero coefficients")
        count[oc] += 1
        out.append(Beat(int(code), oc, ic, ky, kx, int(count[oc] == 1),
                        int(count[oc] == params.nnz[oc]), 0))
    reader.finish()
    short = np.nonzero(count != params.nnz)[0]
    if len(short):
        o = int(short[0])
        raise KernelFormatError("nnz_mismatch", f"channel {o}: {count[o]} nonzero "
                                                f"coefficients, header says {params.nnz[o]}")
    return out


def dense_codes(header, body, config, **build):
    """The header parameters and the dense coefficient codes ``[ocg, icg, kh, kw]`` (int64:
    int8 values or binary16 codes) that :func:`beats` decodes, with the same checks and
    errors; ``(params, codes)``.

    A raw dense body (no bitmap, no palette) of the exact length with every channel's nnz
    right is read in one step; anything else (and every error) goes through :func:`beats`.
    """
    config.check(**build)
    params = parse_header(header, config, **build)
    dense = np.zeros((config.ocg, config.icg, config.kh, config.kw), np.int64)
    if not config.sparse and not config.palette:
        raw = _pad_words(body)
        width = config.entry_bytes
        used = config.positions * width
        if used <= len(raw) < used + 4:     # no early end, no unused word
            dtype = "<u2" if config.coef_fp16 else "i1"
            codes = np.frombuffer(raw[:used], dtype=dtype).astype(np.int64)
            # scan order: oc fastest, then kx, ky, ic
            scan = codes.reshape(config.icg, config.kh, config.kw, config.ocg)
            dense[...] = scan.transpose(3, 0, 1, 2)
            nnz = (~is_zero(dense, config.coef_fp16)).reshape(config.ocg, -1).sum(axis=1)
            if np.array_equal(nnz, params.nnz):
                return params, dense
    beats(header, body, config, _dense=dense, _params=params)
    return params, dense


def reference_beats(weights, coef_fp16):
    """Beats straight from dense (effective) weights, without any blob: the semantics of the
    beat stream stated independently of the encoding (used to check :func:`beats`)."""
    codes = _codes(weights, coef_fp16)
    ocg, icg, kh, kw = codes.shape
    nz = ~is_zero(codes, coef_fp16)
    nnz = nz.reshape(ocg, -1).sum(axis=1)
    out = [Beat(0, o, 0, 0, 0, 1, 1, 1) for o in range(ocg) if nnz[o] == 0]
    seen = np.zeros(ocg, np.int64)
    for ic in range(icg):
        for ky in range(kh):
            for kx in range(kw):
                for o in range(ocg):
                    if nz[o, ic, ky, kx]:
                        seen[o] += 1
                        out.append(Beat(int(codes[o, ic, ky, kx]), o, ic, ky, kx,
                                        int(seen[o] == 1), int(seen[o] == nnz[o]), 0))
    return out
