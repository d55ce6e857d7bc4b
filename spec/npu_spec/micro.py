"""The micro build's register file (``docs/micro.md``): which register words it keeps, and
the RAM row of each.

The micro build (``rtl/npu/micro``) keeps the registers its engine units read in one RAM of
32-bit words, :data:`BLOCK_WORDS` rows for each block of :data:`REGISTER_BLOCKS`; a register
word ``a`` inside block ``k`` lies in row ``BLOCK_WORDS * k + (a - start_k)``. Every other
register word is not kept: a descriptor write to it is dropped, a read returns 0.
"""

from . import dataproc, dma, neural, planar
from .registers import register_maps

__all__ = ["BLOCK_WORDS", "REGISTER_BLOCKS", "ROWS", "UNSUPPORTED", "register_row", "reset_rows"]

#: Register words of a kept block (a power of two, so a block is aligned).
BLOCK_WORDS = 32

#: First register word of each kept block, in row order: core 0 of the neural engine, the
#: planar engine, the data processor's neural-side datasets, its planar-side datasets, the DMA
#: engine.
REGISTER_BLOCKS = (
    neural.core_base(0),
    planar.BASE,
    dataproc.ne_port_base(0, "IN"),
    dataproc.DATA_PROCESSOR.address("PE_A_BASE"),
    dma.BASE,
)

#: Rows of the register file.
ROWS = BLOCK_WORDS * len(REGISTER_BLOCKS)


def register_row(address):
    """The register-file row of register word ``address``, or None when it is not kept."""
    for k, start in enumerate(REGISTER_BLOCKS):
        if start <= address < start + BLOCK_WORDS:
            return BLOCK_WORDS * k + address - start
    return None


def _reset_values():
    values = {}
    for regmap in register_maps():
        for reg in regmap.registers:
            values[regmap.base + reg.offset] = reg.reset
    for reg in neural.NEURAL_ENGINE.registers:
        values[neural.core_base(0) + reg.offset] = reg.reset
    return values


def reset_rows():
    """The register file's initial contents: every kept register's reset value, 0 elsewhere
    (a list of :data:`ROWS` words)."""
    rows = [0] * ROWS
    for address, value in _reset_values().items():
        row = register_row(address)
        if row is not None:
            rows[row] = value
    return rows


for _start in REGISTER_BLOCKS:
    if _start % BLOCK_WORDS:
        raise AssertionError(f"register block 0x{_start:X} is not aligned to {BLOCK_WORDS}")


#: Error code with which a micro unit ends a task whose register values it does not implement
#: (every engine's error field is 4 bits; the engines' own codes stay below it).
UNSUPPORTED = 15
