# amaranth: UnusedElaboratable=no
"""On-chip system memory of the boards (``npu.bridge.sram``): byte-lane writes, reads one
cycle after the request (two with its request register), one request a cycle, ``err`` past its
size."""

import pytest

from npu.bridge import WishboneSRAM
from npu_sim.streams import run_simulation


@pytest.mark.parametrize("registered", [False, True])
@pytest.mark.parametrize("width", [32, 64])
def test_sram(width, registered):
    """Requests back to back; with ``request_register`` every answer comes one cycle later."""
    lanes = width // 8
    dut = WishboneSRAM(10, width, init=[0x0102030405060708 & ((1 << width) - 1)] * 10,
                       request_register=registered)
    answers = []

    async def tb(ctx):
        bus = dut.bus
        ctx.set(bus.cyc, 1)
        # Writes: word 3 gets lanes 0 and 2 only; word 9 all lanes; word 10 is outside.
        requests = [(1, 3, 0b0101, (1 << width) - 1), (1, 9, (1 << lanes) - 1, 0xAB),
                    (1, 10, (1 << lanes) - 1, 0xCD), (0, 3, 0, 0), (0, 9, 0, 0), (0, 10, 0, 0)]
        for we, adr, sel, data in requests:
            ctx.set(bus.stb, 1)
            ctx.set(bus.we, we)
            ctx.set(bus.adr, adr)
            ctx.set(bus.sel, sel)
            ctx.set(bus.dat_w, data)
            _, _, stall = await ctx.tick().sample(bus.stall)
            assert not stall
            answers.append((ctx.get(bus.ack), ctx.get(bus.err), ctx.get(bus.dat_r)))
        ctx.set(bus.stb, 0)
        for _ in range(2):
            await ctx.tick()
            answers.append((ctx.get(bus.ack), ctx.get(bus.err), ctx.get(bus.dat_r)))

    run_simulation(dut, [tb])
    init = 0x0102030405060708 & ((1 << width) - 1)
    mask = 0xFF | 0xFF << 16
    expected = [(1, 0), (1, 0), (0, 1), (1, 0), (1, 0), (0, 1), (0, 0)]
    if registered:
        # Nothing in the cycle after the first request: every answer is one cycle later.
        assert answers[0][:2] == (0, 0)
        answers = answers[1:]
    assert [a[:2] for a in answers[:7]] == expected
    assert answers[3][2] == (init & ~mask) | mask
    assert answers[4][2] == 0xAB
