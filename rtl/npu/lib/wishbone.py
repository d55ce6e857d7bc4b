"""The system memory bus: Wishbone B4 pipelined (``docs/system.md``, "System memory bus").

* :class:`WishboneSignature`: the master side of the bus;
* :class:`Arbiter`: fixed-priority sharing of one bus by several masters, a grant held for a
  whole bus cycle so answers always go back to the master that asked;
* :class:`WordReader`: a stream of 32-bit word reads (the task manager's descriptor fetch) on a
  bus of any width, answered in order.

A request is taken in a cycle with ``cyc & stb & ~stall``; every taken request is answered by
exactly one ``ack`` or ``err``, in request order, after one or more cycles; a master keeps
``cyc`` high until its last answer.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

__all__ = ["ADDR_BITS", "DATA_WIDTHS", "Arbiter", "WishboneSignature", "WordLayout",
           "WordReader"]

#: Width of the bus word address (``adr``), in words of the bus width.
ADDR_BITS = 30
#: Bus widths the NPU supports (``NPUConfig.mem_width``).
DATA_WIDTHS = (32, 64, 128, 256)

#: One answer of a :class:`WordReader`: the 32-bit word, or ``err`` from the bus (``data``
#: is then 0).
WordLayout = data.StructLayout({"data": 32, "err": 1})


def _check_widths(addr_width, data_width):
    if not isinstance(addr_width, int) or isinstance(addr_width, bool) or addr_width < 1:
        raise TypeError(f"Address width must be a positive integer, not {addr_width!r}")
    if data_width not in DATA_WIDTHS:
        raise ValueError(f"Data width must be one of {DATA_WIDTHS}, not {data_width!r}")


class WishboneSignature(wiring.Signature):
    """Wishbone B4 pipelined, from the master's side.

    Parameters
    ----------
    addr_width : int
        Width of ``adr`` (a word address, in words of ``data_width`` bits).
    data_width : int
        32, 64, 128 or 256.

    Members
    -------
    cyc : Out(1)
        A bus cycle is in progress (from the first request to the last answer).
    stb : Out(1)
        A request is presented.
    we : Out(1)
        The request writes.
    adr : Out(addr_width)
        Word address of the request.
    sel : Out(data_width // 8)
        Byte lanes written (of interest on a read); lane ``k`` is ``dat_w[8k:8k+8]``.
    dat_w : Out(data_width)
        Write data.
    dat_r : In(data_width)
        Read data, valid with ``ack``.
    ack : In(1)
        The oldest unanswered request completed.
    stall : In(1)
        The request presented in this cycle is not taken.
    err : In(1)
        The oldest unanswered request completed with an error (instead of ``ack``).
    """

    def __init__(self, addr_width=ADDR_BITS, data_width=32):
        _check_widths(addr_width, data_width)
        self._addr_width = addr_width
        self._data_width = data_width
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

    @property
    def addr_width(self):
        return self._addr_width

    @property
    def data_width(self):
        return self._data_width

    def __eq__(self, other):
        return (isinstance(other, WishboneSignature) and self.addr_width == other.addr_width
                and self.data_width == other.data_width)

    def __hash__(self):
        return hash((WishboneSignature, self.addr_width, self.data_width))

    def __repr__(self):
        return f"WishboneSignature({self.addr_width}, {self.data_width})"


class Arbiter(wiring.Component):
    """Fixed-priority arbiter: ``masters`` masters share one bus, lower index first.

    The grant is a register. In a cycle where no master holds the bus (none is granted, or the
    granted master has dropped ``cyc``), the lowest-indexed master with ``cyc`` high is granted
    from the next cycle on; it keeps the grant while its ``cyc`` stays high, so every answer
    goes to the master that asked. A master that drops ``cyc`` for one cycle lets the others
    in. The granted master sees the bus (its ``stall`` is the bus ``stall``); the others see
    ``stall`` high and no ``ack`` or ``err``. Nothing a master drives reaches another master's
    inputs combinationally, so masters whose ``cyc`` depends on their ``stall`` or ``ack`` make
    no loop. A bus cycle starts one cycle after a master raises ``cyc``.

    Parameters
    ----------
    masters : int
        Number of masters (at least 1).
    addr_width, data_width : int
        See :class:`WishboneSignature`.

    Members
    -------
    masters : In(WishboneSignature(addr_width, data_width)).array(masters)
        The masters' ports.
    bus : Out(WishboneSignature(addr_width, data_width))
        The shared bus.
    owner : Out(range(masters))
        The granted master (meaningful while ``granted``).
    granted : Out(1)
        A master holds the grant (registered).
    """

    def __init__(self, masters, addr_width=ADDR_BITS, data_width=32):
        if not isinstance(masters, int) or isinstance(masters, bool) or masters < 1:
            raise TypeError(f"Number of masters must be a positive integer, not {masters!r}")
        sig = WishboneSignature(addr_width, data_width)
        self._n = masters
        super().__init__({
            "masters": In(sig).array(masters),
            "bus":     Out(sig),
            "owner":   Out(range(masters)),
            "granted": Out(1),
        })

    @property
    def n(self):
        return self._n

    def elaborate(self, platform):
        m = Module()
        owner_cyc = Signal()
        with m.Switch(self.owner):
            for i, port in enumerate(self.masters):
                with m.Case(i):
                    m.d.comb += owner_cyc.eq(port.cyc)

        # A new grant whenever the bus is not held: the lowest-indexed master asking.
        with m.If(~(self.granted & owner_cyc)):
            m.d.sync += self.granted.eq(0)
            for i in reversed(range(self.n)):
                with m.If(self.masters[i].cyc):
                    m.d.sync += [self.granted.eq(1), self.owner.eq(i)]

        # The granted master drives the bus; answers return to it alone.
        for i, port in enumerate(self.masters):
            mine = self.granted & (self.owner == i)
            with m.If(mine):
                m.d.comb += [
                    self.bus.cyc.eq(port.cyc),
                    self.bus.stb.eq(port.stb),
                    self.bus.we.eq(port.we),
                    self.bus.adr.eq(port.adr),
                    self.bus.sel.eq(port.sel),
                    self.bus.dat_w.eq(port.dat_w),
                ]
            m.d.comb += [
                port.dat_r.eq(self.bus.dat_r),
                port.ack.eq(mine & self.bus.ack),
                port.err.eq(mine & self.bus.err),
                port.stall.eq(~mine | self.bus.stall),
            ]
        return m


class WordReader(wiring.Component):
    """Reads 32-bit words of system memory over a bus of ``data_width`` bits.

    A request is the address of a 32-bit word (byte address / 4); the bus word is that address
    divided by ``data_width / 32``, the 32-bit lane its remainder (little-endian lanes: lane
    ``k`` is ``dat_r[32k:32k+32]``), and ``sel`` selects that lane's four bytes. Answers leave
    in request order through a queue of ``depth`` entries (a :class:`~amaranth.lib.fifo.SyncFIFO`,
    its head read combinationally); a request goes out only while the requests in flight plus
    the answers held leave room in it, so ``resp.ready`` low never loses an answer, and at most
    ``depth`` requests are in flight. A request taken waits in a register and goes out on the
    bus from the next cycle on (the bus sees no combinational path from ``req``); ``cyc`` is
    high while a request waits there or is in flight, and low otherwise (releasing the arbiter,
    also while the answer queue is full). Requests go out at one a cycle when the bus allows.

    Parameters
    ----------
    data_width : int
        Bus width: 32, 64, 128 or 256.
    depth : int
        Answer queue depth and bound on the requests in flight.
    addr_width : int
        Width of the bus ``adr`` (the upper bits of a request beyond it are dropped).

    Members
    -------
    req : In(stream.Signature(30))
        Address of a 32-bit word.
    resp : Out(stream.Signature(WordLayout))
        The word read, or ``err`` (in request order).
    bus : Out(WishboneSignature(addr_width, data_width))
        Reads only (``we`` is 0).
    """

    def __init__(self, data_width=32, depth=16, *, addr_width=ADDR_BITS):
        _check_widths(addr_width, data_width)
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ValueError(f"Depth must be a positive integer, not {depth!r}")
        self._data_width = data_width
        self._depth = depth
        super().__init__({
            "req":  In(stream.Signature(30)),
            "resp": Out(stream.Signature(WordLayout)),
            "bus":  Out(WishboneSignature(addr_width, data_width)),
        })

    @property
    def data_width(self):
        return self._data_width

    @property
    def depth(self):
        return self._depth

    def elaborate(self, platform):
        m = Module()
        lanes = self._data_width // 32
        lane_bits = exact_log2(lanes)
        # An unbuffered FIFO: its level counts every answer held, and it takes a write
        # whenever the level is below the depth.
        m.submodules.answers = answers = fifo.SyncFIFO(width=WordLayout.size, depth=self._depth)

        # Requests taken and not yet answered (the one in the request register included); a
        # request is taken only when its answer will have a place. The bus sees the request
        # register, so nothing from ``req`` reaches the bus combinationally.
        in_flight = Signal(range(self._depth + 1))
        room = Signal()
        m.d.comb += room.eq(in_flight + answers.level < self._depth)
        pending = Signal()
        address = Signal(30, reset_less=True)       # looked at only while ``pending``
        taken = Signal()
        answered = Signal()
        m.d.comb += [
            self.bus.stb.eq(pending),
            self.bus.cyc.eq(in_flight != 0),
            self.bus.we.eq(0),
            self.bus.adr.eq(address[lane_bits:]),
            self.req.ready.eq(room & (~pending | ~self.bus.stall)),
            taken.eq(self.req.valid & self.req.ready),
            answered.eq(self.bus.ack | self.bus.err),
        ]
        with m.If(taken):
            m.d.sync += [pending.eq(1), address.eq(self.req.payload)]
        with m.Elif(~self.bus.stall):
            m.d.sync += pending.eq(0)
        m.d.sync += in_flight.eq(in_flight + taken - answered)

        # The lane of every request in flight, in order (read in the cycle of its answer).
        answer = Signal(WordLayout)
        m.d.comb += answer.err.eq(self.bus.err)
        if lanes == 1:
            m.d.comb += self.bus.sel.eq(0xF)
            with m.If(~self.bus.err):
                m.d.comb += answer.data.eq(self.bus.dat_r)
        else:
            m.submodules.lanes = lane_q = fifo.SyncFIFO(width=lane_bits, depth=self._depth)
            m.d.comb += [
                lane_q.w_data.eq(self.req.payload[:lane_bits]),
                lane_q.w_en.eq(taken),
                lane_q.r_en.eq(answered),
                self.bus.sel.word_select(address[:lane_bits], 4).eq(0xF),
            ]
            with m.If(~self.bus.err):
                m.d.comb += answer.data.eq(self.bus.dat_r.word_select(lane_q.r_data, 32))

        # Answers through the queue.
        m.d.comb += [
            answers.w_data.eq(answer),
            answers.w_en.eq(answered),
            self.resp.valid.eq(answers.r_rdy),
            self.resp.payload.eq(answers.r_data),
            answers.r_en.eq(self.resp.ready),
        ]
        return m
