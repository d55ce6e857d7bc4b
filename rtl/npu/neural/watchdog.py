"""The watchdog: a layer whose streams stop moving ends with ``TIMEOUT`` instead of hanging."""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Watchdog"]


class Watchdog(wiring.Component):
    """Counts the cycles of a running layer in which nothing moved.

    Parameters
    ----------
    timeout : int
        Cycles without movement after which ``expired`` rises.

    Members
    -------
    run : In(1)
        A layer is running (the count is 0 while it is low).
    moved : In(1)
        Some stream of the engine moved in this cycle (the count returns to 0).
    expired : Out(1)
        Combinational: ``timeout`` cycles in a row without movement.
    """

    def __init__(self, timeout):
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 1:
            raise ValueError(f"timeout must be a positive integer, not {timeout!r}")
        self._timeout = timeout
        super().__init__({"run": In(1), "moved": In(1), "expired": Out(1)})

    @property
    def timeout(self):
        return self._timeout

    def elaborate(self, platform):
        m = Module()
        idle = Signal(range(self._timeout + 1))
        with m.If(~self.run | self.moved):
            m.d.sync += idle.eq(0)
        with m.Elif(idle != self._timeout):
            m.d.sync += idle.eq(idle + 1)
        m.d.comb += self.expired.eq(idle == self._timeout)
        return m
