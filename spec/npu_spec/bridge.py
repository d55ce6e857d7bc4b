"""The host bridge of a board (``docs/bridge.md``): frame format, address map, UART timing.

The bridge speaks the framing of LiteX's UART bridge, so its host tools can talk to a board:

====================  ==========================================================================
bytes                 meaning
====================  ==========================================================================
1                     command (:class:`Command`)
1                     length ``n``: the number of 32-bit words (0 to 255; 0 does nothing)
4                     word address ``a`` (32-bit word units, big-endian): byte address / 4
``4 n`` (writes)      the data words, each 32 bits big-endian
====================  ==========================================================================

A read answers ``4 n`` bytes: the ``n`` words, each 32 bits big-endian. A write answers nothing.
The incrementing commands access words ``a .. a + n - 1``; the fixed ones access word ``a``
``n`` times.

Address map (32-bit word addresses, :data:`REGIONS`): system memory from word 0 (byte ``4 a``
of the program image is byte 0 of word ``a``, little-endian within the word, as on the NPU's
bus), the NPU's host registers at :data:`NPU_REGS_BASE` (word ``NPU_REGS_BASE + r`` is host
register ``r`` of ``docs/registers.md``), the bridge's own registers (:data:`BRIDGE`) at
:data:`BRIDGE_REGS_BASE`. A frame whose words do not all lie inside one region accesses
nothing: its write data are consumed and dropped, a read answers ``n`` words of 0, and
``STATUS.range_error`` is set.

This module is plain Python: the gateware (``npu.bridge``), the host runtime
(``npu_sim.uart_host``) and the board tops use it.
"""

import enum

from .regmap import Field, Register, RegisterMap

__all__ = ["BRIDGE", "BRIDGE_REGS_BASE", "BRIDGE_REGS_WORDS", "Command", "DEFAULT_BAUD",
           "DEFAULT_TIMEOUT_BITS", "HEADER_BYTES", "MAX_BAUD_ERROR", "MAX_WORDS", "MIN_DIVISOR",
           "NPU_REGS_BASE", "NPU_REGS_WORDS", "Region", "baud_divisor", "frame_region",
           "is_fixed", "is_read", "regions"]


class Command(enum.IntEnum):
    """Command bytes (LiteX's UART bridge)."""
    WRITE = 0x01            # write n words at incrementing addresses
    READ = 0x02             # read n words at incrementing addresses
    WRITE_FIXED = 0x03      # write n words to one address
    READ_FIXED = 0x04       # read one address n times


def is_read(command):
    """True for the commands that answer with data."""
    return Command(command) in (Command.READ, Command.READ_FIXED)


def is_fixed(command):
    """True for the commands that do not increment the address."""
    return Command(command) in (Command.WRITE_FIXED, Command.READ_FIXED)


#: Bytes before the data of a frame: command, length, 4 address bytes.
HEADER_BYTES = 6
#: Largest length of one frame, in 32-bit words.
MAX_WORDS = 255

#: Word address of the NPU's host register 0.
NPU_REGS_BASE = 0x2000_0000
#: Words of the NPU's host register space (its 16-bit host bus address).
NPU_REGS_WORDS = 1 << 16
#: Word address of the bridge's own registers (:data:`BRIDGE`).
BRIDGE_REGS_BASE = 0x3000_0000


BRIDGE = RegisterMap("BRIDGE", base=0, doc=(
    "The bridge's own registers, at word address `BRIDGE_REGS_BASE` of the bridge's address "
    "map (`npu_spec.bridge`): sticky error flags and a count of frames, so a host can tell "
    "whether a frame was lost."
), registers=[
    Register("STATUS", offset=0x0, doc="Sticky error flags; write 1 to a bit to clear it.",
             fields=[
        Field("framing", 1, access="w1c",
              doc="A byte arrived with a low stop bit (it was dropped, and so was the frame)."),
        Field("overrun", 1, access="w1c",
              doc="A received byte found the receive queue full and was lost (the host sent "
                  "while a read answer or a stalled memory access held the bridge); the "
                  "frame was dropped, and every byte until the line was idle."),
        Field("timeout", 1, access="w1c",
              doc="A partial frame was dropped: no byte for the idle timeout."),
        Field("command", 1, access="w1c",
              doc="A byte that is no command arrived where a frame starts; the bridge dropped "
                  "every byte until the line was idle for the idle timeout."),
        Field("range", 1, access="w1c",
              doc="A frame's words did not all lie in one region of the address map: nothing "
                  "was accessed (a read answered zeros)."),
        Field("bus", 1, access="w1c",
              doc="System memory answered a bridge access with `err` (a read answered 0)."),
    ]),
    Register("FRAMES", offset=0x1, doc="Frames completed since reset (modulo 2**16).", fields=[
        Field("count", 16, access="ro", doc="Counts every frame whose last byte arrived."),
    ]),
])

