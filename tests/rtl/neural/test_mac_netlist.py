# amaranth: UnusedElaboratable=no
"""The MAC array's generated Verilog under cocotb, on Icarus and Verilator."""

from pathlib import Path

import pytest
from amaranth.back import verilog

from npu.lib.shared import SharedModules
from npu.neural.mac import MacArray
from npu.neural.mac_select import MAC_UNIT_MODULE, shared_mac_unit
from npu_sim.cocotb_runner import SIMULATORS, run_cocotb
from npu_spec.config import preset

HERE = Path(__file__).parent

pytestmark = pytest.mark.cocotb


CASES = [(sim, preset_name, fmt) for sim in SIMULATORS
         for preset_name, fmt in [("small", "fp16"), ("small", "mixed"), ("ice40", "int8")]]


# Verilator builds of the float array take about a minute each: one of them stays quick.
@pytest.mark.parametrize("simulator, preset_name, fmt", [
    pytest.param(*case, marks=pytest.mark.slow) if case == ("verilator", "small", "mixed")
    else case for case in CASES])
def test_mac_array_netlist(tmp_path, simulator, preset_name, fmt):
    result = run_cocotb(MacArray(preset(preset_name)), toplevel="mac_array",
                        test_module="cocotb_mac_array", python_path=[HERE],
                        simulator=simulator, build_dir=tmp_path / "build",
                        extra_env={"MAC_PRESET": preset_name, "MAC_FORMAT": fmt,
                                   "MAC_COUNT": "3200", "MAC_SEED": "21"})
    assert result.passed == ("cocotb_mac_array.test_random_program",)


@pytest.mark.parametrize("fmt", ["fp16", "mixed"])
def test_mac_array_of_shared_units(tmp_path, fmt):
    """The array as ``top_verilog`` writes it: its units are instances of one converted MAC
    unit; the same random program against the golden model."""
    config = preset("small")
    shared = SharedModules()
    array = MacArray(config, unit=shared_mac_unit(config, shared))
    text = verilog.convert(array, name="mac_array", emit_src=False)
    assert shared.names() == [MAC_UNIT_MODULE]
    text += "\n" + shared.verilog()
    # One unit module, instantiated once per MAC.
    assert text.count(f"module {MAC_UNIT_MODULE}(") == 1
    assert text.count(f"  {MAC_UNIT_MODULE} ") == config.macs
    path = tmp_path / "mac_array.v"
    path.write_text(text)
    result = run_cocotb([path], toplevel="mac_array", test_module="cocotb_mac_array",
                        python_path=[HERE], simulator="icarus", build_dir=tmp_path / "build",
                        extra_env={"MAC_PRESET": "small", "MAC_FORMAT": fmt,
                                   "MAC_COUNT": "3200", "MAC_SEED": "22"})
    assert result.passed == ("cocotb_mac_array.test_random_program",)
