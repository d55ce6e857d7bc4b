"""The buffer: 16-bit elements in element-interleaved banks, read and written in runs.

Element ``a`` lies in bank ``a mod width``, row ``a // width``. A run of up to ``width``
consecutive elements from any address touches every bank at most once (the last ones may wrap
into the next row, or from the last row to row 0), so it is served in one cycle: each bank gets
its own row address and the lanes are rotated onto the banks and back.

Per cycle the banks serve one read run and one write run. Readers are arbitrated round-robin
among those whose response queue has room, writers round-robin too.

Timing: a read request taken in cycle ``n`` reads the banks in cycle ``n`` (transparently: a
write taken in the same cycle is seen) and its response is valid from cycle ``n + 2``. Every
read port has a response queue of ``depth`` runs; a port is granted only while its queue has room
for every run in flight, so a port that holds ``resp.ready`` low loses nothing, and with
``depth >= 3`` a port kept ready is served every cycle it wins. A write taken in cycle ``n`` is
in the banks at the end of cycle ``n``.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In
from amaranth.utils import exact_log2

from .arbiter import RoundRobin
from .ports import ELEMENT_BITS, BufferReadSignature, buffer_write_layout, wrap_address

__all__ = ["READ_LATENCY", "Buffer", "rotate"]

#: Cycles from a read request taken to its response valid (with an empty response queue).
READ_LATENCY = 2


def rotate(m, values, amount, *, name):
    """``values`` rotated towards lower indices by ``amount`` (combinational): element ``k`` of
    the result is ``values[(k + amount) mod len(values)]``; a barrel of ``log2(len)`` stages."""
    n = len(values)
    for b in range(exact_log2(n)):
        nxt = [Signal.like(values[0], name=f"{name}{b}_{k}") for k in range(n)]
        m.d.comb += [nxt[k].eq(Mux(amount[b], values[(k + (1 << b)) % n], values[k]))
                     for k in range(n)]
        values = nxt
    return values


class Buffer(wiring.Component):
    """The banked buffer with several read and write ports.

    Parameters
    ----------
    elements : int
        Elements of the buffer, a multiple of ``width``; addresses wrap modulo this.
    width : int
        Banks, a power of two: the widest run.
    read_ports, write_ports : sequence of int
        Lanes of each read and write port (1 to ``width``).
    depth : int
        Runs each read port's response queue holds.

    Members
    -------
    read<k> : In(BufferReadSignature(read_ports[k]))
        Read port ``k``: runs from ``req.addr``, answered on ``resp`` in request order.
    write<k> : In(stream.Signature(buffer_write_layout(write_ports[k])))
        Write port ``k``: element ``addr + j`` gets ``data[j]`` where ``mask[j]`` is set.
    """

    def __init__(self, elements, width, read_ports, write_ports, *, depth=4):
        if not isinstance(width, int) or width < 1 or width & (width - 1):
            raise ValueError(f"width must be a power of two, not {width!r}")
        if not isinstance(elements, int) or elements < width or elements % width:
            raise ValueError(f"elements must be a positive multiple of the width {width}, "
                             f"not {elements!r}")
        read_ports, write_ports = tuple(read_ports), tuple(write_ports)
        if not read_ports or not write_ports:
            raise ValueError("the buffer needs at least one read and one write port")
        for lanes in read_ports + write_ports:
            if not isinstance(lanes, int) or not 1 <= lanes <= width:
                raise ValueError(f"port lanes must be in [1, {width}], not {lanes!r}")
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self._elements = elements
        self._width = width
        self._read_lanes = read_ports
        self._write_lanes = write_ports
        self._depth = depth
        members = {}
        for k, lanes in enumerate(read_ports):
            members[f"read{k}"] = In(BufferReadSignature(lanes))
        for k, lanes in enumerate(write_ports):
            members[f"write{k}"] = In(stream.Signature(buffer_write_layout(lanes)))
        super().__init__(members)

    @property
    def elements(self):
        return self._elements

    @property
    def width(self):
        return self._width

    @property
    def read_lanes(self):
        return self._read_lanes

    @property
    def write_lanes(self):
        return self._write_lanes

    def read_port(self, k):
        return getattr(self, f"read{k}")

    def write_port(self, k):
        return getattr(self, f"write{k}")

    def _split(self, m, addr, name):
        """The run from ``addr``: its first bank ``s`` and the row of every bank."""
        e = self._width
        log2e = exact_log2(e)
        rows = self._elements // e
        a = Signal(range(self._elements), name=f"{name}_addr")
        m.d.comb += a.eq(wrap_address(addr, self._elements))
        row0 = Signal(range(rows), name=f"{name}_row0")
        row1 = Signal(range(rows), name=f"{name}_row1")
        m.d.comb += [row0.eq(a >> log2e), row1.eq(Mux(row0 == rows - 1, 0, row0 + 1))]
        first = a[:log2e]
        # Bank b holds element a + ((b - s) mod E): in row0 from bank s on, row0 + 1 before.
        return first, [Mux(b < first, row1, row0) if log2e else row0 for b in range(e)]

    def elaborate(self, platform):
        m = Module()
        e = self._width
        rows = self._elements // e
        banks = []
        for b in range(e):
            mem = Memory(shape=ELEMENT_BITS, depth=rows, init=[])
            m.submodules[f"bank{b}"] = mem
            wp = mem.write_port()
            banks.append((wp, mem.read_port(transparent_for=(wp,))))

        # Writes: the granted writer's run, rotated onto the banks.
        writers = [self.write_port(k) for k in range(len(self._write_lanes))]
        m.submodules.write_arbiter = warb = RoundRobin(len(writers))
        w_addr = Signal(len(writers[0].payload.addr))
        w_data = [Signal(ELEMENT_BITS, name=f"w_data{j}") for j in range(e)]
        w_mask = [Signal(name=f"w_mask{j}") for j in range(e)]
        for k, w in enumerate(writers):
            m.d.comb += [warb.requests[k].eq(w.valid), w.ready.eq(warb.grant[k])]
            with m.If(warb.grant[k]):
                m.d.comb += w_addr.eq(w.payload.addr)
                m.d.comb += [w_data[j].eq(w.payload.data[j]) for j in range(len(w.payload.data))]
                m.d.comb += [w_mask[j].eq(w.payload.mask[j]) for j in range(len(w.payload.data))]
        w_first, w_rows = self._split(m, w_addr, "w")
        # Bank b takes lane (b - s) mod E: rotate by E - s.
        w_shift = Signal.like(w_first)
        m.d.comb += w_shift.eq(-w_first)
        bank_data = rotate(m, w_data, w_shift, name="w_rot")
        bank_en = rotate(m, w_mask, w_shift, name="w_en")
        for b, (wp, _) in enumerate(banks):
            m.d.comb += [wp.addr.eq(w_rows[b]), wp.data.eq(bank_data[b]), wp.en.eq(bank_en[b])]

        # Reads: the granted reader's run; its lanes come back rotated, into its queue.
        readers = [self.read_port(k) for k in range(len(self._read_lanes))]
        m.submodules.read_arbiter = rarb = RoundRobin(len(readers))
        r_addr = Signal(len(readers[0].req.payload.addr))
        inflight = Signal(len(readers))
        queues = []
        for k, r in enumerate(readers):
            lanes = self._read_lanes[k]
            q = fifo.SyncFIFO(width=lanes * ELEMENT_BITS, depth=self._depth)
            m.submodules[f"resp{k}"] = q
            queues.append(q)
            room = Signal(name=f"room{k}")
            m.d.comb += [
                room.eq(q.level + inflight[k] < self._depth),
                rarb.requests[k].eq(r.req.valid & room),
                r.req.ready.eq(rarb.grant[k]),
                r.resp.valid.eq(q.r_rdy),
                r.resp.payload.eq(q.r_data),
                q.r_en.eq(r.resp.ready),
            ]
            with m.If(rarb.grant[k]):
                m.d.comb += r_addr.eq(r.req.payload.addr)
        r_first, r_rows = self._split(m, r_addr, "r")
        for b, (_, rp) in enumerate(banks):
            m.d.comb += [rp.addr.eq(r_rows[b]), rp.en.eq(1)]
        first = Signal.like(r_first)
        m.d.sync += [inflight.eq(rarb.grant), first.eq(r_first)]
        lanes_out = rotate(m, [rp.data for _, rp in banks], first, name="r_rot")
        for k, q in enumerate(queues):
            run = data.View(data.ArrayLayout(ELEMENT_BITS, self._read_lanes[k]), q.w_data)
            m.d.comb += [run[j].eq(lanes_out[j]) for j in range(self._read_lanes[k])]
            m.d.comb += q.w_en.eq(inflight[k])
        return m
