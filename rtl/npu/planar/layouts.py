"""Enums, the task configuration and the stream beat of the planar engine.

The codes equal those of the golden model (:mod:`npu_model.planar`) and of the register map
(:mod:`npu.planar.registers`).
"""

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

__all__ = [
    "MAX_WINDOW",
    "SHAPE_BITS",
    "WINDOW_BITS",
    "Axis",
    "Bcast",
    "EltOp",
    "Error",
    "Fmt",
    "Mode",
    "PoolOp",
    "PostFn",
    "RedOp",
    "beat_layout",
    "config_layout",
]

#: Width of the channel, height and width fields.
SHAPE_BITS = 12
#: Width of the window, stride and padding fields.
WINDOW_BITS = 4
#: Largest pooling window side.
MAX_WINDOW = 8


class Mode(enum.Enum, shape=2):
    ELTWISE = 0
    POOL = 1
    REDUCE = 2


class EltOp(enum.Enum, shape=4):
    COPY = 0
    RELU = 1
    ABS = 2
    NEG = 3
    SQUARE = 4
    GAIN_BIAS = 5
    ADD = 6
    SUB = 7
    MUL = 8
    MAX = 9
    MIN = 10
    CMP = 11
    FMA = 12      # A + B * C
    ADDMUL = 13   # (A + B) * C


class PoolOp(enum.Enum, shape=2):
    MAX = 0
    MIN = 1
    AVG = 2


class RedOp(enum.Enum, shape=2):
    SUM = 0
    MAX = 1
    MIN = 2


class PostFn(enum.Enum, shape=2):
    NONE = 0
    SQRT = 1
    RECIP = 2
    RSQRT = 3


class Bcast(enum.Enum, shape=3):
    NONE = 0
    SCALAR = 1
    CHANNEL = 2
    ROW = 3
    COLUMN = 4


class Fmt(enum.Enum, shape=1):
    INT8 = 0
    FP16 = 1


class Axis(enum.Enum, shape=2):
    #: One result per channel plane.
    PLANE = 0
    #: One result for the whole tensor.
    TENSOR = 1
    #: One result per pixel, across the channels (a plane).
    CHANNEL = 2


class Error(enum.Enum, shape=3):
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


def config_layout():
    """The task configuration (one register field per member, see ``registers.py``)."""
    return data.StructLayout({
        "mode": unsigned(2), "op": unsigned(4), "in_fmt": unsigned(1), "out_fmt": unsigned(1),
        "bcast": unsigned(3), "pre": unsigned(4), "post": unsigned(2), "axis": unsigned(2),
        "channels": unsigned(SHAPE_BITS), "height": unsigned(SHAPE_BITS),
        "width": unsigned(SHAPE_BITS),
        "kh": unsigned(WINDOW_BITS), "kw": unsigned(WINDOW_BITS),
        "sy": unsigned(WINDOW_BITS), "sx": unsigned(WINDOW_BITS),
        "py": unsigned(WINDOW_BITS), "px": unsigned(WINDOW_BITS),
        "scale": unsigned(32), "bias": unsigned(32), "scalar": unsigned(32),
    })


def beat_layout(lanes):
    """One stream beat: ``lanes`` elements of 16 bits (INT8 in the low byte, or binary16)."""
    return data.StructLayout({"data": data.ArrayLayout(unsigned(16), lanes)})
