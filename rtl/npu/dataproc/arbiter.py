"""A round-robin arbiter: the buffer's readers and writers take turns."""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RoundRobin"]


class RoundRobin(wiring.Component):
    """Grants one of ``n`` requesters per cycle, starting the search after the last one granted
    (combinational grant; the pointer moves in every cycle with a grant).

    Parameters
    ----------
    n : int
        Number of requesters.

    Members
    -------
    requests : In(n)
        Bit ``i``: requester ``i`` wants the resource in this cycle.
    grant : Out(n)
        One-hot (or 0 without requests): the requester served in this cycle.
    """

    def __init__(self, n):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"a round-robin arbiter needs a positive requester count, not {n!r}")
        self._n = n
        super().__init__({"requests": In(n), "grant": Out(n)})

    @property
    def n(self):
        return self._n

    def elaborate(self, platform):
        m = Module()
        n = self._n
        last = Signal(range(n), init=n - 1)
        with m.Switch(last):
            for prev in range(n):
                with m.Case(prev):
                    # Search prev + 1, prev + 2, ..., prev (the last one granted comes last).
                    for d in range(1, n + 1):
                        i = (prev + d) % n
                        with (m.If if d == 1 else m.Elif)(self.requests[i]):
                            m.d.comb += self.grant[i].eq(1)
                            m.d.sync += last.eq(i)
        return m
