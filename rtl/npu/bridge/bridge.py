"""The host bridge behind a UART: :class:`UARTBridge`."""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu_spec.bridge import DEFAULT_BAUD, DEFAULT_TIMEOUT_BITS, baud_divisor

from ..lib.csr import CSRSignature
from ..lib.wishbone import ADDR_BITS, WishboneSignature
from .core import BridgeCore
from .queue import ByteQueue
from .uart import UARTRx, UARTTx

__all__ = ["UARTBridge"]


class UARTBridge(wiring.Component):
    """The host bridge (``docs/bridge.md``): :class:`~npu.bridge.uart.UARTRx`, a receive
    queue, :class:`~npu.bridge.core.BridgeCore` and :class:`~npu.bridge.uart.UARTTx`.

    The queue holds the bytes that arrive while the frame engine waits for system memory (the
    NPU may hold the bus) or sends a read's answer.

    Parameters
    ----------
    clk_freq : int or float
        Clock frequency in Hz.
    baud : int or float
        Baud rate; a clock that cannot make it within 2% is an error.
    mem_bytes : int
        System memory mapped from word 0, in bytes.
    mem_width : int
        System-memory bus width.
    timeout_bits : int
        Idle timeout of a partial frame, in bit times.
    rx_depth : int
        Bytes of the receive queue (:class:`~npu.bridge.queue.ByteQueue`): a power of two.
    host_addr_bits : int
        Width of the NPU's host bus address.

    Members
    -------
    rx : In(1)
        Serial line from the host (idle high).
    tx : Out(1)
        Serial line to the host.
    mem : Out(WishboneSignature(ADDR_BITS, mem_width))
    csr : Out(CSRSignature(host_addr_bits))
    busy : Out(1)
        A frame is in progress.
    error : Out(1)
        A flag of the bridge's ``STATUS`` register is set.
    """

    def __init__(self, *, clk_freq, mem_bytes, baud=DEFAULT_BAUD, mem_width=32,
                 timeout_bits=DEFAULT_TIMEOUT_BITS, rx_depth=16, host_addr_bits=16):
        # The parts are made in ``elaborate``; the parameters are checked here.
        self._divisor = self.check(clk_freq=clk_freq, mem_bytes=mem_bytes, baud=baud,
                                   mem_width=mem_width, timeout_bits=timeout_bits,
                                   rx_depth=rx_depth, host_addr_bits=host_addr_bits)
        self._clk_freq = clk_freq
        self._baud = baud
        self._mem_bytes = mem_bytes
        self._mem_width = mem_width
        self._timeout = timeout_bits * self._divisor
        self._host_addr_bits = host_addr_bits
        self._rx_depth = rx_depth
        super().__init__({
            "rx":    In(1, init=1),
            "tx":    Out(1, init=1),
            "mem":   Out(WishboneSignature(ADDR_BITS, mem_width)),
            "csr":   Out(CSRSignature(host_addr_bits)),
            "busy":  Out(1),
            "error": Out(1),
        })

    @staticmethod
    def check(*, clk_freq, mem_bytes, baud=DEFAULT_BAUD, mem_width=32,
              timeout_bits=DEFAULT_TIMEOUT_BITS, rx_depth=16, host_addr_bits=16):
        """:class:`ValueError` naming the first bad parameter; the divisor otherwise."""
        if not isinstance(timeout_bits, int) or timeout_bits < 1:
            raise ValueError(f"timeout_bits must be a positive integer, not {timeout_bits!r}")
        if not isinstance(rx_depth, int) or rx_depth < 2 or rx_depth & (rx_depth - 1):
            raise ValueError(f"rx_depth must be a power of two of at least 2, not {rx_depth!r}")
        divisor = baud_divisor(clk_freq, baud)
        BridgeCore.check(mem_bytes=mem_bytes, mem_width=mem_width,
                         timeout=timeout_bits * divisor, host_addr_bits=host_addr_bits)
        return divisor

    @property
    def divisor(self):
        """Clock cycles per bit."""
        return self._divisor

    @property
    def timeout(self):
        """Idle timeout in clock cycles."""
        return self._timeout

    def elaborate(self, platform):
        m = Module()
        m.submodules.uart_rx = rx = UARTRx(self._clk_freq, self._baud)
        m.submodules.uart_tx = tx = UARTTx(self._clk_freq, self._baud)
        m.submodules.rx_queue = queue = ByteQueue(self._rx_depth)
        m.submodules.core = core = BridgeCore(
            mem_bytes=self._mem_bytes, mem_width=self._mem_width, timeout=self._timeout,
            host_addr_bits=self._host_addr_bits)

        m.d.comb += [rx.rx.eq(self.rx), self.tx.eq(tx.tx)]
        wiring.connect(m, rx.data, queue.w)
        wiring.connect(m, queue.r, core.rx)
        wiring.connect(m, core.tx, tx.data)
        m.d.comb += [
            core.rx_error.eq(rx.framing_error),
            core.rx_overrun.eq(rx.overrun),
            core.rx_active.eq(rx.active),
            self.busy.eq(core.busy),
            self.error.eq(core.error),
        ]
        wiring.connect(m, core.mem, wiring.flipped(self.mem))
        wiring.connect(m, core.csr, wiring.flipped(self.csr))
        return m
