"""Payloads and enums shared by the neural engine's sub-blocks (``docs/neural_engine.md``,
``docs/mac.md``).

The MAC array (``npu.neural.mac``) takes command beats and gives result beats.

The kernel extractor (``npu.neural.kernel_extract``) turns the kernel DMA's word stream into
parameter beats (one per output channel of a group, decoded once per group) and coefficient
beats (one per nonzero coefficient, decoded once per work unit); the engine turns coefficient
beats into MAC commands and hands parameter beats to the post-processor
(``npu.neural.postproc``), which turns MAC results into output values.
"""

from amaranth.hdl import unsigned
from amaranth.lib import data
from amaranth.utils import ceil_log2
from npu_spec import mac as mac_spec
from npu_spec.kernel import MAX_KERNEL

from ..lib.enums import hw_enum

__all__ = [
    "KERNEL_WORD", "MAX_KERNEL", "MacFormat", "MacOp",
    "coef_beat_layout", "kernel_config_layout", "mac_command_layout", "mac_result_layout",
    "param_beat_layout", "postproc_out_layout", "slot_shape",
]

MacOp = hw_enum(mac_spec.MacOp)
MacFormat = hw_enum(mac_spec.MacFormat)


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


#: One word of the kernel DMA stream: 4 bytes of the kernel blob, little-endian (byte 0 in
#: bits 0-7), ``last`` on the final word of the part being streamed (header or body).
KERNEL_WORD = data.StructLayout({"data": 32, "last": 1})


def kernel_config_layout(slots):
    """Static configuration of the kernel extractor for one group (held while it runs).

    ========== ===== ===============================================================
    field      bits  meaning
    ========== ===== ===============================================================
    coef_fp16  1     coefficients (and palette entries) are binary16, else int8
    sparse     1     the body carries a zero bitmap per 8 positions
    palette    4     index width 1, 2, 4, 6 or 8; 0 = not palettized; else error
    icg        12    input channels per kernel, 1..4095
    kh, kw     5     kernel height and width, 1..16
    ocg        -     output channels in the group, 1..slots
    ========== ===== ===============================================================
    """
    return data.StructLayout({
        "coef_fp16": 1,
        "sparse":    1,
        "palette":   4,
        "icg":       12,
        "kh":        5,
        "kw":        5,
        "ocg":       slot_shape(slots + 1),
    })


def coef_beat_layout(slots):
    """One nonzero coefficient, in scan order (input channel, kernel row, kernel column, output
    channel; output channel fastest).

    ``coef`` is the binary16 code, or the int8 value in bits 0-7 (bits 8-15 its sign).
    ``first`` marks the slot's first beat of the work unit (seed the accumulator with the
    bias), ``last`` its final beat (emit the result). A slot whose kernel has no nonzero
    coefficient gets one beat with ``hold``, ``first`` and ``last`` set and ``coef`` 0, at the
    place of its first position: it must yield exactly its bias.
    """
    return data.StructLayout({
        "coef":  16,
        "slot":  slot_shape(slots),
        "ic":    12,
        "ky":    4,
        "kx":    4,
        "first": 1,
        "last":  1,
        "hold":  1,
    })


def param_beat_layout(slots):
    """Per-output-channel parameters from the kernel header, one beat per channel of a group,
    in slot order; ``group_last`` on the group's final channel.

    ``bias`` is int32 (int8 format) or binary32 bits; ``scale`` is the int32 multiplier of the
    TOSA rescale (int32 accumulators) or a binary32 factor (binary32 accumulators); ``shift``
    is the rescale's right shift (0..63, unused for binary32).
    """
    return data.StructLayout({
        "slot":       slot_shape(slots),
        "bias":       32,
        "scale":      32,
        "shift":      6,
        "group_last": 1,
    })


def postproc_out_layout(lanes, slots):
    """One post-processed result beat: ``values[i]`` is lane ``i``'s output, a binary16 code or
    an int8 value in bits 0-7 (bits 8-15 its sign)."""
    return data.StructLayout({
        "slot":   slot_shape(slots),
        "values": data.ArrayLayout(16, lanes),
    })
