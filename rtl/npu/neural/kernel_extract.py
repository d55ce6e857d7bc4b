"""Kernel extract: decompresses kernel groups streamed by the kernel DMA.

The blob format (header and body parts, raw / sparse / palettized / both) is specified in
``docs/kernel_format.md``; ``npu_model.kernel_codec`` is its encoder and the golden model of
this block (:func:`npu_model.kernel_codec.beats`).

The extractor composes two decoders that share the palette memory and the channels' nonzero
counts: the header decoder (``npu.neural.kernel_header``) and the body decoder
(``npu.neural.kernel_body``). It checks the group's configuration and keeps the status.
"""

from amaranth.hdl import Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory

from npu_spec.config import NPUConfig
from npu_spec.kernel import PALETTE_BITS

from .kernel_body import BodyDecoder
from .kernel_dense import KernelExtractDense
from .kernel_header import HeaderDecoder, KernelError, palette_width
from .layouts import (
    MAX_KERNEL,
    kernel_extractor_signature,
)

__all__ = ["KernelError", "KernelExtract", "KernelExtractDense", "kernel_extractor"]


class KernelExtract(wiring.Component):
    """Kernel extractor of one neural engine core.

    Decodes a group's header part once (``start_header``) and its body part any number of
    times (``start_body``, once per work unit). ``cfg`` must be held stable from the start
    pulse until ``busy`` falls; starts while busy are ignored.

    Members
    -------
    cfg : In(kernel_config_layout(slots))
        The group's configuration.
    header, body : In(stream.Signature(KERNEL_WORD))
        The two parts of the blob, 32-bit little-endian words, ``last`` on the final word.
    start_header : In(1)
        Pulse: decode one header part (one ``params`` beat per channel, store nnz and palette).
    start_body : In(1)
        Pulse: decode one body part (``coefs`` beats).
    params : Out(stream.Signature(param_beat_layout(slots)))
        Per-channel parameters, in slot order.
    coefs : Out(stream.Signature(coef_beat_layout(slots)))
        Coefficient beats (see ``docs/kernel_format.md``).
    busy : Out(1)
        A part is being decoded (or drained after an error).
    done : Out(1)
        One-cycle pulse: the part finished cleanly and every beat has been accepted.
    error : Out(1)
        Sticky until the next start: the part was malformed (``error_code`` says how). The
        extractor stopped emitting and consumed the part up to its ``last`` word.
    error_code : Out(KernelError)
    """

    def __init__(self, config):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self._config = config
        super().__init__(kernel_extractor_signature(config.acc_slots))

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        conf = self._config
        slots = conf.acc_slots
        cfg = self.cfg
        has_fp16 = conf.has_fp16
        int8_ok = conf.has_int8 or conf.has_mixed
        m.submodules.header = hdr = HeaderDecoder(conf)
        m.submodules.body = body = BodyDecoder(conf)

        # Configuration check (combinational; cfg is static while busy).
        fp16 = Signal()
        m.d.comb += fp16.eq(cfg.coef_fp16 & Const(int(has_fp16), 1))
        bad_config = Signal()
        m.d.comb += bad_config.eq(
            ~cfg.palette.matches(*PALETTE_BITS)
            | (cfg.icg == 0)
            | (cfg.kh == 0) | (cfg.kh > MAX_KERNEL)
            | (cfg.kw == 0) | (cfg.kw > MAX_KERNEL)
            | (cfg.ocg == 0) | (cfg.ocg > slots)
            | (cfg.coef_fp16 & Const(int(not has_fp16), 1))
            | (~cfg.coef_fp16 & Const(int(not int8_ok), 1)))
        for unit in (hdr, body):
            m.d.comb += [unit.cfg.eq(cfg), unit.fp16.eq(fp16), unit.bad_config.eq(bad_config)]

        # The parts and their outputs.
        wiring.connect(m, wiring.flipped(self.header), hdr.words)
        wiring.connect(m, wiring.flipped(self.body), body.words)
        wiring.connect(m, hdr.params, wiring.flipped(self.params))
        wiring.connect(m, body.coefs, wiring.flipped(self.coefs))
        m.d.comb += body.nnz.eq(hdr.nnz)

        # Palette memory: 256 entries, int8 entries stored sign-extended.
        m.submodules.palette = palette = Memory(shape=palette_width(conf), depth=256, init=[])
        pal_wr = palette.write_port()
        pal_rd = palette.read_port()
        m.d.comb += [
            pal_wr.en.eq(hdr.palette.en), pal_wr.addr.eq(hdr.palette.addr),
            pal_wr.data.eq(hdr.palette.data),
            pal_rd.en.eq(body.palette_en), pal_rd.addr.eq(body.palette_addr),
            body.palette_data.eq(pal_rd.data),
        ]

        # Start (one part at a time, the header first) and status.
        m.d.comb += [
            self.busy.eq(hdr.busy | body.busy),
            hdr.start.eq(~self.busy & self.start_header),
            body.start.eq(~self.busy & self.start_body & ~self.start_header),
        ]
        error = Signal()
        error_code = Signal(KernelError)
        done = Signal()
        m.d.sync += done.eq(hdr.finish | body.finish)
        # A start clears the status, unless the part is refused at once; an excess beat of a
        # part abandoned earlier that reaches S2 in the cycle of a start does not count.
        with m.If(body.excess):
            m.d.sync += [error.eq(1), error_code.eq(KernelError.NNZ_MISMATCH)]
        with m.If(~self.busy & (self.start_header | self.start_body)):
            m.d.sync += [error.eq(0), error_code.eq(KernelError.NONE)]
        for unit in (body, hdr):
            with m.If(unit.fail):
                m.d.sync += [error.eq(1), error_code.eq(unit.code)]
        m.d.comb += [self.error.eq(error), self.error_code.eq(error_code),
                     self.done.eq(done)]
        return m


def kernel_extractor(config):
    """The kernel extractor ``config.kernel_extract`` asks for: :class:`KernelExtract`, or
    :class:`npu.neural.kernel_dense.KernelExtractDense` for ``"dense_int8"`` (same ports, same
    beats for the encodings both take)."""
    if not isinstance(config, NPUConfig):
        raise TypeError(f"config must be an NPUConfig, not {config!r}")
    if config.kernel_extract == "dense_int8":
        return KernelExtractDense(config)
    return KernelExtract(config)
