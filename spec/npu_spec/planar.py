"""The planar engine: codes, register map, line-buffer geometry, task rules and stream order.

A planar task is a dict of its register fields (``mode op in_fmt out_fmt bcast pre post axis
channels height width kh kw sy sx py px scale bias scalar``, see :data:`TASK_FIELDS` and
:func:`make_task`); the same dict programs the RTL (:func:`task_writes`), drives the golden
model and is checked by :func:`task_error`, the rules the RTL applies before it runs a task.

Streams carry beats of ``L = P * P`` 16-bit elements (``P = config.planar_lanes``): ``L``
consecutive elements of one row of one channel, INT8 in the low byte or binary16; a row of ``W``
elements takes ``ceil(W / L)`` beats. Operands and results move in raster order (channel, row,
beat); :func:`operand_beats` and :func:`output_shape` / :func:`output_beats` state how many
beats each stream carries (``docs/planar.md``).
"""

import enum
from fractions import Fraction

from .codes import coded
from .engine import ERROR_BITS, TASK_OFFSET, control_registers
from .formats import F32_ONE, F32_POS_INF
from .registers import ADDRESS_WINDOWS
from .regmap import Field, Register, RegisterMap

__all__ = [
    "BASE",
    "ELT_ARITY",
    "INT8_CHANNEL_SUM",
    "INT8_CONST_LIMIT",
    "INT8_ELT_OPS",
    "INT8_SUM_ELEMENTS",
    "INT8_WORD",
    "LINE_BUFFER_DEPTH",
    "MAX_WINDOW",
    "PLANAR_ENGINE",
    "RETAIN",
    "SHAPE_BITS",
    "TASK_FIELDS",
    "TASK_REGISTERS",
    "WINDOW_BITS",
    "Axis",
    "Bcast",
    "EltOp",
    "Fmt",
    "Mode",
    "PlanarError",
    "PoolOp",
    "PostFn",
    "RedOp",
    "channel_reduce_fits",
    "f32_small_integer",
    "h_ring_depth",
    "int8_supported",
    "line_buffer_banks",
    "make_task",
    "operand_beats",
    "output_beats",
    "output_shape",
    "pool_fits",
    "pool_output_size",
    "recip_bits",
    "task_error",
    "task_writes",
    "vector_length",
]

#: Word address of the planar engine's register map.
BASE = ADDRESS_WINDOWS["PLANAR_ENGINE"][0]

#: Width of the channel, height and width fields.
SHAPE_BITS = 12
#: Width of the window, stride and padding fields.
WINDOW_BITS = 4
#: Largest pooling window side.
MAX_WINDOW = 8
#: Retention registers of the reduction (one per cycle of the binary32 adder's latency).
RETAIN = 3
#: Elements of the line buffer of the default build (``plane_depth``).
LINE_BUFFER_DEPTH = 1024



@coded(2)
class Mode(enum.IntEnum):
    """What a task computes (``MODE.mode``; 3 is an error)."""
    ELTWISE = 0
    POOL = 1
    REDUCE = 2


@coded(4)
class EltOp(enum.IntEnum):
    """Elementwise operations (``MODE.op`` in elementwise mode); the unary ones (up to
    ``SQUARE``) are also the reduction's pre-operations (``MODE.pre``)."""
    COPY = 0
    RELU = 1
    ABS = 2
    NEG = 3
    SQUARE = 4
    GAIN_BIAS = 5   # A * SCALE + BIAS
    ADD = 6
    SUB = 7
    MUL = 8
    MAX = 9
    MIN = 10
    CMP = 11        # +1 if A > B, -1 if A < B, else 0
    FMA = 12        # A + B * C
    ADDMUL = 13     # (A + B) * C


def _arity(op):
    return 3 if op >= EltOp.FMA else 2 if op >= EltOp.ADD else 1


#: Operand streams each elementwise operation reads (A; A and B; A, B and C).
ELT_ARITY = {op: _arity(op) for op in EltOp}


@coded(2)
class PoolOp(enum.IntEnum):
    """Pooling operations (``MODE.op`` in pooling mode)."""
    MAX = 0
    MIN = 1
    AVG = 2         # divides by the valid (non-padding) elements of each window


@coded(2)
class RedOp(enum.IntEnum):
    """Reduction operations (``MODE.op`` in reduction mode)."""
    SUM = 0
    MAX = 1
    MIN = 2


