"""The lean task buffer: one task in flight at a time."""

from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import data, wiring

from ..lib.engine import ADDR_WIDTH, TaskEntry
from .taskbuffer import ENGINES, task_buffer_members

__all__ = ["SerialTaskBuffer"]

#: The address fields of a task entry, kept in ``addr_width`` bits by the lean buffer.
_ADDRESSES = ("base", "limit", "addr")


class SerialTaskBuffer(wiring.Component):
    """The task buffer of the lean task manager (``NPUConfig.taskman_impl == "lean"``): one
    entry, so tasks run one at a time in list order, as the full
    :class:`~npu.taskman.taskbuffer.TaskBuffer` does with a skew limit of 1.

    Every rule of the full buffer holds trivially: a task is loaded only into the empty buffer,
    so the task it depends on, every older task of its engine and every older barrier task have
    completed before it starts, and a barrier task is always alone. ``skew`` is ignored.
    Ports and entry state are those of :class:`~npu.taskman.taskbuffer.TaskBuffer` (depth 1),
    so the same formal harness checks both; the start and finish payloads are the entry itself
    whatever their ``valid``, and the entry keeps its memory window and descriptor address in
    ``addr_width`` bits (the upper bits of the start beat are 0).

    Parameters
    ----------
    queues : int
        Number of task queues (width of ``drop``).
    addr_width : int
        Bits kept of ``base``, ``limit`` and ``addr`` (``npu_spec.taskman.address_bits``).
    """

    def __init__(self, queues=8, *, addr_width=ADDR_WIDTH):
        if not isinstance(addr_width, int) or not 1 <= addr_width <= ADDR_WIDTH:
            raise ValueError(f"Address width must be in [1, {ADDR_WIDTH}], not {addr_width!r}")
        self._addr_width = addr_width
        super().__init__(task_buffer_members(queues))
        # Entry state, named as in TaskBuffer (formal harnesses state invariants over it).
        self.valid = [Signal(name="valid0")]
        self.started = [Signal(name="started0")]
        self.entry = [Signal(TaskEntry, name="entry0")]
        self.running = [Signal(range(1), name=f"running{e}") for e in range(ENGINES)]
        self.running_valid = [Signal(name=f"running_valid{e}") for e in range(ENGINES)]

    @property
    def depth(self):
        return 1

    @property
    def addr_width(self):
        return self._addr_width

    def elaborate(self, platform):
        m = Module()
        valid, started, entry = self.valid[0], self.started[0], self.entry[0]

        # The stored entry: every field of TaskEntry, the addresses in ``addr_width`` bits.
        stored = data.StructLayout({
            name: (unsigned(self._addr_width) if name in _ADDRESSES else member.shape)
            for name, member in TaskEntry})
        kept = Signal(stored)
        for name, _ in TaskEntry:
            m.d.comb += entry[name].eq(kept[name])

        dropped = Signal()
        m.d.comb += dropped.eq(valid & ~started &
                               (self.drop | self.withdraw).bit_select(entry.queue, 1))
        for e in range(ENGINES):
            of_engine = valid & (entry.engine == e)
            start = self.start[e]
            m.d.comb += [
                self.running_valid[e].eq(of_engine & started),
                start.payload.eq(entry),
                start.valid.eq(of_engine & ~started & ~dropped),
                self.finished[e].eq(entry),
                self.finished_valid[e].eq(self.running_valid[e] & (self.done[e] | self.kill[e])),
                self.waiting[e].eq(of_engine & ~started & ~start.valid),
                self.loaded[e].eq(of_engine),
            ]
            with m.If(start.valid & start.ready):
                m.d.sync += started.eq(1)
            with m.If(self.finished_valid[e]):
                m.d.sync += valid.eq(0)
        with m.If(dropped):
            m.d.sync += valid.eq(0)

        # Loading into the empty buffer.
        m.d.comb += [self.empty.eq(~valid), self.load.ready.eq(~valid)]
        with m.If(self.load.valid & self.load.ready):
            m.d.sync += [valid.eq(1), started.eq(0), self.next_seq.eq(self.next_seq + 1)]
            for name, _ in TaskEntry:
                m.d.sync += kept[name].eq(self.load.payload[name])
            m.d.sync += kept.seq.eq(self.next_seq)
        return m
