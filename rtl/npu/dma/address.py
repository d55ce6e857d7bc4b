"""The address generator: the elements of a transfer in :func:`npu_spec.dma.transfer_elements`
order, one a cycle.

The index space is a :class:`~npu.lib.loop.LoopNest` of the sizes. Beside it each level ``k``
keeps the addresses of the first element of its current iteration (``mem[k]``, ``chip[k]``):
when level ``k`` steps (the levels inside it are all at their last value) it adds its stride,
and every level inside it starts from the new address. ``mem[0]`` and ``chip[0]`` are the
current element's, so no multiplier is needed.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.dma import RANK, SIZE_BITS

from ..lib.engine import ADDR_WIDTH
from ..lib.loop import LoopNest
from .layouts import BYTE_BITS, CHIP_BITS, ElementLayout, TransferLayout

__all__ = ["AddressGenerator"]


class AddressGenerator(wiring.Component):
    """The elements of a transfer, in order.

    Members
    -------
    transfer : In(TransferLayout)
        The transfer (sizes at least 1); holds while ``busy``.
    base : In(ADDR_WIDTH)
        The window's base in 32-bit words, sampled at ``start``.
    start : In(1)
        Begin the transfer (restarts a running one).
    busy : Out(1)
        Elements remain: from the cycle after ``start`` to the cycle the last one is taken.
    elements : Out(stream.Signature(ElementLayout))
        Bus byte address ``4 * base + offset`` and on-chip address of each element.
    """

    transfer: In(TransferLayout)
    base: In(ADDR_WIDTH)
    start: In(1)
    busy: Out(1)
    elements: Out(stream.Signature(ElementLayout))

    def elaborate(self, platform):
        m = Module()
        t = self.transfer
        levels = [f"i{k}" for k in range(RANK)]
        m.submodules.nest = nest = LoopNest([(name, SIZE_BITS) for name in reversed(levels)])
        m.d.comb += [getattr(nest.limit, levels[k]).eq(t.sizes[k]) for k in range(RANK)]

        # The addresses are written by ``start`` and looked at only while ``busy``: no reset.
        mem = [Signal(BYTE_BITS, name=f"mem{k}", reset_less=True) for k in range(RANK)]
        chip = [Signal(CHIP_BITS, name=f"chip{k}", reset_less=True) for k in range(RANK)]
        m.d.comb += [self.elements.valid.eq(self.busy),
                     self.elements.payload.byte.eq(mem[0]),
                     self.elements.payload.chip.eq(chip[0])]

        # The level that steps is the innermost one not at its last value; level j restarts
        # from its address when every level inside j is at its last value (carry[j]).
        carry = [Signal(name=f"carry{k}") for k in range(RANK)]
        m.d.comb += carry[0].eq(1)
        for k in range(1, RANK):
            m.d.comb += carry[k].eq(carry[k - 1] & getattr(nest.last, levels[k - 1]))
        next_mem, next_chip = mem[0], chip[0]
        for k in reversed(range(RANK)):
            steps = carry[k] & ~getattr(nest.last, levels[k])
            next_mem = Mux(steps, mem[k] + t.mem_strides[k], next_mem)
            next_chip = Mux(steps, chip[k] + t.buf_strides[k], next_chip)
        stepped_mem = Signal(BYTE_BITS)
        stepped_chip = Signal(CHIP_BITS)
        m.d.comb += [stepped_mem.eq(next_mem), stepped_chip.eq(next_chip)]

        advance = self.elements.valid & self.elements.ready
        m.d.comb += nest.advance.eq(advance)
        with m.If(self.start):
            m.d.comb += nest.restart.eq(1)
            m.d.sync += self.busy.eq(1)
            m.d.sync += [a.eq((self.base << 2) + t.mem_addr) for a in mem]
            m.d.sync += [a.eq(t.buf_addr) for a in chip]
        with m.Elif(advance):
            with m.If(nest.done):
                m.d.sync += self.busy.eq(0)
            for k in range(RANK):
                with m.If(carry[k]):
                    m.d.sync += [mem[k].eq(stepped_mem), chip[k].eq(stepped_chip)]
        return m
