"""Enums and layouts of the planar engine.

The codes and the task fields are those of the specification (:mod:`npu_spec.planar`); the
other layouts name what the sub-units pass to each other (a lane pipeline beat, a filter's
beat descriptor, a result queue entry, ...), so that nothing is packed and sliced by hand.
"""

from amaranth.hdl import signed, unsigned
from amaranth.lib import data, enum

from npu_spec import planar as spec
from npu_spec.planar import MAX_WINDOW, SHAPE_BITS, WINDOW_BITS

from ..lib.enums import hw_enum
from ..lib.fp32 import MacOp

__all__ = [
    "MAX_WINDOW",
    "SHAPE_BITS",
    "WINDOW_BITS",
    "Axis",
    "Bcast",
    "EltOp",
    "Error",
    "Fmt",
    "MacOp",
    "Mode",
    "PoolOp",
    "PostFn",
    "RedOp",
    "Spread",
    "beat_layout",
    "config_layout",
    "fold_layout",
    "hdesc_layout",
    "keep_layout",
    "lane_input_layout",
    "lane_output_layout",
    "load_shape_layout",
    "queue_entry_layout",
    "read_layout",
    "ring_keep_layout",
    "ring_read_layout",
    "ring_write_layout",
    "sizes_layout",
    "vdesc_layout",
    "vresult_layout",
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

#: Width of a binary32 value.
F32_BITS = 32
#: Width of the beat counts of a reduction group (up to the tensor's beats). The pooling walk's
#: counts are narrower, modular (``Geometry.count_bits``, ``Geometry.hword_bits``).
COUNT_BITS = 40


class Spread(enum.Enum, shape=2):
    """Where the lanes of a line-buffer read find their elements, from the base address."""
    SAME = 0    # every lane reads the base (a channel or column vector element)
    ROW = 1     # lane i reads base + i (a row vector)
    STEP = 2    # lane i reads base + sx * i (a pooling window step)


def config_layout():
    """The task configuration: one member per field of the task registers."""
    return data.StructLayout({f.name: unsigned(f.width)
                              for reg in spec.TASK_REGISTERS for f in reg.fields})


def beat_layout(lanes):
    """One stream beat: ``lanes`` elements of 16 bits (INT8 in the low byte, or binary16)."""
    return data.StructLayout({"data": data.ArrayLayout(unsigned(16), lanes)})


def sizes_layout():
    """Products of a task's shape fields, computed once per task by the control unit.

    ``wb`` beats per row; ``beats_plane`` beats per plane; ``beats_group`` beats per reduction
    group (a plane, or the tensor); ``rows`` rows of the task (``C H``); ``owb`` filter words
    per output row (``ceil(OW / FL)``) and its products with ``H``, ``kh``, ``sy``, ``py``;
    ``step_cols`` window columns between two filter words (``FL sx``), ``beat_cols`` between
    two output beats (``L sx``).
    """
    return data.StructLayout({
        "wb": 13, "beats_plane": 26, "beats_group": COUNT_BITS, "rows": 24,
        "owb": SHAPE_BITS + 1, "h_owb": 24, "kh_owb": 16, "sy_owb": 16, "py_owb": 16,
        "step_cols": 16, "beat_cols": 16,
    })


def lane_input_layout(lanes, word=F32_BITS):
    """A beat entering the lane pipeline: operation ``op`` on ``a``, ``b``, ``c`` (binary32,
    or ``word``-bit integers in the integer build) in the lanes of ``mask``; ``vector``:
    operand B is the line buffer's read data; ``scalar``: operand B is the ``SCALAR``
    register."""
    f32s = data.ArrayLayout(word, lanes)
    return data.StructLayout({"valid": 1, "op": EltOp, "mask": lanes, "vector": 1,
                              "scalar": 1, "a": f32s, "b": f32s, "c": f32s})


def lane_output_layout(lanes, word=F32_BITS):
    """A beat leaving the lane pipeline (a binary32 or ``word``-bit integer ``value`` per
    lane)."""
    return data.StructLayout({"valid": 1, "mask": lanes,
                              "value": data.ArrayLayout(word, lanes)})


def load_shape_layout():
    """What the loader writes into the line buffer: ``planes`` of ``rows`` rows of ``length``
    elements."""
    return data.StructLayout({"planes": SHAPE_BITS, "rows": SHAPE_BITS, "length": SHAPE_BITS})


def read_layout(ring_depth):
    """A line-buffer read: lane ``i`` reads ring address ``base + offset_i`` (see
    :class:`Spread`), ``stride`` apart for :attr:`Spread.STEP`; ``-15 <= base < 2
    ring_depth``."""
    return data.StructLayout({"en": 1, "base": signed((2 * ring_depth).bit_length() + 1),
                              "spread": Spread,
                              "stride": WINDOW_BITS})


def keep_layout(count_bits):
    """The first element (counted from the start of the task, modulo ``2**count_bits``) that a
    reader of the line buffer still needs; the loader never overwrites it while ``valid``."""
    return data.StructLayout({"valid": 1, "first": count_bits})


def ring_keep_layout(hword_bits):
    """The first H word (counted from the start of the task, modulo ``2**hword_bits``) that the
    vertical filter still needs; the horizontal filter never overwrites it while ``valid``."""
    return data.StructLayout({"valid": 1, "word": hword_bits})


def ring_write_layout(word_shape):
    """A write of the H ring: word ``word`` (taken modulo the ring) in this cycle."""
    return data.StructLayout({"valid": 1, "word": word_shape})


def ring_read_layout(depth):
    """A read of the H ring (data in the next cycle)."""
    return data.StructLayout({"en": 1, "addr": range(depth)})


def fold_layout(lanes, word=F32_BITS):
    """Operands of the horizontal filter's ``lanes`` add/max/min pipes."""
    f32s = data.ArrayLayout(word, lanes)
    return data.StructLayout({"a": f32s, "b": f32s, "op": MacOp})


def hdesc_layout(ring_depth, count_bits, hword_bits):
    """An H beat of the horizontal filter: global input row ``row`` of the task, first window
    column of lane 0 ``gxb``, ring address ``ring`` and element count ``row_start`` of the
    row's first element (modulo ``2**count_bits``), H word index ``hw`` (modulo
    ``2**hword_bits``)."""
    return data.StructLayout({"valid": 1, "row": 24, "gxb": signed(16),
                              "ring": range(ring_depth), "row_start": count_bits,
                              "hw": hword_bits})


def vdesc_layout(hword_bits):
    """A V beat (output beat group of the vertical filter): first window row ``oyb``, first
    window column of lane 0 ``gxb``, filter word ``ob`` in the output row, H word index
    ``roww`` of H row ``oyb``'s first word (modulo ``2**hword_bits``; it is below the plane's
    first word for a padding row)."""
    return data.StructLayout({"valid": 1, "oyb": signed(14), "gxb": signed(16), "ob": 12,
                              "roww": hword_bits})


def queue_entry_layout(filter_lanes, value_shape=F32_BITS):
    """A vertical filter result: ``filter_lanes`` values (of ``value_shape``; the integer
    build's are INT8, ``Geometry.buffer_shape``) and the window position of lane 0."""
    return data.StructLayout({"value": data.ArrayLayout(value_shape, filter_lanes),
                              "oyb": signed(14), "gxb": signed(16)})


def vresult_layout(filter_lanes, value_shape=F32_BITS):
    """What the vertical filter tells the result queue in a cycle: ``start`` a group starts
    (reserve three entries); ``valid`` a result ``entry`` is written; ``empty`` an invalid
    beat of a group ended (release its reservation)."""
    return data.StructLayout({"start": 1, "valid": 1, "empty": 1,
                              "entry": queue_entry_layout(filter_lanes, value_shape)})
