"""cocotb test of the SPRAM build of the system memory against its block RAM build (run by
``test_sram_spram.py``).

Both builds of ``WishboneSRAM`` take the same random requests every cycle (``cyc``, ``stb``,
``we``, ``adr``, ``sel``, ``dat_w``; addresses in range, at bank edges and past the end). Every
cycle their ``ack`` and ``err`` must be equal; on the answer to a read, every byte of ``dat_r``
that has been written must be equal (SPRAM has no initial contents, the block RAM starts at
zero, so bytes never written are not compared).
"""

import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge


def _address(rng, words):
    pick = rng.random()
    if pick < 0.4:
        return rng.randrange(0, min(words, 24))
    if pick < 0.6:
        return max(0, min(words - 1, 16384 + rng.randrange(-6, 6)))
    if pick < 0.9:
        return max(0, words + rng.randrange(-6, 4))
    return rng.randrange(0, 1 << 30)


def _bytes_of(value, lanes):
    """The bytes of a LogicArray, lowest first, each an int or None if not all 0/1."""
    bits = str(value)[::-1]   # lowest bit first
    out = []
    for i in range(lanes):
        chunk = bits[8 * i:8 * i + 8][::-1]
        out.append(int(chunk, 2) if set(chunk) <= {"0", "1"} else None)
    return out


@cocotb.test()
async def test_random_requests(dut):
    words = int(os.environ["SRAM_WORDS"])
    width = int(os.environ["SRAM_WIDTH"])
    count = int(os.environ["SRAM_COUNT"])
    rng = random.Random(int(os.environ["SRAM_SEED"]))
    lanes = width // 8
    written = set()                 # (word, lane) written at least once

    Clock(dut.clk, 10, unit="ns").start()
    dut.cyc.value = dut.stb.value = dut.we.value = 0
    dut.adr.value = dut.sel.value = dut.dat_w.value = 0
    dut.rst.value = 1
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0

    pending = None                  # the request taken in the previous cycle
    compared = errors = 0
    for _ in range(count):
        cyc = int(rng.random() < 0.9)
        stb = int(rng.random() < 0.85)
        we = int(rng.random() < 0.5)
        adr = _address(rng, words)
        sel = rng.randrange(1 << lanes)
        dut.cyc.value, dut.stb.value, dut.we.value = cyc, stb, we
        dut.adr.value, dut.sel.value = adr, sel
        dut.dat_w.value = rng.getrandbits(width)
        await ReadOnly()
        for name in ("ack", "err", "stall"):
            g, s = int(getattr(dut, f"g_{name}").value), int(getattr(dut, f"s_{name}").value)
            assert g == s, f"{name}: block RAM {g}, SPRAM {s} (request {pending})"
        if pending is not None:
            p_we, p_adr, p_sel = pending
            inside = p_adr < words
            assert int(dut.s_ack.value) == inside and int(dut.s_err.value) == (not inside)
            errors += not inside
            if inside and not p_we:
                g = _bytes_of(dut.g_dat_r.value, lanes)
                s = _bytes_of(dut.s_dat_r.value, lanes)
                for lane in range(lanes):
                    if (p_adr, lane) in written:
                        assert g[lane] is not None and g[lane] == s[lane], \
                            f"read of word {p_adr:#x} lane {lane}: block RAM {g}, SPRAM {s}"
                        compared += 1
            if inside and p_we:
                written |= {(p_adr, lane) for lane in range(lanes) if p_sel >> lane & 1}
        else:
            assert not int(dut.s_ack.value) and not int(dut.s_err.value)
        pending = (we, adr, sel) if cyc and stb else None
        await RisingEdge(dut.clk)
    # The test compared enough to mean something.
    assert compared > count // 8 and errors > count // 50, (compared, errors)
    dut._log.info(f"{compared} bytes compared, {errors} err answers")