@coded(2)
class PostFn(enum.IntEnum):
    """Post-processor function applied to a reduction result (``MODE.post``)."""
    NONE = 0
    SQRT = 1
    RECIP = 2
    RSQRT = 3


@coded(3)
class Bcast(enum.IntEnum):
    """How operand B is given (``MODE.bcast``): a full tensor on stream B, the ``SCALAR``
    register, or a vector on stream B repeated along the other axes."""
    NONE = 0
    SCALAR = 1
    CHANNEL = 2     # C elements, one per channel
    ROW = 3         # W elements, one row for every channel and row
    COLUMN = 4      # H elements, one per row


@coded(1)
class Fmt(enum.IntEnum):
    """Element format of the streams (``MODE.in_fmt``, ``MODE.out_fmt``)."""
    INT8 = 0
    FP16 = 1


@coded(2)
class Axis(enum.IntEnum):
    """Reduction axis (``MODE.axis``)."""
    PLANE = 0       # one result per channel plane
    TENSOR = 1      # one result for the whole tensor
    CHANNEL = 2     # one result per pixel, across the channels (a plane)


@coded(ERROR_BITS)
class PlanarError(enum.IntEnum):
    """``STATUS.error_code`` of the planar engine (the checks of :func:`task_error`)."""
    NONE = 0
    #: Unknown mode, operation, broadcast kind, pre-operation, axis or post function (or a
    #: post function on a reduction across channels).
    BAD_MODE = 1
    #: A zero dimension, or a plane / broadcast vector larger than the line buffers.
    BAD_SHAPE = 2
    #: A window, stride or padding that is zero, too large, or leaves a window empty.
    BAD_WINDOW = 3
    #: FP16 requested in a build without binary16 support.
    BAD_FORMAT = 4
    #: An operation, constant or sum the integer build (``planar_impl="int8"``) does not
    #: compute exactly (:func:`int8_supported`).
    UNSUPPORTED = 5


PLANAR_ENGINE = RegisterMap("PLANAR_ENGINE", base=BASE, doc=(
    "Planar engine task registers (see `docs/planar.md`). Program `MODE`, `SHAPE0`, `SHAPE1`, "
    "`WINDOW` and the constants, then start the task (`CTRL.start`, or a start beat from the "
    "task manager). The operand streams are consumed and the results produced in the order of "
    "`docs/planar.md`. A task with an unsupported code or an impossible shape consumes "
    "nothing, sets `STATUS.error_code` and finishes at once."
), registers=control_registers(PlanarError) + [
    Register("MODE", offset=TASK_OFFSET, doc="What the task computes.", fields=[
        Field("mode", Mode.bits, enum=Mode, doc="0 elementwise, 1 pooling, 2 reduction (3 is "
              "an error)."),
        Field("op", EltOp.bits, offset=4,
              doc="Elementwise: 0 copy, 1 relu, 2 abs, 3 neg, 4 square, 5 gain-bias, 6 add, "
                  "7 sub, 8 mul, 9 max, 10 min, 11 cmp, 12 A+B*C, 13 (A+B)*C. Pooling: 0 max, "
                  "1 min, 2 avg. Reduction: 0 sum, 1 max, 2 min."),
        Field("in_fmt", Fmt.bits, offset=8, enum=Fmt, doc="Input format: 0 INT8, 1 FP16."),
        Field("out_fmt", Fmt.bits, offset=9, enum=Fmt, doc="Output format: 0 INT8, 1 FP16."),
        Field("bcast", Bcast.bits, offset=12, doc="Broadcast of operand B: 0 none, 1 scalar "
              "(`SCALAR`), 2 per channel, 3 row, 4 column."),
        Field("pre", EltOp.bits, offset=16, doc="Reduction: unary elementwise op applied first "
              "(0-4)."),
        Field("post", PostFn.bits, offset=20, enum=PostFn,
              doc="Reduction: 0 none, 1 sqrt, 2 reciprocal, 3 reciprocal sqrt."),
        Field("axis", Axis.bits, offset=24, enum=Axis,
              doc="Reduction: 0 one result per channel plane, 1 one result for the tensor, "
                  "2 one result per pixel across the channels (a plane; `post` must be 0)."),
    ]),
    Register("SHAPE0", doc="Plane size.", fields=[
        Field("width", SHAPE_BITS, doc="W, elements per row (1-4095)."),
        Field("height", SHAPE_BITS, offset=16, doc="H, rows per plane (1-4095)."),
    ]),
    Register("SHAPE1", doc="Channels.", fields=[
        Field("channels", SHAPE_BITS, doc="C, planes (1-4095)."),
    ]),
    Register("WINDOW", doc="Pooling window.", fields=[
        Field("kh", WINDOW_BITS, doc=f"Window height (1-{MAX_WINDOW})."),
        Field("kw", WINDOW_BITS, doc=f"Window width (1-{MAX_WINDOW})."),
        Field("sy", WINDOW_BITS, doc="Vertical stride (>= 1)."),
        Field("sx", WINDOW_BITS, doc="Horizontal stride (>= 1)."),
        Field("py", WINDOW_BITS, doc="Top/bottom padding (< kh)."),
        Field("px", WINDOW_BITS, doc="Left/right padding (< kw)."),
    ]),
    Register("SCALE", doc="Binary32 constant.", fields=[
        Field("scale", 32, reset=F32_ONE,
              doc="Gain `s` of gain-bias; multiplier of a reduction result (`1/N` for a mean)."),
    ]),
    Register("BIAS", doc="Binary32 constant.", fields=[
        Field("bias", 32, doc="Bias `b` of gain-bias."),
    ]),
    Register("SCALAR", doc="Binary32 constant.", fields=[
        Field("scalar", 32, doc="Operand B when `MODE.bcast` is 1 (scalar)."),
    ]),
])

