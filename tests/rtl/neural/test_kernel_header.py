# amaranth: UnusedElaboratable=no
"""The header decoder (npu.neural.kernel_header) against npu_model.kernel_codec.parse_header:
parameter beats, nonzero counts and palette writes; malformed headers fail with the codec's
code and are drained to their last word."""

import numpy as np
import pytest

from npu.neural.kernel_header import HeaderDecoder, KernelError
from npu_model import kernel_codec as kc
from npu_spec.config import preset
from tests.support.csr import run
from tests.support.neural import random_kernel_group


def decode(config, cases, *, stall=0.3, seed=0):
    """Run each ``(encoded config, header bytes)``; returns per case ``(params, nnz, palette
    writes, finish, fail code or None)``."""
    dut = HeaderDecoder(config)
    rng = np.random.default_rng(seed)
    outcomes = []

    async def tb(ctx):
        for cfg, header in cases:
            fp16 = cfg.coef_fp16 and config.has_fp16
            ctx.set(dut.cfg, cfg.as_dict())
            ctx.set(dut.fp16, fp16)
            bad = cfg.palette not in kc.PALETTE_BITS or not 1 <= cfg.ocg <= config.acc_slots
            ctx.set(dut.bad_config, bad)
            ctx.set(dut.start, 1)
            _, _, fail, fcode = await ctx.tick().sample(dut.fail, dut.code)
            ctx.set(dut.start, 0)
            words = kc.word_stream(header)
            params, palette, finish = [], {}, False
            code = KernelError(fcode.value).name.lower() if fail else None
            for _ in range(40 * len(words) + 600):
                offer = bool(words) and rng.random() >= stall
                if offer:
                    ctx.set(dut.words.payload, {"data": words[0][0], "last": words[0][1]})
                ctx.set(dut.words.valid, offer)
                take = bool(rng.random() >= stall)
                ctx.set(dut.params.ready, take)
                _, _, wready, pv, p, pe, pa, pd, fin, fail, fcode, busy = \
                    await ctx.tick().sample(dut.words.ready, dut.params.valid,
                                            dut.params.payload, dut.palette.en,
                                            dut.palette.addr, dut.palette.data, dut.finish,
                                            dut.fail, dut.code, dut.busy)
                if offer and wready:
                    words.pop(0)
                if pv and take:
                    params.append({"slot": p.slot, "bias": p.bias, "scale": p.scale,
                                   "shift": p.shift, "group_last": p.group_last})
                if pe:
                    palette[pa] = pd
                finish |= bool(fin)
                if fail:
                    assert code is None, "a second failure"
                    code = KernelError(fcode.value).name.lower()
                if not busy and not words:
                    break
            assert not words, "the part was not consumed to its last word"
            nnz = ctx.get(dut.nnz)
            outcomes.append((params, [nnz[s] for s in range(cfg.ocg)], palette, finish, code))

    run(dut, tb)
    return outcomes


@pytest.mark.parametrize("name", ["small", "ice40"])
def test_against_model(name):
    config = preset(name)
    rng = np.random.default_rng(len(name))
    fp16s = (False, True) if config.has_fp16 else (False,)
    encs = [random_kernel_group(rng, coef_fp16=fp16, sparse=bool(k % 2), bits=bits)
            for k, (fp16, bits) in enumerate((f, b) for f in fp16s for b in kc.PALETTE_BITS)]
    outs = decode(config, [(e.config, e.header) for e in encs], seed=len(name))
    for enc, (params, nnz, palette, finish, code) in zip(encs, outs):
        p = kc.parse_header(enc.header, enc.config)
        assert (finish, code) == (True, None)
        assert params == [{"slot": s, "bias": int(p.bias[s]), "scale": int(p.scale[s]),
                           "shift": int(p.shift[s]), "group_last": int(s == enc.config.ocg - 1)}
                          for s in range(enc.config.ocg)]
        assert nnz == list(p.nnz)
        width = 16 if config.has_fp16 else 8
        assert palette == {i: int(v) & ((1 << width) - 1) for i, v in enumerate(p.palette)}


def test_malformed_headers():
    config = preset("small")
    rng = np.random.default_rng(9)
    enc = random_kernel_group(rng, coef_fp16=False, sparse=True, bits=2, ocg=3)
    h = enc.header
    shifted = bytearray(h)
    shifted[8] = 64                 # channel 0's shift above 63
    reserved = bytearray(h)
    reserved[21] = 1                # channel 1's reserved byte
    cases = [(enc.config, h[:-4]), (enc.config, h + bytes(8)), (enc.config, bytes(shifted)),
             (enc.config, bytes(reserved)),
             (kc.KernelConfig(False, True, 3, 1, 2, 2, 3), h)]
    outs = decode(config, cases + [(enc.config, h)], seed=3)
    for (cfg, header), (_, _, _, finish, code) in zip(cases, outs):
        with pytest.raises(kc.KernelFormatError) as info:
            kc.parse_header(header, cfg, slots=config.acc_slots)
        assert (finish, code) == (False, info.value.code)
    assert outs[-1][3:] == (True, None)         # a good header after them
