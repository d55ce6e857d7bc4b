# amaranth: UnusedElaboratable=no
"""The lean iCE40 block options on the UP5K (real synthesis and place and route): they stay
within the budgets of ``docs/synthesis.md`` ("Lean block options for the iCEBreaker build")."""

import pytest

from npu.neural.kernel_extract import kernel_extractor
from npu.neural.postproc_seq import post_processor
from npu_fpga.synth import TARGETS, SynthError, find_tool, synthesize
from npu_spec.config import preset

LEAN = preset("ice40").replace(kernel_extract="dense_int8", postproc_impl="sequential")


@pytest.fixture(autouse=True)
def _tools():
    try:
        find_tool("YOSYS")
        find_tool(TARGETS["ice40-up5k"].nextpnr_var)
    except SynthError as error:
        pytest.skip(str(error))


@pytest.mark.synth
@pytest.mark.parametrize("block, cells, ebr, dsp", [
    ("kernel_extract", 1100, 2, 0),        # measured 909 (harness 275 FF, 43 LUT)
    ("postproc", 2000, 3, 1),              # measured 1,844 (harness 665 FF, 46 LUT)
])
def test_lean_block_fits_its_budget(block, cells, ebr, dsp, tmp_path):
    """Logic cells (harness included), EBR and DSP within budget, at 25 MHz or more."""
    dut = kernel_extractor(LEAN) if block == "kernel_extract" else post_processor(LEAN)
    report = synthesize(dut, "ice40-up5k", name=block, build_dir=tmp_path, seed=1,
                        progress=None)
    assert report.logic_cells <= cells, report.format()
    assert report.brams <= ebr and report.dsps == dsp, report.format()
    assert report.fmax_mhz >= 25.0, report.format()
