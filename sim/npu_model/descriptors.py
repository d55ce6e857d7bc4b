"""Task descriptors: the format, an encoder (used by the compiler) and a strict decoder.

A descriptor is a list of 32-bit words in system memory (word addresses). Layout::

    word 0  H0  [7:0] magic 0xD7   [15:8] length (total words, header included)
                [16] engine (0 NE, 1 PE)   [17] TSE  [18] SPC  [19] DPC  [20] TSR  [21] SPL
                [22] SRC_MEM (input always from system memory)
                [23] DST_MEM (output always also to system memory)
                [24] IRQ (raise the task_done interrupt when the task completes)
                [31:25] reserved, 0
    word 1  H1  [15:0] task ID   [23:16] network ID   [31:24] dependency distance
    word 2  H2  [15:0] source offset   [23:16] source length (words)   [31:24] reserved, 0
    word 3  H3  [15:0] destination offset   [31:16] reserved, 0
    then entries, each a word  [15:0] register word address  [31:16] count (>= 1)
                followed by ``count`` data words written to address, address + 1, ...

Source and destination offsets are relative to the network's base address (base-address table
entry of the queue) in system memory, and are plain buffer addresses in the data buffer.
The dependency distance ``d`` (0 = none) says the task reads the output of the task ``d``
positions earlier in the same task list (normally a task of the other engine; tasks of one
engine always run in list order).

Error classes (each a :class:`DescriptorError` subclass, mirrored by the RTL's exception causes
in :class:`npu.taskman.registers.Cause`): :class:`DecodeError` (magic, reserved bits, lengths,
count 0, network ID), :class:`AddressError` (a register write outside every register-map window
of :data:`npu.registers.ADDRESS_WINDOWS`), :class:`WindowError` (descriptor or data outside the
network's memory window).
"""

from dataclasses import dataclass, field

from npu.registers import ADDRESS_WINDOWS
from npu.regmap import WriteBlock

__all__ = [
    "FLAGS",
    "HEADER_WORDS",
    "MAGIC",
    "NE",
    "PE",
    "AddressError",
    "DecodeError",
    "Descriptor",
    "DescriptorError",
    "WindowError",
    "blocks_from_map",
    "check_address",
    "check_window",
    "decode",
    "encode",
]

MAGIC = 0xD7
HEADER_WORDS = 4
NE = 0
PE = 1
#: Flag names and their bit in H0.
FLAGS = {"tse": 17, "spc": 18, "dpc": 19, "tsr": 20, "spl": 21, "src_mem": 22, "dst_mem": 23,
         "irq": 24}
_RESERVED_H0 = 0xFE00_0000
_RESERVED_H2 = 0xFF00_0000
_RESERVED_H3 = 0xFFFF_0000
MAX_LENGTH = 0xFF


class DescriptorError(ValueError):
    """A descriptor that the task manager rejects."""


class DecodeError(DescriptorError):
    """Undecodable descriptor."""


class AddressError(DescriptorError):
    """A register write outside every register map window."""


class WindowError(DescriptorError):
    """A descriptor or data pointer outside the network's memory window."""


@dataclass(frozen=True)
class Descriptor:
    """One task. ``blocks`` are :class:`npu.regmap.WriteBlock` (address, count, words)."""
    task_id: int
    network: int = 0
    engine: int = NE
    tse: bool = False
    spc: bool = False
    dpc: bool = False
    tsr: bool = False
    spl: bool = False
    src_mem: bool = False
    dst_mem: bool = False
    irq: bool = False
    dep: int = 0
    src: int = 0
    src_len: int = 1
    dst: int = 0
    blocks: tuple = field(default_factory=tuple)

    @property
    def length(self):
        return HEADER_WORDS + sum(1 + b.count for b in self.blocks)

    @property
    def flags(self):
        return {name: getattr(self, name) for name in FLAGS}


def _range(what, value, bits):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < (1 << bits):
        raise DecodeError(f"{what} must be an integer in [0, {(1 << bits) - 1}], not {value!r}")
    return value


def check_address(address, count):
    """:class:`AddressError` unless registers ``address .. address + count - 1`` lie in one
    window of :data:`npu.registers.ADDRESS_WINDOWS`."""
    for start, size in ADDRESS_WINDOWS.values():
        if start <= address and address + count <= start + size:
            return
    raise AddressError(f"Register write to 0x{address:X}..0x{address + count - 1:X} lies "
                       f"outside every register map window")


