"""Stream layouts and enums shared by the blocks.

Every payload that crosses a block boundary is declared here once, as an
:class:`amaranth.lib.data.StructLayout` (or a function that builds one for a configuration) or
an :class:`amaranth.lib.enum.Enum`. The formats are documented in ``docs/mac.md``.
"""

from amaranth.hdl import unsigned
from amaranth.lib import data, enum
from amaranth.utils import ceil_log2

__all__ = ["MacOp", "MacFormat", "mac_command_layout", "mac_result_layout"]


class MacOp(enum.Enum, shape=2):
    """What a MAC unit does with the product ``p = data * coef`` and accumulator slot ``acc``.

    ``acc`` is the slot's value, or the command's ``bias`` when ``first`` is set.
    """
    #: ``acc + p`` (int32 wrap, or binary32 add with round-to-nearest-even).
    MAC = 0
    #: ``max(acc, p)`` (binary32: NaN if either is NaN; -0 < +0).
    MAX = 1
    #: ``min(acc, p)``.
    MIN = 2
    #: ``+1`` if ``p > acc``, ``-1`` if ``p < acc``, else ``0`` (equal or unordered), in the
    #: accumulator format (int32, or binary32 +1.0 / -1.0 / +0.0).
    CMP = 3


class MacFormat(enum.Enum, shape=2):
    """Operand formats of a MAC command: ``<data> x <coefficient>``."""
    #: int8 x int8, int32 accumulator.
    INT8 = 0
    #: binary16 x binary16, binary32 accumulator.
    FP16 = 1
    #: int8 data x binary16 coefficient, binary32 accumulator.
    I8F16 = 2
    #: binary16 data x int8 coefficient, binary32 accumulator.
    F16I8 = 3

    @property
    def is_float(self):
        return self is not MacFormat.INT8


def slot_shape(slots):
    """Shape of an accumulator slot index for ``slots`` slots (at least one bit wide)."""
    return unsigned(max(1, ceil_log2(slots)))


def mac_command_layout(lanes, slots):
    """One beat of the MAC array's command stream.

    ========  ======================  ===================================================
    field     shape                   meaning
    ========  ======================  ===================================================
    op        :class:`MacOp`          operation applied to every lane
    fmt       :class:`MacFormat`      operand formats
    slot      ``slot_shape(slots)``   accumulator slot read and written
    first     1                       use ``bias`` instead of the slot's value
    last      1                       emit the slot's new value on the result stream
    dual      1                       dual-kernel mode: lane ``2i`` and ``2i+1`` both take
                                      ``data[i]``, with ``coef[0]`` and ``coef[1]``
    bias      32                      int32 or binary32 bits, broadcast to every lane
    coef      2 x 16                  broadcast coefficients (``coef[1]`` only in dual mode);
                                      int8 operands are the low 8 bits
    data      lanes x 16              one operand per lane (int8: low 8 bits)
    ========  ======================  ===================================================
    """
    return data.StructLayout({
        "op":    MacOp,
        "fmt":   MacFormat,
        "slot":  slot_shape(slots),
        "first": 1,
        "last":  1,
        "dual":  1,
        "bias":  32,
        "coef":  data.ArrayLayout(16, 2),
        "data":  data.ArrayLayout(16, lanes),
    })


def mac_result_layout(lanes, slots):
    """One beat of the MAC array's result stream (emitted for commands with ``last`` set).

    ``acc[i]`` is lane ``i``'s slot value after the command: int32 for ``INT8``, binary32 bits
    for the other formats.
    """
    return data.StructLayout({
        "fmt":  MacFormat,
        "slot": slot_shape(slots),
        "acc":  data.ArrayLayout(32, lanes),
    })
