"""Circular M-slot producer/consumer flow control of one dataset (seed 002's scheduler;
``docs/system.md``, "Flow control").

A producer writes the dataset's units (rows) ``0 .. N-1`` in order, unit ``r`` into slot
``r mod M``; a consumer works through its own units ``0 .. U-1`` in order, and consumer unit
``c`` reads producer units ``c * S - P .. c * S - P + K - 1`` (clipped to ``[0, N)``): a window
of ``K`` rows with stride ``S`` and padding ``P``. Two rules keep the data right:

* *sufficient*: consumer unit ``c`` may start only when the last unit it reads has been
  written (``produced > min(c S - P + K - 1, N - 1)``);
* *threshold*: the producer may write unit ``r`` only when its slot is free, that is when no
  unfinished consumer unit reads unit ``r - M`` (``r - M < max(0, c S - P)`` for the oldest
  unfinished unit ``c``, or every consumer unit is finished).

The unit tracks ``produced`` (units written) and ``consumed`` (consumer units finished) and
keeps ``c S - P`` incrementally, so it needs no multiplier. :func:`npu_model.flow` states the
same rules for the golden model.
"""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["FlowControl", "FlowParams"]

#: Width of unit counts.
COUNT_BITS = 12

#: The parameters of a producer/consumer pair.
FlowParams = data.StructLayout({
    "rows":   COUNT_BITS,       # N, units the producer writes
    "units":  COUNT_BITS,       # U, units the consumer works through
    "slots":  COUNT_BITS,       # M, slots of the circular buffer
    "kernel": 5,                # K, rows a consumer unit reads
    "stride": 4,                # S
    "pad":    4,                # P
})


class FlowControl(wiring.Component):
    """The flow-control state of one dataset.

    Members
    -------
    params : In(FlowParams)
        Sampled at ``start``.
    start : In(1)
        Begin: no unit written, none consumed.
    produce : In(1)
        The producer finished writing unit ``produced`` (only while ``may_produce``).
    consume : In(1)
        The consumer finished unit ``consumed`` (only while ``may_consume``).
    may_produce, may_consume : Out(1)
        The threshold and sufficient rules for the next unit of each side.
    slot : Out(COUNT_BITS)
        Slot of the next unit the producer writes.
    first_slot : Out(COUNT_BITS)
        Slot of the first unit the next consumer unit reads.
    produced, consumed : Out(COUNT_BITS + 1)
        Units written, consumer units finished.
    done : Out(1)
        Every unit written and consumed.
    """

    params: In(FlowParams)
    start: In(1)
    produce: In(1)
    consume: In(1)
    may_produce: Out(1)
    may_consume: Out(1)
    slot: Out(COUNT_BITS)
    first_slot: Out(COUNT_BITS)
    produced: Out(COUNT_BITS + 1)
    consumed: Out(COUNT_BITS + 1)
    done: Out(1)

    def __init__(self):
        super().__init__()
        # State; attributes (not locals of elaborate) so that formal harnesses can state
        # invariants over them: the latched parameters, and c S - P of the next consumer unit.
        self.p = Signal(FlowParams)
        self.window = Signal(signed(COUNT_BITS + 6))

    def elaborate(self, platform):
        m = Module()
        p, window = self.p, self.window
        # The first unit the next consumer unit reads (clipped to 0).
        first = Signal(COUNT_BITS + 1)
        last = Signal(signed(COUNT_BITS + 7))
        m.d.comb += [
            first.eq(Mux(window < 0, 0, window)),
            last.eq(window + p.kernel - 1),
        ]
        all_consumed = self.consumed >= p.units
        all_produced = self.produced >= p.rows
        needed = Signal(COUNT_BITS + 1)        # last unit the next consumer unit reads, + 1
        m.d.comb += needed.eq(Mux(last >= p.rows - 1, p.rows, last + 1))
        m.d.comb += [
            self.may_consume.eq(~all_consumed & (self.produced >= needed)),
            self.may_produce.eq(~all_produced &
                                (all_consumed | (self.produced < first + p.slots))),
            self.done.eq(all_consumed & all_produced),
        ]

        with m.If(self.start):
            m.d.sync += [p.eq(self.params), self.produced.eq(0), self.consumed.eq(0),
                         window.eq(-self.params.pad), self.slot.eq(0), self.first_slot.eq(0)]
        with m.Else():
            with m.If(self.produce & self.may_produce):
                m.d.sync += [self.produced.eq(self.produced + 1),
                             self.slot.eq(Mux(self.slot + 1 == p.slots, 0, self.slot + 1))]
            with m.If(self.consume & self.may_consume):
                m.d.sync += [self.consumed.eq(self.consumed + 1), window.eq(window + p.stride)]
                # The slot of the new first unit: advance by the units the window passed.
                new_first = Signal(COUNT_BITS + 1)
                m.d.comb += new_first.eq(Mux(window + p.stride < 0, 0, window + p.stride))
                step = Signal(COUNT_BITS + 1)
                m.d.comb += step.eq(new_first - first)
                wrapped = Signal(COUNT_BITS + 2)
                m.d.comb += wrapped.eq(self.first_slot + step)
                m.d.sync += self.first_slot.eq(Mux(wrapped >= p.slots, wrapped - p.slots,
                                                   wrapped))
        return m
