"""The system simulation with the engines on gated clocks (``NPUTop(gate_clocks=True)``)
against the build with the free-running clock: the same programs give the same cycle counts,
task trace, registers and final memory, and both equal the golden system model."""

import pytest

from npu_model.system import run_program
from npu_sim.programs import random_program
from npu_sim.system import compare, rtl_run
from npu_spec.config import PRESETS
from tests.system.test_system import fig15_program

CFG = PRESETS["small"]
LATENCY = 4

#: What a run answers that must not depend on the clock gating (``rtl_run``'s result).
SAME = ("memory", "trace", "registers", "queues", "cycles", "bus_bytes", "bus_stall",
        "sim_cycles")


def both(program, **kwargs):
    """Run ``program`` on both builds; assert they answer alike and match the golden model."""
    free = rtl_run(program, backend="verilator", latency=LATENCY, gate_clocks=False, **kwargs)
    gated = rtl_run(program, backend="verilator", latency=LATENCY, gate_clocks=True, **kwargs)
    for key in SAME:
        assert gated[key] == free[key], key
    summary = compare(program, run_program(program), gated)
    assert summary["match"], summary
    return free, gated


@pytest.mark.parametrize("seed", range(3))
def test_random_programs_gated_equal_free(seed):
    free, _ = both(random_program(CFG, 5, 500 + seed), stall=0.25, seed=seed)
    assert free["sim_cycles"] > free["cycles"] > 0


def test_preemption_gated_equal_free():
    """Seed 000 FIG. 15's task switch (``tests/system/test_system.py``): a second network
    arrives while the first runs; the engines stop and start again between their tasks."""
    _, gated = both(fig15_program(), late={1: 2})
    assert gated["registers"]["SWITCHES"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40))
def test_random_programs_gated_equal_free_slow(seed):
    both(random_program(CFG, 6, 2000 + seed), stall=(seed % 4) / 8, seed=seed)


@pytest.mark.slow
def test_two_cores_gated_equal_free():
    """Two cores on one layer (``ecp5``): each core on a gated clock of its own."""
    from tests.system.test_system import _two_core_program
    config = PRESETS["ecp5"]
    program = _two_core_program(config, 2)
    free = rtl_run(program, backend="verilator", latency=LATENCY, gate_clocks=False)
    gated = rtl_run(program, backend="verilator", latency=LATENCY, gate_clocks=True)
    for key in SAME:
        assert gated[key] == free[key], key
    assert compare(program, run_program(program), gated)["match"]
