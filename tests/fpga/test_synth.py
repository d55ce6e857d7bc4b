# amaranth: UnusedElaboratable=no
"""Out-of-context synthesis: the harness (fast) and real runs of both targets (``-m synth``)."""

import json
import os
import time

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_fpga.synth import (
    TARGETS,
    OutOfContextHarness,
    SynthError,
    SynthReport,
    SynthTimeout,
    find_tool,
    synthesize,
)


class PipelinedMAC(wiring.Component):
    """8x8 signed multiply-accumulate into a 32-bit accumulator, three pipeline stages.

    Members
    -------
    a, b : In(signed(8))
        Operands.
    valid : In(1)
        Accumulate ``a * b``.
    clear : In(1)
        Start a new sum (with the product if ``valid``, else with zero).
    acc : Out(signed(32))
        The sum, two cycles after the last operands.
    """

    a: In(signed(8))
    b: In(signed(8))
    valid: In(1)
    clear: In(1)
    acc: Out(signed(32))

    def elaborate(self, platform):
        m = Module()

        # Stage 1: operands (reset-less, like a datapath register).
        a = Signal(signed(8), reset_less=True)
        b = Signal(signed(8), reset_less=True)
        valid_1 = Signal()
        clear_1 = Signal()
        m.d.sync += [a.eq(self.a), b.eq(self.b), valid_1.eq(self.valid), clear_1.eq(self.clear)]

        # Stage 2: product.
        product = Signal(signed(16))
        valid_2 = Signal()
        clear_2 = Signal()
        m.d.sync += [product.eq(a * b), valid_2.eq(valid_1), clear_2.eq(clear_1)]

        # Stage 3: accumulator.
        with m.If(clear_2):
            m.d.sync += self.acc.eq(Mux(valid_2, product, 0))
        with m.Elif(valid_2):
            m.d.sync += self.acc.eq(self.acc + product)

        return m


