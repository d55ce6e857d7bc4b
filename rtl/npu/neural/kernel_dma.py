"""The kernel DMA: streams each output-channel group's kernel parts from the kernel memory.

For every output-channel group it reads the group's entry of the kernel group table
(``npu_spec.kernel.GROUP_TABLE``: header address and words, body address and words), then
streams the header part once and the body part once per work unit (``tiles_y x tiles_x``),
word by word into a queue that feeds the kernel extractor (``docs/neural_engine.md``).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.kernel import GROUP_TABLE, GROUP_TABLE_WORDS

from ..lib.loop import LoopNest
from ..lib.pipe import Queue
from .layouts import KERNEL_WORD, KernelReadSignature

__all__ = ["KernelDMA", "KernelPart", "QUEUE_DEPTH", "group_entry_layout", "queue_entry_layout"]

#: Words the queue in front of the kernel extractor holds by default.
QUEUE_DEPTH = 8


class KernelPart(enum.Enum, shape=2):
    """What a kernel-memory read fetches."""
    TABLE = 0
    HEADER = 1
    BODY = 2


def group_entry_layout():
    """One output-channel group's entry of the kernel group table, as the DMA keeps it."""
    return data.StructLayout({name: 16 for name in GROUP_TABLE})


def queue_entry_layout():
    """A word in the queue: the kernel word and the part (header or body) it belongs to."""
    return data.StructLayout({"word": KERNEL_WORD, "part": KernelPart})


