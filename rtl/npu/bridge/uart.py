"""A UART: 8 data bits, no parity, one stop bit, least significant bit first.

:class:`UARTRx` samples each bit in its middle and flags a low stop bit; :class:`UARTTx` sends
one byte after another with no gap. The bit time is a whole number of clock cycles
(:func:`npu_spec.bridge.baud_divisor`), and a clock and baud rate whose divisor is too far off
are rejected when the component is built.
"""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from npu_spec.bridge import baud_divisor

__all__ = ["UARTRx", "UARTTx"]


class _UARTBase(wiring.Component):
    def __init__(self, clk_freq, baud, members):
        self._divisor = baud_divisor(clk_freq, baud)
        self._clk_freq = clk_freq
        self._baud = baud
        super().__init__(members)

    @property
    def divisor(self):
        """Clock cycles per bit."""
        return self._divisor

    @property
    def clk_freq(self):
        return self._clk_freq

    @property
    def baud(self):
        return self._baud


class UARTRx(_UARTBase):
    """UART receiver.

    The line passes two flip-flops (it comes from a pin). A falling edge starts a byte; the
    start bit is checked half a bit later (a shorter low pulse is ignored), then each data bit
    and the stop bit are sampled a bit time apart, in their middles. A byte with a high stop
    bit is delivered on ``data``; a low stop bit drops the byte, pulses ``framing_error`` and
    waits for the line to go high before the next start bit.

    Parameters
    ----------
    clk_freq : int or float
        Clock frequency in Hz.
    baud : int or float
        Baud rate.

    Members
    -------
    rx : In(1)
        The serial line (idle high).
    data : Out(stream.Signature(8))
        Received bytes. A byte waits for ``ready``; one that arrives while the previous one
        still waits is dropped and pulses ``overrun``.
    framing_error : Out(1)
        One-cycle pulse: a byte had a low stop bit.
    overrun : Out(1)
        One-cycle pulse: a byte was lost because ``data`` was not taken.
    active : Out(1)
        A byte is being received (from its start edge to its stop bit).
    """

    def __init__(self, clk_freq, baud):
        super().__init__(clk_freq, baud, {
            "rx":            In(1, init=1),
            "data":          Out(stream.Signature(8)),
            "framing_error": Out(1),
            "overrun":       Out(1),
            "active":        Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        div = self._divisor
        line = Signal(init=1)
        m.submodules.sync = FFSynchronizer(self.rx, line, init=1)

        # The byte waiting for the consumer.
        with m.If(self.data.ready):
            m.d.sync += self.data.valid.eq(0)

        timer = Signal(range(div))
        bit = Signal(range(8))
        shreg = Signal(8)
        sample = timer == 0
        with m.If(~sample):
            m.d.sync += timer.eq(timer - 1)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += timer.eq(div // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                m.d.comb += self.active.eq(1)
                with m.If(sample):
                    m.d.sync += [timer.eq(div - 1), bit.eq(0)]
                    # A start bit that is no longer low was a glitch.
                    m.next = "IDLE"
                    with m.If(~line):
                        m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += self.active.eq(1)
                with m.If(sample):
                    m.d.sync += [timer.eq(div - 1), shreg.eq(Cat(shreg[1:], line)),
                                 bit.eq(bit + 1)]
                    with m.If(bit == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                m.d.comb += self.active.eq(1)
                with m.If(sample):
                    with m.If(line):
                        m.next = "IDLE"
                        with m.If(self.data.valid & ~self.data.ready):
                            m.d.comb += self.overrun.eq(1)
                        with m.Else():
                            m.d.sync += [self.data.valid.eq(1), self.data.payload.eq(shreg)]
                    with m.Else():
                        m.d.comb += self.framing_error.eq(1)
                        m.next = "BREAK"
            with m.State("BREAK"):
                # A low stop bit: wait for the line to be idle before the next start bit.
                with m.If(line):
                    m.next = "IDLE"
        return m


class UARTTx(_UARTBase):
    """UART transmitter: start bit, 8 data bits, stop bit; the next byte's start bit follows
    the stop bit directly.

    Parameters
    ----------
    clk_freq : int or float
        Clock frequency in Hz.
    baud : int or float
        Baud rate.

    Members
    -------
    data : In(stream.Signature(8))
        Bytes to send.
    tx : Out(1)
        The serial line (idle high; registered).
    active : Out(1)
        A byte is being sent.
    """

    def __init__(self, clk_freq, baud):
        super().__init__(clk_freq, baud, {
            "data":   In(stream.Signature(8)),
            "tx":     Out(1, init=1),
            "active": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        div = self._divisor
        timer = Signal(range(div))
        left = Signal(range(10))            # bits still to put on the line after this one
        shreg = Signal(9)                   # data bits, then the stop bit
        busy = Signal()
        bit_end = timer == 0
        with m.If(~bit_end):
            m.d.sync += timer.eq(timer - 1)

        # A byte is taken when idle or in the last cycle of a stop bit.
        done = busy & bit_end & (left == 0)
        m.d.comb += [self.data.ready.eq(~busy | done), self.active.eq(busy)]
        with m.If(self.data.valid & self.data.ready):
            m.d.sync += [busy.eq(1), self.tx.eq(0), shreg.eq(Cat(self.data.payload, 1)),
                         left.eq(9), timer.eq(div - 1)]
        with m.Elif(done):
            m.d.sync += busy.eq(0)
        with m.Elif(busy & bit_end):
            m.d.sync += [self.tx.eq(shreg[0]), shreg.eq(shreg[1:]), left.eq(left - 1),
                         timer.eq(div - 1)]
        return m
