"""A neural engine core: register map, input-buffer geometry, layer rules and result order.

A layer is a dict of the core's layer-register fields (``fmt log2w sparse palette groups icpg
ocpg in_h in_w out_h out_w kh kw stride dilation pad addr out_fp16 stochastic act zero_point
lo hi alpha seed``; :data:`LAYER_FIELDS`, :func:`make_layer`); the same dict programs the RTL
(:func:`layer_writes`) and is checked by :func:`layer_error`, the rules the RTL applies.

Loop nest (``docs/neural_engine.md``): ``for group (up to acc_slots output channels): for
tile_y: for tile_x: for (ic, ky, kx, oc) in scan order``. A work unit is ``W x H`` output
positions with ``W = 2**log2w``, ``W * H = macs``; lane ``i`` is position ``(i // W, i % W)``
of the unit (:func:`work_unit`). :func:`result_order` gives the order in which the engine
post-processes and writes its results.
"""

import enum

from .codes import coded
from .engine import ERROR_BITS, TASK_OFFSET, control_registers
from .kernel import MAX_ICG, MAX_KERNEL, PALETTE_BITS, encoding_accepted
from .mac import MacFormat, format_built
from .postproc import Act, postproc_error
from .registers import ADDRESS_WINDOWS
from .regmap import Field, Register, RegisterMap

__all__ = [
    "BASE",
    "CORE_STRIDE",
    "LAYER_FIELDS",
    "LAYER_REGISTERS",
    "LEAN_UNSTORED",
    "MAX_KERNEL",
    "NEURAL_ENGINE",
    "NeuralError",
    "best_log2w",
    "out_channel_limit",
    "out_size_limit",
    "post_lanes",
    "core_base",
    "core_register_map",
    "engine_geometry",
    "halo_width",
    "layer_error",
    "layer_writes",
    "make_layer",
    "result_order",
    "shift_beats",
    "stride_order",
    "stride_rotation",
    "work_unit",
    "work_unit_shapes",
]

#: Word address of core 0's registers; core ``i`` is at ``BASE + CORE_STRIDE * i``.
BASE = ADDRESS_WINDOWS["NEURAL_ENGINE"][0]
CORE_STRIDE = 0x100


def core_base(core):
    """Word address of core ``core``'s registers."""
    return BASE + CORE_STRIDE * core


@coded(ERROR_BITS)
class NeuralError(enum.IntEnum):
    """``STATUS.error_code`` of a neural engine core (0: no error)."""
    NONE = 0
    #: The layer's MAC format is not built in.
    FORMAT = 1
    #: A zero-sized loop: groups, channels, input or output size, kernel size, stride or
    #: dilation 0; or more output channels than the build counts (``out_channel_limit``), or
    #: more output rows or columns (``out_size_limit``).
    SHAPE = 2
    #: Kernel larger than 16x16, or a work-unit width the build does not offer.
    KERNEL = 3
    #: The work unit's halo row is wider than the input buffer's rows.
    HALO = 4
    #: The input channels of one output-channel group times the kernel height exceed the input
    #: buffer.
    BUFFER = 5
    #: The kernel extractor reported an error (malformed or short kernel stream).
    EXTRACT = 6
    #: No stream moved for the engine's timeout.
    TIMEOUT = 7
    #: The post-processor configuration does not fit the format (``postproc_error``).
    POSTPROC = 8


