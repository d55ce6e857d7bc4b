"""Enums, the task configuration and the stream beat of the planar engine.

The codes and the task fields are those of the specification (:mod:`npu_spec.planar`).
"""

from amaranth.hdl import unsigned
from amaranth.lib import data
from npu_spec import planar as spec
from npu_spec.planar import MAX_WINDOW, SHAPE_BITS, WINDOW_BITS

from ..lib.enums import hw_enum

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

Mode = hw_enum(spec.Mode)
EltOp = hw_enum(spec.EltOp)
PoolOp = hw_enum(spec.PoolOp)
RedOp = hw_enum(spec.RedOp)
PostFn = hw_enum(spec.PostFn)
Bcast = hw_enum(spec.Bcast)
Fmt = hw_enum(spec.Fmt)
Axis = hw_enum(spec.Axis)
Error = hw_enum(spec.PlanarError)


def config_layout():
    """The task configuration: one member per field of the task registers."""
    return data.StructLayout({f.name: unsigned(f.width)
                              for reg in spec.TASK_REGISTERS for f in reg.fields})


def beat_layout(lanes):
    """One stream beat: ``lanes`` elements of 16 bits (INT8 in the low byte, or binary16)."""
    return data.StructLayout({"data": data.ArrayLayout(unsigned(16), lanes)})
