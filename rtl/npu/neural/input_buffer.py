"""The input buffer: one memory per lane row, two banks (``docs/neural_engine.md``, "Input
buffer and shifter").

The loader fills one bank with the rows a work unit needs while the sequencer computes on the
other. Each bank's ``full`` flag is the handshake: the loader sets it when the bank's rows are
all written, the sequencer clears it when the bank's last read has been made.
"""

from amaranth.hdl import Module
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .block_ram import block_memory, registered_read

__all__ = ["BufferWriteSignature", "InputBuffer"]


class BufferWriteSignature(wiring.Signature):
    """Row writes into the input buffer, from the writer's side.

    Members
    -------
    en : Out(1)
        Write ``values`` in this cycle.
    row : Out(range(max_rows))
        The lane row whose memory is written.
    addr : Out(range(2 * buffer_rows))
        The row's address: ``bank * buffer_rows + channel * kh + ky``.
    values : Out(data.ArrayLayout(bits, row_values))
        The halo row (each value's low ``bits`` bits).
    """

    def __init__(self, max_rows, row_values, buffer_rows, bits=16):
        super().__init__({
            "en":     Out(1),
            "row":    Out(range(max_rows)),
            "addr":   Out(range(2 * buffer_rows)),
            "values": Out(data.ArrayLayout(bits, row_values)),
        })


class InputBuffer(wiring.Component):
    """Input buffer of one neural engine core.

    Parameters
    ----------
    max_rows, row_values, buffer_rows : int
        Lane-row memories, inputs per row, rows per bank (``engine_geometry``).
    bits : int
        Bits kept of each input value (``npu.neural.shifter.value_bits``: 8 in int8-only
        builds).

    Members
    -------
    write : In(BufferWriteSignature(max_rows, row_values, buffer_rows, bits))
        Row writes (from the loader).
    read_addr : In(range(2 * buffer_rows))
        Row read from every lane-row memory ...
    read_en : In(1)
        ... in this cycle; ``rows`` holds it in the next.
    rows : Out(data.ArrayLayout(data.ArrayLayout(bits, row_values), max_rows))
        The rows read, one per lane row.
    fill : In(2)
        Set the ``full`` flag of bank 0 (bit 0) or 1 (bit 1).
    release : In(2)
        Clear a bank's ``full`` flag (wins over ``fill`` in the same cycle).
    full : Out(2)
        The banks holding a complete work unit's rows.
    """

    def __init__(self, max_rows, row_values, buffer_rows, bits=16):
        self._max_rows = max_rows
        self._row_values = row_values
        self._buffer_rows = buffer_rows
        self._bits = bits
        super().__init__({
            "write":     In(BufferWriteSignature(max_rows, row_values, buffer_rows, bits)),
            "read_addr": In(range(2 * buffer_rows)),
            "read_en":   In(1),
            "rows":      Out(data.ArrayLayout(data.ArrayLayout(bits, row_values), max_rows)),
            "fill":      In(2),
            "release":   In(2),
            "full":      Out(2),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.full.eq((self.full | self.fill) & ~self.release)
        # The loader writes one bank while the sequencer reads the other: no read meets a
        # write of the same row.
        for r in range(self._max_rows):
            mem = block_memory(data.ArrayLayout(self._bits, self._row_values),
                               2 * self._buffer_rows)
            m.submodules[f"row{r}"] = mem
            wp = mem.write_port()
            m.d.comb += [
                wp.addr.eq(self.write.addr),
                wp.data.eq(self.write.values),
                wp.en.eq(self.write.en & (self.write.row == r)),
                self.rows[r].eq(registered_read(m, mem, self.read_addr, self.read_en,
                                                name=f"row{r}_data")),
            ]
        return m
