"""The system simulation with the engines on gated clocks (``NPUTop(gate_clocks=True)``)
against the build with the free-running clock: the same programs give the same cycle counts,
task trace, registers and final memory, and both equal the golden system model."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

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


def _lines_by_trigger(obj_dir):
    """Lines of the generated clocked-region functions (``_eval_nba``) by the set of
    triggers they run under: ``{frozenset of trigger texts: lines}``."""
    fast = "".join(p.read_text() for p in sorted(obj_dir.glob("Vtop___024root__*.cpp"))
                   if "Slow" not in p.name)
    slow = "".join(p.read_text() for p in obj_dir.glob("Vtop___024root__*Slow.cpp"))
    act = re.search(r"_dump_triggers__act\(.*?\n\}\n", slow, re.S).group(0)
    triggers = dict(re.findall(r"trigger index (\d+) is active: @\((.*?)\)\\n", act))
    lines = {m.group(1): m.group(2).count("\n") for m in re.finditer(
        r"^void (Vtop___024root___nba_\w+)\(Vtop___024root\* vlSelf\) \{\n(.*?)^\}",
        fast, re.S | re.M)}
    body = re.search(r"void Vtop___024root___eval_nba\(.*?\n\}\n", fast, re.S).group(0)
    split, mask = {}, None
    for line in body.splitlines():
        if m := re.match(r"\s+if \(\((\w+) & vlSelfRef\.__VnbaTriggered", line):
            mask = int(m.group(1).removesuffix("ULL"), 0)
        elif (m := re.match(r"\s+(Vtop___024root___nba_\w+)\(vlSelf\);", line)) and mask:
            key = frozenset(triggers[str(i)] for i in range(64) if mask >> i & 1)
            split[key] = split.get(key, 0) + lines[m.group(1)]
    return split


@pytest.mark.slow
def test_planar_logic_runs_on_planar_edges_only(tmp_path):
    """The planar engine's boundary registers (``npu.top._planar_boundary``) leave no planar
    datapath logic that Verilator evaluates on ``sync`` edges: in the gated ``small`` build,
    the logic run on ``sync`` or ``pe`` edges (and no core's) is small, that run on ``pe``
    edges only is most of the design (``docs/system.md``: 2 % and 71 %; 18 % and 55 % before)."""
    from npu.lib.shared import SharedModules
    from npu_sim.sysmem import DPI_CPP, DPI_VERILOG
    from npu_sim.system import SystemBench
    from npu_sim.verilator import BUILD_FLAGS, StreamBench

    shared = SharedModules()
    bench = SystemBench(CFG, latency=LATENCY, shared=shared, gate_clocks=True, storage="dpi")
    sb = StreamBench(bench, extra_verilog=lambda: shared.verilog() + DPI_VERILOG,
                     extra_cpp=DPI_CPP)
    (tmp_path / "top.v").write_text(sb.verilog)
    (tmp_path / "main.cpp").write_text(sb.main_cpp)
    flags = [f for f in BUILD_FLAGS if f != "-MAKEFLAGS" and not f.startswith("OPT_")]
    verilator = shutil.which("verilator") or str(Path(sys.executable).parent / "verilator")
    subprocess.run([verilator, "--cc", "--exe", *flags, "top.v", "main.cpp"], cwd=tmp_path,
                   check=True, capture_output=True)
    split = _lines_by_trigger(tmp_path / "obj_dir")
    total = sum(split.values())
    pe = "posedge (clk & top.dut.npu.pe_enable_held)"
    assert split[frozenset({pe})] > 0.6 * total, split
    assert split.get(frozenset({"posedge clk", pe}), 0) < 0.05 * total, split