def check_window(what, start, count, window):
    """:class:`WindowError` unless ``[start, start + count)`` lies in ``window`` =
    ``(base, words)``."""
    base, words = window
    if not (base <= start and start + count <= base + words):
        raise WindowError(f"{what} 0x{start:X}..0x{start + count - 1:X} lies outside the memory "
                          f"window 0x{base:X}..0x{base + words - 1:X}")


def encode(desc):
    """The words of ``desc``; :class:`DescriptorError` for a value that does not fit."""
    if not isinstance(desc, Descriptor):
        raise TypeError(f"Descriptor must be a Descriptor, not {desc!r}")
    _range("Task ID", desc.task_id, 16)
    _range("Network ID", desc.network, 8)
    _range("Dependency distance", desc.dep, 8)
    _range("Source offset", desc.src, 16)
    _range("Source length", desc.src_len, 8)
    _range("Destination offset", desc.dst, 16)
    if desc.engine not in (NE, PE):
        raise DecodeError(f"Engine must be NE (0) or PE (1), not {desc.engine!r}")
    if desc.length > MAX_LENGTH:
        raise DecodeError(f"Descriptor of {desc.length} words is longer than {MAX_LENGTH}")
    h0 = MAGIC | desc.length << 8 | desc.engine << 16
    for name, bit in FLAGS.items():
        h0 |= int(bool(getattr(desc, name))) << bit
    words = [h0, desc.task_id | desc.network << 16 | desc.dep << 24,
             desc.src | desc.src_len << 16, desc.dst]
    for block in desc.blocks:
        address, count, data = block
        data = tuple(data)
        _range("Register address", address, 16)
        if not 1 <= count < (1 << 16) or count != len(data):
            raise DecodeError(f"Entry at 0x{address:X}: count {count!r} must be >= 1 and equal "
                              f"the {len(data)} data words")
        check_address(address, count)
        words.append(address | count << 16)
        words += [_range("Data word", w, 32) for w in data]
    return words


def decode(words, *, network=None, window=None, address=0):
    """Parse and check the descriptor at the start of ``words``.

    ``network`` (the queue's network ID) and ``window`` (``(base, words)`` of the queue's base
    table entry) enable the corresponding checks; ``address`` is where the descriptor sits in
    memory. Returns a :class:`Descriptor` or raises a :class:`DescriptorError` subclass.
    """
    words = list(words)
    if not words:
        raise DecodeError("Empty descriptor")
    h0 = words[0]
    if h0 & 0xFF != MAGIC:
        raise DecodeError(f"Bad magic 0x{h0 & 0xFF:02X} (expected 0x{MAGIC:02X})")
    if h0 & _RESERVED_H0:
        raise DecodeError(f"Reserved bits set in header word 0: 0x{h0:08X}")
    length = (h0 >> 8) & 0xFF
    if length < HEADER_WORDS:
        raise DecodeError(f"Length {length} is shorter than the {HEADER_WORDS}-word header")
    if window is not None:
        check_window("Descriptor", address, length, window)
    if len(words) < length:
        raise DecodeError(f"Descriptor of length {length} truncated to {len(words)} words")
    h1, h2, h3 = words[1:4]
    if h2 & _RESERVED_H2 or h3 & _RESERVED_H3:
        raise DecodeError("Reserved bits set in header words 2/3")
    net = (h1 >> 16) & 0xFF
    if network is not None and net != network:
        raise DecodeError(f"Network ID {net} differs from the queue's network {network}")
    src, src_len, dst = h2 & 0xFFFF, (h2 >> 16) & 0xFF, h3 & 0xFFFF
    if window is not None:
        check_window("Source", window[0] + src, src_len, window)
        check_window("Destination", window[0] + dst, 1, window)
    blocks = []
    k = HEADER_WORDS
    while k < length:
        reg, count = words[k] & 0xFFFF, words[k] >> 16
        if count == 0:
            raise DecodeError(f"Entry at word {k} has count 0")
        check_address(reg, count)
        if k + 1 + count > length:
            raise DecodeError(f"Entry at word {k} (count {count}) runs past the length {length}")
        blocks.append(WriteBlock(reg, count, tuple(words[k + 1:k + 1 + count])))
        k += 1 + count
    flags = {name: bool(h0 >> bit & 1) for name, bit in FLAGS.items()}
    return Descriptor(task_id=h1 & 0xFFFF, network=net, engine=(h0 >> 16) & 1,
                      dep=h1 >> 24, src=src, src_len=src_len, dst=dst, blocks=tuple(blocks),
                      **flags)


def blocks_from_map(regmap, writes):
    """Entries for ``writes`` to ``regmap`` (:meth:`npu.regmap.RegisterMap.encode_block`)."""
    return tuple(regmap.encode_block(writes))
