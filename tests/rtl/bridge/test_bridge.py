# amaranth: UnusedElaboratable=no
"""The whole UART bridge (``npu.bridge.UARTBridge``) driven at the bit level by the host's
line model (``npu_sim.uart_host``): round trips of memory and NPU registers at the boards'
clock rates, a host that stops mid-frame (line idle high), a mistuned host, garbage on the
line, and a host that does not wait for a read's answer."""

import random

import pytest

from npu.bridge import UARTBridge
from npu_sim.uart_host import BridgeModel, decode_words, encode_read, encode_write, words_of
from npu_spec.bridge import BRIDGE, BRIDGE_REGS_BASE, NPU_REGS_BASE
from npu_spec.registers import MAGIC, NPU_INFO

from .bench import image_words, run_uart, uart_bench

MEM = 256
STATUS = encode_read(BRIDGE_REGS_BASE, 2)


def flags(words):
    return {n for n, v in BRIDGE["STATUS"].unpack(words[0]).items() if v}, words[1]


@pytest.mark.parametrize("clk_freq,mem_width,n", [(12e6, 32, 5), (25e6, 64, 2)])
def test_round_trip(clk_freq, mem_width, n):
    rng = random.Random(1)
    image = bytes(rng.randrange(256) for _ in range(MEM))
    bench = uart_bench(MEM, clk_freq=clk_freq, baud=1e6, mem_width=mem_width,
                       init=image_words(image, mem_width))
    words = [rng.randrange(1 << 32) for _ in range(n)]
    script = [encode_write(3, words), encode_read(2, n + 2),
              encode_read(NPU_REGS_BASE + NPU_INFO["ID"].offset, 1), STATUS]
    answer, memory = run_uart(bench, script)
    model = BridgeModel(MEM, memory=image, regs={NPU_INFO["ID"].offset: MAGIC})
    assert answer == b"".join(model.feed(f) for f in script)
    assert memory == bytes(model.memory)
    assert decode_words(answer)[n + 2] == MAGIC
    assert flags(decode_words(answer)[n + 3:]) == (set(), 3)


def test_host_disconnects_mid_frame():
    """The host stops inside a write (the line idles high): after the idle timeout the bridge
    drops the frame; the next frame works; only the words that fully arrived were written."""
    rng = random.Random(2)
    image = bytes(rng.randrange(256) for _ in range(MEM))
    bench = uart_bench(MEM, clk_freq=12e6, baud=1e6, timeout_bits=40,
                       init=image_words(image, 32))
    cut = encode_write(8, [0xA1A2A3A4, 0xB1B2B3B4, 0xC1C2C3C4])[:6 + 4 + 3]
    script = [cut, 60, encode_write(20, [0x600D_F00D]), encode_read(8, 2), STATUS]
    answer, memory = run_uart(bench, script)
    words = decode_words(answer)
    assert words[:2] == [0xA1A2A3A4, int.from_bytes(image[36:40], "little")]
    assert flags(words[2:]) == ({"timeout"}, 2)
    expected = bytearray(image)
    expected[32:36] = (0xA1A2A3A4).to_bytes(4, "little")
    expected[80:84] = (0x600D_F00D).to_bytes(4, "little")
    assert memory == bytes(expected)


def test_garbage_then_recovery():
    """Noise on the line (bytes that are no command, a bad stop bit): dropped; after the line
    is idle for the timeout the next frame works and memory is untouched."""
    bench = uart_bench(MEM, clk_freq=12e6, baud=1e6, timeout_bits=30)
    script = [b"\xff\x13\x00\x07", 45, encode_write(1, [0x1234_5678]), encode_read(0, 3),
              STATUS]
    answer, memory = run_uart(bench, script)
    words = decode_words(answer)
    assert words[:3] == [0, 0x1234_5678, 0]
    assert flags(words[3:]) == ({"command"}, 2)
    assert words_of(memory) == [0, 0x1234_5678] + [0] * (MEM // 4 - 2)


def test_framing_error_on_the_line():
    bench = uart_bench(MEM, clk_freq=4e6, baud=1e6, timeout_bits=30)
    # Byte 6 (the first data byte of the write) has a low stop bit.
    script = [encode_write(0, [0xFFFF_FFFF]), 45, encode_read(0, 1), STATUS]
    answer, memory = run_uart(bench, script, bad_stop={6})
    words = decode_words(answer)
    assert words[0] == 0
    assert "framing" in flags(words[1:])[0]
    assert memory == bytes(MEM)


@pytest.mark.parametrize("error", [-0.03, 0.03])
def test_mistuned_host(error):
    """A host 3% off the bridge's rate in either direction: frames both ways still work."""
    bench = uart_bench(MEM, clk_freq=12e6, baud=1e6)
    script = [encode_write(4, [0x0BAD_CAFE, 0x8000_0001]), encode_read(4, 2)]
    answer, _ = run_uart(bench, script, cycles_per_bit=12 * (1 + error))
    assert decode_words(answer) == [0x0BAD_CAFE, 0x8000_0001]


def test_host_that_does_not_wait_for_answers():
    """Frames sent back to back while a read's answer goes out wait in the receive queue."""
    bench = uart_bench(MEM, clk_freq=4e6, baud=1e6, rx_depth=16)
    script = [encode_write(0, [1, 2, 3]) + encode_read(0, 3) + encode_write(3, [4])
              + encode_read(1, 3) + STATUS]
    answer, _ = run_uart(bench, script)
    words = decode_words(answer)
    assert words[:6] == [1, 2, 3, 2, 3, 4]
    assert flags(words[6:]) == (set(), 4)


def test_timeout_parameter_is_in_bit_times():
    dut = UARTBridge(clk_freq=25e6, baud=1e6, mem_bytes=64, timeout_bits=100)
    assert dut.divisor == 25 and dut.timeout == 2500
    with pytest.raises(ValueError, match="timeout_bits"):
        UARTBridge(clk_freq=25e6, mem_bytes=64, timeout_bits=0)
    with pytest.raises(ValueError, match=r"4\.2% off"):
        UARTBridge(clk_freq=25e6, baud=3e6, mem_bytes=64)


def test_receive_queue_overrun_is_flagged():
    """A host that sends a long frame while a read's answer goes out overflows a small receive
    queue: the lost bytes are flagged, and after an idle timeout frames work again."""
    bench = uart_bench(MEM, clk_freq=4e6, baud=1e6, rx_depth=4, timeout_bits=30)
    script = [encode_read(0, 8) + encode_write(8, list(range(1, 9))), 45,
              encode_write(20, [0xFEED]), encode_read(20, 1), STATUS]
    answer, memory = run_uart(bench, script)
    words = decode_words(answer)
    assert words[:8] == [0] * 8
    assert words[8] == 0xFEED
    assert "overrun" in flags(words[9:])[0]
    # Nothing outside the two frames' words was written.
    assert words_of(memory)[:8] == [0] * 8 and words_of(memory)[16:20] == [0] * 4
