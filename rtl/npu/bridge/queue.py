"""The bridge's receive queue: :class:`ByteQueue`."""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..neural.block_ram import block_memory, registered_read

__all__ = ["ByteQueue"]


class ByteQueue(wiring.Component):
    """A first-in first-out queue of ``depth`` bytes in one block RAM.

    The bytes wait in a memory with a synchronous read port whose output register is the
    queue's head (``r``): a byte written into an empty queue is on ``r`` two cycles later. The
    pointers wrap at ``depth`` (a power of two) by themselves; one count of the bytes held
    (memory and head together) gives ``w.ready`` by a test for equality, so the queue has no
    comparator and no pointer that wraps by logic (``amaranth.lib.fifo.SyncFIFOBuffered`` of the
    same capacity keeps ``depth - 1`` bytes in its memory and wraps its pointers at that).

    Parameters
    ----------
    depth : int
        Bytes the queue holds: a power of two, at least 2.

    Members
    -------
    w : In(stream.Signature(8))
        Bytes in; ``ready`` is low while the queue holds ``depth`` bytes.
    r : Out(stream.Signature(8))
        Bytes out, in the order they came.
    """

    def __init__(self, depth):
        if not isinstance(depth, int) or depth < 2 or depth & (depth - 1):
            raise ValueError(f"depth must be a power of two of at least 2, not {depth!r}")
        self._depth = depth
        super().__init__({"w": In(stream.Signature(8)), "r": Out(stream.Signature(8))})

    @property
    def depth(self):
        return self._depth

    def elaborate(self, platform):
        m = Module()
        depth = self._depth
        # The memory is never read and written at one address in one cycle (below), so
        # Yosys need not emulate a read-first port around the block RAM (``block_memory``).
        m.submodules.memory = memory = block_memory(8, depth)
        write = memory.write_port()
        produce = Signal(range(depth))
        consume = Signal(range(depth))
        held = Signal(range(depth + 1))         # bytes in the memory and in the head

        # In: a byte is written while fewer than ``depth`` are held.
        m.d.comb += [self.w.ready.eq(held != depth), write.addr.eq(produce),
                     write.data.eq(self.w.payload), write.en.eq(self.w.valid & self.w.ready)]
        with m.If(write.en):
            m.d.sync += produce.eq(produce + 1)

        # Out: the read port's register is the head; it is refilled from the memory when it is
        # empty or being taken and the memory holds a byte (``held`` counts the head too). The
        # memory is never read and written at one address in one cycle: they meet only when it
        # is empty (no read) or full (no write).
        in_memory = (held != 0) & ~((held == 1) & self.r.valid)
        taken = self.r.valid & self.r.ready
        refill = in_memory & (~self.r.valid | self.r.ready)
        head = registered_read(m, memory, consume, refill, name="head")
        m.d.comb += self.r.payload.eq(head)
        with m.If(refill):
            m.d.sync += [consume.eq(consume + 1), self.r.valid.eq(1)]
        with m.Elif(taken):
            m.d.sync += self.r.valid.eq(0)

        with m.If(write.en & ~taken):
            m.d.sync += held.eq(held + 1)
        with m.Elif(taken & ~write.en):
            m.d.sync += held.eq(held - 1)
        return m
