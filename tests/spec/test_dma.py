"""The DMA transfer rules of the specification, against brute force over the index space."""

import itertools
import random

import pytest

from npu_spec.dma import (
    DMA,
    RANK,
    DmaDir,
    DmaError,
    DmaFormat,
    dma_error,
    extent,
    make_transfer,
    transfer_elements,
    transfer_writes,
)


def _random_transfer(rng):
    rank = rng.randint(1, RANK)
    sizes = [rng.randint(1, 4) for _ in range(rank)]
    return make_transfer(dir=rng.choice(list(DmaDir)), fmt=rng.choice(list(DmaFormat)),
                         core=rng.randint(0, 2), mem_addr=rng.randint(0, 200),
                         buf_addr=rng.randint(0, 200), sizes=sizes,
                         mem_strides=[rng.randint(-20, 20) for _ in range(rank)],
                         buf_strides=[rng.randint(-20, 20) for _ in range(rank)])


@pytest.mark.parametrize("seed", range(20))
def test_extent_and_elements_match_brute_force(seed):
    rng = random.Random(seed)
    t = _random_transfer(rng)
    pairs = list(transfer_elements(t))
    n = t["sizes"]
    assert len(pairs) == n[0] * n[1] * n[2] * n[3] * n[4]
    expected = []
    for i4, i3, i2, i1, i0 in itertools.product(*(range(k) for k in reversed(n))):
        idx = (i0, i1, i2, i3, i4)
        expected.append((t["mem_addr"] + sum(a * b for a, b in zip(idx, t["mem_strides"])),
                         t["buf_addr"] + sum(a * b for a, b in zip(idx, t["buf_strides"]))))
    assert pairs == expected
    mems = [p[0] for p in pairs]
    bufs = [p[1] for p in pairs]
    assert extent(t["mem_addr"], n, t["mem_strides"]) == (min(mems), max(mems))
    assert extent(t["buf_addr"], n, t["buf_strides"]) == (min(bufs), max(bufs))


@pytest.mark.parametrize("seed", range(40))
def test_error_matches_element_checks(seed):
    rng = random.Random(seed)
    t = _random_transfer(rng)
    limits = dict(cores=2, buffer_elements=150, kernel_words=120, limit_bytes=180)
    error = dma_error(t, **limits)
    kmem = t["dir"] == DmaDir.MEM_TO_KMEM
    if (t["fmt"] == DmaFormat.WORD) != kmem or (kmem and t["core"] >= 2):
        assert error == DmaError.BAD_MODE
        return
    size = {DmaFormat.INT8: 1, DmaFormat.HALF: 2, DmaFormat.WORD: 4}[t["fmt"]]
    pairs = list(transfer_elements(t))
    if any(m % size for m, _ in pairs):
        assert error == DmaError.ALIGN
    elif any(m < 0 or m + size > 180 for m, _ in pairs):
        assert error == DmaError.WINDOW
    elif any(b < 0 or b >= (120 if kmem else 150) for _, b in pairs):
        assert error == DmaError.BOUNDS
    else:
        assert error == DmaError.NONE


def test_zero_size_is_a_shape_error():
    t = make_transfer(dir=DmaDir.MEM_TO_BUF, fmt=DmaFormat.INT8, mem_addr=0, buf_addr=0,
                      sizes=[3, 0], mem_strides=[1, 3], buf_strides=[1, 3])
    assert dma_error(t, cores=1, buffer_elements=10, kernel_words=10,
                     limit_bytes=10) == DmaError.BAD_SHAPE


def test_writes_unpack_to_the_transfer():
    t = make_transfer(dir=DmaDir.BUF_TO_MEM, fmt=DmaFormat.HALF, mem_addr=0x1234,
                      buf_addr=77, sizes=[3, 4, 5], mem_strides=[2, -6, 24],
                      buf_strides=[1, 3, 12])
    words = dict(transfer_writes(t))
    by_name = {reg.name: words[DMA.base + reg.offset] for reg in DMA.registers
               if DMA.base + reg.offset in words}
    assert DMA["MODE"].unpack(by_name["MODE"])["dir"] == DmaDir.BUF_TO_MEM
    assert by_name["MEM_STRIDE1"] == (-6) & 0xFFFF_FFFF
    assert DMA["SIZE0"].unpack(by_name["SIZE0"]) == {"n0": 3, "n1": 4}
    assert DMA["SIZE1"].unpack(by_name["SIZE1"]) == {"n2": 5, "n3": 1}
    with pytest.raises(ValueError):
        make_transfer(dir=0, fmt=0, mem_addr=0, buf_addr=0, sizes=[1] * 6,
                      mem_strides=[], buf_strides=[])
