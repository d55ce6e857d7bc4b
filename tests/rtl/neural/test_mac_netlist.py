# amaranth: UnusedElaboratable=no
"""The MAC array's generated Verilog under cocotb, on Icarus and Verilator."""

from pathlib import Path

import pytest

from npu.neural.mac import MacArray
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
