"""Amaranth enums derived from the specification's codes."""

from functools import cache

from amaranth.hdl import unsigned
from amaranth.lib import enum

__all__ = ["hw_enum"]


@cache
def hw_enum(codes):
    """The :class:`amaranth.lib.enum.Enum` of a specification code class.

    ``codes`` is an :class:`enum.IntEnum` decorated with :func:`npu_spec.codes.coded`; the
    result has the same members and the shape ``unsigned(codes.bits)``, so signals of it are
    typed views that compare only with its members. The same class is returned for the same
    ``codes``, so every module sees one enum.
    """
    bits = getattr(codes, "bits", None)
    if bits is None:
        raise TypeError(f"{codes!r} has no bit width; declare it with npu_spec.codes.coded()")
    namespace = enum.EnumType.__prepare__(codes.__name__, (enum.Enum,), shape=unsigned(bits))
    for member in codes:
        namespace[member.name] = member.value
    cls = enum.EnumType(codes.__name__, (enum.Enum,), namespace, shape=unsigned(bits))
    cls.__doc__ = codes.__doc__
    cls.__module__ = codes.__module__
    return cls
