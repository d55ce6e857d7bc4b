"""Operation, format and error codes: :class:`enum.IntEnum` classes that know their width.

A code is stored in a register field, a descriptor word and a stream beat; the width is part of
the fact, so it is declared with the code. The gateware turns each class into an Amaranth enum
of that shape (:func:`npu.lib.enums.hw_enum`); the golden model and the compiler use the class
itself.
"""

import enum

__all__ = ["coded"]


def coded(bits):
    """Class decorator: ``cls`` (an :class:`enum.IntEnum`) holds codes of ``bits`` bits.

    Sets ``cls.bits``; :class:`ValueError` names a member that does not fit.

    >>> @coded(2)
    ... class Op(enum.IntEnum):
    ...     ADD = 0
    ...     MAX = 1
    >>> Op.bits
    2
    """
    if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= 32:
        raise ValueError(f"Code width must be an integer in [1, 32], not {bits!r}")

    def decorate(cls):
        if not (isinstance(cls, type) and issubclass(cls, enum.IntEnum)):
            raise TypeError(f"coded() applies to enum.IntEnum classes, not {cls!r}")
        for member in cls:
            if not 0 <= member.value < (1 << bits):
                raise ValueError(f"{cls.__name__}.{member.name} = {member.value} does not fit "
                                 f"in {bits} bit(s)")
        cls.bits = bits
        return cls

    return decorate
