"""Task descriptors: the word format, an encoder (used by the compiler) and a strict decoder.

A descriptor is a list of 32-bit words in system memory (word addresses): four header words
(:data:`HEADER`, declared like registers so that their fields are named once and the gateware
decodes them through the same declarations), then entries, each an :data:`ENTRY` word
(register word address, count >= 1) followed by ``count`` data words written to ``address``,
``address + 1``, ... (``docs/descriptors.md``)::

    word 0  H0  magic 0xD7, length (total words, header included), engine (0 NE, 1 PE,
                2 DMA),
                flags TSE SPC DPC TSR SPL, SRC_MEM (input always from system memory),
                DST_MEM (output always also to system memory), IRQ (interrupt on completion)
    word 1  H1  task ID, network ID, dependency distance
    word 2  H2  source offset, source length (words)
    word 3  H3  destination offset

Source and destination offsets are relative to the network's base address (base-address table
entry of the queue) in system memory, and are plain buffer addresses in the data buffer. The
dependency distance ``d`` (0 = none) says the task reads the output of the task ``d`` positions
earlier in the same task list (normally a task of the other engine; tasks of one engine always
run in list order).

Error classes (each a :class:`DescriptorError` subclass, the task manager's exception causes of
:class:`npu_spec.taskman.Cause`): :class:`DecodeError` (magic, reserved bits, lengths, count 0,
network ID), :class:`AddressError` (a register write outside every register-map window of
:data:`npu_spec.registers.ADDRESS_WINDOWS`), :class:`WindowError` (descriptor or data outside the
network's memory window).
"""

from dataclasses import dataclass, field

from .engine import Engine
from .registers import ADDRESS_WINDOWS
from .regmap import DATA_WIDTH, Field, Register, WriteBlock

__all__ = [
    "ENTRY",
    "FLAGS",
    "HEADER",
    "HEADER_WORDS",
    "MAGIC",
    "MAX_LENGTH",
    "NE",
    "PE",
    "SWITCH_POINTS",
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
    "reserved_mask",
]

#: ``H0.magic`` of every descriptor.
MAGIC = 0xD7
#: Engines a descriptor addresses (``H0.engine``).
NE = Engine.NEURAL
PE = Engine.PLANAR

#: Task flags, in ``H0`` bit order.
FLAGS = ("tse", "spc", "dpc", "tsr", "spl", "src_mem", "dst_mem", "irq")
#: The flags that make a task a switch point: the task manager starts it only when every older
#: task has completed and starts no younger task before it completes (a barrier).
SWITCH_POINTS = ("tse", "tsr", "spl")

#: The header words.
HEADER = (
    Register("H0", doc="Format, engine and task-switch flags.", fields=[
        Field("magic", 8, doc=f"Always 0x{MAGIC:02X}."),
        Field("length", 8, doc="Total words, header included."),
        Field("engine", Engine.bits, enum=Engine, doc="Engine of the task."),
        Field("tse", 1, doc="Task-switch enable: a switch request during this task sets GTSP."),
        Field("spc", 1, doc="Reads its input from system memory when its queue's TQSP is "
              "set."),
        Field("dpc", 1, doc="Writes its output to system memory while GTSP is set."),
        Field("tsr", 1, doc="Task-switch ready: the switch happens when this task completes."),
        Field("spl", 1, doc="Clears its queue's TQSP."),
        Field("src_mem", 1, doc="The input always comes from system memory."),
        Field("dst_mem", 1, doc="The output always also goes to system memory."),
        Field("irq", 1, doc="Raise the task_done interrupt when the task completes."),
    ]),
    Register("H1", doc="Identity and dependency.", fields=[
        Field("task_id", 16, doc="Task ID."),
        Field("network", 8, doc="Network ID; must equal the queue's."),
        Field("dep", 8, doc="Dependency distance (0: none)."),
    ]),
    Register("H2", doc="Source.", fields=[
        Field("src", 16, doc="Source offset (words) in the network's window."),
        Field("src_len", 8, doc="Source length (words)."),
    ]),
    Register("H3", doc="Destination.", fields=[
        Field("dst", 16, doc="Destination offset (words) in the network's window."),
    ]),
)
#: Words in the header.
HEADER_WORDS = len(HEADER)
#: Largest descriptor, in words (the width of ``H0.length``).
MAX_LENGTH = HEADER[0]["length"].max

#: An entry's first word.
ENTRY = Register("ENTRY", doc="Entry header: a run of consecutive register writes.", fields=[
    Field("address", 16, doc="Word address of the first register written."),
    Field("count", 16, doc="Registers written (>= 1); that many data words follow."),
])


def reserved_mask(register):
    """Bits of a descriptor word declared by ``register`` (an element of :data:`HEADER`, or
    :data:`ENTRY`) that lie outside every field: they must be 0."""
    if not isinstance(register, Register):
        raise TypeError(f"Register must be a Register, not {register!r}")
    declared = 0
    for f in register.fields:
        declared |= f.mask
    return ~declared & ((1 << DATA_WIDTH) - 1)


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
    """One task. ``blocks`` are :class:`npu_spec.regmap.WriteBlock` (address, count, words)."""
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


def check_address(address, count):
    """:class:`AddressError` unless registers ``address .. address + count - 1`` lie in one
    window of :data:`npu_spec.registers.ADDRESS_WINDOWS`."""
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


def _pack(register, **values):
    try:
        return register.pack(**values)
    except (TypeError, ValueError) as e:
        raise DecodeError(str(e)) from None