NEURAL_ENGINE = RegisterMap("NEURAL_ENGINE", base=BASE, doc=(
    "Control, status, counters and layer registers of neural engine core 0 (core `i` at "
    f"`0x{BASE:04X} + 0x{CORE_STRIDE:X} * i`). A layer is a convolution (groups, stride, "
    "dilation, padding) or a fully connected layer mapped to a 1x1 convolution; its kernels "
    "come from the kernel memory through the group table at `KTABLE` (4 words per "
    "output-channel group: header address, header words, body address, body words). The "
    "layer registers are read while the core runs and must not be written until `STATUS.busy` "
    "falls."
), registers=control_registers(NeuralError, counter_doc="Cycles from start to done of the last "
                               "(or running) layer.") + [
    Register("MAC_ACTIVE", offset=0x03, doc="MAC-array activity of the last layer.", fields=[
        Field("count", 32, access="ro", doc="Cycles in which the MAC array took a command."),
    ]),
    Register("FORMAT", offset=TASK_OFFSET, doc="Number formats, work-unit shape and kernel "
             "encoding.", fields=[
        Field("fmt", MacFormat.bits, enum=MacFormat, doc="MAC format: data x weights."),
        Field("log2w", 4, offset=4, doc="Work-unit width `W = 2**log2w`; height `H = MACs / "
              "W` (at most the build's largest work-unit height)."),
        Field("sparse", 1, offset=8, doc="Kernel bodies carry zero bitmaps."),
        Field("palette", 4, offset=12, doc="Palette index width (1, 2, 4, 6, 8; 0: none)."),
    ]),
    Register("GROUPS", doc="Convolution groups and channels per group.", fields=[
        Field("groups", 12, doc="Groups `G` (1: ordinary convolution, channels: depthwise)."),
        Field("icpg", 12, offset=16, doc=f"Input channels per group (`C = G * icpg`; at most "
              f"{MAX_ICG})."),
    ]),
    Register("OCPG", doc="Output channels per group.", fields=[
        Field("ocpg", 12, doc="Output channels per group (`K = G * ocpg`)."),
    ]),
    Register("IN_SIZE", doc="Input height and width.", fields=[
        Field("in_h", 12, doc="Input rows."),
        Field("in_w", 12, offset=16, doc="Input columns."),
    ]),
    Register("OUT_SIZE", doc="Output height and width.", fields=[
        Field("out_h", 12, doc="Output rows."),
        Field("out_w", 12, offset=16, doc="Output columns."),
    ]),
    Register("KERNEL", doc="Kernel window.", fields=[
        Field("kh", 5, doc=f"Kernel rows (1..{MAX_KERNEL})."),
        Field("kw", 5, offset=8, doc=f"Kernel columns (1..{MAX_KERNEL})."),
        Field("stride", 3, offset=16, doc="Stride (both axes)."),
        Field("dilation", 3, offset=20, doc="Dilation (both axes)."),
        Field("pad", 4, offset=24, doc="Zero padding above and left (below and right follow "
              "from the output size)."),
    ]),
    Register("KTABLE", doc="Kernel group table.", fields=[
        Field("addr", 16, doc="Kernel-memory word address of the group table."),
    ]),
    Register("POST_CTRL", offset=0x10, doc="Post-processor: output format and activation "
             "(`docs/postproc.md`).", fields=[
        Field("out_fp16", 1, doc="Output binary16 (else int8)."),
        Field("stochastic", 1, offset=1, doc="Stochastic rounding to binary16."),
        Field("act", Act.bits, offset=4, enum=Act, doc="Activation."),
        Field("zero_point", 8, offset=8, doc="Output zero point (int8, two's complement)."),
    ]),
    Register("POST_LO", doc="Lower clamp bound.", fields=[
        Field("lo", 32, doc="binary32 bits (float path) or int8 in bits 0-7 (int path)."),
    ]),
    Register("POST_HI", doc="Upper clamp bound.", fields=[
        Field("hi", 32, doc="binary32 bits (float path) or int8 in bits 0-7 (int path)."),
    ]),
    Register("POST_ALPHA", doc="Leaky-ReLU slope.", fields=[
        Field("alpha", 32, doc="binary32 bits."),
    ]),
    Register("POST_SEED", doc="Stochastic-rounding seed.", fields=[
        Field("seed", 32, reset=1, doc="LFSR seed, loaded at every start."),
    ]),
])

#: The layer registers, in address order (every register from ``FORMAT`` on).
LAYER_REGISTERS = tuple(reg for reg in NEURAL_ENGINE.registers if reg.offset >= TASK_OFFSET)

#: The fields of a layer, in register order (field names are unique across the registers).
LAYER_FIELDS = tuple(f.name for reg in LAYER_REGISTERS for f in reg.fields)


#: Layer-register fields a core with the lean layer control (``ne_control="lean"``) and the
#: sequential int8 post-processor never reads, with the bits of each it keeps: stochastic
#: rounding and its seed (binary16 outputs only), the leaky-ReLU slope (not in that
#: post-processor's activations) and the clamp bounds above their int8 bits.
LEAN_UNSTORED = {"stochastic": 0, "alpha": 0, "seed": 0, "lo": 8, "hi": 8}


