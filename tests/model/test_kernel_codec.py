"""Kernel codec (npu_model.kernel_codec): round trips, beats, palettes, malformed blobs."""

import numpy as np
import pytest

from npu_model import kernel_codec as kc


def random_weights(rng, shape, coef_fp16, sparsity, distinct=None):
    """Random weights with a fraction ``sparsity`` of zeros (binary16: +0 and -0 mixed,
    only +0 when ``distinct`` limits the number of distinct codes)."""
    if coef_fp16:
        vals = rng.normal(0, 2, size=shape).astype(np.float16).view(np.uint16)
        if distinct:
            pool = vals.ravel()[:distinct] if vals.size >= distinct else vals.ravel()
            vals = rng.choice(pool, size=shape)
        zeros = [0x0000] if distinct else [0x0000, 0x8000]
        zero = rng.choice(np.array(zeros, np.uint16), size=shape)
    else:
        if distinct:
            pool = rng.integers(-128, 128, size=distinct)
            vals = rng.choice(pool, size=shape).astype(np.int8)
        else:
            vals = rng.integers(-128, 128, size=shape).astype(np.int8)
        zero = np.zeros(shape, np.int8)
    mask = rng.random(shape) < sparsity
    return np.where(mask, zero, vals)


def random_group(rng, *, coef_fp16, sparse, bits, sparsity, shape=None, exact=False):
    if shape is None:
        shape = (int(rng.integers(1, 9)), int(rng.integers(1, 6)), int(rng.integers(1, 4)),
                 int(rng.integers(1, 4)))
    distinct = (1 << bits) - 1 if (bits and exact) else None
    w = random_weights(rng, shape, coef_fp16, sparsity, distinct)
    ocg = shape[0]
    enc = kc.encode(w, coef_fp16=coef_fp16, sparse=sparse, palette_bits=bits,
                    bias=rng.integers(-(1 << 31), 1 << 31, ocg),
                    scale=rng.integers(0, 1 << 32, ocg), shift=rng.integers(0, 64, ocg))
    return w, enc


ENCODINGS = [(sparse, bits) for sparse in (False, True) for bits in (0, 1, 2, 4, 6, 8)]


@pytest.mark.parametrize("coef_fp16", [False, True], ids=["int8", "fp16"])
@pytest.mark.parametrize("sparse,bits", ENCODINGS)
def test_round_trip(coef_fp16, sparse, bits):
    rng = np.random.default_rng(bits * 4 + sparse * 2 + coef_fp16)
    for sparsity in (0.0, 0.3, 0.7, 1.0):
        for exact in (True, False):
            w, enc = random_group(rng, coef_fp16=coef_fp16, sparse=sparse, bits=bits,
                                  sparsity=sparsity, exact=exact)
            params, dense = kc.decode_group(enc.header, enc.body, enc.config)
            np.testing.assert_array_equal(dense, enc.weights)
            np.testing.assert_array_equal(params.nnz, enc.nnz)
            if bits == 0 or exact:
                # Lossless: only sparse binary16 -0 turns into +0.
                expect = w
                if coef_fp16 and sparse:
                    expect = np.where(kc.is_zero(w, True), 0, w).astype(np.uint16)
                np.testing.assert_array_equal(enc.weights, expect)
            # Zeros stay zeros through any palette (zero skipping survives quantization).
            assert np.all(kc.is_zero(enc.weights, coef_fp16)[kc.is_zero(w, coef_fp16)])
            assert len(enc.header) % 4 == 0 and len(enc.body) % 4 == 0


@pytest.mark.parametrize("coef_fp16", [False, True], ids=["int8", "fp16"])
@pytest.mark.parametrize("sparse,bits", ENCODINGS)
def test_beats_match_reference(coef_fp16, sparse, bits):
    rng = np.random.default_rng(100 + bits * 4 + sparse * 2 + coef_fp16)
    for sparsity in (0.0, 0.5, 0.9, 1.0):
        _, enc = random_group(rng, coef_fp16=coef_fp16, sparse=sparse, bits=bits,
                              sparsity=sparsity)
        got = kc.beats(enc.header, enc.body, enc.config)
        assert got == kc.reference_beats(enc.weights, coef_fp16)
        nz = int(np.count_nonzero(~kc.is_zero(enc.weights, coef_fp16)))
        zero_channels = int(np.sum(enc.nnz == 0))
        assert len(got) == nz + zero_channels


def test_header_bytes_by_hand():
    """The header of a 2-channel int8 group with a 1-bit palette, laid out by hand."""
    w = np.array([[[[3]], [[0]]], [[[0]], [[3]]]], np.int8)  # ocg 2, icg 2, 1x1
    enc = kc.encode(w, coef_fp16=False, sparse=False, palette_bits=1,
                    bias=[-2, 0x01020304], scale=[0x40000000, 7], shift=[5, 63])
    assert enc.header == bytes([
        0xFE, 0xFF, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x40, 5, 0, 1, 0,
        0x04, 0x03, 0x02, 0x01, 0x07, 0x00, 0x00, 0x00, 63, 0, 1, 0,
        0x00, 0x03, 0x00, 0x00])
    # Scan order oc fastest: (ic0: oc0=3, oc1=0), (ic1: oc0=0, oc1=3) -> indices 1,0,0,1.
    assert enc.body == bytes([0b1001, 0, 0, 0])