def encode(desc):
    """The words of ``desc``; :class:`DescriptorError` for a value that does not fit."""
    if not isinstance(desc, Descriptor):
        raise TypeError(f"Descriptor must be a Descriptor, not {desc!r}")
    if desc.engine not in tuple(Engine):
        names = ", ".join(f"{e.name} ({e.value})" for e in Engine)
        raise DecodeError(f"Engine must be one of {names}, not {desc.engine!r}")
    if desc.length > MAX_LENGTH:
        raise DecodeError(f"Descriptor of {desc.length} words is longer than {MAX_LENGTH}")
    h0, h1, h2, h3 = HEADER
    words = [
        _pack(h0, magic=MAGIC, length=desc.length, engine=int(desc.engine),
              **{name: int(bool(getattr(desc, name))) for name in FLAGS}),
        _pack(h1, task_id=desc.task_id, network=desc.network, dep=desc.dep),
        _pack(h2, src=desc.src, src_len=desc.src_len),
        _pack(h3, dst=desc.dst),
    ]
    for block in desc.blocks:
        address, count, data = block
        data = tuple(data)
        if count != len(data) or count < 1:
            raise DecodeError(f"Entry at 0x{address:X}: count {count!r} must be >= 1 and equal "
                              f"the {len(data)} data words")
        words.append(_pack(ENTRY, address=address, count=count))
        check_address(address, count)
        for w in data:
            if not isinstance(w, int) or isinstance(w, bool) or not 0 <= w < (1 << 32):
                raise DecodeError(f"Data word must be an integer in [0, 0xFFFFFFFF], "
                                  f"not {w!r}")
        words += data
    return words


def _unpack(register, word, what):
    try:
        return register.unpack(word)
    except ValueError:
        raise DecodeError(f"Reserved bits set in {what}: 0x{word:08X}") from None


def decode(words, *, network=None, window=None, address=0, tail=None,
           max_length=MAX_LENGTH):
    """Parse and check the descriptor at the start of ``words``.

    ``network`` (the queue's network ID) and ``window`` (``(base, words)`` of the queue's base
    table entry) enable the corresponding checks; ``address`` is where the descriptor sits in
    memory; ``tail`` (the queue's ``TAIL``; ``None`` or 0: unchecked) is the end of the list:
    a descriptor reaching past it is a :class:`WindowError`; ``max_length`` is the largest
    length accepted (the task manager's slot size).

    The words are checked in memory order, as the task manager's DMA checks them while they
    arrive, so the first failing word decides the error class; within a word, a
    :class:`DecodeError` comes before a :class:`WindowError` or an :class:`AddressError`:

    * H0: magic, engine code (3 is no engine), reserved bits, length below
      :data:`HEADER_WORDS` or above ``max_length`` (decode); the descriptor outside the window
      or past the tail (window);
    * H1: network ID (decode);
    * H2: reserved bits (decode); ``src + src_len`` beyond the window (window);
    * H3: reserved bits (decode); ``dst + 1`` beyond the window (window);
    * each entry: count 0 or running past the length (decode); registers outside every window
      of :data:`npu_spec.registers.ADDRESS_WINDOWS` (address).

    Returns a :class:`Descriptor` or raises a :class:`DescriptorError` subclass.
    """
    words = list(words)
    if not words:
        raise DecodeError("Empty descriptor")
    h0 = HEADER[0].unpack(words[0], strict=False)
    if h0["magic"] != MAGIC:
        raise DecodeError(f"Bad magic 0x{h0['magic']:02X} (expected 0x{MAGIC:02X})")
    if h0["engine"] not in tuple(Engine):
        raise DecodeError(f"Engine {h0['engine']} is not an engine (header word 0: "
                          f"0x{words[0]:08X})")
    _unpack(HEADER[0], words[0], "header word 0")
    length = h0["length"]
    if length < HEADER_WORDS:
        raise DecodeError(f"Length {length} is shorter than the {HEADER_WORDS}-word header")
    if length > max_length:
        raise DecodeError(f"Length {length} is longer than {max_length} words")
    if window is not None:
        check_window("Descriptor", address, length, window)
    if tail and address + length > tail:
        raise WindowError(f"Descriptor 0x{address:X}..0x{address + length - 1:X} reaches past "
                          f"the tail 0x{tail:X}")
    if len(words) < length:
        raise DecodeError(f"Descriptor of length {length} truncated to {len(words)} words")
    h1 = _unpack(HEADER[1], words[1], "header word 1")
    if network is not None and h1["network"] != network:
        raise DecodeError(f"Network ID {h1['network']} differs from the queue's network "
                          f"{network}")
    h2 = _unpack(HEADER[2], words[2], "header word 2")
    if window is not None:
        check_window("Source", window[0] + h2["src"], h2["src_len"], window)
    h3 = _unpack(HEADER[3], words[3], "header word 3")
    if window is not None:
        check_window("Destination", window[0] + h3["dst"], 1, window)
    blocks = []
    k = HEADER_WORDS
    while k < length:
        entry = _unpack(ENTRY, words[k], f"entry word {k}")
        reg, count = entry["address"], entry["count"]
        if count == 0:
            raise DecodeError(f"Entry at word {k} has count 0")
        if k + 1 + count > length:
            raise DecodeError(f"Entry at word {k} (count {count}) runs past the length {length}")
        check_address(reg, count)
        blocks.append(WriteBlock(reg, count, tuple(words[k + 1:k + 1 + count])))
        k += 1 + count
    return Descriptor(engine=int(h0["engine"]), blocks=tuple(blocks), **h1, **h2, **h3,
                      **{name: bool(h0[name]) for name in FLAGS})


def blocks_from_map(regmap, writes):
    """Entries for ``writes`` to ``regmap`` (:meth:`npu_spec.regmap.RegisterMap.encode_block`)."""
    return tuple(regmap.encode_block(writes))
