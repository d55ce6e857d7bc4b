# amaranth: UnusedElaboratable=no
"""Bulk MAC array checks on Verilator: 100,000 random operations per format in the quick suite
(more under ``-m slow``), random stalls on both streams, every result compared bit for bit with
the golden model."""

import numpy as np
import pytest

from npu_fpga.toolenv import apply_tool_env
from npu_model.mac import run_mac_program
from npu_sim.mac import compare_results, random_program, run_verilator
from npu_spec.config import preset


def _check(cfg, fmt, count, seed, stall):
    apply_tool_env()
    prog = random_program(cfg.macs, cfg.acc_slots, fmt, count, seed)
    expected, _ = run_mac_program(prog, cfg.macs, cfg.acc_slots, cfg.formats)
    got, stats = run_verilator(cfg, prog, seed=seed, stall=stall)
    bad = compare_results(expected, got)
    assert not bad, "\n".join(bad)
    assert len(got) == int(np.count_nonzero(prog["last"]))
    assert stats["sent"] == len(prog["op"]) == stats["active"]
    return stats


@pytest.mark.parametrize("fmt", ["int8", "fp16", "mixed"])
def test_100k_operations(fmt):
    cfg = preset("small")
    _check(cfg, fmt, 100_000, seed=11, stall=0.25)


def test_ice40_int8_100k():
    _check(preset("ice40"), "int8", 100_000, seed=12, stall=0.25)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["int8", "fp16", "mixed"])
@pytest.mark.parametrize("seed", [101, 102])
def test_1m_operations(fmt, seed):
    cfg = preset("small")
    _check(cfg, fmt, 1_000_000, seed=seed, stall=0.1)


@pytest.mark.slow
def test_ecp5_preset_fp16():
    _check(preset("ecp5"), "fp16", 400_000, seed=13, stall=0.2)
