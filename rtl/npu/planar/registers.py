"""Register map of the planar engine (plain Python: no Amaranth, no numpy).

One task is described by the ``MODE``, ``SHAPE*``, ``WINDOW`` and constant registers; a write
of 1 to ``CTRL.start`` starts it. ``STATUS`` reports ``busy`` and the ``error`` code of the last
task. Field names equal the members of :func:`npu.planar.layouts.config_layout`, so a register
file's outputs connect field by field to the engine's ``cfg`` port.
"""

import enum

from ..registers import ADDRESS_WINDOWS
from ..regmap import Field, Register, RegisterMap
from . import layouts

__all__ = ["PLANAR_ENGINE", "REGISTER_MAPS", "TASK_REGISTERS", "encode_task"]


def _int_enum(e):
    """The register map's view (an ``IntEnum``) of one of the engine's enums."""
    return enum.IntEnum(e.__name__, {m.name: m.value for m in e})


Mode, Fmt, Bcast, PostFn, Axis, Error = (
    _int_enum(e) for e in (layouts.Mode, layouts.Fmt, layouts.Bcast, layouts.PostFn,
                           layouts.Axis, layouts.Error))


_BASE = ADDRESS_WINDOWS["PLANAR_ENGINE"][0]

PLANAR_ENGINE = RegisterMap("PLANAR_ENGINE", base=_BASE, doc=(
    "Planar engine task registers (see `docs/planar.md`). Program `MODE`, `SHAPE0`, `SHAPE1`, "
    "`WINDOW` and the constants, then write `CTRL.start`. The operand streams are consumed and "
    "the results produced in the order of `docs/planar.md`. A task with an unsupported code or "
    "an impossible shape consumes nothing, sets `STATUS.error` and finishes at once."
), registers=[
    Register("CTRL", offset=0x0, doc="Commands.", fields=[
        Field("start", 1, access="wo", doc="Write 1 to start the programmed task."),
    ]),
    Register("STATUS", offset=0x1, doc="State of the engine.", fields=[
        Field("busy", 1, access="ro", doc="A task is running."),
        Field("error", 3, offset=4, access="ro", enum=Error,
              doc="Result of the last task: 0 ran; 1 unknown mode/op/broadcast/pre code; 2 zero "
                  "dimension or plane/vector larger than the line buffer; 3 impossible window; "
                  "4 FP16 in a build without binary16."),
    ]),
    Register("MODE", offset=0x2, doc="What the task computes.", fields=[
        Field("mode", 2, enum=Mode, doc="0 elementwise, 1 pooling, 2 reduction (3 is an error)."),
        Field("op", 4, offset=4,
              doc="Elementwise: 0 copy, 1 relu, 2 abs, 3 neg, 4 square, 5 gain-bias, 6 add, "
                  "7 sub, 8 mul, 9 max, 10 min, 11 cmp, 12 A+B*C, 13 (A+B)*C. Pooling: 0 max, "
                  "1 min, 2 avg. Reduction: 0 sum, 1 max, 2 min."),
        Field("in_fmt", 1, offset=8, enum=Fmt, doc="Input format: 0 INT8, 1 FP16."),
        Field("out_fmt", 1, offset=9, enum=Fmt, doc="Output format: 0 INT8, 1 FP16."),
        Field("bcast", 3, offset=12, doc="Broadcast of operand B: 0 none, 1 scalar (`SCALAR`), "
              "2 per channel, 3 row, 4 column."),
        Field("pre", 4, offset=16, doc="Reduction: unary elementwise op applied first (0-4)."),
        Field("post", 2, offset=20, enum=PostFn,
              doc="Reduction: 0 none, 1 sqrt, 2 reciprocal, 3 reciprocal sqrt."),
        Field("axis", 2, offset=24, enum=Axis,
              doc="Reduction: 0 one result per channel plane, 1 one result for the tensor, "
                  "2 one result per pixel across the channels (a plane; `post` must be 0)."),
    ]),
    Register("SHAPE0", offset=0x3, doc="Plane size.", fields=[
        Field("width", 12, doc="W, elements per row (1-4095)."),
        Field("height", 12, offset=16, doc="H, rows per plane (1-4095)."),
    ]),
    Register("SHAPE1", offset=0x4, doc="Channels.", fields=[
        Field("channels", 12, doc="C, planes (1-4095)."),
    ]),
    Register("WINDOW", offset=0x5, doc="Pooling window.", fields=[
        Field("kh", 4, doc="Window height (1-8)."),
        Field("kw", 4, doc="Window width (1-8)."),
        Field("sy", 4, doc="Vertical stride (>= 1)."),
        Field("sx", 4, doc="Horizontal stride (>= 1)."),
        Field("py", 4, doc="Top/bottom padding (< kh)."),
        Field("px", 4, doc="Left/right padding (< kw)."),
    ]),
    Register("SCALE", offset=0x6, doc="Binary32 constant.", fields=[
        Field("scale", 32, reset=0x3F80_0000,
              doc="Gain `s` of gain-bias; multiplier of a reduction result (`1/N` for a mean)."),
    ]),
    Register("BIAS", offset=0x7, doc="Binary32 constant.", fields=[
        Field("bias", 32, doc="Bias `b` of gain-bias."),
    ]),
    Register("SCALAR", offset=0x8, doc="Binary32 constant.", fields=[
        Field("scalar", 32, doc="Operand B when `MODE.bcast` is 1 (scalar)."),
    ]),
])

REGISTER_MAPS = (PLANAR_ENGINE,)

#: Register holding each task field.
TASK_REGISTERS = {f.name: reg.name for reg in PLANAR_ENGINE.registers
                  if reg.name not in ("CTRL", "STATUS") for f in reg.fields}


def encode_task(task):
    """Register writes ``[(word address, value), ...]`` that program ``task`` (a dict of
    field values; missing fields take their reset values), without the start command."""
    writes = []
    for reg in PLANAR_ENGINE.registers:
        if reg.name in ("CTRL", "STATUS"):
            continue
        values = {f.name: task.get(f.name, f.reset) for f in reg.fields}
        writes.append((PLANAR_ENGINE.base + reg.offset, reg.pack(**values)))
    return writes
