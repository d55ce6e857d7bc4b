"""Kernel extract for dense int8 kernels only (``NPUConfig.kernel_extract == "dense_int8"``).

The same ports and the same beats as :class:`npu.neural.kernel_extract.KernelExtract`, for the
one encoding a small FPGA build needs: raw int8 coefficients without a zero bitmap or palette
(``docs/kernel_format.md``). Any other encoding is refused at the start of either part with
``KernelError.BAD_CONFIG`` (the rule is ``npu_spec.kernel.encoding_accepted``; the golden
model, ``npu_model.kernel_codec``, applies the same rule).

A dense int8 body is the ``ocg * icg * kh * kw`` coefficient bytes in scan order, zero padded to
a word, so the body decoder walks the positions with a plain loop counter, one byte per cycle
straight from the stream's word, and needs no bit ring, no chunk-base tables and no palette
memory. Zero coefficients still cost no beat (zero skipping), and nnz is still checked.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu_spec.config import NPUConfig
from npu_spec.kernel import PALETTE_BITS

from .kernel_header import HeaderDecoder, KernelError, NnzWriteSignature
from .layouts import (
    KERNEL_WORD,
    MAX_KERNEL,
    coef_beat_layout,
    kernel_config_layout,
    kernel_extractor_signature,
    slot_shape,
)

__all__ = ["DenseBodyDecoder", "KernelExtractDense"]


class DenseBodyDecoder(wiring.Component):
    """Decodes one dense raw int8 body part per ``start`` (``docs/kernel_format.md``).

    First a hold beat for every channel whose nnz is 0 (lowest slot first, one a cycle), then
    one position a cycle in scan order (output channel fastest), a beat for each nonzero byte.

    The channels' nnz and the beats each still has due are two small memories (block RAM on an
    FPGA), read one position ahead (the next position's channel is known), so that the
    per-channel counters cost no logic per slot: a channel's due count is valid only once its
    ``seen`` bit is set in this body (before, its nnz is), which is how a new body restarts
    every count in one cycle.

    Members
    -------
    cfg : In(kernel_config_layout(slots))
        The group's configuration (held while busy).
    bad_config : In(1)
        The configuration is refused: a start reports ``BAD_CONFIG`` and drains the part.
    start : In(1)
        Decode a body part (only while not busy).
    words : In(stream.Signature(KERNEL_WORD))
    nnz_write : In(NnzWriteSignature(slots))
        Each channel's nonzero count, written by the header decoder.
    coefs : Out(stream.Signature(coef_beat_layout(slots)))
    busy : Out(1)
    finish : Out(1)
        The part ended cleanly and its last beat was taken (combinational).
    fail : Out(1), code : Out(KernelError)
        The part is malformed (combinational, one cycle); the decoder then consumes the part up
        to its last word.
    """

    def __init__(self, config):
        self._config = config
        slots = config.acc_slots
        super().__init__({
            "cfg":        In(kernel_config_layout(slots)),
            "bad_config": In(1),
            "start":      In(1),
            "words":      In(stream.Signature(KERNEL_WORD)),
            "nnz_write":  In(NnzWriteSignature(slots)),
            "coefs":      Out(stream.Signature(coef_beat_layout(slots))),
            "busy":       Out(1),
            "finish":     Out(1),
            "fail":       Out(1),
            "code":       Out(KernelError),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        slots = self._config.acc_slots
        depth = 1 << slot_shape(slots).width
        words, coefs = self.words, self.coefs

        def fail(code):
            m.d.comb += [self.fail.eq(1), self.code.eq(code)]

        out_free = Signal()
        m.d.comb += out_free.eq(~coefs.valid | coefs.ready)
        with m.If(coefs.valid & coefs.ready):
            m.d.sync += coefs.valid.eq(0)

        # The position: a loop counter, output channel fastest, and the byte of the word.
        oc = Signal(slot_shape(slots))
        kx = Signal(4)
        ky = Signal(4)
        ic = Signal(12)
        byte = Signal(2)
        last_oc = oc == cfg.ocg - 1
        last_kx = kx == cfg.kw - 1
        last_ky = ky == cfg.kh - 1
        last_ic = ic == cfg.icg - 1
        final = last_oc & last_kx & last_ky & last_ic
        step = Signal()             # the position is done this cycle

        # Per channel: nnz (from the header) and the beats still due (valid while `seen`; the
        # nnz before the channel's first beat), read at the channel of the position after a
        # step, else of this one.
        attrs = {"ram_style": "block"}
        m.submodules.nnz = nnz_mem = Memory(shape=16, depth=depth, init=[], attrs=attrs)
        m.submodules.due = due_mem = Memory(shape=16, depth=depth, init=[], attrs=attrs)
        nnz_wr = nnz_mem.write_port()
        due_wr = due_mem.write_port()
        nnz_rd = nnz_mem.read_port()
        due_rd = due_mem.read_port(transparent_for=(due_wr,))
        read_oc = Mux(step, Mux(last_oc, 0, oc + 1), oc)
        m.d.comb += [
            nnz_wr.en.eq(self.nnz_write.en), nnz_wr.addr.eq(self.nnz_write.addr),
            nnz_wr.data.eq(self.nnz_write.data),
            nnz_rd.addr.eq(read_oc), due_rd.addr.eq(read_oc),
        ]
        zero = Signal(slots)        # channels whose nnz is 0
        with m.If(self.nnz_write.en):
            m.d.sync += zero.bit_select(self.nnz_write.addr, 1).eq(self.nnz_write.data == 0)
        seen = Signal(slots)        # channels with a beat in this body
        complete = Signal(slots)    # channels that had their last beat in this body
        holds = Signal(slots)       # channels with nnz 0 still to get their hold beat
        in_group = Signal(slots)    # slot < ocg
        m.d.comb += in_group.eq(Cat(*(cfg.ocg > s for s in range(slots))))
        seen_oc = seen.bit_select(oc, 1)
        due = Signal(16)
        m.d.comb += due.eq(Mux(seen_oc, due_rd.data, nnz_rd.data))

        value = Signal(8)
        m.d.comb += value.eq(words.payload.data.word_select(byte, 8))

        with m.FSM() as fsm:
            m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") | coefs.valid)
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [oc.eq(0), kx.eq(0), ky.eq(0), ic.eq(0), byte.eq(0),
                                 seen.eq(0), complete.eq(0), holds.eq(zero & in_group)]
                    with m.If(self.bad_config):
                        fail(KernelError.BAD_CONFIG)
                        m.next = "DRAIN"
                    with m.Else():
                        m.next = "HOLD"

            # A hold beat (coef 0, first, last, hold) for each channel without nonzeros.
            with m.State("HOLD"):
                lowest = Signal(slots)
                m.d.comb += lowest.eq(holds & -holds)
                with m.If(holds == 0):
                    m.next = "WALK"
                with m.Elif(out_free):
                    slot = Signal(slot_shape(slots))
                    for s in range(slots):
                        with m.If(lowest[s]):
                            m.d.comb += slot.eq(s)
                    m.d.sync += [
                        holds.eq(holds & ~lowest),
                        coefs.valid.eq(1),
                        coefs.payload.eq(0),
                        coefs.payload.slot.eq(slot),
                        coefs.payload.first.eq(1),
                        coefs.payload.last.eq(1),
                        coefs.payload.hold.eq(1),
                    ]

            # One position a cycle: its byte, then the next position.
            with m.State("WALK"):
                nonzero = value != 0
                excess = nonzero & (due == 0)
                last = due == 1
                m.d.comb += [step.eq(words.valid & (out_free | ~nonzero)),
                             words.ready.eq(step & ((byte == 3) | final))]
                with m.If(step):
                    m.d.sync += byte.eq(byte + 1)
                    m.d.sync += oc.eq(oc + 1)
                    with m.If(last_oc):
                        m.d.sync += [oc.eq(0), kx.eq(kx + 1)]
                        with m.If(last_kx):
                            m.d.sync += [kx.eq(0), ky.eq(ky + 1)]
                            with m.If(last_ky):
                                m.d.sync += [ky.eq(0), ic.eq(ic + 1)]
                    with m.If(nonzero & ~excess):
                        m.d.comb += [due_wr.en.eq(1), due_wr.addr.eq(oc),
                                     due_wr.data.eq(due - 1)]
                        m.d.sync += [
                            coefs.valid.eq(1),
                            coefs.payload.coef.eq(value.as_signed()),
                            coefs.payload.slot.eq(oc),
                            coefs.payload.ic.eq(ic),
                            coefs.payload.ky.eq(ky),
                            coefs.payload.kx.eq(kx),
                            coefs.payload.first.eq(~seen_oc),
                            coefs.payload.last.eq(last),
                            coefs.payload.hold.eq(0),
                            seen.bit_select(oc, 1).eq(1),
                        ]
                        with m.If(last):
                            m.d.sync += complete.bit_select(oc, 1).eq(1)
                    # Errors in stream order: a surplus nonzero, the part ending early, a
                    # whole word left over; then a channel short of its nnz.
                    with m.If(excess):
                        fail(KernelError.NNZ_MISMATCH)
                        m.next = "DRAIN"
                        with m.If(words.ready & words.payload.last):
                            m.next = "IDLE"
                    with m.Elif(final):
                        with m.If(~words.payload.last):
                            fail(KernelError.TRAILING)
                            m.next = "DRAIN"
                        with m.Else():
                            m.next = "CHECK"
                    with m.Elif((byte == 3) & words.payload.last):
                        fail(KernelError.EARLY_END)
                        m.next = "IDLE"

            with m.State("CHECK"):
                with m.If((in_group & ~zero & ~complete) != 0):
                    fail(KernelError.NNZ_MISMATCH)
                    m.next = "IDLE"
                with m.Elif(~coefs.valid):
                    m.d.comb += self.finish.eq(1)
                    m.next = "IDLE"

            with m.State("DRAIN"):
                m.d.comb += words.ready.eq(1)
                with m.If(words.valid & words.payload.last):
                    m.next = "IDLE"
        return m


class KernelExtractDense(wiring.Component):
    """Kernel extractor of one neural engine core for dense raw int8 kernels only.

    Ports and behaviour as :class:`npu.neural.kernel_extract.KernelExtract` (``start_header``,
    ``start_body``, ``params``, ``coefs``, ``busy``, ``done``, ``error``, ``error_code``), except
    that a group whose ``cfg`` asks for binary16 coefficients, a zero bitmap or a palette is
    refused with ``BAD_CONFIG`` (``npu_spec.kernel.encoding_accepted``).

    Members
    -------
    cfg : In(kernel_config_layout(slots))
    header, body : In(stream.Signature(KERNEL_WORD))
    start_header, start_body : In(1)
    params : Out(stream.Signature(param_beat_layout(slots)))
    coefs : Out(stream.Signature(coef_beat_layout(slots)))
    busy, done, error : Out(1)
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
        int8_ok = conf.has_int8 or conf.has_mixed
        m.submodules.header = hdr = HeaderDecoder(conf, palette=False)
        m.submodules.body = body = DenseBodyDecoder(conf)

        # Configuration check (combinational; cfg is static while busy): the checks of the
        # full extractor, and dense raw int8 only.
        bad_config = Signal()
        m.d.comb += bad_config.eq(
            ~cfg.palette.matches(*PALETTE_BITS)
            | (cfg.icg == 0)
            | (cfg.kh == 0) | (cfg.kh > MAX_KERNEL)
            | (cfg.kw == 0) | (cfg.kw > MAX_KERNEL)
            | (cfg.ocg == 0) | (cfg.ocg > slots)
            | cfg.coef_fp16 | cfg.sparse | (cfg.palette != 0)
            | int(not int8_ok))
        m.d.comb += [hdr.cfg.eq(cfg), hdr.fp16.eq(0), hdr.bad_config.eq(bad_config),
                     body.cfg.eq(cfg), body.bad_config.eq(bad_config)]

        # The parts and their outputs.
        wiring.connect(m, wiring.flipped(self.header), hdr.words)
        wiring.connect(m, wiring.flipped(self.body), body.words)
        wiring.connect(m, hdr.params, wiring.flipped(self.params))
        wiring.connect(m, body.coefs, wiring.flipped(self.coefs))
        wiring.connect(m, hdr.nnz_write, body.nnz_write)

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
        with m.If(~self.busy & (self.start_header | self.start_body)):
            m.d.sync += [error.eq(0), error_code.eq(KernelError.NONE)]
        for unit in (body, hdr):
            with m.If(unit.fail):
                m.d.sync += [error.eq(1), error_code.eq(unit.code)]
        m.d.comb += [self.error.eq(error), self.error_code.eq(error_code),
                     self.done.eq(done)]
        return m

