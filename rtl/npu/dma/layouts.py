"""Layouts shared by the DMA engine's sub-units."""

from amaranth.hdl import Signal, signed, unsigned
from amaranth.lib import data

from npu_spec.dma import DMA, RANK, SIZE_BITS, DmaFormat

__all__ = [
    "BUS_ADDR_BITS", "BYTE_BITS", "CHIP_BITS", "EXTENT_BITS", "ElementLayout", "TransferLayout",
    "byte_mask", "lane_bits",
]

#: Width of the bus word address (``docs/system.md``, "System memory bus").
BUS_ADDR_BITS = 30

#: Width of an on-chip address (buffer element or kernel-memory word).
CHIP_BITS = DMA["BUF_ADDR"]["addr"].width
#: Width of a bus byte address: ``4 * BASE + offset`` with ``BASE`` a 32-bit word address and
#: the offset below ``4 * LIMIT`` (34 bits each).
BYTE_BITS = 35
#: Width of the signed extents the check computes: ``addr + sum((nk - 1) * stridek)``.
EXTENT_BITS = 52

#: The task registers of a transfer, as latched at the start (``dir`` and ``fmt`` are raw codes:
#: a code outside :class:`~npu_spec.dma.DmaDir` or :class:`~npu_spec.dma.DmaFormat` is a
#: ``BAD_MODE`` the check must see).
TransferLayout = data.StructLayout({
    "dir":         unsigned(DMA["MODE"]["dir"].width),
    "fmt":         unsigned(DMA["MODE"]["fmt"].width),
    "core":        unsigned(DMA["MODE"]["core"].width),
    "mem_addr":    unsigned(DMA["MEM_ADDR"]["addr"].width),
    "buf_addr":    unsigned(CHIP_BITS),
    "sizes":       data.ArrayLayout(unsigned(SIZE_BITS), RANK),
    "mem_strides": data.ArrayLayout(signed(32), RANK),
    "buf_strides": data.ArrayLayout(signed(32), RANK),
})

#: One element of a transfer: its bus byte address and its on-chip address.
ElementLayout = data.StructLayout({
    "byte": unsigned(BYTE_BITS),
    "chip": unsigned(CHIP_BITS),
})


def lane_bits(mem_width):
    """Width of a byte lane index of a ``mem_width``-bit bus word."""
    return (mem_width // 8 - 1).bit_length()


def byte_mask(m, fmt, lane, mem_width):
    """The ``sel`` of an element of format ``fmt`` at byte lane ``lane`` (combinational)."""
    mask = Signal(4)
    with m.Switch(fmt):
        with m.Case(DmaFormat.INT8):
            m.d.comb += mask.eq(0b0001)
        with m.Case(DmaFormat.HALF):
            m.d.comb += mask.eq(0b0011)
        with m.Default():
            m.d.comb += mask.eq(0b1111)
    return (mask << lane)[:mem_width // 8]
