# amaranth: UnusedElaboratable=no
"""The UART (``npu.bridge.uart``): loopback at the boards' rates, the host's bit-level line
model against the receiver, mistuned rates, bad stop bits, glitches, and the divisor check."""

import random

import pytest
from amaranth.hdl import Elaboratable, Module

from npu.bridge import UARTRx, UARTTx
from npu_sim.streams import run_simulation
from npu_sim.uart_host import uart_receive, uart_send
from npu_spec.bridge import baud_divisor


class Loop(Elaboratable):
    def __init__(self, clk_freq, baud):
        self.rx = UARTRx(clk_freq, baud)
        self.tx = UARTTx(clk_freq, baud)

    def elaborate(self, platform):
        m = Module()
        m.submodules.rx, m.submodules.tx = self.rx, self.tx
        m.d.comb += self.rx.rx.eq(self.tx.tx)
        return m


@pytest.mark.parametrize("clk_freq,baud,divisor", [
    (12e6, 1_000_000, 12), (25e6, 1_000_000, 25), (12e6, 3_000_000, 4), (12e6, 115_200, 104)])
def test_divisors(clk_freq, baud, divisor):
    assert baud_divisor(clk_freq, baud) == divisor
    assert UARTRx(clk_freq, baud).divisor == divisor


@pytest.mark.parametrize("clk_freq,baud,message", [
    (25e6, 3_000_000, r"divisor 8 gives 3125000 baud, 4\.2% off"),
    (12e6, 4_000_000, "at least 4 clock cycles per bit"),
    (12e6, 0, "positive"),
])
def test_bad_rates_are_rejected(clk_freq, baud, message):
    with pytest.raises(ValueError, match=message):
        UARTTx(clk_freq, baud)


@pytest.mark.parametrize("clk_freq,baud", [(12e6, 1e6), (25e6, 1e6), (4e6, 1e6)])
def test_loopback(clk_freq, baud):
    """Bytes sent back to back by the transmitter arrive in order, and the transmitter keeps
    exactly one bit time per bit (a byte every 10 bit times)."""
    dut = Loop(clk_freq, baud)
    data = bytes(random.Random(1).randrange(256) for _ in range(12))
    got = []
    starts = []

    async def sender(ctx):
        for b in data:
            ctx.set(dut.tx.data.valid, 1)
            ctx.set(dut.tx.data.payload, b)
            await ctx.tick().until(dut.tx.data.ready)
        ctx.set(dut.tx.data.valid, 0)

    async def receiver(ctx):
        ctx.set(dut.rx.data.ready, 1)
        cycle = 0
        while len(got) < len(data):
            _, _, valid, byte, taken = await ctx.tick().sample(
                dut.rx.data.valid, dut.rx.data.payload, dut.tx.data.valid & dut.tx.data.ready)
            if valid:
                got.append(byte)
            if taken:
                starts.append(cycle)
            cycle += 1

    run_simulation(dut, [sender, receiver])
    assert bytes(got) == data
    div = dut.tx.divisor
    assert [b - a for a, b in zip(starts, starts[1:])] == [10 * div] * (len(data) - 1)


def rx_run(clk_freq, baud, data, cycles_per_bit, *, bad_stop=(), glitch=False, gap_bits=0):
    """Send ``data`` with the host's line model into a receiver; returns (bytes, framing
    errors)."""
    dut = UARTRx(clk_freq, baud)
    got = []
    errors = []

    async def host(ctx):
        await ctx.tick().repeat(5)
        if glitch:
            # A low pulse shorter than half a bit is no start bit.
            ctx.set(dut.rx, 0)
            await ctx.tick().repeat(dut.divisor // 2 - 2)
            ctx.set(dut.rx, 1)
            await ctx.tick().repeat(3 * dut.divisor)
        await uart_send(ctx, dut.rx, data, cycles_per_bit, bad_stop=bad_stop,
                        gap_bits=gap_bits)
        await ctx.tick().repeat(3 * dut.divisor)

    async def sink(ctx):
        ctx.set(dut.data.ready, 1)
        while True:
            _, _, valid, byte, err = await ctx.tick().sample(dut.data.valid, dut.data.payload,
                                                             dut.framing_error)
            if valid:
                got.append(byte)
            if err:
                errors.append(len(got))

    run_simulation(dut, [host], background=[sink])
    return bytes(got), errors


DATA = bytes([0x00, 0xFF, 0x55, 0xAA, 0x01, 0x80, 0x7F, 0xFE]) + bytes(range(0x30, 0x38))


@pytest.mark.parametrize("error", [-0.035, -0.02, 0.0, 0.02, 0.035])
def test_mistuned_host(error):
    """A host off by up to 3.5% (back-to-back bytes, the worst case) is received correctly."""
    div = baud_divisor(12e6, 1e6)
    got, errors = rx_run(12e6, 1e6, DATA, div * (1 + error))
    assert got == DATA and errors == []


@pytest.mark.parametrize("error", [-0.08, 0.08])
def test_badly_mistuned_host_is_noticed(error):
    """Off by 8%, the last bit is sampled in the wrong bit: bytes come out wrong or with a
    framing error (the check above can fail)."""
    div = baud_divisor(12e6, 1e6)
    got, errors = rx_run(12e6, 1e6, DATA, div * (1 + error))
    assert got != DATA or errors


def test_bad_stop_bit_and_glitch():
    got, errors = rx_run(12e6, 1e6, b"\x11\x22\x33\x44", 12, bad_stop={1}, glitch=True,
                         gap_bits=1)
    # 0x22 has a low stop bit: dropped and flagged; once the line is high again (one idle bit
    # here) the next start bit is found.
    assert got == b"\x11\x33\x44"
    assert errors == [1]


def test_host_receiver_reads_the_transmitter():
    dut = UARTTx(25e6, 1e6)
    data = b"\x00\xffNPU\x81"
    got = []

    async def sender(ctx):
        for b in data:
            ctx.set(dut.data.valid, 1)
            ctx.set(dut.data.payload, b)
            await ctx.tick().until(dut.data.ready)
        ctx.set(dut.data.valid, 0)

    async def host(ctx):
        got.append(await uart_receive(ctx, dut.tx, len(data), 25, timeout=1000))

    run_simulation(dut, [sender, host])
    assert got == [data]
