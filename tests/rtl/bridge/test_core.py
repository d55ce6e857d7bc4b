# amaranth: UnusedElaboratable=no
"""The bridge's frame engine (``npu.bridge.core``) on byte streams, against the reference model
(``npu_sim.uart_host.BridgeModel``): memory and register round trips, every bus width,
back-to-back and longest frames, and the error paths (bad command, truncated frame, range,
bus error, framing error) that must leave memory outside the addressed words alone."""

import random

import pytest

from npu.bridge import BridgeCore
from npu_sim.uart_host import (
    BridgeModel,
    bytes_of,
    decode_words,
    encode_read,
    encode_write,
    words_of,
)
from npu_spec.bridge import BRIDGE, BRIDGE_REGS_BASE, MAX_WORDS, NPU_REGS_BASE, Command
from npu_spec.registers import MAGIC, NPU_INFO, VERSION_MAJOR, VERSION_MINOR

from .bench import ERROR, core_bench, image_words, run_core

MEM = 1024          # bytes mapped by the bridge
TIMEOUT = 64        # idle timeout of the core, in cycles


def random_image(n, seed):
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(n))


def status_of(words):
    st = BRIDGE["STATUS"].unpack(words[0])
    return {name for name, v in st.items() if v}, words[1]


READ_STATUS = encode_read(BRIDGE_REGS_BASE, 2)


@pytest.mark.parametrize("mem_width,latency,stall", [
    (32, 1, 0.0), (64, 3, 0.3), (128, 2, 0.0), (256, 1, 0.5)])
def test_memory_round_trip(mem_width, latency, stall):
    image = random_image(MEM, 1)
    bench = core_bench(MEM, mem_width=mem_width, latency=latency,
                       init=image_words(image, mem_width), timeout=1000)
    rng = random.Random(2)
    words = [rng.randrange(1 << 32) for _ in range(11)]
    script = [encode_write(5, words), encode_read(3, 15), encode_read(0, 1)]
    answer, memory = run_core(bench, script, stall=stall, stall_prob=64 if stall else 0)
    model = BridgeModel(MEM, memory=image)
    expected = b"".join(model.feed(f) for f in script)
    assert answer == expected
    assert memory == bytes(model.memory)
    # The words landed where the address says, little-endian within each word.
    assert words_of(memory[20:64]) == words
    assert memory[:20] == image[:20] and memory[64:] == image[64:]


def test_npu_registers_and_bridge_registers():
    bench = core_bench(MEM)
    id_, version, scratch = (NPU_INFO[n].offset for n in ("ID", "VERSION", "SCRATCH"))
    script = [
        encode_read(NPU_REGS_BASE + id_, 2),
        encode_write(NPU_REGS_BASE + scratch, [0xDEAD_BEEF]),
        encode_read(NPU_REGS_BASE + scratch, 1),
        encode_read(NPU_REGS_BASE + scratch, 3, fixed=True),
        READ_STATUS,
    ]
    answer, _ = run_core(bench, script)
    words = decode_words(answer)
    assert words[:2] == [MAGIC, VERSION_MAJOR << 16 | VERSION_MINOR]
    assert words[2:6] == [0xDEAD_BEEF] * 4
    flags, frames = status_of(words[6:])
    assert flags == set() and frames == 4


def test_back_to_back_longest_frames_and_fixed_writes():
    bench = core_bench(MEM, mem_width=64, timeout=1000)
    rng = random.Random(3)
    first = [rng.randrange(1 << 32) for _ in range(MAX_WORDS)]
    script = [
        encode_write(0, first) + encode_read(0, MAX_WORDS) + encode_write(1, [0x1111_1111])
        + encode_write(2, [7, 8, 9], fixed=True) + encode_read(0, 4),
        READ_STATUS,
    ]
    answer, memory = run_core(bench, script, stall=0.2)
    words = decode_words(answer)
    assert words[:MAX_WORDS] == first
    assert words[MAX_WORDS:MAX_WORDS + 4] == [first[0], 0x1111_1111, 9, first[3]]
    assert status_of(words[-2:]) == (set(), 5)
    assert words_of(memory)[4:MAX_WORDS] == first[4:]