#: Words of the bridge's register window.
BRIDGE_REGS_WORDS = 1 << max(1, (BRIDGE.size - 1).bit_length())


class Region(enum.IntEnum):
    """The regions of the bridge's address map."""
    MEMORY = 0
    NPU = 1
    BRIDGE = 2


def regions(mem_bytes):
    """``{Region: (first word, words)}`` of a board with ``mem_bytes`` bytes of system memory."""
    if not isinstance(mem_bytes, int) or mem_bytes < 4 or mem_bytes % 4:
        raise ValueError(f"system memory must be a positive multiple of 4 bytes, not "
                         f"{mem_bytes!r}")
    if mem_bytes // 4 > NPU_REGS_BASE:
        raise ValueError(f"system memory of {mem_bytes} bytes overlaps the register windows")
    return {
        Region.MEMORY: (0, mem_bytes // 4),
        Region.NPU: (NPU_REGS_BASE, NPU_REGS_WORDS),
        Region.BRIDGE: (BRIDGE_REGS_BASE, BRIDGE_REGS_WORDS),
    }


def frame_region(mem_bytes, command, address, length):
    """The :class:`Region` a frame accesses, or ``None`` when its words are not all inside one
    region (the bridge then accesses nothing). A length of 0 accesses nothing: ``None``."""
    if length == 0:
        return None
    last = address if is_fixed(command) else address + length - 1
    for region, (first, words) in regions(mem_bytes).items():
        if first <= address and last < first + words:
            return region
    return None


#: Default idle timeout of a partial frame, in bit times (0.1 s at 1 Mbaud).
DEFAULT_TIMEOUT_BITS = 100_000
#: Default baud rate of the boards.
DEFAULT_BAUD = 1_000_000
#: Largest relative error of the baud rate a divisor may give: the receiver samples the middle
#: of the stop bit 9.5 bits after the start edge, so the two ends together may be off by under
#: half a bit in 9.5 bits (5.2%); each end gets less than half of that.
MAX_BAUD_ERROR = 0.02
#: Smallest divisor (clock cycles per bit): the receiver needs a few samples per bit.
MIN_DIVISOR = 4


def baud_divisor(clk_freq, baud):
    """Clock cycles per bit for ``baud`` at ``clk_freq`` Hz; :class:`ValueError` naming the
    error when the rate it gives is off by more than :data:`MAX_BAUD_ERROR`."""
    if not isinstance(baud, (int, float)) or baud <= 0:
        raise ValueError(f"baud rate must be a positive number, not {baud!r}")
    if not isinstance(clk_freq, (int, float)) or clk_freq <= 0:
        raise ValueError(f"clock frequency must be a positive number, not {clk_freq!r}")
    divisor = max(1, round(clk_freq / baud))
    if divisor < MIN_DIVISOR:
        raise ValueError(f"{baud} baud needs at least {MIN_DIVISOR} clock cycles per bit; "
                         f"a {clk_freq / 1e6:g} MHz clock gives {clk_freq / baud:.2f}")
    error = abs(clk_freq / divisor - baud) / baud
    if error > MAX_BAUD_ERROR:
        raise ValueError(f"{baud} baud from a {clk_freq / 1e6:g} MHz clock: divisor {divisor} "
                         f"gives {clk_freq / divisor:.0f} baud, {error:.1%} off (more than "
                         f"{MAX_BAUD_ERROR:.0%})")
    return divisor