#: The task registers, in address order (every register from ``MODE`` on).
TASK_REGISTERS = tuple(reg for reg in PLANAR_ENGINE.registers if reg.offset >= TASK_OFFSET)

#: The fields of a task, in register order.
TASK_FIELDS = tuple(f.name for reg in TASK_REGISTERS for f in reg.fields)


def make_task(**fields):
    """A task dict: every field at its register's reset value, then ``fields`` (a ``mode`` or
    ``op`` may be given as a member or a lower-case name of its enum).

    Window fields default to a 1x1 window of stride 1, so that an elementwise or reduction
    task is valid as it stands.
    """
    task = {f.name: f.reset or 0 for reg in TASK_REGISTERS for f in reg.fields}
    task.update(kh=1, kw=1, sy=1, sx=1)
    mode = fields.get("mode", task["mode"])
    if isinstance(mode, str):
        mode = Mode[mode.upper()]
    fields = dict(fields, mode=int(mode))
    op_enum = {Mode.ELTWISE: EltOp, Mode.POOL: PoolOp, Mode.REDUCE: RedOp}.get(int(mode))
    for name, value in fields.items():
        if name not in task:
            raise ValueError(f"unknown planar task field {name!r}; fields: "
                             f"{', '.join(TASK_FIELDS)}")
        if isinstance(value, str):
            enum_ = {"op": op_enum, "pre": EltOp, "post": PostFn, "bcast": Bcast, "axis": Axis,
                     "in_fmt": Fmt, "out_fmt": Fmt}.get(name)
            if enum_ is None:
                raise ValueError(f"field {name!r} takes a number, not {value!r}")
            value = enum_[value.upper()]
        task[name] = int(value)
    return task


def task_writes(task):
    """Register writes ``[(word address, value), ...]`` that program ``task`` (a dict of field
    values; missing fields take their reset values), without the start command.

    A value need only fit its field: a code that is no member of the field's enum (``mode``
    3, ``axis`` 3) is written as it is, and the engine rejects the task (:func:`task_error`).
    """
    return [(PLANAR_ENGINE.base + reg.offset,
             reg.pack(strict=False, **{f.name: int(task.get(f.name, f.reset or 0))
                                       for f in reg.fields}))
            for reg in TASK_REGISTERS]


# --------------------------------------------------------------------------------------------
# geometry of a build


def _is_prime(n):
    return n > 1 and all(n % k for k in range(2, int(n ** 0.5) + 1))