class StreamAdder(wiring.Component):
    """Combinational: nested stream ports and a port array, to exercise port flattening."""

    def __init__(self):
        self._layout = data.StructLayout({"x": 5, "y": 5})
        super().__init__({
            "i": In(stream.Signature(self._layout)),
            "o": Out(stream.Signature(6)),
            "taps": Out(3).array(2),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [
            self.o.payload.eq(self.i.payload.x + self.i.payload.y),
            self.o.valid.eq(self.i.valid),
            self.i.ready.eq(self.o.ready),
            self.taps[0].eq(self.i.payload.x[:3]),
            self.taps[1].eq(self.i.payload.y[:3]),
        ]
        return m


class Counter(wiring.Component):
    count: Out(7)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.count.eq(self.count + 1)
        return m


class Sink(wiring.Component):
    data: In(8)

    def elaborate(self, platform):
        return Module()


class FastCounter(wiring.Component):
    count: Out(4)

    def elaborate(self, platform):
        m = Module()
        m.d.fast += self.count.eq(self.count + 1)
        return m


# Harness generation, without tools.

def test_harness_mac():
    harness = OutOfContextHarness(PipelinedMAC())
    assert harness.in_width == 8 + 8 + 1 + 1
    assert harness.out_width == 32
    assert set(harness.signature.members) == {"clk", "rst", "din", "dout"}
    # XOR tree over 32 bits: 8 + 2 + 1 nodes.
    assert harness.luts == 11
    assert harness.ffs == 2 + 18 + 32 + 11
    text = rtlil.convert(harness, name="top")
    assert "module \\top\n" in text
    assert "module \\top.dut\n" in text
    for name in ("ooc_in", "ooc_out", "ooc_xor0_0", "ooc_xor2_0"):
        assert f"\\{name}" in text


def test_harness_nested_ports():
    harness = OutOfContextHarness(StreamAdder())
    assert harness.in_width == 10 + 1 + 1           # i.payload, i.valid, o.ready
    assert harness.out_width == 1 + 6 + 1 + 3 + 3   # i.ready, o.payload, o.valid, taps
    rtlil.convert(harness)


def test_harness_without_inputs():
    harness = OutOfContextHarness(Counter())
    assert harness.in_width == 0
    assert "din" not in harness.signature.members
    # XOR tree over 7 bits: 2 + 1 nodes.
    assert harness.ffs == 2 + 7 + 3 and harness.luts == 3
    rtlil.convert(harness)


def test_harness_single_output_bit():
    harness = OutOfContextHarness(Counter(), ports=None)
    assert harness.out_width == 7
    block = Module()
    flag = Signal()
    block.d.sync += flag.eq(~flag)
    harness = OutOfContextHarness(block, ports={"flag": (flag, Out)})
    assert harness.out_width == 1 and harness.luts == 0 and harness.ffs == 3
    rtlil.convert(harness)


def test_harness_needs_outputs():
    with pytest.raises(ValueError, match=r"has no output ports"):
        OutOfContextHarness(Sink())


def test_harness_needs_ports():
    with pytest.raises(TypeError, match=r"must have a wiring signature or be given ports="):
        OutOfContextHarness(Module())
    with pytest.raises(ValueError, match=r"Direction of port 'x' must be In or Out"):
        OutOfContextHarness(Module(), ports={"x": (Signal(), "in")})


def test_bad_target():
    with pytest.raises(ValueError, match=r"Unknown target 'xc7a35t'; choose one of "
                                         r"'ecp5-85f', 'ice40-up5k'"):
        synthesize(PipelinedMAC(), "xc7a35t")


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"Clock frequency must be a positive number"):
        synthesize(PipelinedMAC(), "ecp5-85f", freq_mhz=0)
    with pytest.raises(ValueError, match=r"Name must be an identifier, not 'a b'"):
        synthesize(PipelinedMAC(), "ecp5-85f", name="a b")


def test_missing_tool(monkeypatch):
    monkeypatch.setenv("YOSYS", "/nonexistent/yosys")
    with pytest.raises(SynthError, match=r"YOSYS: cannot find the tool '/nonexistent/yosys'"):
        synthesize(PipelinedMAC(), "ice40-up5k", progress=None)


def test_failing_tool(monkeypatch, tmp_path):
    # `false` stands in for a Yosys that fails.
    monkeypatch.setenv("YOSYS", "false")
    monkeypatch.setenv("NEXTPNR_ICE40", "false")
    with pytest.raises(SynthError, match=r"yosys synth_ice40 -dsp failed with exit code 1"):
        synthesize(PipelinedMAC(), "ice40-up5k", build_dir=tmp_path, progress=None)
    # The files written into a given build directory are removed unless kept.
    assert os.listdir(tmp_path) == []


def test_other_clock_domain(monkeypatch):
    monkeypatch.setenv("YOSYS", "true")
    monkeypatch.setenv("NEXTPNR_ECP5", "true")
    with pytest.raises(ValueError, match=r"clock domain 'fast'.*DomainRenamer"):
        synthesize(FastCounter(), "ecp5-85f", progress=None)


def test_report_format():
    report = SynthReport(
        target="ice40-up5k", device=TARGETS["ice40-up5k"].device, name="top", seed=1,
        target_mhz=50.0, fmax_mhz=48.25, met=False, luts=75, ffs=131, dsps=1, brams=0,
        spram=0, logic_cells=166, harness_luts=11, harness_ffs=63,
        utilization={"ICESTORM_LC": {"used": 166, "available": 5280},
                     "ICESTORM_DSP": {"used": 1, "available": 8}})
    text = report.format()
    assert "48.2 MHz" in text and "NOT MET" in text
    assert "logic cells" in text and "5280" in text
    assert "(harness 63)" in text
    assert json.loads(report.to_json())["utilization"]["ICESTORM_DSP"]["used"] == 1


# Real synthesis and place-and-route.

def _require_tools(target):
    try:
        find_tool("YOSYS")
        find_tool(TARGETS[target].nextpnr_var)
    except SynthError as error:
        pytest.skip(str(error))


@pytest.mark.synth
@pytest.mark.parametrize("target", list(TARGETS))
def test_synth_mac(target, tmp_path):
    _require_tools(target)
    lines = []
    report = synthesize(PipelinedMAC(), target, name="mac", build_dir=tmp_path,
                        keep_files=True, progress=lines.append)
    assert any(line.startswith("synth: yosys") for line in lines)
    assert any(line.startswith("synth: nextpnr") for line in lines)

    assert report.target == target
    assert report.target_mhz == TARGETS[target].default_mhz
    assert report.fmax_mhz > 0
    assert report.met == (report.fmax_mhz >= report.target_mhz)
    assert report.critical_path.startswith("Critical path report for clock ")
    assert report.luts > 0
    assert report.dsps == 1
    assert report.brams == 0
    # The harness is counted exactly, and the block is not optimised away: at least its
    # accumulator and product remain.
    harness = OutOfContextHarness(PipelinedMAC())
    assert (report.harness_luts, report.harness_ffs) == (harness.luts, harness.ffs)
    assert report.ffs - report.harness_ffs >= 32 + 16
    if target == "ice40-up5k":
        assert report.logic_cells >= report.ffs
        assert report.spram == 0 and report.lutram is None
    else:
        assert report.lutram == 0 and report.spram is None and report.logic_cells is None

    assert "Fmax" in report.format()
    assert json.loads(report.to_json())["fmax_mhz"] == report.fmax_mhz
    for path in report.files.values():
        assert os.path.isfile(path)
    assert os.path.basename(report.files["netlist"]) == "mac.json"


@pytest.mark.synth
@pytest.mark.parametrize("target", list(TARGETS))
def test_synth_yosys_only(target):
    """``place=False``: the Yosys netlist's cells, no nextpnr and no Fmax."""
    try:
        find_tool("YOSYS")
    except SynthError as error:
        pytest.skip(str(error))
    lines = []
    report = synthesize(PipelinedMAC(), target, name="mac", progress=lines.append, place=False)
    assert not any(line.startswith("synth: nextpnr") for line in lines)
    assert not report.placed and report.fmax_mhz is None and not report.met
    assert report.dsps == 1 and report.brams == 0
    harness = OutOfContextHarness(PipelinedMAC())
    assert (report.harness_luts, report.harness_ffs) == (harness.luts, harness.ffs)
    assert report.ffs - report.harness_ffs >= 32 + 16
    cells = report.netlist_cells
    if target == "ecp5-85f":
        assert report.luts == cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0)
        assert report.utilization["TRELLIS_COMB"] == {"used": report.luts, "available": 83640}
    else:
        assert report.luts == cells["SB_LUT4"] and report.logic_cells is None
    assert "Yosys only" in report.format() and "MHz" not in report.format()


