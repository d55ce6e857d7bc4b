"""The descriptor DMA and the fetch queue: reads the target queue's head descriptor into the
fetch slot and checks every word as it arrives."""

from amaranth.hdl import Array, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.descriptors import ENTRY, HEADER, HEADER_WORDS, MAGIC, reserved_mask
from npu_spec.engine import Engine
from npu_spec.registers import ADDRESS_WINDOWS
from npu_spec.taskman import BASE_TABLE_SIZE, MAX_QUEUES

from ..lib.csr import register_layout
from ..lib.engine import ADDR_WIDTH, QUEUE_WIDTH
from .layouts import (
    CauseCode,
    ExceptionEvent,
    MemoryWindow,
    MemReadSignature,
    QueueControl,
    QueueStatus,
    fetched_layout,
    slot_word,
)

__all__ = ["Fetch"]


class Fetch(wiring.Component):
    """Descriptor DMA and fetch queue.

    When the fetch queue is empty and there is a target, the DMA reads the target queue's head
    descriptor: in the first cycle it computes the bounds of the window and tail checks from the
    descriptor's address (so that no adder sits in the checks of an arriving word), then it
    requests word 0, then, once the length is known, the rest, pipelined (a request a
    cycle while the memory takes them, up to ``max_in_flight`` reads in flight). The responses
    come back in order after any latency. Each word is written into the fetch slot and checked
    in the cycle it arrives; the outcome is registered and acted on in the next cycle (an
    exception, or the completion by the last word), unless the fetch is stale by then (a
    :class:`~npu_spec.descriptors.DecodeError` check of a word comes before its window or
    address check, and the first failing word decides the cause, as in
    :func:`npu_spec.descriptors.decode`):

    * any word answered with a bus error (``BUS``);
    * H0: magic, engine code, reserved bits, length below the header or above the slot
      (``DECODE``); the descriptor outside the window ``[BASE, BASE + LIMIT)`` or past the
      queue's ``TAIL`` (``WINDOW``; the window and ``TAIL`` are read when the fetch starts);
    * H1: network ID differing from the queue's (``DECODE``);
    * H2: reserved bits (``DECODE``); ``src + src_len`` beyond ``LIMIT`` (``WINDOW``);
    * H3: reserved bits (``DECODE``); ``dst + 1`` beyond ``LIMIT`` (``WINDOW``);
    * an entry word: count 0 or running past the length (``DECODE``); registers outside every
      window of ``ADDRESS_WINDOWS`` (``ADDRESS``).

    An error ends the fetch (the descriptor is dropped; the caller retires the queue); a word
    arriving in the cycle the error is raised is not checked. The last word, once checked,
    completes the descriptor, which waits in the fetch queue until it is committed. The
    fetch queue has no side effects: when it no longer matches the target (another target, the
    head moved, the queue retired) it is dropped, and the new target is fetched.

    A dropped fetch (stale or failed) may still have reads in flight: their number is kept
    (``drain``) and that many responses, the next to come, are discarded before any word is
    taken for a new fetch, so a word of an old fetch is never taken for a new one. A request
    that the memory has not taken stays offered, unchanged, until it is taken (stream rules),
    even when its fetch is dropped meanwhile; it counts as in flight from the cycle it is first
    offered.

    Parameters
    ----------
    queues : int
        Number of task queues.
    slot_words : int
        Words of the fetch slot: the largest descriptor accepted (a power of two).
    max_in_flight : int
        Largest number of reads in flight (offered and not yet answered).
    addr_width : int
        Bits kept of the descriptor address and the window (the lean build's
        ``npu_spec.taskman.address_bits``; the inputs' upper bits are ignored).
    base_entries : int
        Entries of the base-address table in use; a queue whose base index is beyond them has
        the empty window (its descriptors fail with ``WINDOW``).

    Members
    -------
    queue : In(data.ArrayLayout(QueueStatus, queues))
        State of every queue (head pointers, retired flags).
    control : In(data.ArrayLayout(QueueControl, queues))
        Network ID, base-table index and tail of every queue.
    window : In(data.ArrayLayout(MemoryWindow, BASE_TABLE_SIZE))
        The base-address table.
    target : In(QUEUE_WIDTH); target_valid : In(1)
        The queue to fetch from.
    mem : Out(MemReadSignature())
        Descriptor reads (requests and in-order responses).
    fill : Out(stream.Signature(slot_word(slot_words), always_ready=True))
        The words of the descriptor, written into the fetch slot as they arrive.
    descriptor : Out(stream.Signature(fetched_layout(addr_width)))
        The complete, checked descriptor in the fetch queue; a transfer is its commit.
    exception : Out(ExceptionEvent)
        A word of the descriptor failed its check, in the cycle after the word arrived
        (``cause`` is ``NONE`` otherwise; from registers, gated by ``stale``).
    """

    def __init__(self, queues, slot_words, *, max_in_flight=8, addr_width=ADDR_WIDTH,
                 base_entries=BASE_TABLE_SIZE):
        if not isinstance(queues, int) or not 1 <= queues <= MAX_QUEUES:
            raise ValueError(f"Number of queues must be in [1, {MAX_QUEUES}], not {queues!r}")
        if (not isinstance(slot_words, int) or slot_words < 8 or slot_words > 256
                or slot_words & (slot_words - 1)):
            raise ValueError(f"Slot size must be a power of two in [8, 256], not {slot_words!r}")
        if not isinstance(max_in_flight, int) or not 1 <= max_in_flight <= 64:
            raise ValueError(f"Reads in flight must be in [1, 64], not {max_in_flight!r}")
        if not isinstance(addr_width, int) or not 1 <= addr_width <= ADDR_WIDTH:
            raise ValueError(f"Address width must be in [1, {ADDR_WIDTH}], not {addr_width!r}")
        if not isinstance(base_entries, int) or not 1 <= base_entries <= BASE_TABLE_SIZE:
            raise ValueError(f"Base-table entries must be in [1, {BASE_TABLE_SIZE}], "
                             f"not {base_entries!r}")
        self._queues = queues
        self._slot_words = slot_words
        self._max_in_flight = max_in_flight
        self._addr_width = addr_width
        self._base_entries = base_entries
        layout = fetched_layout(addr_width)
        # Fetch state; attributes (not locals of elaborate) so that formal harnesses can state
        # invariants over them.
        self.busy = Signal()            # reading a descriptor
        self.valid = Signal()           # the fetch queue holds a complete descriptor
        # Its queue, address, window, TSR flag and length (written when a fetch starts and
        # looked at only while ``busy`` or ``valid``: no reset).
        self.fetched = Signal(layout, reset_less=True)
        self.length_known = Signal()
        self.issued = Signal(8)         # words requested
        self.received = Signal(8)       # words arrived
        self.in_flight = Signal(range(max_in_flight + 1))   # reads offered, not answered
        self.drain = Signal(range(max_in_flight + 1))       # ... of them, of dropped fetches
        self.hold = Signal()            # a request offered and not taken is offered again
        self.stale = Signal()           # the fetch no longer matches the target
        self.primed = Signal()          # the window's bounds for the checks are computed
        self.checked = Signal()         # a word arrived in the previous cycle; its check is due
        self.check_cause = Signal(CauseCode, reset_less=True)   # ... and its outcome
        super().__init__({
            "queue": In(data.ArrayLayout(QueueStatus, queues)),
            "control": In(data.ArrayLayout(QueueControl, queues)),
            "window": In(data.ArrayLayout(MemoryWindow, BASE_TABLE_SIZE)),
            "target": In(QUEUE_WIDTH),
            "target_valid": In(1),
            "mem": Out(MemReadSignature()),
            "fill": Out(stream.Signature(slot_word(slot_words), always_ready=True)),
            "descriptor": Out(stream.Signature(layout)),
            "exception": Out(ExceptionEvent),
        })

    @property
    def queues(self):
        return self._queues

    @property
    def slot_words(self):
        return self._slot_words

    @property
    def max_in_flight(self):
        return self._max_in_flight

    def elaborate(self, platform):
        m = Module()
        nq = self._queues
        queue = Array(self.queue[i] for i in range(nq))
        control = Array(self.control[i] for i in range(nq))

        busy, valid, fetched = self.busy, self.valid, self.fetched
        slot = fetched.slot
        length_known, issued, received = self.length_known, self.issued, self.received
        in_flight, drain, hold, stale = self.in_flight, self.drain, self.hold, self.stale
        entry_left = Signal(ENTRY["count"].width)   # data words left in the current entry

        # The fetch queue is replaced (no side effects) when it no longer matches the target.
        m.d.comb += stale.eq(~self.target_valid | (slot.queue != self.target) |
                             (queue[slot.queue].head != slot.addr) | queue[slot.queue].retired)

        # Requests: word 0 first, the rest once the length is known. A request not taken is
        # offered again, unchanged, in the next cycle.
        req = self.mem.req
        held_addr = Signal(self._addr_width + 1, reset_less=True)     # looked at with ``hold``
        issue = Signal()
        m.d.comb += issue.eq(busy & self.primed & ~stale & ~hold &
                             (in_flight < self._max_in_flight) &
                             ((issued == 0) | (length_known & (issued < fetched.length))))
        m.d.comb += [req.valid.eq(hold | issue),
                     req.payload.eq(Mux(hold, held_addr, slot.addr + issued))]
        m.d.sync += [hold.eq(req.valid & ~req.ready), held_addr.eq(req.payload)]
        with m.If(issue):
            m.d.sync += issued.eq(issued + 1)

        # Responses, always taken, in request order: the first ``drain`` belong to dropped
        # fetches and are discarded; the others are the words of this fetch.
        resp = self.mem.resp
        m.d.comb += resp.ready.eq(1)
        in_flight_next = Signal.like(in_flight)
        m.d.comb += in_flight_next.eq(in_flight + issue - resp.valid)
        m.d.sync += in_flight.eq(in_flight_next)
        word = resp.payload.data
        k = received
        arrive = Signal()
        m.d.comb += arrive.eq(resp.valid & (drain == 0) & busy & ~stale)
        m.d.comb += [self.fill.valid.eq(arrive & ~resp.payload.err),
                     self.fill.payload.index.eq(k), self.fill.payload.data.eq(word)]

        # The word seen through each declaration.
        h0, h1, h2, h3 = (data.View(register_layout(r), word) for r in HEADER)
        entry = data.View(register_layout(ENTRY), word)
        reserved = [(word & reserved_mask(r)) != 0 for r in HEADER]
        tail = Signal(self._addr_width, reset_less=True)   # the queue's TAIL, read at the start
        # The bounds of the checks, computed in the first cycle of a fetch (no word is
        # requested before): the room left in the window and before the tail from the
        # descriptor's address, saturated at the largest length, and the limit saturated above
        # the largest source or destination end.
        length_max = (1 << HEADER[0]["length"].width) - 1
        end_max = (1 << (max(HEADER[2]["src"].width, HEADER[3]["dst"].width) + 1)) - 1
        room_window = Signal(range(length_max + 1), reset_less=True)
        room_tail = Signal(range(length_max + 1), reset_less=True)
        outside = Signal(reset_less=True)   # the window or the tail is already passed
        tail_passed = Signal(reset_less=True)
        limit = Signal(range(end_max + 1), reset_less=True)
        window_left = Signal(signed(self._addr_width + 2))
        tail_left = Signal(signed(self._addr_width + 2))
        m.d.comb += [window_left.eq(slot.base + slot.limit - slot.addr),
                     tail_left.eq(tail - slot.addr)]
        with m.If(busy & ~self.primed):
            m.d.sync += [self.primed.eq(1),
                         outside.eq((slot.addr < slot.base) | (window_left < 0)),
                         room_window.eq(Mux(window_left > length_max, length_max, window_left)),
                         tail_passed.eq((tail != 0) & (tail_left < 0)),
                         room_tail.eq(Mux((tail == 0) | (tail_left > length_max), length_max,
                                          tail_left)),
                         limit.eq(Mux(slot.limit > end_max, end_max, slot.limit))]
        reg_end = Signal(ENTRY["address"].width + 1)
        m.d.comb += reg_end.eq(entry.address + entry.count)
        in_map = 0
        for start, size in ADDRESS_WINDOWS.values():
            in_map = in_map | ((entry.address >= start) & (reg_end <= start + size))

        # The checks of word k: a decode error, else a misplaced word (window or address).
        undecodable = Signal()
        misplaced = Signal()
        misplaced_cause = Signal(CauseCode)
        with m.Switch(k):
            with m.Case(0):
                m.d.comb += [
                    undecodable.eq((h0.magic != MAGIC) | (h0.engine >= len(Engine)) |
                                   reserved[0] | (h0.length < HEADER_WORDS) |
                                   (h0.length > self._slot_words)),
                    misplaced.eq(outside | (h0.length > room_window) |
                                 tail_passed | (h0.length > room_tail)),
                    misplaced_cause.eq(CauseCode.WINDOW),
                ]
            with m.Case(1):
                m.d.comb += undecodable.eq(reserved[1] |
                                           (h1.network != control[slot.queue].network))
            with m.Case(2):
                m.d.comb += [undecodable.eq(reserved[2]),
                             misplaced.eq(h2.src + h2.src_len > limit),
                             misplaced_cause.eq(CauseCode.WINDOW)]
            with m.Case(3):
                m.d.comb += [undecodable.eq(reserved[3]),
                             misplaced.eq(h3.dst + 1 > limit),
                             misplaced_cause.eq(CauseCode.WINDOW)]
            with m.Default():
                with m.If(entry_left == 0):
                    m.d.comb += [undecodable.eq((entry.count == 0) |
                                                (k + 1 + entry.count > fetched.length)),
                                 misplaced.eq(~in_map),
                                 misplaced_cause.eq(CauseCode.ADDRESS)]
        # The outcome of the check is registered and acted on in the next cycle (the exception,
        # or the completion by the last word), unless the fetch has become stale meanwhile.
        checked = self.checked
        cause = self.check_cause
        last = Signal(reset_less=True)
        m.d.sync += [checked.eq(arrive), last.eq(length_known & (k + 1 == fetched.length)),
                     cause.eq(CauseCode.NONE)]
        with m.If(resp.payload.err):
            m.d.sync += cause.eq(CauseCode.BUS)
        with m.Elif(undecodable):
            m.d.sync += cause.eq(CauseCode.DECODE)
        with m.Elif(misplaced):
            m.d.sync += cause.eq(misplaced_cause)
        error = self.exception
        m.d.comb += [error.queue.eq(slot.queue), error.addr.eq(slot.addr)]
        with m.If(checked & busy & ~stale):
            m.d.comb += error.cause.eq(cause)
        failed = Signal()
        m.d.comb += failed.eq(error.cause != CauseCode.NONE)

        # Progress: the length from H0 (known only when it is a length the slot takes, so that
        # no word beyond the slot is requested while word 0's check is pending), the entry
        # headers' counts; the last word, once checked, completes the descriptor (word 0 never
        # is the last: a descriptor has the 4 header words at least).
        with m.If(arrive):
            m.d.sync += received.eq(received + 1)
            with m.If(k == 0):
                m.d.sync += [fetched.length.eq(h0.length), slot.tsr.eq(h0.tsr),
                             length_known.eq((h0.length >= HEADER_WORDS) &
                                             (h0.length <= self._slot_words))]
            with m.Elif(k >= HEADER_WORDS):
                with m.If(entry_left == 0):
                    m.d.sync += entry_left.eq(entry.count)
                with m.Else():
                    m.d.sync += entry_left.eq(entry_left - 1)
        with m.If(checked & busy & ~stale & last & ~failed):
            m.d.sync += [busy.eq(0), valid.eq(1)]

        # A dropped fetch (failed or stale) leaves its reads in flight to be discarded.
        dropped = Signal()
        m.d.comb += dropped.eq(failed | ((busy | valid) & stale))
        with m.If(dropped):
            m.d.sync += [busy.eq(0), valid.eq(0), drain.eq(in_flight_next)]
        with m.Elif(resp.valid & (drain != 0)):
            m.d.sync += drain.eq(drain - 1)

        # A new fetch from the target's head; the commit empties the queue.
        m.d.comb += [self.descriptor.valid.eq(valid & ~stale),
                     self.descriptor.payload.eq(fetched)]
        table = Signal(MemoryWindow)       # the target's window; empty beyond the table
        with m.Switch(control[self.target].base_index):
            for j in range(self._base_entries):
                with m.Case(j):
                    m.d.comb += table.eq(self.window[j])
        with m.If(~busy & ~valid & self.target_valid):
            m.d.sync += [busy.eq(1), slot.queue.eq(self.target),
                         slot.addr.eq(queue[self.target].head),
                         issued.eq(0), received.eq(0), length_known.eq(0), entry_left.eq(0),
                         self.primed.eq(0),
                         slot.base.eq(table.base), slot.limit.eq(table.limit),
                         tail.eq(control[self.target].tail)]
        with m.If(self.descriptor.valid & self.descriptor.ready):
            m.d.sync += valid.eq(0)
        return m
