# amaranth: UnusedElaboratable=no
"""The input buffer (npu.neural.input_buffer): row writes land in their lane row's memory,
reads return them one cycle later, the bank flags follow fill and release."""

import random

from npu.neural.input_buffer import InputBuffer
from tests.support.csr import run


def test_against_model():
    max_rows, row_values, buffer_rows = 2, 8, 16
    dut = InputBuffer(max_rows, row_values, buffer_rows)
    rng = random.Random(3)

    async def tb(ctx):
        mems = [[[0] * row_values for _ in range(2 * buffer_rows)] for _ in range(max_rows)]
        full = 0
        read = None         # the rows the read of the cycle before returns
        for _ in range(400):
            write = rng.random() < 0.5
            row, addr = rng.randrange(max_rows), rng.randrange(2 * buffer_rows)
            values = [rng.randrange(1 << 16) for _ in range(row_values)]
            ctx.set(dut.write.en, write)
            ctx.set(dut.write.row, row)
            ctx.set(dut.write.addr, addr)
            ctx.set(dut.write.values, values)
            read_en = rng.random() < 0.7
            read_addr = rng.randrange(2 * buffer_rows)
            ctx.set(dut.read_en, read_en)
            ctx.set(dut.read_addr, read_addr)
            fill, release = rng.randrange(4), rng.randrange(4) * (rng.random() < 0.3)
            ctx.set(dut.fill, fill)
            ctx.set(dut.release, release)
            # Reads see the memory before this cycle's write.
            if read_en:
                read = [list(mems[r][read_addr]) for r in range(max_rows)]
            await ctx.tick()
            if write:
                mems[row][addr] = values
            full = (full | fill) & ~release
            assert ctx.get(dut.full) == full
            if read is not None:
                rows = ctx.get(dut.rows)
                assert [[rows[r][j] for j in range(row_values)] for r in range(max_rows)] == read

    run(dut, tb)
