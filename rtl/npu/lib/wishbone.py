"""The Wishbone B4 pipelined bus to system memory (``docs/system.md``, "System memory bus")."""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["WishboneSignature"]


class WishboneSignature(wiring.Signature):
    """A Wishbone B4 pipelined bus, from the master's side.

    Parameters
    ----------
    addr_width : int
        Width of ``adr`` (a word address).
    data_width : int
        Width of a word; a multiple of 8 (one ``sel`` bit a byte lane).

    Members
    -------
    cyc, stb, we : Out(1)
        A bus cycle is in progress; a request is presented; the request writes.
    adr : Out(addr_width)
        Word address of the request.
    sel : Out(data_width // 8)
        Byte lanes of the request.
    dat_w : Out(data_width)
        Write data.
    dat_r : In(data_width)
        Read data, valid with ``ack``.
    ack, err : In(1)
        One request completed, in request order (``err``: with an error).
    stall : In(1)
        The request presented in this cycle is not taken.
    """

    def __init__(self, addr_width=30, data_width=32):
        if not isinstance(addr_width, int) or addr_width < 1:
            raise TypeError(f"Address width must be a positive integer, not {addr_width!r}")
        if not isinstance(data_width, int) or data_width < 8 or data_width % 8:
            raise ValueError(f"Data width must be a positive multiple of 8, not {data_width!r}")
        self.addr_width = addr_width
        self.data_width = data_width
        super().__init__({
            "cyc":   Out(1),
            "stb":   Out(1),
            "we":    Out(1),
            "adr":   Out(addr_width),
            "sel":   Out(data_width // 8),
            "dat_w": Out(data_width),
            "dat_r": In(data_width),
            "ack":   In(1),
            "stall": In(1),
            "err":   In(1),
        })

    def __eq__(self, other):
        return (type(other) is type(self) and other.addr_width == self.addr_width
                and other.data_width == self.data_width)

    def __hash__(self):
        return hash((type(self), self.addr_width, self.data_width))

    def __repr__(self):
        return f"WishboneSignature({self.addr_width}, {self.data_width})"
