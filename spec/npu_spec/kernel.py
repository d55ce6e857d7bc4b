"""The compressed kernel format's constants and error codes (``docs/kernel_format.md``).

A kernel group (the kernels of up to ``acc_slots`` output channels) is stored as a header part
(per-channel parameters, then the palette) and a body part (the coefficients in scan order, in
chunks of :data:`CHUNK` positions, raw or palettized, optionally with a zero bitmap per chunk),
each streamed as 32-bit little-endian words. The encoder and the golden model of the kernel
extractor are :mod:`npu_model.kernel_codec`; the gateware is :mod:`npu.neural.kernel_extract`.
"""

import enum

from .codes import coded
from .regmap import Field, Register

__all__ = [
    "CHANNEL_WORDS",
    "CHUNK",
    "GROUP_TABLE",
    "GROUP_TABLE_WORDS",
    "HEADER_CHANNEL_BYTES",
    "MAX_ICG",
    "MAX_KERNEL",
    "MAX_SHIFT",
    "PALETTE_BITS",
    "SHIFT_WORD",
    "KernelError",
    "encoding_accepted",
]

#: Positions per chunk (one bitmap byte in sparse bodies).
CHUNK = 8
#: Largest kernel height or width.
MAX_KERNEL = 16
#: Largest number of input channels per kernel.
MAX_ICG = 4095
#: Allowed palette index widths (0 = not palettized).
PALETTE_BITS = (0, 1, 2, 4, 6, 8)
#: Header words per output channel: bias, scale, then :data:`SHIFT_WORD`.
CHANNEL_WORDS = 3
#: Header bytes per output channel.
HEADER_CHANNEL_BYTES = 4 * CHANNEL_WORDS
#: Largest right shift of the int32 rescale.
MAX_SHIFT = 63
#: The words of one output-channel group's entry in the neural engine's kernel group table
#: (``KTABLE``), in address order: where the group's header part starts in the kernel memory
#: and how many words it has, then the same for its body part. Each word holds a 16-bit value
#: (a kernel-memory word address or a word count) in bits 0-15.
GROUP_TABLE = ("header_addr", "header_words", "body_addr", "body_words")
#: Words per output-channel group in the kernel group table.
GROUP_TABLE_WORDS = len(GROUP_TABLE)

#: The third header word of a channel.
SHIFT_WORD = Register("SHIFT_WORD", doc="Third header word of an output channel.", fields=[
    Field("shift", 8, doc=f"Right shift of the int32 rescale (0-{MAX_SHIFT})."),
    Field("reserved", 8, doc="Must be 0."),
    Field("nnz", 16, doc="Nonzero coefficients of the channel's kernel."),
])


@coded(3)
class KernelError(enum.IntEnum):
    """Error codes of the kernel extractor."""
    NONE = 0
    #: Palette bits not in :data:`PALETTE_BITS`, icg 0, kh or kw 0 or above 16, ocg 0 or above
    #: the slot count, a coefficient format the build does not have, or an encoding the build
    #: does not decode (:func:`encoding_accepted`).
    BAD_CONFIG = 1
    #: The part's final word came before the decoder finished.
    EARLY_END = 2
    #: The decoder finished with at least one whole word of the part left over.
    TRAILING = 3
    #: A channel got more nonzero coefficients than its header nnz, or fewer at the end.
    NNZ_MISMATCH = 4
    #: A header's reserved byte is not zero, or its shift is above :data:`MAX_SHIFT`.
    RESERVED = 5


def encoding_accepted(extract, *, coef_fp16, sparse, palette):
    """Whether a kernel extractor built as ``extract`` (``NPUConfig.kernel_extract``) decodes
    a group in this encoding.

    The ``"dense_int8"`` build takes dense raw int8 bodies only (``sparse`` 0, ``palette`` 0,
    ``coef_fp16`` 0); any other encoding is a ``KernelError.BAD_CONFIG`` at the start of either
    part. The ``"full"`` build takes every encoding (the other configuration checks apply to
    both builds).
    """
    if extract == "dense_int8":
        return not coef_fp16 and not sparse and not palette
    return True