def test_body_bytes_by_hand():
    """Sparse raw int8 and sparse 2-bit palettized bodies, laid out by hand."""
    w = np.zeros((1, 1, 3, 4), np.int8)  # 12 positions: chunks of 8 and 4
    w[0, 0, 0, 1] = -1
    w[0, 0, 1, 3] = 5
    w[0, 0, 2, 0] = 2
    enc = kc.encode(w, coef_fp16=False, sparse=True, palette_bits=0)
    assert enc.body == bytes([0b1000_0010, 0xFF, 5, 0b0001, 2, 0, 0, 0])
    enc = kc.encode(w, coef_fp16=False, sparse=True, palette_bits=2,
                    palette=[0, -1, 2, 5])
    assert enc.body == bytes([0b1000_0010, 0b1101, 0b0001, 0b10])


def test_dense_fp16_bytes_and_zero_skip():
    w = np.array([0x3C00, 0x8000, 0x0000, 0xC000], np.uint16).reshape(1, 1, 2, 2)
    enc = kc.encode(w, coef_fp16=True, sparse=False, palette_bits=0)
    assert enc.body == bytes([0x00, 0x3C, 0x00, 0x80, 0x00, 0x00, 0x00, 0xC0])
    b = kc.beats(enc.header, enc.body, enc.config)
    assert b == [kc.Beat(0x3C00, 0, 0, 0, 0, 1, 0, 0), kc.Beat(0xC000, 0, 0, 1, 1, 0, 1, 0)]


def test_zero_channel_hold_beat():
    w = np.zeros((3, 2, 1, 1), np.int8)
    w[1, 1, 0, 0] = 9
    enc = kc.encode(w, coef_fp16=False, sparse=True, palette_bits=0)
    assert kc.beats(enc.header, enc.body, enc.config) == [
        kc.Beat(0, 0, 0, 0, 0, 1, 1, 1), kc.Beat(0, 2, 0, 0, 0, 1, 1, 1),
        kc.Beat(9, 1, 1, 0, 0, 1, 1, 0)]


@pytest.mark.parametrize("coef_fp16", [False, True], ids=["int8", "fp16"])
def test_palette_quantization(coef_fp16):
    rng = np.random.default_rng(3)
    w = random_weights(rng, (4, 8, 3, 3), coef_fp16, 0.3)
    for bits in (1, 2, 4):
        enc = kc.encode(w, coef_fp16=coef_fp16, sparse=False, palette_bits=bits)
        assert len(enc.palette) == 1 << bits
        used = np.unique(enc.weights.astype(np.int64) & (0xFFFF if coef_fp16 else 0xFF))
        assert len(used) <= 1 << bits
        # Zero is kept exact; every effective weight is the nearest palette entry.
        assert np.all(kc.is_zero(enc.weights, coef_fp16)[kc.is_zero(w, coef_fp16)])
        val = kc._numeric(kc._codes(w, coef_fp16), coef_fp16)
        eff = kc._numeric(kc._codes(enc.weights, coef_fp16), coef_fp16)
        pal = kc._numeric(enc.palette, coef_fp16)
        best = np.min(np.abs(val[..., None] - pal), axis=-1)
        nz = ~kc.is_zero(w, coef_fp16)
        np.testing.assert_allclose(np.abs(val - eff)[nz], best[nz])


def test_given_palette_maps_to_nearest():
    w = np.array([-9, -2, 0, 1, 7, 100], np.int8).reshape(1, 6, 1, 1)
    enc = kc.encode(w, coef_fp16=False, sparse=False, palette_bits=2, palette=[0, -8, 2, 64])
    np.testing.assert_array_equal(enc.weights.ravel(), [-8, 0, 0, 0, 2, 64])
    with pytest.raises(ValueError):
        kc.encode(w, coef_fp16=False, sparse=False, palette_bits=1, palette=[0, 1, 2])