class KernelDMA(wiring.Component):
    """Kernel DMA of one neural engine core.

    A read is issued only while the queue has room for it and every read still in flight, so
    the queue never refuses a word.

    Parameters
    ----------
    slots : int
        Accumulator slots: output channels per group.
    channel_bits : int
        Width of the output-channel counter: ``out_channel_limit(config).bit_length()``
        (``npu_spec.neural``; 24 by default). Layers with more channels are refused at the
        start.
    tile_bits : int
        Width of the work-unit counters (tile row and column):
        ``out_size_limit(config).bit_length()`` (``npu_spec.neural``; 12 by default). Layers
        with more output rows or columns are refused at the start.
    queue_depth : int
        Words of the queue in front of the extractor (:data:`QUEUE_DEPTH` by default, at
        least 2). Reads are issued only while the queue has room for every read in flight,
        so a shallower queue keeps fewer reads in flight and may read kernels more slowly.

    Members
    -------
    start : In(1)
        A layer starts (its registers passed the start check).
    table : In(16)
        Kernel-memory word address of the group table (``KTABLE.addr``).
    out_channels : In(24)
        Output channels of the layer (``K``): groups of ``slots`` channels.
    tiles_y, tiles_x : In(12)
        Work units of the layer: each group's body is streamed ``tiles_y * tiles_x`` times.
    kmem : Out(KernelReadSignature())
        Read port of the kernel memory.
    header, body : Out(stream.Signature(KERNEL_WORD))
        The words of the header and body parts, ``last`` on each part's final word.
    moved : Out(1)
        A read was issued or a word entered the queue in this cycle (for the watchdog).
    """

    def __init__(self, slots, *, channel_bits=24, tile_bits=12, queue_depth=QUEUE_DEPTH):
        self._channel_bits = channel_bits
        self._tile_bits = tile_bits
        if not isinstance(queue_depth, int) or queue_depth < 2:
            raise ValueError(f"queue_depth must be an integer of at least 2, "
                             f"not {queue_depth!r}")
        self._depth = queue_depth
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be a positive integer, not {slots!r}")
        self._slots = slots
        super().__init__({
            "start":        In(1),
            "table":        In(16),
            "out_channels": In(24),
            "tiles_y":      In(12),
            "tiles_x":      In(12),
            "kmem":         Out(KernelReadSignature()),
            "header":       Out(stream.Signature(KERNEL_WORD)),
            "body":         Out(stream.Signature(KERNEL_WORD)),
            "moved":        Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self._depth
        m.submodules.queue = queue = Queue(queue_entry_layout(), depth)
        m.submodules.loop = loop = LoopNest([("base", self._channel_bits, self._slots),
                                             ("ty", self._tile_bits), ("tx", self._tile_bits)])
        m.d.comb += [loop.limit.base.eq(self.out_channels), loop.limit.ty.eq(self.tiles_y),
                     loop.limit.tx.eq(self.tiles_x)]

        # Reads in flight: a read issued in one cycle returns its word in the next.
        issue = Signal()            # a read of any part
        issue_part = Signal()       # ... of a header or body word
        returning = Signal()
        ret_part = Signal(KernelPart)
        ret_last = Signal()
        in_flight = Signal(range(depth + 2))
        room = Signal()
        m.d.sync += returning.eq(issue)
        m.d.sync += in_flight.eq(in_flight + issue_part
                                 - (returning & (ret_part != KernelPart.TABLE)))
        m.d.comb += room.eq(queue.level + in_flight + 1 < depth)

        addr = Signal(16)
        left = Signal(16)           # words of the current part (or table entry) still to read
        part = Signal(KernelPart)
        entry = Signal(group_entry_layout())
        entry_addr = Signal(16)     # table address of the current group's entry
        entry_words = Signal(range(GROUP_TABLE_WORDS + 1))   # entry words received
        m.d.comb += [self.kmem.addr.eq(addr), self.kmem.en.eq(issue)]

        # Table words land in `entry`; part words go to the queue.
        with m.If(returning & (ret_part == KernelPart.TABLE)):
            with m.Switch(entry_words):
                for k, name in enumerate(GROUP_TABLE):
                    with m.Case(k):
                        m.d.sync += getattr(entry, name).eq(self.kmem.data)
            m.d.sync += entry_words.eq(entry_words + 1)
        w = queue.w.payload
        m.d.comb += [
            queue.w.valid.eq(returning & (ret_part != KernelPart.TABLE)),
            w.word.data.eq(self.kmem.data),
            w.word.last.eq(ret_last),
            w.part.eq(ret_part),
            self.moved.eq(issue | queue.w.valid),
        ]

        # The queue's head goes to the header or the body stream.
        r = queue.r.payload
        is_header = r.part == KernelPart.HEADER
        m.d.comb += [
            self.header.payload.eq(r.word),
            self.body.payload.eq(r.word),
            self.header.valid.eq(queue.r.valid & is_header),
            self.body.valid.eq(queue.r.valid & ~is_header),
            queue.r.ready.eq(Mux(is_header, self.header.ready, self.body.ready)),
        ]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.comb += loop.restart.eq(1)
                    m.d.sync += [entry_words.eq(0), entry_addr.eq(self.table),
                                 addr.eq(self.table), left.eq(GROUP_TABLE_WORDS)]
                    m.next = "TABLE"
            with m.State("TABLE"):
                # Read the group's table entry.
                with m.If(left != 0):
                    m.d.comb += issue.eq(1)
                    m.d.sync += [addr.eq(addr + 1), left.eq(left - 1),
                                 ret_part.eq(KernelPart.TABLE)]
                with m.Elif(~returning & (entry_words == GROUP_TABLE_WORDS)):
                    m.d.sync += [addr.eq(entry.header_addr), left.eq(entry.header_words),
                                 part.eq(KernelPart.HEADER)]
                    m.next = "PART"
            with m.State("PART"):
                with m.If((left != 0) & room):
                    m.d.comb += [issue.eq(1), issue_part.eq(1)]
                    m.d.sync += [addr.eq(addr + 1), left.eq(left - 1),
                                 ret_part.eq(part), ret_last.eq(left == 1)]
                with m.Elif(left == 0):
                    # Next part: a body per work unit after the header, then the next group.
                    with m.If(part == KernelPart.HEADER):
                        m.d.sync += [addr.eq(entry.body_addr), left.eq(entry.body_words),
                                     part.eq(KernelPart.BODY)]
                    with m.Else():
                        m.d.comb += loop.advance.eq(1)
                        with m.If(~loop.last.ty | ~loop.last.tx):
                            m.d.sync += [addr.eq(entry.body_addr), left.eq(entry.body_words)]
                        with m.Elif(~loop.last.base):
                            next_entry = entry_addr + GROUP_TABLE_WORDS
                            m.d.sync += [entry_words.eq(0), left.eq(GROUP_TABLE_WORDS),
                                         entry_addr.eq(next_entry), addr.eq(next_entry)]
                            m.next = "WAIT_TABLE"
                        with m.Else():
                            m.next = "IDLE"
            with m.State("WAIT_TABLE"):
                # Let the last part's reads land before the table read reuses `ret_part`.
                with m.If(~returning):
                    m.next = "TABLE"
        return m
