"""The neural engine core's schedule: what each of its sub-units issues, in order.

The core runs (``docs/neural_engine.md``, "The loop nest")::

    for group in output channels, acc_slots at a time:            # header decoded once
        for tile_y in ceil(out_h / H):
            for tile_x in ceil(out_w / W):                        # one work unit
                for (ic, ky, kx, oc) in scan order, zero coefficients skipped: a MAC command

Each function below states the traffic of one sub-unit for a layer, from the layer's register
fields (:func:`npu_spec.neural.make_layer`), the work-unit shape
(:func:`npu_spec.neural.work_unit`), the result order (:func:`npu_spec.neural.result_order`)
and the kernel encoding (:mod:`npu_model.kernel_codec`). The RTL's unit tests compare each
sub-unit with its function.
"""

from npu_spec.formats import F16_NEG_INF, F16_ONE
from npu_spec.mac import MacFormat, MacOp
from npu_spec.neural import result_order, work_unit

from .kernel_codec import beats as kernel_beats
from .kernel_codec import pack_words, parse_header

__all__ = [
    "kernel_stream",
    "lane_inputs",
    "mac_commands",
    "output_groups",
    "replay_beats",
    "row_requests",
    "row_writes",
    "tiles",
]


def tiles(fields, macs):
    """``(tiles_y, tiles_x)``: the work units down and across the output."""
    w, h = work_unit(macs, fields["log2w"])
    return -(-fields["out_h"] // h), -(-fields["out_w"] // w)


def output_groups(fields, slots):
    """The output-channel groups of a layer, in order, each a dict:

    * ``base``: its first output channel, ``ocg``: its channels (up to ``slots``);
    * ``conv_groups``: the convolution group of each of its channels;
    * ``in_base``: the first input channel it reads, ``in_count``: how many it reads (its
      convolution groups' input channels);
    * ``slot_base``: each channel's first input channel, relative to ``in_base``.
    """
    k = fields["groups"] * fields["ocpg"]
    icpg = fields["icpg"]
    for base in range(0, k, slots):
        ocg = min(slots, k - base)
        conv = [(base + s) // fields["ocpg"] for s in range(ocg)]
        yield {
            "base": base,
            "ocg": ocg,
            "conv_groups": conv,
            "in_base": conv[0] * icpg,
            "in_count": (conv[-1] - conv[0] + 1) * icpg,
            "slot_base": [(g - conv[0]) * icpg for g in conv],
        }


def _units(fields, config):
    """``(group index, group, ty, tx, bank)`` of every work unit in order; the input-buffer
    banks alternate from 0."""
    tiles_y, tiles_x = tiles(fields, config.macs)
    bank = 0
    for index, group in enumerate(output_groups(fields, config.acc_slots)):
        for ty in range(tiles_y):
            for tx in range(tiles_x):
                yield index, group, ty, tx, bank
                bank ^= 1


def kernel_stream(fields, config, groups):
    """The kernel DMA's words, in order: ``(part, word, last)`` with ``part`` "header" or
    "body". Each group's header part (``groups[g]``, an :class:`~npu_model.kernel_codec.
    EncodedGroup`) once, then its body part once per work unit; ``last`` on each part's final
    word."""
    tiles_y, tiles_x = tiles(fields, config.macs)
    out = []

    def part(name, data):
        words = [int(w) for w in pack_words(data)]
        out.extend((name, w, int(i == len(words) - 1)) for i, w in enumerate(words))

    for group in groups:
        part("header", group.header)
        for _ in range(tiles_y * tiles_x):
            part("body", group.body)
    return out


def row_requests(fields, config, buffer_rows):
    """The loader's row requests, in order, each a dict: input channel ``c``, input row ``y``
    and first column ``x`` (negative in the padding), and where the answer goes: lane row
    ``row`` and input-buffer address ``addr`` (``bank * buffer_rows + channel * kh + ky``,
    the channel counted from the group's first input channel).

    For every work unit: the group's input channels, each kernel row, each lane row (fastest);
    lane row ``y`` of tile ``(ty, tx)`` needs row ``(ty*H + y)*stride + ky*dilation - pad``
    from column ``tx*W*stride - pad`` on."""
    w, h = work_unit(config.macs, fields["log2w"])
    s, d, pad, kh = fields["stride"], fields["dilation"], fields["pad"], fields["kh"]
    out = []
    for _, group, ty, tx, bank in _units(fields, config):
        for c in range(group["in_count"]):
            for ky in range(kh):
                for y in range(h):
                    out.append({"c": group["in_base"] + c, "y": (ty * h + y) * s + ky * d - pad,
                                "x": tx * w * s - pad, "row": y,
                                "addr": bank * buffer_rows + c * kh + ky})
    return out


def _hold_operands(fmt):
    """``(op, coef, data)`` of the command for a channel whose kernel is all zero: it must
    yield exactly the bias. Binary32 accumulators: MAX against the product -infinity (the
    binary16 operand is -infinity, the other 1); int32: MAC with coefficient 0 (``data`` None:
    whatever the input buffer holds)."""
    fmt = MacFormat(fmt)
    if fmt == MacFormat.INT8:
        return MacOp.MAC, 0, None
    if fmt == MacFormat.FP16:
        return MacOp.MAX, F16_ONE, F16_NEG_INF
    if fmt == MacFormat.F16I8:        # binary16 data, int8 coefficients
        return MacOp.MAX, 1, F16_NEG_INF
    return MacOp.MAX, F16_NEG_INF, 1  # int8 data, binary16 coefficients


def mac_commands(fields, config, groups, buffer_rows):
    """The sequencer's MAC commands, in order, each a dict of the command's fields (``op``,
    ``fmt``, ``slot``, ``first``, ``last``, ``dual``, ``bias``, ``coef`` 0 and 1) and where its
    data comes from: ``addr`` and ``kx`` (lane inputs from input-buffer row ``addr``, shifted
    to kernel column ``kx``), or ``data``, one value for every lane.

    For every work unit, one command per coefficient beat of the group's body
    (:func:`npu_model.kernel_codec.beats`), with the bias from the group's header."""
    out = []
    fmt = fields["fmt"]
    hold_op, hold_coef, hold_data = _hold_operands(fmt)
    kh = fields["kh"]
    for index, group, _, _, bank in _units(fields, config):
        enc = groups[index]
        bias = parse_header(enc.header, enc.config).bias
        for b in kernel_beats(enc.header, enc.body, enc.config):
            cmd = {"op": MacOp.MAC, "fmt": fmt, "slot": b.slot, "first": b.first,
                   "last": b.last, "dual": 0, "bias": int(bias[b.slot]), "coef0": b.coef,
                   "coef1": 0,
                   "addr": bank * buffer_rows + (group["slot_base"][b.slot] + b.ic) * kh + b.ky,
                   "kx": b.kx}
            if b.hold:
                cmd["op"], cmd["coef0"] = hold_op, hold_coef
                if hold_data is not None:
                    cmd["data"] = hold_data
                    del cmd["addr"], cmd["kx"]
            out.append(cmd)
    return out


def replay_beats(fields, config, groups):
    """The parameter replayer's beats to the post-processor, in order: for every work unit,
    the group's channels in slot order, each ``(slot, scale, shift, group_last)``."""
    out = []
    for index, group, _, _, _ in _units(fields, config):
        enc = groups[index]
        params = parse_header(enc.header, enc.config)
        ocg = group["ocg"]
        out += [(s, int(params.scale[s]), int(params.shift[s]), int(s == ocg - 1))
                for s in range(ocg)]
    return out


def row_writes(fields, config, slot_orders):
    """The output circuit's row writes, in order, each a dict: ``result`` (the index of the
    result written, in :func:`npu_spec.neural.result_order`), channel ``oc``, output row ``y``,
    first column ``x``, ``lanes`` (the result lane written to column ``x + j``, for the columns
    written) and ``mask`` (``macs`` flags: column ``x + j`` is written).

    For every result (:func:`npu_spec.neural.result_order` with ``slot_orders``): its ``H``
    lane rows in order, those outside the output skipped; lane row ``r`` of tile ``(ty, tx)``
    is output row ``ty*H + r``, columns ``tx*W ..``, lane ``r*W + j`` at column ``tx*W + j``.
    """
    w, h = work_unit(config.macs, fields["log2w"])
    out = []
    for index, (oc, ty, tx) in enumerate(result_order(fields, config, slot_orders)):
        for r in range(h):
            y = ty * h + r
            if y >= fields["out_h"]:
                continue
            mask = [int(j < w and tx * w + j < fields["out_w"]) for j in range(config.macs)]
            out.append({"result": index, "oc": oc, "y": y, "x": tx * w,
                        "lanes": [r * w + j for j in range(config.macs) if mask[j]],
                        "mask": mask})
    return out


def lane_inputs(rows, kx, dilation, stride, log2w, macs):
    """The shifter's output: lane ``i`` of a ``W x H`` work unit (row ``i // W``, column
    ``i % W``) takes element ``(i % W) * stride + kx * dilation`` of its row's halo row
    ``rows[i // W]``."""
    w, _ = work_unit(macs, log2w)
    return [rows[i // w][(i % w) * stride + kx * dilation] for i in range(macs)]
