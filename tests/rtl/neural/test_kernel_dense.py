# amaranth: UnusedElaboratable=no
"""The dense int8 kernel extractor (npu.neural.kernel_dense, ``kernel_extract="dense_int8"``)
against the codec's golden model (npu_model.kernel_codec) with the same build rule: beats and
params bit for bit, every error code, refusal of the other encodings, throughput."""

import numpy as np
import pytest
from amaranth.hdl import Fragment

from npu.neural.kernel_dense import KernelExtractDense
from npu.neural.kernel_extract import KernelExtract, kernel_extractor
from npu_model import kernel_codec as kc
from npu_spec.config import NPUConfig, preset
from npu_spec.kernel import encoding_accepted
from tests.rtl.neural.test_kernel_extract import (
    Op,
    check_groups,
    expected_beats,
    expected_params,
    group_ops,
    random_encoded,
    run,
)

#: The iCE40 build with the dense extractor, and an odd slot count.
DENSE = preset("ice40").replace(kernel_extract="dense_int8")
DENSE3 = NPUConfig(macs=4, acc_slots=3, formats=("int8",), kernel_extract="dense_int8")


def dense(rng, slots, sparsity, shape=None):
    return random_encoded(rng, slots, coef_fp16=False, sparse=False, bits=0,
                          sparsity=sparsity, shape=shape)


def test_selected_by_config():
    for config, cls in ((DENSE, KernelExtractDense), (preset("ice40"), KernelExtract)):
        block = kernel_extractor(config)
        assert type(block) is cls
        Fragment.get(block, None)
    with pytest.raises(TypeError, match="NPUConfig"):
        KernelExtractDense("ice40")
    with pytest.raises(ValueError, match="kernel_extract"):
        NPUConfig(kernel_extract="sparse")


@pytest.mark.parametrize("config", [DENSE, DENSE3], ids=["ice40", "3slots"])
def test_random_groups(config):
    """Dense int8 groups, 0-100% zeros (hold beats, zero skipping), odd shapes, random stalls,
    bodies replayed after their header."""
    rng = np.random.default_rng(21 + config.acc_slots)
    encs = [dense(rng, config.acc_slots, s) for s in (0.0, 0.5, 0.9, 1.0, 0.3, 0.7)]
    check_groups(config, encs, seed=config.acc_slots, stall=0.4)


def test_directed_shapes():
    """A single position; 16x16 kernels; 1x1 kernels over 19 channels; one nonzero, at the
    very end; positions that end exactly on a word and one byte past it."""
    rng = np.random.default_rng(3)
    encs = [kc.encode(np.array([[[[7]]]], np.int8), coef_fp16=False, sparse=False,
                      palette_bits=0)]
    encs.append(dense(rng, 8, 0.2, shape=(2, 1, 16, 16)))
    encs.append(dense(rng, 8, 0.2, shape=(1, 19, 1, 1)))
    w = np.zeros((8, 3, 3, 3), np.int8)
    w[7, 2, 2, 2] = -128
    encs.append(kc.encode(w, coef_fp16=False, sparse=False, palette_bits=0))
    encs.append(dense(rng, 8, 0.0, shape=(4, 1, 1, 2)))
    encs.append(dense(rng, 8, 0.0, shape=(3, 1, 1, 3)))
    check_groups(DENSE, encs, seed=9, stall=0.2, replays=1)


def _golden_code(op, header):
    """The golden model's error code for ``op`` on the dense build, or "none"."""
    build = {"slots": DENSE.acc_slots, "int8": True, "fp16": False, "extract": "dense_int8"}
    try:
        if op.part == "header":
            kc.parse_header(op.data, op.config, **build)
        else:
            kc.beats(header, op.data, op.config, **build)
    except kc.KernelFormatError as e:
        return e.code
    return "none"


