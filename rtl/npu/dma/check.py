"""The transfer check: :func:`npu_spec.dma.dma_error` in hardware.

The mode, shape and alignment checks are combinational on the latched transfer. The window and
bounds checks need the extents ``addr + sum((nk - 1) * stridek)`` of both sides: one level a
cycle, with one multiplier a side between registers (the level's operands registered, the
product registered, then added), then the code itself is registered, so it is ready
:data:`LATENCY` cycles after ``start``.
"""

from amaranth.hdl import Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu_spec.dataproc import buffer_elements
from npu_spec.dma import RANK, DmaDir, DmaError, DmaFormat
from npu_spec.engine import ERROR_BITS

from ..lib.engine import ADDR_WIDTH
from .layouts import EXTENT_BITS, TransferLayout

__all__ = ["LATENCY", "TransferCheck"]

#: Cycles from ``start`` to ``done``.
LATENCY = RANK + 4


class TransferCheck(wiring.Component):
    """Checks a transfer before its first access.

    Parameters
    ----------
    config : NPUConfig
        ``cores``, ``buffer_kib`` and ``kernel_kib`` bound the mode and the on-chip side.

    Members
    -------
    transfer : In(TransferLayout)
        The transfer; holds from ``start`` to ``done``.
    limit : In(ADDR_WIDTH)
        The window's size in 32-bit words; holds from ``start`` to ``done``.
    start : In(1)
        Begin a check.
    done : Out(1)
        One-cycle strobe, :data:`LATENCY` cycles after ``start``: ``code`` is valid.
    code : Out(ERROR_BITS)
        The :class:`~npu_spec.dma.DmaError` of the transfer (registered; valid with
        ``done``).
    """

    transfer: In(TransferLayout)
    limit: In(ADDR_WIDTH)
    start: In(1)
    done: Out(1)
    code: Out(ERROR_BITS)

    def __init__(self, config):
        self._cores = config.cores
        self._buffer_elements = buffer_elements(config)
        self._kernel_words = config.kernel_kib * 256
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        t = self.transfer

        # Mode: known codes, WORD exactly with a kernel memory that the build has.
        kmem = t.dir == DmaDir.MEM_TO_KMEM
        word = t.fmt == DmaFormat.WORD
        bad_mode = ((t.dir > max(DmaDir)) | (t.fmt > max(DmaFormat)) | (word != kmem)
                    | (kmem & (t.core >= self._cores)))
        bad_shape = Signal()
        m.d.comb += bad_shape.eq(0)
        for k in range(RANK):
            with m.If(t.sizes[k] == 0):
                m.d.comb += bad_shape.eq(1)

        # Alignment: the first offset and every stride that is used, a multiple of the size.
        align = Signal(2)
        with m.Switch(t.fmt):
            with m.Case(DmaFormat.HALF):
                m.d.comb += align.eq(0b01)
            with m.Case(DmaFormat.WORD):
                m.d.comb += align.eq(0b11)
        misaligned = Signal()
        m.d.comb += misaligned.eq((t.mem_addr[:2] & align) != 0)
        for k in range(RANK):
            with m.If((t.sizes[k] > 1) & ((t.mem_strides[k][:2] & align) != 0)):
                m.d.comb += misaligned.eq(1)

        # Extents: one level a cycle through three registers: the level's count nk - 1 and
        # strides, their products, then the step to the low or the high end.
        level = Signal(range(RANK + 1))
        running = Signal()
        # (The extents and their operands are written from ``start`` on before they are
        # looked at, and the code only with ``done``: no reset.)
        mem_lo, mem_hi, buf_lo, buf_hi = (Signal(signed(EXTENT_BITS), name=name, reset_less=True)
                                          for name in ("mem_lo", "mem_hi", "buf_lo", "buf_hi"))
        count = Signal(signed(t.sizes[0].shape().width + 1), reset_less=True)
        strides = [Signal(signed(32), name=f"{side}_stride", reset_less=True)
                   for side in ("mem", "buf")]
        steps = [Signal(signed(EXTENT_BITS), name=f"{side}_step", reset_less=True)
                 for side in ("mem", "buf")]
        operands, products, last = Signal(), Signal(), Signal(2)
        extents = Signal()          # the extents are final: the code is registered
        m.d.sync += [extents.eq(0), operands.eq(0), products.eq(operands),
                     last.eq(last << 1)]
        with m.If(self.start):
            m.d.sync += [mem_lo.eq(t.mem_addr), mem_hi.eq(t.mem_addr),
                         buf_lo.eq(t.buf_addr), buf_hi.eq(t.buf_addr),
                         level.eq(0), running.eq(1), last.eq(0)]
        with m.Elif(running):
            m.d.sync += [count.eq(t.sizes[level] - 1), strides[0].eq(t.mem_strides[level]),
                         strides[1].eq(t.buf_strides[level]), operands.eq(1),
                         level.eq(level + 1)]
            with m.If(level == RANK - 1):
                m.d.sync += [running.eq(0), last[0].eq(1)]
        with m.If(operands):
            m.d.sync += [step.eq(count * stride) for step, stride in zip(steps, strides)]
        with m.If(products):
            for (lo, hi), step in zip(((mem_lo, mem_hi), (buf_lo, buf_hi)), steps):
                with m.If(step < 0):
                    m.d.sync += lo.eq(lo + step)
                with m.Else():
                    m.d.sync += hi.eq(hi + step)
        with m.If(last[1]):
            m.d.sync += extents.eq(1)

        # The code, in the order of dma_error, registered (no reset: looked at with ``done``).
        code = Signal(ERROR_BITS)
        registered = Signal(ERROR_BITS, reset_less=True)
        m.d.sync += [self.done.eq(extents), registered.eq(code)]
        m.d.comb += self.code.eq(registered)
        # The last byte an element may start at, computed at ``start`` (the transfer and the
        # limit hold): the window check is then one comparison of two registers.
        size = Signal(unsigned(3))
        m.d.comb += size.eq(Mux(word, 4, Mux(t.fmt == DmaFormat.HALF, 2, 1)))
        last_start = Signal(signed(ADDR_WIDTH + 4), reset_less=True)
        with m.If(self.start):
            m.d.sync += last_start.eq((self.limit << 2) - size)
        chip_words = Mux(kmem, self._kernel_words, self._buffer_elements)
        with m.If(bad_mode):
            m.d.comb += code.eq(DmaError.BAD_MODE)
        with m.Elif(bad_shape):
            m.d.comb += code.eq(DmaError.BAD_SHAPE)
        with m.Elif(misaligned):
            m.d.comb += code.eq(DmaError.ALIGN)
        with m.Elif((mem_lo < 0) | (mem_hi > last_start)):
            m.d.comb += code.eq(DmaError.WINDOW)
        with m.Elif((buf_lo < 0) | (buf_hi >= chip_words)):
            m.d.comb += code.eq(DmaError.BOUNDS)
        return m