def line_buffer_banks(lanes, plane_depth):
    """``(NB, BD)``: the line buffer's bank count and words per bank.

    ``NB`` is the smallest prime above ``lanes`` and above the largest stride (15), so that
    ``lanes`` elements at a stride of 1 to 15 always fall in different banks;
    ``NB * BD >= plane_depth + 15``. One lane reads and writes one element a cycle, so it
    has one bank (``NB = 1``).
    """
    smax = 2 ** WINDOW_BITS - 1
    if lanes == 1:
        return 1, plane_depth + smax
    nb = max(lanes, smax) + 1
    while not _is_prime(nb):
        nb += 1
    # At least one more word than a lane's largest offset (15 (L - 1)) spans, so that a read
    # address wraps around the ring at most once; and 15 elements more than a row, so that a
    # window step's first address (ring address of its row + a column up to W + 14) is below
    # twice the ring.
    return nb, max(-(-(plane_depth + smax) // nb), smax * (lanes - 1) // nb + 1)


def h_ring_depth(lanes, plane_depth):
    """Words (of ``lanes`` elements) of the H ring between the pooling filters: a power of
    two, at least ``plane_depth / lanes`` and 4."""
    n = max(4, -(-plane_depth // lanes))
    return 1 << (n - 1).bit_length()


def recip_bits(n):
    """Binary32 bits of ``1/n`` rounded to nearest even (exact rational arithmetic): the
    average's divisor for ``n`` valid elements (``+inf`` for 0)."""
    if n < 1:
        return F32_POS_INF
    x = Fraction(1, n)
    e = 0
    while x < 1:
        x *= 2
        e -= 1
    sig = x * (1 << 23)
    q = sig.numerator // sig.denominator
    r = sig - q
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and q & 1):
        q += 1
    if q == 1 << 24:
        q, e = 1 << 23, e + 1
    return ((e + 127) << 23) | (q & 0x7F_FFFF)


# --------------------------------------------------------------------------------------------
# task rules


def _lanes(config):
    return config.planar_lanes ** 2


def _shape(task):
    return task["channels"], task["height"], task["width"]


def vector_length(task):
    """Elements of the broadcast vector on stream B (0 if B is not a vector)."""
    c, h, w = _shape(task)
    return {Bcast.CHANNEL: c, Bcast.ROW: w, Bcast.COLUMN: h}.get(task["bcast"], 0)


def _uses_vector(task):
    return (task["mode"] == Mode.ELTWISE and task["op"] in ELT_ARITY
            and ELT_ARITY[task["op"]] >= 2 and task["bcast"] >= Bcast.CHANNEL)


def pool_output_size(task):
    """``(OH, OW)`` of a pooling task with a valid window: ``(H + 2 py - kh) // sy + 1`` and
    likewise for the columns."""
    c, h, w = _shape(task)
    return ((h + 2 * task["py"] - task["kh"]) // task["sy"] + 1,
            (w + 2 * task["px"] - task["kw"]) // task["sx"] + 1)


def pool_fits(task, config, plane_depth=LINE_BUFFER_DEPTH):
    """Whether a pooling task fits the line buffers (``docs/planar.md``, "Line buffers"):
    ``min(C H, 3) W <= plane_depth`` (input rows of a horizontal group) and
    ``min(H, kh + 2 sy) ceil(OW / (K L)) + 2 <= HD`` (H ring words of a vertical group, a
    word being ``K = planar_pool_beats`` beats)."""
    lanes = _lanes(config)
    c, h, w = _shape(task)
    ow = pool_output_size(task)[1]
    owb = -(-ow // (lanes * config.planar_pool_beats))
    return (min(c * h, 3) * w <= plane_depth
            and min(h, task["kh"] + 2 * task["sy"]) * owb + 2
            <= h_ring_depth(lanes, plane_depth))


def channel_reduce_fits(task, config, plane_depth=LINE_BUFFER_DEPTH):
    """Whether a reduction across channels fits: its accumulator plane, ``H ceil(W / L)``
    beats, must fit the H ring."""
    lanes = _lanes(config)
    c, h, w = _shape(task)
    return h * -(-w // lanes) <= h_ring_depth(lanes, plane_depth)


def _bad_mode(task):
    mode, op = task["mode"], task["op"]
    if mode == Mode.ELTWISE:
        return op > max(EltOp) or task["bcast"] > max(Bcast)
    if mode == Mode.POOL:
        return op > max(PoolOp)
    if mode == Mode.REDUCE:
        return (op > max(RedOp) or task["pre"] > EltOp.SQUARE or task["axis"] > max(Axis)
                or (task["axis"] == Axis.CHANNEL and task["post"] != PostFn.NONE))
    return True


# --------------------------------------------------------------------------------------------
# the integer build (``NPUConfig.planar_impl == "int8"``)

#: Width of the integer build's values (two's complement) in its lanes, filters, rings and
#: line buffer; its reduction tree and retention registers are wider (``docs/planar.md``).
INT8_WORD = 16
#: Elementwise operations of the integer build (gain-bias only with the constants below).
INT8_ELT_OPS = (EltOp.COPY, EltOp.RELU, EltOp.ABS, EltOp.NEG, EltOp.GAIN_BIAS, EltOp.ADD,
                EltOp.SUB, EltOp.MAX, EltOp.MIN, EltOp.CMP)
#: ``BIAS`` and ``SCALAR`` must be integers of magnitude below this (so ``A + BIAS`` fits the
#: 16-bit word).
INT8_CONST_LIMIT = 1 << 14
#: A sum over planes or the tensor may cover at most this many elements (beats times lanes):
#: every partial sum of int8 values then stays within ``2^24``, where binary32 is exact.
INT8_SUM_ELEMENTS = 1 << 17
#: A sum across channels may cover at most this many channels (it is kept in the 16-bit words
#: of the H ring: ``255 * 128 < 2^15``).
INT8_CHANNEL_SUM = 255


def f32_small_integer(bits, limit=INT8_CONST_LIMIT):
    """The integer value of binary32 ``bits`` if it is an integer of magnitude below ``limit``
    (a power of two; ``-0.0`` and ``+0.0`` give 0), else None."""
    bits &= 0xFFFF_FFFF
    sign, exp, frac = bits >> 31, (bits >> 23) & 0xFF, bits & 0x7F_FFFF
    if exp == 0 and frac == 0:
        return 0
    e = exp - 127
    if not 0 <= e < limit.bit_length() - 1 or frac & ((1 << (23 - e)) - 1):
        return None
    value = (frac | 1 << 23) >> (23 - e)
    return -value if sign else value


def _group_beats(task, lanes):
    c, h, w = _shape(task)
    beats = _beats(h, w, lanes)
    return beats * c if task["axis"] == Axis.TENSOR else beats


def int8_supported(task, config):
    """Whether the planar engine built as ``config.planar_impl`` computes ``task`` (a task
    with valid codes); always True for the ``"float"`` build.

    The ``"int8"`` build computes exactly, with 16-bit integers, the tasks whose golden
    binary32 result is an integer it can reach without rounding: pooling ``max`` and ``min``;
    elementwise copy, relu, abs, neg, add, sub, max, min, cmp, and gain-bias with ``SCALE``
    ``+0.0`` or ``1.0`` and an integer ``BIAS`` below :data:`INT8_CONST_LIMIT` in magnitude; a
    scalar operand B (``bcast`` 1) an integer in the same range; reductions with ``pre`` copy,
    relu, abs or neg, ``post`` none and ``SCALE`` exactly ``1.0``, a sum over planes or the
    tensor of at most :data:`INT8_SUM_ELEMENTS` elements (``beats * L``), a sum across channels
    of at most :data:`INT8_CHANNEL_SUM` channels. Anything else (average pooling, mul, square,
    fma, addmul, other constants, means, post functions) is ``PlanarError.UNSUPPORTED``.
    """
    if config.planar_impl != "int8":
        return True
    mode, op = task["mode"], task["op"]
    if mode == Mode.POOL:
        return op in (PoolOp.MAX, PoolOp.MIN)
    if mode == Mode.ELTWISE:
        if op not in INT8_ELT_OPS:
            return False
        if op == EltOp.GAIN_BIAS and (task["scale"] not in (0, F32_ONE)
                                      or f32_small_integer(task["bias"]) is None):
            return False
        return not (ELT_ARITY[op] >= 2 and task["bcast"] == Bcast.SCALAR
                    and f32_small_integer(task["scalar"]) is None)
    if task["pre"] > EltOp.NEG or task["post"] != PostFn.NONE or task["scale"] != F32_ONE:
        return False
    if op != RedOp.SUM:
        return True
    if task["axis"] == Axis.CHANNEL:
        return task["channels"] <= INT8_CHANNEL_SUM
    return _group_beats(task, _lanes(config)) * _lanes(config) <= INT8_SUM_ELEMENTS


def _bad_window(task):
    if task["mode"] != Mode.POOL:
        return False
    c, h, w = _shape(task)
    kh, kw, sy, sx, py, px = (task[k] for k in ("kh", "kw", "sy", "sx", "py", "px"))
    return (min(kh, kw, sy, sx) == 0 or max(kh, kw) > MAX_WINDOW or py >= kh or px >= kw
            or kh > h + 2 * py or kw > w + 2 * px)


def task_error(task, config, plane_depth=LINE_BUFFER_DEPTH):
    """The :class:`PlanarError` the engine reports for ``task`` (``NONE`` if it runs).

    The checks, in the order the engine applies them: the codes (``BAD_MODE``), the formats of
    the build (``BAD_FORMAT``), the sizes (``BAD_SHAPE``: a zero dimension, a broadcast vector
    longer than ``plane_depth``, a pooling task or a reduction across channels that does not fit
    the line buffers), the window (``BAD_WINDOW``). The integer build (``planar_impl="int8"``)
    checks :func:`int8_supported` after the formats (``UNSUPPORTED``).
    """
    if _bad_mode(task):
        return PlanarError.BAD_MODE
    if not config.has_fp16 and (task["in_fmt"] or task["out_fmt"]):
        return PlanarError.BAD_FORMAT
    if not int8_supported(task, config):
        return PlanarError.UNSUPPORTED
    bad_window = _bad_window(task)
    mode = task["mode"]
    if (min(_shape(task)) == 0
            or (_uses_vector(task) and vector_length(task) > plane_depth)
            or (mode == Mode.POOL and not bad_window
                and not pool_fits(task, config, plane_depth))
            or (mode == Mode.REDUCE and task["axis"] == Axis.CHANNEL
                and not channel_reduce_fits(task, config, plane_depth))):
        return PlanarError.BAD_SHAPE
    if bad_window:
        return PlanarError.BAD_WINDOW
    return PlanarError.NONE


# --------------------------------------------------------------------------------------------
# stream order


def _beats(rows, width, lanes):
    return rows * -(-width // lanes)


def operand_beats(task, lanes):
    """Beats the engine consumes on each operand stream: ``{"a": n, "b": n, "c": n}``.

    A is the ``(C, H, W)`` input in raster order. B is, for a binary or ternary elementwise
    task, the full tensor (``bcast`` none) or the broadcast vector as one row (channel, row or
    column vector), which the engine reads completely before the first beat of A; C is the
    full tensor of a ternary task. A rejected task consumes nothing.
    """
    c, h, w = _shape(task)
    counts = {"a": _beats(c * h, w, lanes), "b": 0, "c": 0}
    if task["mode"] == Mode.ELTWISE:
        arity = ELT_ARITY.get(task["op"], 1)
        if arity >= 2 and task["bcast"] == Bcast.NONE:
            counts["b"] = counts["a"]
        elif _uses_vector(task):
            counts["b"] = _beats(1, vector_length(task), lanes)
        if arity == 3:
            counts["c"] = counts["a"]
    return counts


def output_shape(task):
    """Shape of a valid task's result: ``(C, H, W)`` elementwise, ``(C, OH, OW)`` pooling;
    a reduction gives ``(C, 1)`` per plane, ``(1, 1)`` for the tensor, ``(1, H, W)`` across the
    channels."""
    c, h, w = _shape(task)
    if task["mode"] == Mode.ELTWISE:
        return (c, h, w)
    if task["mode"] == Mode.POOL:
        return (c, *pool_output_size(task))
    if task["axis"] == Axis.CHANNEL:
        return (1, h, w)
    return (1 if task["axis"] == Axis.TENSOR else c, 1)


def output_beats(task, lanes):
    """Result beats of a valid task, in the order they leave: raster order of
    :func:`output_shape`, each row in ``ceil(width / lanes)`` beats (missing lanes zero); a
    reduction over planes or the tensor gives one beat per result, the value in lane 0."""
    shape = output_shape(task)
    if task["mode"] == Mode.REDUCE and task["axis"] != Axis.CHANNEL:
        return shape[0]
    rows = 1
    for n in shape[:-1]:
        rows *= n
    return _beats(rows, shape[-1], lanes)
