"""Payloads, ports and enums shared by the neural engine's sub-units (``docs/neural_engine.md``,
``docs/mac.md``).

The MAC array (``npu.neural.mac``) takes command beats and gives result beats.

The kernel extractor (``npu.neural.kernel_extract``) turns the kernel DMA's word stream into
parameter beats (one per output channel of a group, decoded once per group) and coefficient
beats (one per nonzero coefficient, decoded once per work unit); the sequencer turns
coefficient beats into MAC commands and hands the parameters to the post-processor
(``npu.neural.postproc``), which turns MAC results into output values.

The engine's layer registers reach the sub-units as one :func:`layer_layout` value, and the
values derived from them at the start of a layer as one :func:`geometry_layout` value.
"""

from amaranth.hdl import signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from npu_spec import kernel as kernel_spec
from npu_spec import mac as mac_spec
from npu_spec.kernel import MAX_KERNEL
from npu_spec.neural import LAYER_REGISTERS, out_channel_limit

from ..lib.enums import hw_enum

__all__ = [
    "KERNEL_WORD", "MAX_KERNEL", "KernelReadSignature", "MacFormat", "MacOp",
    "coef_beat_layout", "geometry_layout", "group_bits", "kernel_config_layout",
    "kernel_extractor_signature",
    "layer_layout",
    "mac_command_layout", "mac_result_layout", "param_beat_layout", "param_store_layout",
    "postproc_out_layout",
    "row_data_layout", "row_request_layout", "row_tag_layout", "row_write_layout",
    "slot_shape",
]

MacOp = hw_enum(mac_spec.MacOp)
MacFormat = hw_enum(mac_spec.MacFormat)


def layer_layout():
    """The layer registers of a core (``npu_spec.neural.LAYER_REGISTERS``) as one struct: a
    member per field, named as the field (``fmt``, ``log2w``, ..., ``addr`` of ``KTABLE``,
    ``lo`` of ``POST_LO``), with the field's width; ``fmt`` is a :class:`MacFormat`. The core
    samples the registers when a layer starts (``go``) and its sub-units read that copy while the
    layer runs: later writes are for the next layer."""
    fields = {}
    for reg in LAYER_REGISTERS:
        for f in reg.fields:
            fields[f.name] = MacFormat if f.name == "fmt" else unsigned(f.width)
    return data.StructLayout(fields)


def geometry_layout(macs):
    """Values of a layer derived from its registers (``npu.neural.layer.LayerSetup``).

    ============== ========================================================================
    field          meaning
    ============== ========================================================================
    unit_w         work-unit width ``W = 2**log2w`` (registered at the start)
    unit_h         work-unit height ``H = macs / W`` (registered)
    log2h          ``log2(H)`` (registered)
    out_channels   ``K = groups * ocpg`` (registered)
    fp_data        the data operand is binary16 (registered)
    fp_coef        the coefficient operand is binary16 (registered)
    is_int         int8 x int8: int32 accumulators (registered)
    tiles_y        work units down the output, ``ceil(out_h / H)`` (registered)
    tiles_x        work units across the output, ``ceil(out_w / W)`` (registered)
    halo_w         inputs a lane row needs per kernel row, ``(W-1)*stride + (kw-1)*dilation
                   + 1`` (registered)
    ============== ========================================================================
    """
    log2n = ceil_log2(macs)
    return data.StructLayout({
        "unit_w":       range(macs + 1),
        "unit_h":       range(macs + 1),
        "log2h":        range(log2n + 1),
        "out_channels": 24,
        "fp_data":      1,
        "fp_coef":      1,
        "is_int":       1,
        "tiles_y":      12,
        "tiles_x":      12,
        "halo_w":       16,
    })


def group_bits(config):
    """Width of a core's output-channel group counters (the sequencer's and the replayer's
    group and header counts): enough for every group of ``out_channel_limit(config)``
    channels, at most 16 (the default build's)."""
    groups = -(-out_channel_limit(config) // config.acc_slots)
    return min(16, groups.bit_length())


def row_tag_layout(max_rows, buffer_rows):
    """What a row request carries back with its data: the lane row and the input-buffer
    address (both banks: ``2 * buffer_rows`` rows) the row is written to."""
    return data.StructLayout({"row": range(max_rows), "addr": range(2 * buffer_rows)})


def row_request_layout(tag):
    """One input row wanted from the data source: channel ``c``, row ``y`` and first column
    ``x`` (both signed: padding lies outside the image), and the ``tag`` to return."""
    return data.StructLayout({"c": 12, "y": signed(14), "x": signed(14), "tag": tag})


def row_data_layout(row_values, tag):
    """The answer to a row request: inputs ``x .. x + row_values - 1`` of the row (zeros
    outside the image) and the request's ``tag``."""
    return data.StructLayout({"values": data.ArrayLayout(16, row_values), "tag": tag})


def row_write_layout(lanes):
    """One output row segment: channel ``oc``, row ``y``, first column ``x``, ``values``
    (``values[j]`` is column ``x + j``) and ``mask`` (which values to write)."""
    return data.StructLayout({
        "oc": 12, "y": 12, "x": 12,
        "values": data.ArrayLayout(16, lanes), "mask": lanes})


class KernelReadSignature(wiring.Signature):
    """A synchronous read port of the kernel memory, from the reader's side.

    Members
    -------
    addr : Out(16)
        Word address.
    en : Out(1)
        Read ``addr`` in this cycle.
    data : In(32)
        The word read, in the cycle after ``en``.
    """

    def __init__(self):
        super().__init__({"addr": Out(16), "en": Out(1), "data": In(32)})


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


def kernel_extractor_signature(slots):
    """The ports of every kernel extractor build (``npu.neural.kernel_extract``): the layer's
    kernel configuration, the header and body word streams with their start pulses, the
    parameter and coefficient beats out, and the part's status."""
    return wiring.Signature({
        "cfg":          In(kernel_config_layout(slots)),
        "header":       In(stream.Signature(KERNEL_WORD)),
        "body":         In(stream.Signature(KERNEL_WORD)),
        "start_header": In(1),
        "start_body":   In(1),
        "params":       Out(stream.Signature(param_beat_layout(slots))),
        "coefs":        Out(stream.Signature(coef_beat_layout(slots))),
        "busy":         Out(1),
        "done":         Out(1),
        "error":        Out(1),
        "error_code":   Out(hw_enum(kernel_spec.KernelError)),
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


def param_store_layout(slots):
    """A write into the parameter replayer's tables: in cycles with ``en``, slot ``slot`` of
    table ``bank`` (the group index's lowest bit) gets ``scale`` and ``shift``."""
    return data.StructLayout({
        "en":    1,
        "bank":  1,
        "slot":  slot_shape(slots),
        "scale": 32,
        "shift": 6,
    })


def postproc_out_layout(lanes, slots):
    """One post-processed result beat: ``values[i]`` is lane ``i``'s output, a binary16 code or
    an int8 value in bits 0-7 (bits 8-15 its sign)."""
    return data.StructLayout({
        "slot":   slot_shape(slots),
        "values": data.ArrayLayout(16, lanes),
    })
