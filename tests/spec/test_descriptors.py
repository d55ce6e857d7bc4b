"""The descriptor encoder and decoder (pure Python)."""

import random

import pytest

from npu_spec.descriptors import (
    ENTRY,
    FLAGS,
    HEADER,
    MAGIC,
    PE,
    AddressError,
    DecodeError,
    Descriptor,
    WindowError,
    blocks_from_map,
    check_address,
    decode,
    encode,
    reserved_mask,
)
from npu_spec.engine import Engine
from npu_spec.registers import NPU_INFO, register_maps
from npu_spec.regmap import WriteBlock


def random_descriptor(rng):
    blocks = []
    for _ in range(rng.randrange(0, 4)):
        count = rng.randrange(1, 5)
        start = rng.choice((0x2000, 0x3000, 0x4000, 0x1000))
        blocks.append(WriteBlock(start + rng.randrange(0, 0x80), count,
                                 tuple(rng.getrandbits(32) for _ in range(count))))
    flags = {name: rng.random() < 0.5 for name in FLAGS}
    return Descriptor(task_id=rng.getrandbits(16), network=rng.getrandbits(8),
                      engine=rng.choice(list(Engine)), dep=rng.getrandbits(8),
                      src=rng.getrandbits(16), src_len=rng.getrandbits(8),
                      dst=rng.getrandbits(16), blocks=tuple(blocks), **flags)


def test_round_trip():
    rng = random.Random(1)
    for _ in range(200):
        desc = random_descriptor(rng)
        words = encode(desc)
        assert len(words) == desc.length
        assert decode(words) == desc


def test_layout_of_header():
    desc = Descriptor(task_id=0x1234, network=0x56, engine=PE, tse=True, spl=True, dep=3,
                      src=0x10, src_len=2, dst=0x20,
                      blocks=(WriteBlock(0x2000, 2, (7, 8)),))
    words = encode(desc)
    # H0: magic, length 7, engine bits [17:16], TSE bit 18, SPL bit 22.
    assert words[0] == MAGIC | 7 << 8 | 1 << 16 | 1 << 18 | 1 << 22
    dma = encode(Descriptor(task_id=0, engine=Engine.DMA, irq=True))
    # Engine 2 (DMA), IRQ bit 25.
    assert dma[0] == MAGIC | 4 << 8 | 2 << 16 | 1 << 25
    assert words[1] == 0x1234 | 0x56 << 16 | 3 << 24
    assert words[2] == 0x10 | 2 << 16
    assert words[3] == 0x20
    assert words[4:] == [0x2000 | 2 << 16, 7, 8]


def test_blocks_from_register_map():
    writes = [("SCRATCH", {"value": 5}), ("IRQ_STATUS", {"bus_read_error": 1})]
    blocks = blocks_from_map(NPU_INFO, writes)
    assert blocks == (WriteBlock(NPU_INFO.address("SCRATCH"), 2, (5, 1)),)
    desc = Descriptor(task_id=1, blocks=blocks)
    assert decode(encode(desc)).blocks == blocks


def test_every_register_map_is_addressable():
    for regmap in register_maps():
        for reg in regmap:
            check_address(regmap.base + reg.offset, 1)


@pytest.mark.parametrize("address", [0x0100, 0x0FFF, 0x5100, 0xFFFF])
def test_address_outside_windows(address):
    with pytest.raises(AddressError):
        encode(Descriptor(task_id=0, blocks=(WriteBlock(address, 1, (0,)),)))
    with pytest.raises(AddressError):
        check_address(address, 1)


def test_block_straddling_windows():
    with pytest.raises(AddressError):
        check_address(0x1FFF, 2)


@pytest.mark.parametrize("mutate", [
    lambda w: w.__setitem__(0, w[0] ^ 0x80),                   # magic
    lambda w: w.__setitem__(0, w[0] | 1 << 31),                # reserved H0
    lambda w: w.__setitem__(0, w[0] | 1 << 26),                # reserved H0, lowest bit
    lambda w: w.__setitem__(0, w[0] | 3 << 16),                # engine 3
    lambda w: w.__setitem__(2, w[2] | 1 << 28),                # reserved H2
    lambda w: w.__setitem__(3, w[3] | 1 << 16),                # reserved H3
    lambda w: w.__setitem__(0, (w[0] & ~0xFF00) | 2 << 8),     # too short
    lambda w: w.__setitem__(4, w[4] & 0xFFFF),                 # count 0
    lambda w: w.__setitem__(4, (w[4] & 0xFFFF) | 9 << 16),     # entry past the length
    lambda w: w.__delitem__(slice(5, None)),                   # truncated
])
def test_decode_errors(mutate):
    words = encode(Descriptor(task_id=1, blocks=(WriteBlock(0x2000, 1, (5,)),)))
    mutate(words)
    with pytest.raises(DecodeError):
        decode(words)


def test_network_and_window_checks():
    words = encode(Descriptor(task_id=1, network=4, src=0x100, src_len=4, dst=0x200))
    decode(words, network=4, window=(0x1000, 0x300), address=0x1000)
    with pytest.raises(DecodeError):
        decode(words, network=5)
    with pytest.raises(WindowError):
        decode(words, window=(0x1000, 0x200), address=0x1000)      # dst outside
    with pytest.raises(WindowError):
        decode(words, window=(0x1000, 0x300), address=0x0FFE)     # descriptor outside


@pytest.mark.parametrize("field,value", [("task_id", 1 << 16), ("network", 256), ("dep", -1),
                                         ("src_len", 256), ("engine", 3)])
def test_encode_range_errors(field, value):
    with pytest.raises(DecodeError):
        encode(Descriptor(**{"task_id": 0, field: value}))


def test_reserved_masks():
    # The bits above the last field of each word (docs/descriptors.md, "Layout").
    assert [reserved_mask(r) for r in HEADER] == [0xFC00_0000, 0, 0xFF00_0000, 0xFFFF_0000]
    assert reserved_mask(ENTRY) == 0


def test_tail_and_max_length():
    words = encode(Descriptor(task_id=1, blocks=(WriteBlock(0x2000, 2, (5, 6)),)))
    assert len(words) == 7
    decode(words, address=0x100, tail=0x107, max_length=7)
    decode(words, address=0x100, tail=0)                       # 0: unchecked
    with pytest.raises(WindowError):
        decode(words, address=0x100, tail=0x106)
    with pytest.raises(DecodeError):
        decode(words, max_length=6)


@pytest.mark.parametrize("mutate,address,error", [
    # H2's window error comes before H3's reserved bits.
    (lambda w: (w.__setitem__(2, (2 << 16) | 0x3FF), w.__setitem__(3, w[3] | 1 << 20)),
     0x1000, WindowError),
    # H1's network comes before H2's window.
    (lambda w: (w.__setitem__(1, w[1] ^ 1 << 16), w.__setitem__(2, (2 << 16) | 0x3FF)),
     0x1000, DecodeError),
    # An entry running past the length is a decode error even when its registers are unmapped.
    (lambda w: w.__setitem__(4, 0x5100 | 9 << 16), 0x1000, DecodeError),
    # H0's window error (the descriptor starts below the window) comes before H1's network.
    (lambda w: w.__setitem__(1, w[1] ^ 1 << 16), 0x0FFF, WindowError),
])
def test_first_failing_word_decides(mutate, address, error):
    words = encode(Descriptor(task_id=1, network=4, blocks=(WriteBlock(0x2000, 1, (5,)),)))
    mutate(words)
    with pytest.raises(error):
        decode(words, network=4, window=(0x1000, 0x400), address=address)