def test_refuses_other_encodings():
    """Sparse, palettized and binary16 groups are refused with BAD_CONFIG at either part, as
    the golden model's rule says; each is followed by a clean dense group."""
    rng = np.random.default_rng(4)
    refused = [random_encoded(rng, 8, coef_fp16=fp16, sparse=sparse, bits=bits, sparsity=0.3)
               for fp16, sparse, bits in ((False, True, 0), (False, False, 4),
                                          (False, True, 2), (True, False, 0))]
    ok = dense(rng, 8, 0.3)
    ops = []
    for enc in refused:
        assert not encoding_accepted("dense_int8", coef_fp16=enc.config.coef_fp16,
                                     sparse=enc.config.sparse, palette=enc.config.palette)
        ops += [Op("header", enc.config, enc.header), Op("body", enc.config, enc.body)]
        ops += group_ops(ok, 1)
    outs = run(DENSE, ops, seed=4)
    for k, (op, out) in enumerate(zip(ops, outs)):
        if k % 4 < 2:
            assert _golden_code(op, ok.header) == "bad_config"
            # The full build takes the same group.
            assert kc.beats(op.data if op.part == "header" else refused[k // 4].header,
                            refused[k // 4].body, op.config, slots=8) is not None
            assert (out.done, out.error, out.code) == (0, 1, kc.ERRORS["bad_config"]), k
            assert out.params == [] and out.beats == []
        elif op.part == "header":
            assert (out.done, out.error, out.params) == (1, 0, expected_params(ok.header,
                                                                              ok.config))
        else:
            assert (out.done, out.error) == (1, 0)
            assert out.beats == expected_beats(ok.header, ok.body, ok.config)


def test_errors():
    """Every other error code on dense groups, each followed by a clean group; the golden model
    with the dense rule gives the same code."""
    rng = np.random.default_rng(5)
    w = rng.integers(-3, 4, size=(3, 2, 3, 3)).astype(np.int8)
    w[1] = 0
    w[0, 0, 0, 0] = 0
    enc = kc.encode(w, coef_fp16=False, sparse=False, palette_bits=0)
    h, b, cfg = enc.header, enc.body, enc.config
    clean = dense(rng, 8, 0.4)
    cases = []
    for bad in (dict(icg=0), dict(kh=0), dict(kw=17), dict(ocg=0), dict(ocg=9)):
        bad_cfg = kc.KernelConfig(**{**cfg.as_dict(), **bad})
        cases += [(Op("header", bad_cfg, h), None), (Op("body", bad_cfg, b), h)]
    cases += [(Op("header", cfg, h[:-4]), None), (Op("header", cfg, h + bytes(4)), None)]
    for byte, value in ((9, 1), (8, 64), (33, 0x80)):
        bad = bytearray(h)
        bad[byte] = value
        cases.append((Op("header", cfg, bytes(bad)), None))
    cases += [(Op("body", cfg, b[:-4]), h), (Op("body", cfg, b + bytes(4)), h),
              (Op("body", cfg, b + bytes(12)), h), (Op("body", cfg, b[:8]), h)]
    for delta in (-1, 1, -int(enc.nnz[0])):
        bad = bytearray(h)
        bad[10] = (bad[10] + delta) % 256
        cases.append((Op("body", cfg, b), bytes(bad)))
    bad = bytearray(h)
    bad[12 * 2 + 10:12 * 2 + 12] = bytes(2)          # channel 2 says nnz 0 but has nonzeros
    cases.append((Op("body", cfg, b), bytes(bad)))
    ops, codes = [], []
    for op, header in cases:
        if header is not None:
            ops.append(Op("header", cfg, header))
            codes.append(None)
        ops.append(op)
        codes.append(_golden_code(op, header))
        ops += group_ops(clean, 1)
        codes += ["none", "none"]
    outs = run(DENSE, ops, seed=6, stall=0.3)
    seen = set()
    for i, (op, code, out) in enumerate(zip(ops, codes, outs)):
        if code is None:
            assert (out.done, out.error) == (1, 0), i
        elif code == "none":
            assert (out.done, out.error, out.code) == (1, 0, 0), i
            if op.part == "body":
                assert out.beats == expected_beats(clean.header, clean.body, clean.config)
        else:
            assert (out.done, out.error, out.code) == (0, 1, kc.ERRORS[code]), (i, code, out)
            seen.add(code)
    assert seen == set(kc.ERRORS) - {"none"}


def test_throughput():
    """One position a cycle plus one cycle per zero channel, with at most 4 cycles besides
    (start, the hold check, the output register, the end check), no stalls anywhere."""
    rng = np.random.default_rng(8)
    encs = [dense(rng, 8, s, shape=(8, 6, 3, 3)) for s in (0.0, 0.5, 1.0)]
    ops = [op for enc in encs for op in group_ops(enc, 1)]
    outs = run(DENSE, ops, seed=0, stall=0.0, gap=False)
    for enc, out in zip(encs, outs[1::2]):
        assert out.beats == expected_beats(enc.header, enc.body, enc.config)
        stated = enc.config.positions + int(np.sum(enc.nnz == 0))
        assert stated <= out.cycles <= stated + 4, (stated, out.cycles)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_random_sweep_slow(seed):
    rng = np.random.default_rng(2000 + seed)
    config = [DENSE, DENSE3, NPUConfig(macs=2, acc_slots=1, formats=("int8",),
                                       kernel_extract="dense_int8"),
              NPUConfig(macs=4, acc_slots=5, formats=("int8",), kernel_extract="dense_int8")
              ][seed]
    encs = [dense(rng, config.acc_slots, float(rng.random()),
                  shape=(int(rng.integers(1, config.acc_slots + 1)), int(rng.integers(1, 9)),
                         int(rng.integers(1, 6)), int(rng.integers(1, 6))))
            for _ in range(12)]
    check_groups(config, encs, seed=seed, stall=float(rng.choice([0.0, 0.3, 0.6])),
                 replays=int(rng.integers(1, 4)))
