"""MAC operations and operand formats of the neural engine's MAC array (``docs/mac.md``)."""

import enum

from .codes import coded

__all__ = ["FORMAT_NEEDS", "MacFormat", "MacOp", "format_built"]


@coded(2)
class MacOp(enum.IntEnum):
    """What a MAC unit does with the product ``p = data * coef`` and accumulator slot ``acc``
    (``acc`` is the command's ``bias`` when ``first`` is set)."""
    #: ``acc + p`` (int32 wrap, or binary32 add with round-to-nearest-even).
    MAC = 0
    #: ``max(acc, p)`` (binary32: NaN if either is NaN; -0 < +0).
    MAX = 1
    #: ``min(acc, p)``.
    MIN = 2
    #: ``+1`` if ``p > acc``, ``-1`` if ``p < acc``, else ``0`` (equal or unordered), in the
    #: accumulator format (int32, or binary32 +1.0 / -1.0 / +0.0).
    CMP = 3


@coded(2)
class MacFormat(enum.IntEnum):
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
        """The accumulator holds binary32."""
        return self is not MacFormat.INT8

    @property
    def data_fp16(self):
        return self in (MacFormat.FP16, MacFormat.F16I8)

    @property
    def coef_fp16(self):
        return self in (MacFormat.FP16, MacFormat.I8F16)


#: The configuration format (``NPUConfig.formats``) each MAC format needs.
FORMAT_NEEDS = {
    MacFormat.INT8: "int8",
    MacFormat.FP16: "fp16",
    MacFormat.I8F16: "mixed",
    MacFormat.F16I8: "mixed",
}


def format_built(config, fmt):
    """Whether a build with ``config`` has the hardware for MAC format ``fmt``."""
    return FORMAT_NEEDS[MacFormat(fmt)] in config.formats