@pytest.mark.synth
def test_synth_ice40_without_dsp():
    _require_tools("ice40-up5k")
    report = synthesize(PipelinedMAC(), "ice40-up5k", synth_opts="", freq_mhz=20, seed=2,
                        progress=None)
    assert report.dsps == 0
    assert report.target_mhz == 20.0 and report.seed == 2
    assert report.files == {}


@pytest.mark.synth
def test_ice40_mac_array_fits_with_dsps(tmp_path):
    """The ice40 preset's MAC array places on the UP5K with one DSP per lane."""
    from npu.neural.mac import MacArray
    from npu_spec.config import preset

    cfg = preset("ice40")
    report = synthesize(MacArray(cfg), "ice40-up5k", name="mac_array", build_dir=tmp_path,
                        progress=lambda msg: None)
    assert report.dsps == cfg.macs
    assert report.logic_cells <= 5280
    assert report.fmax_mhz > 0


# The time limit of place and route.

def test_pnr_timeout_stops_a_router_that_does_not_finish(monkeypatch, tmp_path):
    # A stand-in nextpnr that never finishes (and starts a child of its own, which must be
    # stopped too); `true` stands in for Yosys.
    marker = tmp_path / "child.pid"
    fake = tmp_path / "fake-nextpnr"
    fake.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {marker}\nwait\n")
    fake.chmod(0o755)
    monkeypatch.setenv("YOSYS", "true")
    monkeypatch.setenv("NEXTPNR_ICE40", str(fake))
    lines = []
    start = time.monotonic()
    with pytest.raises(SynthTimeout, match=r"nextpnr-ice40 place and route at 50 MHz, seed 1, "
                                           r"router1 stopped after 1 s \(time limit\): it did "
                                           r"not finish; try the other router \(router2\)"
                       ) as info:
        synthesize(PipelinedMAC(), "ice40-up5k", build_dir=tmp_path / "build", timeout=1,
                   progress=lines.append)
    assert time.monotonic() - start < 20
    assert info.value.seconds == 1 and info.value.step.startswith("nextpnr-ice40")
    assert isinstance(info.value, SynthError)
    child = int(marker.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the stand-in router's child process is still running")


def test_router_and_timeout_arguments():
    assert TARGETS["ice40-up5k"].router == "router1"
    assert TARGETS["ecp5-85f"].router == "router2"
    with pytest.raises(ValueError, match=r"Router must be one of router1, router2, not 'r3'"):
        synthesize(PipelinedMAC(), "ice40-up5k", router="r3")
    with pytest.raises(ValueError, match=r"Timeout must be a number of seconds >= 0"):
        synthesize(PipelinedMAC(), "ice40-up5k", timeout=-1)


@pytest.mark.synth
def test_pnr_timeout_real_nextpnr(tmp_path):
    """The real nextpnr is stopped by a limit shorter than its run."""
    _require_tools("ice40-up5k")
    from npu.neural.mac_select import mac_array
    from npu_spec.config import preset

    with pytest.raises(SynthTimeout, match=r"stopped after 2 s"):
        synthesize(mac_array(preset("ice40")), "ice40-up5k", build_dir=tmp_path, timeout=2,
                   progress=None)


def test_blocks_see_the_device():
    from npu.neural.mac_ice40 import is_ice40_platform
    from npu_fpga.synth import OutOfContextPlatform

    assert is_ice40_platform(OutOfContextPlatform(TARGETS["ice40-up5k"]))
    assert not is_ice40_platform(OutOfContextPlatform(TARGETS["ecp5-85f"]))
    assert OutOfContextPlatform(TARGETS["ecp5-85f"]).family == "ecp5"


@pytest.mark.synth
def test_ice40_mac_array_two_lanes_per_dsp(tmp_path):
    """The ice40 preset's MAC array (mac_impl="ice40") places on the UP5K with two lanes per
    SB_MAC16, its slots in 2 EBR per lane, and far fewer logic cells than the generic build
    (4,706 logic cells, docs/synthesis.md)."""
    from npu.neural.mac_select import mac_array
    from npu_spec.config import preset

    cfg = preset("ice40")
    report = synthesize(mac_array(cfg), "ice40-up5k", name="mac_array", build_dir=tmp_path,
                        progress=None)
    assert report.router == "router1" and report.pnr_seconds > 0
    assert report.dsps == cfg.macs // 2
    assert report.brams == 2 * cfg.macs
    assert report.logic_cells < 3500
    assert report.fmax_mhz > 30


def test_first_error_names_a_wasm_trap():
    """A YoWASP tool that runs out of stack says so in the one-line error."""
    from npu_fpga.synth import _first_error
    tail = "Running ABC command\nCaused by:\n    wasm trap: call stack exhausted\n"
    assert _first_error(tail) == "wasm trap: call stack exhausted"
    assert _first_error("all fine\n") == ""


def test_a_long_tool_run_reports_progress(monkeypatch, tmp_path):
    """A tool that runs longer than the progress interval gets progress lines with its time so
    far and the last step of its log (a Yosys pass here); they stop when it ends."""
    import npu_fpga.synth
    from npu_fpga.synth import _run
    monkeypatch.setattr(npu_fpga.synth, "PROGRESS_INTERVAL", 0.2)
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\necho '1. Executing HIERARCHY pass.'\n"
                    "echo '4.2. Executing ABC pass.'\necho 'some output'\nsleep 1.5\n")
    tool.chmod(0o755)
    lines = []
    seconds = _run("yosys", [str(tool)], cwd=tmp_path, log_path=tmp_path / "log",
                   progress=lines.append, keep=False)
    heartbeats = [line for line in lines if "running for" in line]
    assert lines[0] == "synth: yosys ..." and lines[-1].startswith("synth: yosys done in")
    assert 3 <= len(heartbeats) <= 8 and seconds >= 1.5
    assert all(line.endswith("at: ABC pass") for line in heartbeats[1:]), heartbeats


@pytest.mark.synth
def test_classic_lut_mapper_on_the_ecp5():
    """``lut_mapper="abc"``: a complete ECP5 netlist (every LUT a ``LUT4`` or a PFU
    multiplexer of them, no generic cell left) within a quarter of ABC9's LUT4 count, and
    the same flip-flops and DSPs."""
    reports = {mapper: synthesize(PipelinedMAC(), "ecp5-85f", name="mac", place=False,
                                  progress=None, lut_mapper=mapper)
               for mapper in ("abc9", "abc")}
    abc, abc9 = reports["abc"], reports["abc9"]
    print({mapper: (r.luts, r.ffs, r.dsps) for mapper, r in reports.items()})
    assert not [cell for cell in abc.netlist_cells if cell.startswith("$")]
    assert abc.netlist_cells.get("LUT4", 0) > 0
    assert abc.ffs == abc9.ffs and abc.dsps == abc9.dsps
    assert 0.75 * abc9.luts <= abc.luts <= 1.25 * abc9.luts
