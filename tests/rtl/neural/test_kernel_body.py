# amaranth: UnusedElaboratable=no
"""The body decoder (npu.neural.kernel_body) against npu_model.kernel_codec.beats: coefficient
beats of every encoding from a header's nonzero counts and palette; malformed bodies fail with
the codec's code."""

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib.memory import Memory

from npu.neural.kernel_body import BodyDecoder
from npu.neural.kernel_header import KernelError
from npu_model import kernel_codec as kc
from npu_spec.config import preset
from tests.support.csr import run
from tests.support.neural import random_kernel_group


class Bench(Elaboratable):
    """The decoder reading a palette memory loaded with ``palette``."""

    def __init__(self, config, palette):
        self.body = BodyDecoder(config)
        self.palette = palette
        self.width = 16 if config.has_fp16 else 8

    def elaborate(self, platform):
        m = Module()
        m.submodules.body = body = self.body
        init = [int(v) & ((1 << self.width) - 1) for v in self.palette] + [0] * 256
        m.submodules.palette = mem = Memory(shape=self.width, depth=256, init=init[:256])
        port = mem.read_port()
        m.d.comb += [port.addr.eq(body.palette_addr), port.en.eq(body.palette_en),
                     body.palette_data.eq(port.data)]
        return m


def decode(config, header, body, cfg, *, stall=0.3, seed=0):
    """Decode ``body`` after ``header``; returns ``(beats, finish, fail code or None)``."""
    params = kc.parse_header(header, cfg)
    bench = Bench(config, params.palette)
    dut = bench.body
    rng = np.random.default_rng(seed)
    outcome = []

    async def tb(ctx):
        ctx.set(dut.cfg, cfg.as_dict())
        ctx.set(dut.fp16, cfg.coef_fp16 and config.has_fp16)
        ctx.set(dut.nnz, [int(v) for v in params.nnz] + [0] * (config.acc_slots - cfg.ocg))
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        words = kc.word_stream(body)
        beats, finish, code = [], False, None
        for _ in range(40 * len(words) + 4 * cfg.positions + 100):
            offer = bool(words) and rng.random() >= stall
            if offer:
                ctx.set(dut.words.payload, {"data": words[0][0], "last": words[0][1]})
            ctx.set(dut.words.valid, offer)
            take = bool(rng.random() >= stall)
            ctx.set(dut.coefs.ready, take)
            _, _, wready, cv, c, fin, fail, fcode, excess, busy = await ctx.tick().sample(
                dut.words.ready, dut.coefs.valid, dut.coefs.payload, dut.finish, dut.fail,
                dut.code, dut.excess, dut.busy)
            if offer and wready:
                words.pop(0)
            if cv and take:
                beats.append(kc.Beat(c.coef, c.slot, c.ic, c.ky, c.kx, c.first, c.last, c.hold))
            finish |= bool(fin)
            if (fail or excess) and code is None:
                code = "nnz_mismatch" if excess else KernelError(fcode.value).name.lower()
            if not busy and not words:
                break
        assert not words, "the part was not consumed to its last word"
        outcome.extend((beats, finish, code))

    run(bench, tb)
    return outcome


@pytest.mark.parametrize("coef_fp16", [False, True], ids=["int8", "fp16"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_against_model(coef_fp16, sparse):
    config = preset("small")
    rng = np.random.default_rng(2 * coef_fp16 + sparse)
    for bits in kc.PALETTE_BITS:
        enc = random_kernel_group(rng, coef_fp16=coef_fp16, sparse=sparse, bits=bits)
        beats, finish, code = decode(config, enc.header, enc.body, enc.config,
                                     seed=bits + 10 * sparse)
        assert (finish, code) == (True, None)
        assert beats == kc.beats(enc.header, enc.body, enc.config), enc.config


def test_malformed_bodies():
    config = preset("small")
    rng = np.random.default_rng(4)
    enc = random_kernel_group(rng, coef_fp16=False, sparse=True, bits=0, ocg=3)
    h, b, cfg = enc.header, enc.body, enc.config
    for body, nnz in ((b[:-4], None), (b + bytes(4), None), (b, enc.nnz + 1),
                      (b, np.maximum(enc.nnz - 1, 0))):
        header = h
        if nnz is not None:      # the header the changed counts come from
            header = bytearray(h)
            for o, count in enumerate(nnz):
                header[12 * o + 10:12 * o + 12] = int(count).to_bytes(2, "little")
            header = bytes(header)
        with pytest.raises(kc.KernelFormatError) as info:
            kc.beats(header, body, cfg)
        _, finish, code = decode(config, header, body, cfg, seed=len(body))
        assert (finish, code) == (False, info.value.code)