def core_register_map(config):
    """The register map a core of ``config`` builds: :data:`NEURAL_ENGINE`, except in a core
    with the lean layer control and the sequential post-processor, which stores only the bits
    of :data:`LEAN_UNSTORED` it reads (the others read as 0 and ignore writes; the layer
    behaves the same, since the core never reads them). Offsets, names and the documented map
    are :data:`NEURAL_ENGINE`'s."""
    if config.ne_control != "lean" or config.postproc_impl != "sequential":
        return NEURAL_ENGINE
    registers = []
    for reg in NEURAL_ENGINE.registers:
        fields = []
        for f in reg.fields:
            keep = LEAN_UNSTORED.get(f.name)
            if keep is None:
                fields.append(f)
            elif keep:
                fields.append(Field(f.name, keep, offset=f.offset, access=f.access,
                                    enum=f.enum, doc=f.doc))
            else:
                fields.append(Field(f.name, f.width, offset=f.offset, access="ro", doc=f.doc))
        registers.append(Register(reg.name, fields, offset=reg.offset, doc=reg.doc))
    return RegisterMap(NEURAL_ENGINE.name, registers, base=NEURAL_ENGINE.base,
                       doc=NEURAL_ENGINE.doc)


def make_layer(**fields):
    """A layer dict: every field at its register's reset value, then ``fields``."""
    layer = {f.name: f.reset or 0 for reg in LAYER_REGISTERS for f in reg.fields}
    for name, value in fields.items():
        if name not in layer:
            raise ValueError(f"unknown neural layer field {name!r}; fields: "
                             f"{', '.join(LAYER_FIELDS)}")
        layer[name] = int(value)
    return layer


def layer_writes(layer, core=0):
    """Register writes ``[(word address, value), ...]`` that program ``layer`` on core
    ``core`` (fields not given take their reset values), without the start command. A signed
    ``zero_point`` is written in two's complement."""
    writes = []
    for reg in LAYER_REGISTERS:
        values = {f.name: layer.get(f.name, f.reset or 0) for f in reg.fields}
        if "zero_point" in values:
            values["zero_point"] &= 0xFF
        writes.append((core_base(core) + reg.offset, reg.pack(**values)))
    return writes


# --------------------------------------------------------------------------------------------
# geometry


def _log2(n):
    return n.bit_length() - 1