def test_sizes_and_words():
    rng = np.random.default_rng(9)
    w = random_weights(rng, (8, 16, 3, 3), False, 0.5)
    dense = kc.encode(w, coef_fp16=False, sparse=False, palette_bits=0)
    sparse = kc.encode(w, coef_fp16=False, sparse=True, palette_bits=0)
    hb, bb = kc.compressed_size(dense.header, dense.body)
    assert hb == 8 * 12 and bb == 8 * 16 * 9
    nz = int(np.count_nonzero(sparse.weights))
    assert kc.compressed_size(sparse.header, sparse.body)[1] == 4 * -(-(8 * 16 * 9 // 8 + nz)
                                                                     // 4)
    words = kc.word_stream(b"\x01\x02\x03\x04\x05")
    assert words == [(0x04030201, 0), (0x05, 1)]
    assert list(kc.pack_words(b"\x01\x02\x03\x04")) == [0x04030201]


def _blob(**kw):
    w = np.zeros((2, 3, 2, 2), np.int8)
    w[0, 0, 0, 0], w[1, 2, 1, 1], w[0, 1, 1, 0] = 4, -3, 1
    return kc.encode(w, coef_fp16=False, palette_bits=kw.pop("bits", 0),
                     sparse=kw.pop("sparse", False))


@pytest.mark.parametrize("bits", [0, 2])
@pytest.mark.parametrize("sparse", [False, True])
def test_errors(bits, sparse):
    enc = _blob(bits=bits, sparse=sparse)
    cfg = enc.config

    def code(header, body, config=cfg):
        with pytest.raises(kc.KernelFormatError) as info:
            kc.beats(header, body, config)
        return info.value.code

    assert code(enc.header, enc.body, KernelConfigReplace(cfg, palette=3)) == "bad_config"
    assert code(enc.header, enc.body, KernelConfigReplace(cfg, kh=17)) == "bad_config"
    assert code(enc.header[:-4], enc.body) == "early_end"
    assert code(enc.header + bytes(4), enc.body) == "trailing"
    assert code(enc.header, enc.body[:-4]) == "early_end"
    assert code(enc.header, enc.body + bytes(4)) == "trailing"
    bad = bytearray(enc.header)
    bad[9] = 1
    assert code(bytes(bad), enc.body) == "reserved"
    bad = bytearray(enc.header)
    bad[8] = 64
    assert code(bytes(bad), enc.body) == "reserved"
    for delta in (-1, 1):
        bad = bytearray(enc.header)
        bad[10] += delta
        assert code(bytes(bad), enc.body) == "nnz_mismatch"
    with pytest.raises(kc.KernelFormatError) as info:
        cfg.check(slots=1)
    assert info.value.number == 1
    with pytest.raises(kc.KernelFormatError):
        KernelConfigReplace(cfg, coef_fp16=True).check(fp16=False)


def KernelConfigReplace(cfg, **changes):
    d = cfg.as_dict()
    d.update(changes)
    d["coef_fp16"], d["sparse"] = bool(d["coef_fp16"]), bool(d["sparse"])
    return kc.KernelConfig(**d)


def _dense_from_beats(header, body, config):
    """Dense codes by replaying the beats (the stream the extractor emits)."""
    dense = np.zeros((config.ocg, config.icg, config.kh, config.kw), np.int64)
    for b in kc.beats(header, body, config):
        if not b.hold:
            dense[b.slot, b.ic, b.ky, b.kx] = b.coef
    return dense


@pytest.mark.parametrize("coef_fp16", [False, True], ids=["int8", "fp16"])
@pytest.mark.parametrize("sparse,bits", ENCODINGS)
def test_dense_codes_match_beats(coef_fp16, sparse, bits):
    rng = np.random.default_rng(200 + bits * 4 + sparse * 2 + coef_fp16)
    for sparsity in (0.0, 0.5, 1.0):
        _, enc = random_group(rng, coef_fp16=coef_fp16, sparse=sparse, bits=bits,
                              sparsity=sparsity)
        params, dense = kc.dense_codes(enc.header, enc.body, enc.config)
        want = _dense_from_beats(enc.header, enc.body, enc.config)
        zero = kc.is_zero(want, coef_fp16)
        np.testing.assert_array_equal(np.where(zero, 0, dense) & 0xFFFF, want & 0xFFFF)
        assert np.all(kc.is_zero(dense, coef_fp16) == zero)
        np.testing.assert_array_equal(dense & 0xFFFF, enc.weights.astype(np.int64) & 0xFFFF)
        np.testing.assert_array_equal(params.nnz, enc.nnz)


@pytest.mark.parametrize("sparse", [False, True])
def test_dense_codes_errors_like_beats(sparse):
    """Malformed raw and sparse bodies raise the error :func:`beats` raises."""
    enc = _blob(sparse=sparse)
    cfg = enc.config
    cases = [(enc.header, enc.body[:-4]), (enc.header, enc.body + bytes(4)),
             (enc.header[:-4], enc.body), (enc.header + bytes(4), enc.body)]
    for delta in (-1, 1):
        bad = bytearray(enc.header)
        bad[10] += delta
        cases.append((bytes(bad), enc.body))
    body = bytearray(enc.body)
    if sparse:
        body[0] ^= 0x02             # a bitmap bit of a zero coefficient
    else:
        body[1] ^= 0x01             # a zero coefficient becomes nonzero
    cases.append((enc.header, bytes(body)))
    for header, body in cases:
        with pytest.raises(kc.KernelFormatError) as want:
            kc.beats(header, body, cfg)
        with pytest.raises(kc.KernelFormatError) as got:
            kc.dense_codes(header, body, cfg)
        assert got.value.code == want.value.code
    with pytest.raises(kc.KernelFormatError, match="bad_config"):
        kc.dense_codes(enc.header, enc.body, cfg, slots=1)
