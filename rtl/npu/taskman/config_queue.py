"""The configuration queue: committed descriptors waiting to be programmed, and the fetch slot
after them, in one memory."""

from amaranth.hdl import Array, Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..lib.engine import ADDR_WIDTH
from .layouts import SlotReadSignature, slot_info, slot_word
from .slots import SlotRing

__all__ = ["ConfigQueue"]


class ConfigQueue(wiring.Component):
    """A FIFO of ``depth`` committed descriptors and the fetch slot, each ``slot_words`` words.

    The slots are a :class:`~npu.taskman.slots.SlotRing` over one memory of
    ``(depth + 1) * slot_words`` words. The DMA writes the arriving descriptor into the fetch
    slot (``fill``); a commit makes the fetch slot the youngest committed slot, with its
    :data:`~npu.taskman.layouts.SlotInfo`, and the next slot becomes the fetch slot. The
    programming stage reads the oldest committed slot (``read``) and pops it. The fetch slot is
    never a committed slot, so a fetch or its replacement never overwrites committed words.

    Parameters
    ----------
    depth : int
        Committed descriptors held (1 to 15).
    slot_words : int
        Words per slot (a power of two).
    addr_width : int
        Bits of the addresses kept of each slot (:func:`~npu.taskman.layouts.slot_info`).

    Members
    -------
    fill : In(stream.Signature(slot_word(slot_words), always_ready=True))
        A word of the descriptor in the fetch slot.
    commit : In(1); info : In(slot_info(addr_width))
        Commit the fetch slot, with what is kept of it; taken only when not ``full``.
    full : Out(1)
        ``depth`` descriptors are committed.
    read : In(SlotReadSignature(slot_words, addr_width))
        The oldest committed descriptor: its words (one cycle after the index) and info, and
        its release.
    """

    def __init__(self, depth, slot_words, *, addr_width=ADDR_WIDTH):
        if not isinstance(depth, int) or not 1 <= depth <= 15:
            raise ValueError(f"Configuration queue depth must be in [1, 15], not {depth!r}")
        if (not isinstance(slot_words, int) or slot_words < 2
                or slot_words & (slot_words - 1)):
            raise ValueError(f"Slot size must be a power of two, not {slot_words!r}")
        self._depth = depth
        self._slot_words = slot_words
        self._info = slot_info(addr_width)
        super().__init__({
            "fill": In(stream.Signature(slot_word(slot_words), always_ready=True)),
            "commit": In(1),
            "info": In(self._info),
            "full": Out(1),
            "read": In(SlotReadSignature(slot_words, addr_width)),
        })

    @property
    def depth(self):
        return self._depth

    @property
    def slot_words(self):
        return self._slot_words

    def elaborate(self, platform):
        m = Module()
        slots = self._depth + 1
        m.submodules.ring = ring = SlotRing(self._depth)
        m.d.comb += [ring.commit.eq(self.commit), ring.pop.eq(self.read.pop),
                     self.full.eq(ring.full), self.read.valid.eq(~ring.empty)]

        # The words: word i of slot s at s * slot_words + i.
        m.submodules.words = words = Memory(shape=32, depth=slots * self._slot_words, init=[])
        write = words.write_port()
        m.d.comb += [write.addr.eq(Cat(self.fill.payload.index, ring.wr)),
                     write.data.eq(self.fill.payload.data), write.en.eq(self.fill.valid)]
        read = words.read_port(transparent_for=())
        m.d.comb += [read.addr.eq(Cat(self.read.index, ring.rd)),
                     self.read.data.eq(read.data)]

        # What is kept of each slot, written at its commit (looked at only while the slot is
        # committed: no reset).
        info = Array(Signal(self._info, name=f"info{s}", reset_less=True) for s in range(slots))
        with m.If(ring.committed):
            m.d.sync += info[ring.wr].eq(self.info)
        m.d.comb += self.read.info.eq(info[ring.rd])
        return m
