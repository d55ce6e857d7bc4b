"""The programming stage: the oldest committed descriptor becomes register writes to the blocks
and a task in the task buffer."""

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.descriptors import ENTRY, HEADER, HEADER_WORDS, SWITCH_POINTS
from npu_spec.taskman import MAX_QUEUES

from ..lib.csr import register_layout
from ..lib.engine import ADDR_WIDTH, SEQ_WIDTH, TaskEntry, WriteLayout
from .layouts import SlotReadSignature
from .taskbuffer import ENGINES

__all__ = ["Programmer"]


class Programmer(wiring.Component):
    """Reads the oldest committed descriptor word by word, sends its entries as register writes
    and then loads its task into the task buffer.

    The header words H0..H3 are kept (their fields, through the declarations of
    :data:`npu_spec.descriptors.HEADER`, make the task entry, with the queue, the descriptor
    address and the network's memory window ``base``, ``limit`` of the slot); each entry word
    gives the first register address and the count of the data words that follow, each sent on
    ``writes`` as
    ``(address + i, data[i])`` when the blocks are ready, tagged with the sequence number the
    task gets in the task buffer. After the last word the task is loaded, then the descriptor
    is popped. The slot memory is read one word ahead, so one word is handled per cycle.

    A descriptor of a dropped queue (a watchdog timeout) is popped without further writes or a
    load, in whatever state the stage is.

    Parameters
    ----------
    queues : int
        Number of task queues (width of ``drop``).
    slot_words : int
        Words per descriptor slot.
    addr_width : int
        Bits of the slot's addresses (zero-extended into the task entry).

    Members
    -------
    slot : Out(SlotReadSignature(slot_words, addr_width))
        The configuration queue's read side.
    drop : In(queues)
        Bit ``i``: queue ``i``'s committed descriptors are dropped.
    next_seq : In(SEQ_WIDTH)
        The sequence number the next loaded task gets (the tag of the writes).
    writes : Out(stream.Signature(WriteLayout))
        Register writes to the blocks.
    load : Out(stream.Signature(TaskEntry))
        The task, after its writes (``seq`` is left to the task buffer).
    dropped_tsr : Out(1)
        A TSR task is dropped from the configuration queue in this cycle (combinational).
    engine_busy : In(ENGINES)
        Per engine: a task of it is loaded or running; a descriptor's register writes wait
        until its engine has none.
    """

    def __init__(self, queues, slot_words, *, addr_width=ADDR_WIDTH):
        if not isinstance(queues, int) or not 1 <= queues <= MAX_QUEUES:
            raise ValueError(f"Number of queues must be in [1, {MAX_QUEUES}], not {queues!r}")
        if (not isinstance(slot_words, int) or slot_words < 8 or slot_words > 256
                or slot_words & (slot_words - 1)):
            raise ValueError(f"Slot size must be a power of two in [8, 256], not {slot_words!r}")
        self._queues = queues
        self._slot_words = slot_words
        super().__init__({
            "slot": Out(SlotReadSignature(slot_words, addr_width)),
            "drop": In(queues),
            "next_seq": In(SEQ_WIDTH),
            "writes": Out(stream.Signature(WriteLayout)),
            "load": Out(stream.Signature(TaskEntry)),
            "dropped_tsr": Out(1),
            "engine_busy": In(ENGINES),
        })

    @property
    def queues(self):
        return self._queues

    @property
    def slot_words(self):
        return self._slot_words

    def elaborate(self, platform):
        m = Module()
        slot = self.slot
        word = slot.data
        # The descriptor's state, written in IDLE or from its own words before it is looked
        # at: no reset.
        k = Signal(8, reset_less=True)                  # word of the descriptor on ``word``
        length = Signal(HEADER[0]["length"].width, reset_less=True)
        header = [Signal(register_layout(r), name=f"h{n}", reset_less=True)
                  for n, r in enumerate(HEADER)]
        word_h0 = data.View(register_layout(HEADER[0]), word)     # the word seen as H0
        entry = data.View(register_layout(ENTRY), word)
        address = Signal(unsigned(ENTRY["address"].width), reset_less=True)  # next write's
        left = Signal(unsigned(ENTRY["count"].width), reset_less=True)   # data words left
        dropped = Signal()
        m.d.comb += dropped.eq(self.drop.bit_select(slot.info.queue, 1))

        # The task entry: every header field the entry has, plus where the task came from.
        load = self.load.payload
        for n, register in enumerate(HEADER):
            for f in register.fields:
                if f.name in TaskEntry.members:
                    m.d.comb += load[f.name].eq(header[n][f.name])
        m.d.comb += [
            load.barrier.eq(Cat(header[0][name] for name in SWITCH_POINTS).any()),
            load.queue.eq(slot.info.queue), load.base.eq(slot.info.base),
            load.limit.eq(slot.info.limit), load.addr.eq(slot.info.addr),
        ]
        m.d.comb += [self.writes.payload.addr.eq(address), self.writes.payload.data.eq(word),
                     self.writes.payload.seq.eq(self.next_seq)]

        # The slot memory is read one word ahead: ``index`` is the word presented next cycle.
        advance = Signal()
        m.d.comb += slot.index.eq(Mux(advance, k + 1, k))
        with m.FSM(name="program"):
            with m.State("IDLE"):
                m.d.comb += slot.index.eq(0)
                with m.If(slot.valid):
                    with m.If(dropped):
                        m.d.comb += slot.pop.eq(1)
                    with m.Else():
                        m.d.sync += [k.eq(0), left.eq(0)]
                        m.next = "WORD"
            with m.State("WORD"):
                with m.If(dropped):
                    m.d.comb += slot.pop.eq(1)
                    m.next = "IDLE"
                with m.Elif(k < HEADER_WORDS):
                    # A header word.
                    for n in range(HEADER_WORDS):
                        with m.If(k == n):
                            m.d.sync += header[n].eq(word)
                    with m.If(k == 0):
                        m.d.sync += length.eq(word_h0.length)
                    m.d.comb += advance.eq(1)
                with m.Elif(left == 0):
                    # An entry word.
                    m.d.sync += [address.eq(entry.address), left.eq(entry.count)]
                    m.d.comb += advance.eq(1)
                with m.Elif(~self.engine_busy.bit_select(header[0].engine, 1)):
                    # A data word, once no earlier task of the engine is loaded or running:
                    # a task's program never changes the registers of an earlier task of its
                    # engine (engines read some registers while they run).
                    m.d.comb += self.writes.valid.eq(1)
                    with m.If(self.writes.ready):
                        m.d.sync += [address.eq(address + 1), left.eq(left - 1)]
                        m.d.comb += advance.eq(1)
                with m.If(advance):
                    m.d.sync += k.eq(k + 1)
                    with m.If((k != 0) & (k + 1 == length)):
                        m.next = "LOAD"
            with m.State("LOAD"):
                with m.If(dropped):
                    m.d.comb += slot.pop.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += self.load.valid.eq(1)
                    with m.If(self.load.ready):
                        m.d.comb += slot.pop.eq(1)
                        m.next = "IDLE"
        # A dropped TSR task no longer blocks commits.
        m.d.comb += self.dropped_tsr.eq(slot.pop & dropped & slot.info.tsr)
        return m

