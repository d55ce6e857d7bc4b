"""Bit patterns of the number formats that the datapaths and the golden model share.

``docs/formats.md`` states the rules (IEEE 754 binary16 and binary32 with subnormals, signed
zero and infinities; round to nearest even). One choice is the project's own: every NaN result
is the canonical quiet NaN below.
"""

__all__ = [
    "F16_NEG_INF",
    "F16_ONE",
    "F16_POS_INF",
    "F16_QNAN",
    "F32_MINUS_ONE",
    "F32_NEG_INF",
    "F32_NEG_ZERO",
    "F32_ONE",
    "F32_POS_INF",
    "F32_QNAN",
]

#: Canonical quiet NaN of binary16 (sign 0, exponent all ones, top fraction bit set).
F16_QNAN = 0x7E00
#: Canonical quiet NaN of binary32.
F32_QNAN = 0x7FC0_0000

#: +infinity, -infinity and +1.0 in binary16.
F16_POS_INF = 0x7C00
F16_NEG_INF = 0xFC00
F16_ONE = 0x3C00
#: Binary32 +1.0 and -1.0.
F32_ONE = 0x3F80_0000
F32_MINUS_ONE = 0xBF80_0000
#: Binary32 -0.0, the identity of a sum.
F32_NEG_ZERO = 0x8000_0000
#: Binary32 +infinity and -infinity, the identities of min and max.
F32_POS_INF = 0x7F80_0000
F32_NEG_INF = 0xFF80_0000
