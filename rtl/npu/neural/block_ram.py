"""Block RAM whose readers never read an entry in the cycle it is written.

Amaranth's synchronous read port returns the old value when the same entry is written in the
same cycle; the iCE40's block RAM does not promise that, so Yosys adds logic that emulates it
(a copy of the write data and address and a comparator per memory: about 140 flip-flops on
the input buffer of the ``icebreaker`` core). The core's input buffer, bias table and
parameter tables are never read and written at the same entry in one cycle (their owners
say why), so they are built here as an asynchronous read port followed by a register, on a
memory marked ``no_rw_check``: Yosys merges the register into the block RAM's read port and
leaves the collision undefined. In simulation the behaviour is that of the synchronous port
(the value before the write).
"""

from amaranth.hdl import Signal
from amaranth.lib.memory import Memory

__all__ = ["block_memory", "registered_read"]


def block_memory(shape, depth):
    """A :class:`Memory` of ``depth`` entries of ``shape``, zero-initialised, whose reads
    (:func:`registered_read`) never meet a write of the same entry."""
    return Memory(shape=shape, depth=depth, init=[], attrs={"no_rw_check": 1})


def registered_read(m, memory, addr, en, *, name):
    """Read ``memory`` (from :func:`block_memory`) at ``addr`` in cycles with ``en``; returns
    the value read, held from the next cycle until the next read (a synchronous read port
    with enable)."""
    port = memory.read_port(domain="comb")
    # Reset-less, as a read port's data is: a reset would keep Yosys from merging the
    # register into the block RAM.
    value = Signal(memory.shape, name=name, reset_less=True)
    m.d.comb += port.addr.eq(addr)
    with m.If(en):
        m.d.sync += value.eq(port.data)
    return value