def test_random_frames_against_the_model():
    """Random valid and invalid frames (out of range, zero length, every command) in a row."""
    rng = random.Random(4)
    image = random_image(MEM, 5)
    bench = core_bench(MEM, words=2 * MEM // 4, init=image_words(image, 32), timeout=1000)
    model = BridgeModel(MEM, memory=image)
    script = []
    for _ in range(30):
        command = rng.choice(list(Command))
        length = rng.choice([0, 1, 2, 5, 40])
        address = rng.choice([rng.randrange(MEM // 4), MEM // 4 - rng.randrange(1, 8),
                              NPU_REGS_BASE + NPU_INFO["SCRATCH"].offset, 1 << 31])
        words = [rng.randrange(1 << 32) for _ in range(length)]
        if command in (Command.READ, Command.READ_FIXED):
            words = []
        script.append(bytes([command, length]) + address.to_bytes(4, "big")
                      + b"".join(w.to_bytes(4, "big") for w in words))
    script.append(READ_STATUS)
    answer, memory = run_core(bench, script, seed=4, stall=0.3)
    expected = b"".join(model.feed(f) for f in script)
    # NPU registers of the model are plain storage; only SCRATCH is written, so it agrees.
    assert answer == expected
    assert memory[:MEM] == bytes(model.memory)
    assert memory[MEM:] == bytes(MEM)         # beyond the mapped bytes: never touched


def test_out_of_range_frames_touch_nothing():
    image = random_image(MEM, 6)
    # The memory behind the bridge is larger than what it maps: the rest must stay zero.
    bench = core_bench(MEM, words=MEM // 2, init=image_words(image, 32))
    last = MEM // 4 - 1
    script = [
        encode_write(last - 3, list(range(MAX_WORDS))),         # runs past the end
        encode_read(last - 1, 3),                               # likewise: zeros
        encode_write(NPU_REGS_BASE - 2, [1, 2, 3, 4]),          # straddles into the registers
        encode_write((1 << 32) - 2, [5, 6, 7]),                 # wraps the 32-bit space
        bytes([Command.WRITE, 0]) + (7).to_bytes(4, "big"),     # length 0: nothing
        encode_read(4, 0),
        READ_STATUS,
    ]
    answer, memory = run_core(bench, script)
    words = decode_words(answer)
    assert words[:3] == [0, 0, 0]
    assert status_of(words[3:]) == ({"range"}, 6)
    assert memory == image + bytes(MEM)


def test_bad_command_is_dropped_until_idle():
    image = random_image(MEM, 7)
    bench = core_bench(MEM, init=image_words(image, 32))
    # A stray byte, then a frame sent without a pause: it is dropped with the garbage (its
    # bytes could be the tail of a corrupted frame). After an idle timeout frames work again.
    script = [
        b"\x00", encode_write(0, [0xAAAA_AAAA]), TIMEOUT + 8,
        bytes([0x7F, 0x02, 0x01]), TIMEOUT + 8,
        encode_write(1, [0x5555_5555]), encode_read(0, 2), READ_STATUS,
    ]
    answer, memory = run_core(bench, script)
    words = decode_words(answer)
    assert words[:2] == [int.from_bytes(image[:4], "little"), 0x5555_5555]
    assert status_of(words[2:]) == ({"command"}, 2)
    assert memory[:4] == image[:4] and memory[8:] == image[8:]


def test_truncated_frames_time_out():
    image = random_image(MEM, 8)
    bench = core_bench(MEM, init=image_words(image, 32))
    full = encode_write(16, [0x0102_0304, 0x0506_0708, 0x090A_0B0C, 0x0D0E_0F10])
    script = [
        full[:5], TIMEOUT + 4,                 # inside the address
        full[:6 + 4 + 2], TIMEOUT + 4,         # inside the second word: the first is written
        encode_read(0, 3)[:3], TIMEOUT + 4,    # a read cut short answers nothing
        encode_read(16, 2), READ_STATUS,
    ]
    answer, memory = run_core(bench, script)
    words = decode_words(answer)
    assert words[:2] == [0x0102_0304, int.from_bytes(image[68:72], "little")]
    assert status_of(words[2:]) == ({"timeout"}, 1)
    assert memory[:64] == image[:64] and memory[68:] == image[68:]


def test_a_short_pause_is_not_a_timeout():
    bench = core_bench(MEM)
    frame = encode_write(2, [0xCAFE_F00D, 0x1234_5678])
    script = [frame[:3], TIMEOUT - 4, frame[3:9], TIMEOUT - 4, frame[9:], encode_read(2, 2),
              READ_STATUS]
    answer, _ = run_core(bench, script)
    words = decode_words(answer)
    assert words[:2] == [0xCAFE_F00D, 0x1234_5678]
    assert status_of(words[2:]) == (set(), 2)


def test_framing_error_drops_the_frame():
    bench = core_bench(MEM)
    frame = encode_write(0, [0x1111_1111, 0x2222_2222])
    script = [frame[:10], ERROR, frame[10:], encode_write(3, [9]), TIMEOUT + 4,
              encode_read(0, 4), READ_STATUS]
    answer, _ = run_core(bench, script)
    words = decode_words(answer)
    # The word before the error was written; the rest of the frame and the frame after it
    # (sent before the line was idle) were dropped.
    assert words[:4] == [0x1111_1111, 0, 0, 0]
    assert status_of(words[4:]) == ({"framing"}, 1)


def test_bus_error_answers_zero():
    # The bridge maps more bytes than the memory has: words past the memory get ``err``.
    bench = core_bench(MEM, words=MEM // 8)
    script = [encode_write(MEM // 8 - 1, [0xAB, 0xCD]), encode_read(MEM // 8 - 1, 2),
              READ_STATUS]
    answer, memory = run_core(bench, script)
    words = decode_words(answer)
    assert words[:2] == [0xAB, 0]
    assert status_of(words[2:]) == ({"bus"}, 2)
    assert memory == bytes_of([0] * (MEM // 8 - 1) + [0xAB])


def test_status_flags_clear_by_writing_one():
    bench = core_bench(MEM)
    clear = encode_write(BRIDGE_REGS_BASE, [BRIDGE["STATUS"].write_mask])
    script = [encode_read(MEM // 4, 1), READ_STATUS, clear, READ_STATUS]
    answer, _ = run_core(bench, script)
    words = decode_words(answer)
    assert status_of(words[1:3]) == ({"range"}, 1)
    assert status_of(words[3:5]) == (set(), 3)


@pytest.mark.parametrize("kwargs,message", [
    ({"mem_bytes": 6}, "multiple of 4"),
    ({"mem_bytes": 1 << 33}, "overlaps"),
    ({"mem_bytes": 64, "timeout": 0}, "timeout"),
    ({"mem_bytes": 64, "mem_width": 48}, "Data width"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BridgeCore(**kwargs)