def engine_geometry(config, row_values=None, buffer_rows=None):
    """Build parameters of a core's input buffer: ``(max_rows, row_values, buffer_rows)``.

    ``max_rows`` is the largest work-unit height ``H`` (the shapes are ``W x H`` with
    ``W >= H``), ``row_values`` the widest halo row, ``buffer_rows`` the rows (input channels
    x kernel rows) each lane row holds per bank. Arguments given win; otherwise the
    configuration's ``ne_row_values`` and ``ne_buffer_rows`` where set (not 0), else
    ``min(2 macs, 64)`` and 256 (1024 above 64 MACs).
    """
    n = config.macs
    max_rows = 1 << (_log2(n) // 2)
    if row_values is None:
        row_values = config.ne_row_values or min(2 * n, 64)
    if buffer_rows is None:
        buffer_rows = config.ne_buffer_rows or (256 if n <= 64 else 1024)
    return max_rows, row_values, buffer_rows


def out_channel_limit(config):
    """The most output channels (``groups * ocpg``) a core of ``config`` takes in one layer:
    ``config.ne_out_channels``, or what the registers can express (4095 x 4095). The core's
    output-channel counters are ``out_channel_limit(config).bit_length()`` bits wide."""
    return config.ne_out_channels or 4095 * 4095


def out_size_limit(config):
    """The most output rows and the most output columns (``out_h``, ``out_w``) a core of
    ``config`` takes in one layer: ``config.ne_out_size``, or what the registers can express
    (4095). The core's work-unit counters and output row and column positions are
    ``out_size_limit(config).bit_length()`` bits wide."""
    return config.ne_out_size or 4095


def post_lanes(config):
    """Lanes a core's pipelined post-processor handles per cycle: ``config.ne_post_lanes``, or
    a quarter of the MACs (at least 1). A result beat takes ``macs / post_lanes(config)``
    cycles; the MAC array makes one per slot every ``icpg x kh x kw`` commands."""
    return config.ne_post_lanes or max(1, config.macs // 4)


def work_unit(macs, log2w):
    """``(W, H)`` of the work-unit shape ``log2w``: ``W = 2**log2w`` columns, ``H = macs / W``
    rows; lane ``i`` is row ``i // W``, column ``i % W``."""
    return 1 << log2w, macs >> log2w


def work_unit_shapes(config, row_values=None):
    """The ``log2w`` values a build offers: ``H`` at most ``max_rows`` and ``W`` at most
    ``min(macs, row_values)`` (the shifter's columns)."""
    max_rows, row_values, _ = engine_geometry(config, row_values)
    n = config.macs
    return tuple(lw for lw in range(_log2(n) + 1)
                 if (n >> lw) <= max_rows and (1 << lw) <= min(n, row_values))


def halo_width(log2w, kw, stride, dilation):
    """Inputs a lane row of a ``2**log2w``-wide work unit needs per kernel row: its halo
    row, ``(W - 1) * stride + (kw - 1) * dilation + 1``."""
    return ((1 << log2w) - 1) * stride + (kw - 1) * dilation + 1


def stride_order(row_values, stride):
    """Where the input buffer keeps a halo row's values for a layer of stride ``stride``: entry
    ``p`` holds element ``stride_order(...)[p]`` of the halo row. The elements are sorted by
    phase ``e % stride``, then by ``e // stride``, so that the elements one lane row needs at
    a kernel offset, ``x * stride + offset`` for ``x = 0, 1, ...``, sit side by side (at
    :func:`stride_rotation` ``+ x``). Stride 1 keeps the row as it is."""
    return tuple(e for phase in range(stride) for e in range(phase, row_values, stride))


def stride_rotation(row_values, stride, offset):
    """The entry of a row kept in :func:`stride_order` that holds element ``offset`` of the
    halo row (``offset < row_values``); element ``x * stride + offset`` follows it ``x``
    entries on, as long as it lies inside the halo row."""
    phase, q = offset % stride, offset // stride
    return sum(-(-(row_values - p) // stride) for p in range(phase)) + q


def shift_beats(config, row_values=None):
    """What the shifter of a build must serve: ``{(log2w, stride): offsets}``, every beat
    ``kx`` of a layer that passes the ``HALO`` check, with ``offset = kx * dilation``. The
    shapes are :func:`work_unit_shapes`; stride and dilation every value of their layer
    fields but 0, ``kx`` below :data:`MAX_KERNEL`. A beat outside the set belongs to a layer
    the core refuses, so the shifter's answer to it is never used: the input buffer's stride
    order need not build a stride no shape can take, and the shifter need not reach an entry
    no beat reads (``docs/neural_engine.md``, "Input buffer and shifter")."""
    _, row_values, _ = engine_geometry(config, row_values)
    width = {f.name: f.width for reg in LAYER_REGISTERS for f in reg.fields}
    beats = {}
    for log2w in work_unit_shapes(config, row_values):
        for stride in range(1, 1 << width["stride"]):
            for dilation in range(1, 1 << width["dilation"]):
                for kx in range(MAX_KERNEL):
                    if halo_width(log2w, kx + 1, stride, dilation) <= row_values:
                        beats.setdefault((log2w, stride), set()).add(kx * dilation)
    return {key: frozenset(offsets) for key, offsets in beats.items()}


def best_log2w(config, out_w, kw=1, stride=1, dilation=1, row_values=None):
    """The work-unit shape that wastes the fewest lanes on ``out_w`` columns (the wider on a
    tie), among the build's shapes whose halo row fits the input buffer; the narrowest if none
    fits (the engine then reports ``HALO``)."""
    max_rows, row_values, _ = engine_geometry(config, row_values)
    best = None
    for log2w in sorted(range(_log2(config.macs) + 1), reverse=True):
        if (config.macs >> log2w) > max_rows:
            continue
        if halo_width(log2w, kw, stride, dilation) > row_values:
            continue
        w = 1 << log2w
        key = (-(-out_w // w) * w - out_w, -w)
        if best is None or key < best[0]:
            best = (key, log2w)
    if best is None:
        return _log2(config.macs) - _log2(max_rows)
    return best[1]


# --------------------------------------------------------------------------------------------
# layer rules


def _groups_of_slots(layer, slots):
    """``(first conv group, conv groups spanned)`` of each output-channel group."""
    k = layer["groups"] * layer["ocpg"]
    for base in range(0, k, slots):
        last = min(k, base + slots) - 1
        g0 = base // layer["ocpg"]
        yield g0, last // layer["ocpg"] - g0 + 1


def layer_error(layer, config, row_values=None, buffer_rows=None):
    """The :class:`NeuralError` a core reports for ``layer`` before or while it runs, for a
    layer whose kernel stream is well formed (``EXTRACT``) and whose memories answer
    (``TIMEOUT``); ``NONE`` if it runs.

    The checks, in the order the core applies them: ``FORMAT`` (the MAC format is not built),
    ``SHAPE`` (a zero-sized loop, more output channels than ``out_channel_limit`` or more
    output rows or columns than ``out_size_limit``),
    ``KERNEL`` (a kernel side above :data:`MAX_KERNEL`, or a
    work-unit width the build does not offer), ``HALO`` (a halo row wider than
    ``row_values``), then for each output-channel group before its header is decoded
    ``BUFFER`` (the group's input rows, channels x kernel rows, exceed ``buffer_rows``; the
    groups before it run) and ``EXTRACT`` (a palette width the kernel format does not have, or
    an encoding the build's extractor does not decode, ``npu_spec.kernel.encoding_accepted``:
    the extractor refuses the first header), and last ``POSTPROC`` (an activation or output
    format the accumulator format does not allow, found when the results are
    post-processed).
    """
    max_rows, row_values, buffer_rows = engine_geometry(config, row_values, buffer_rows)
    n = config.macs
    if not format_built(config, layer["fmt"]):
        return NeuralError.FORMAT
    if 0 in (layer[k] for k in ("groups", "icpg", "ocpg", "out_h", "out_w", "in_h", "in_w",
                                "kh", "kw", "stride", "dilation")):
        return NeuralError.SHAPE
    if layer["groups"] * layer["ocpg"] > out_channel_limit(config):
        return NeuralError.SHAPE
    if max(layer["out_h"], layer["out_w"]) > out_size_limit(config):
        return NeuralError.SHAPE
    log2w = layer["log2w"]
    if (layer["kh"] > MAX_KERNEL or layer["kw"] > MAX_KERNEL or log2w > _log2(n)
            or (n >> log2w) > max_rows):
        return NeuralError.KERNEL
    if halo_width(log2w, layer["kw"], layer["stride"], layer["dilation"]) > row_values:
        return NeuralError.HALO
    for _, spanned in _groups_of_slots(layer, config.acc_slots):
        if spanned * layer["icpg"] * layer["kh"] > buffer_rows:
            return NeuralError.BUFFER
        if layer["palette"] not in PALETTE_BITS or not encoding_accepted(
                config.kernel_extract, coef_fp16=MacFormat(layer["fmt"]).coef_fp16,
                sparse=layer["sparse"], palette=layer["palette"]):
            return NeuralError.EXTRACT
    if postproc_error(layer["fmt"] == MacFormat.INT8, layer["act"], layer["out_fp16"],
                      config.formats):
        return NeuralError.POSTPROC
    return NeuralError.NONE


# --------------------------------------------------------------------------------------------
# result order


def result_order(layer, config, slot_orders):
    """The result beats of ``layer`` in the order the core post-processes and writes them.

    For each output-channel group ``g`` (``acc_slots`` consecutive output channels), each
    work unit in raster order (tile row ``ty``, tile column ``tx``), the group's channels in
    the order their accumulations end: ``slot_orders[g]``, the slots in the order of their
    last coefficient beat in the kernel extractor's scan (:func:`npu_model.kernel_codec.beats`).
    Each beat holds lane ``i`` = output ``(ty H + i // W, tx W + i % W)``; the output circuit
    writes its ``H`` rows in order, skipping rows and columns outside the output.

    Yields ``(oc, ty, tx)``.
    """
    w, h = work_unit(config.macs, layer["log2w"])
    tiles_y = -(-layer["out_h"] // h)
    tiles_x = -(-layer["out_w"] // w)
    slots = config.acc_slots
    for g, order in enumerate(slot_orders):
        for ty in range(tiles_y):
            for tx in range(tiles_x):
                for slot in order:
                    yield g * slots + slot, ty, tx
