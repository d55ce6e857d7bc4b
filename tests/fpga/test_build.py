# amaranth: UnusedElaboratable=no
"""``npu build`` (``npu_fpga.build``, ``docs/boards.md``). The quick tests run the whole flow
with stand-in tools (shell scripts in place of Yosys, nextpnr and the packer) and a stand-in
NPU, so that what is checked is the flow itself: the build plan's commands with seed, router
and report, the fit report from nextpnr's log when the design does not fit (exit status 3, no
bitstream), the report and bitstream when it does, and the programmer's errors. The real tools
run in the ``synth`` group."""

import json
import os
import stat

import pytest

import npu_fpga.boards
from npu_cli.main import main
from npu_fpga.build import ProgramError, _pnr_where, build_board, program_board
from npu_spec.config import preset

from .test_boards import StandInNPU

NO_FIT_LOG = """Info: Packing constants..
Info: Device utilisation:
Info: \t         ICESTORM_LC:  9133/ 5280   172%
Info: \t        ICESTORM_RAM:    12/   30    40%
Info: \t               SB_IO:     6/   96     6%
Info: \t        ICESTORM_DSP:     4/    8    50%
ERROR: Unable to place cell 'x', no Bels remaining of type 'ICESTORM_LC'
"""

FIT_REPORT = {
    "utilization": {"ICESTORM_LC": {"used": 2000, "available": 5280},
                    "ICESTORM_DSP": {"used": 4, "available": 8},
                    "ICESTORM_RAM": {"used": 12, "available": 30},
                    "ICESTORM_SPRAM": {"used": 2, "available": 4}},
    "fmax": {"pll_clk": {"achieved": 31.7, "constraint": 25.125}},
}

#: The end of nextpnr's log (``--log``) after routing: a critical path of the clock, and one
#: from a pin, which is not the clock's.
ROUTED_LOG = """Info: Routing complete.
Info: Critical path report for clock 'pll_clk' (posedge -> posedge):
Info:       type curr  total name
Info:   clk-to-q  1.00  1.00 Source npu.dma.count_SB_DFF_Q.Q
Info:    routing  2.50  3.50 Net npu.dma.count[3] (3,4) -> (5,6)
Info:                          Sink npu.taskman.go_SB_LUT4_O.I0
Info:      logic  1.25  4.75 Source npu.taskman.go_SB_LUT4_O.O
Info:    routing  2.00  6.75 Net npu.taskman.go (5,6) -> (9,9)
Info:                          Sink npu.core0.start_SB_DFF_Q.D
Info: 2.25 ns logic, 4.50 ns routing

Info: Critical path report for cross-domain path '<async>' -> 'posedge pll_clk':
Info:       type curr  total name
Info:     source  0.00  0.00 Source uart_rx$sb_io.D_IN_0
Info:                          Sink bridge.rx_SB_DFF_Q.D
Info: 0.00 ns logic, 3.00 ns routing

Info: Max frequency for clock 'pll_clk': 31.70 MHz (PASS at 25.12 MHz)
"""


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """Stand-in tools; ``tools(fits)`` installs them. The nextpnr stand-in records its
    arguments in ``nextpnr.args``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def install(fits):
        monkeypatch.setenv("YOSYS", _script(bin_dir / "yosys",
                                            "echo '{\"modules\": {}}' > npu_board.json\n"))
        if fits:
            report = json.dumps(FIT_REPORT).replace("'", "")
            pnr = (f'echo "$@" > {bin_dir}/nextpnr.args\n'
                   f"echo '{report}' > npu_board.report.json\ntouch npu_board.asc\n"
                   f"cat > npu_board.tim <<'EOF'\n{ROUTED_LOG}EOF\n")
        else:
            pnr = (f'echo "$@" > {bin_dir}/nextpnr.args\n'
                   f"cat <<'EOF'\n{NO_FIT_LOG}EOF\nexit 1\n")
        monkeypatch.setenv("NEXTPNR_ICE40", _script(bin_dir / "nextpnr-ice40", pnr))
        monkeypatch.setenv("ICEPACK", _script(bin_dir / "icepack", 'cp "$1" "$2"\n'))
        return bin_dir
    # The board's NPU is a stand-in: the flow, not the NPU, is under test.
    monkeypatch.setattr(npu_fpga.boards, "NPUTop", StandInNPU)
    return install


def test_a_design_that_does_not_fit_is_reported(tools, tmp_path):
    bin_dir = tools(fits=False)
    report = build_board("icebreaker", preset("icebreaker"), seed=7, clk_mhz=25,
                         build_dir=tmp_path / "b")
    assert not report.fits and report.bitstream is None and report.fmax_mhz is None
    assert report.logic_cells == 9133 and report.dsps == 4 and report.brams == 12
    assert report.utilization["ICESTORM_LC"] == {"used": 9133, "available": 5280}
    assert "ICESTORM_LC 9133/5280" in report.message
    args = (bin_dir / "nextpnr.args").read_text().split()
    assert args[args.index("--seed") + 1] == "7"
    assert args[args.index("--router") + 1] == "router1"
    assert "--timing-allow-fail" in args and "--up5k" in args
    # Yosys gets the UP5K's DSPs and SPRAMs.
    assert "synth_ice40 -dsp -spram" in (tmp_path / "b" / "npu_board.ys").read_text()


def test_a_design_that_fits_gets_a_bitstream(tools, tmp_path):
    tools(fits=True)
    report = build_board("icebreaker", preset("icebreaker"), router="router2", clk_mhz=25,
                         build_dir=tmp_path / "b")
    assert report.fits and report.fmax_mhz == 31.7 and report.met
    assert report.target_mhz == 25.125        # what the PLL makes from 12 MHz
    assert report.logic_cells == 2000 and report.spram == 2 and report.router == "router2"
    assert report.bitstream == str(tmp_path / "b" / "npu_board.bin")
    assert os.path.exists(report.bitstream)
    assert report.pnr_seconds is not None and report.pnr_seconds >= 0
    # The routed critical path of the clock (not the pin's), in the report and in a file.
    assert report.critical_path.startswith("Critical path report for clock 'pll_clk'")
    assert "npu.core0.start_SB_DFF_Q.D" in report.critical_path
    assert "uart_rx" not in report.critical_path
    assert (tmp_path / "b" / "npu_board.paths.txt").read_text() == report.critical_path + "\n"
    assert ("critical path: 6.75 ns (2.25 logic, 4.50 routing) from npu.dma.count_SB_DFF_Q.Q "
            "to npu.core0.start_SB_DFF_Q.D") in report.format()


def test_npu_build_json_and_exit_status(tools, tmp_path, capsys):
    tools(fits=False)
    rc = main(["build", "--board", "icebreaker", "--json", "--build-dir", str(tmp_path / "b")])
    out = json.loads(capsys.readouterr().out)
    assert rc == 3
    for key in ("fmax_mhz", "target_mhz", "met", "luts", "logic_cells", "dsps", "brams",
                "utilization", "fits", "pnr_seconds", "router", "bitstream"):
        assert key in out, key
    assert out["fits"] is False and out["bitstream"] is None and out["router"] == "router1"
    tools(fits=True)
    assert main(["build", "--board", "icebreaker", "--build-dir", str(tmp_path / "b")]) == 0
    assert "Fmax 31.7 MHz, target 25.125 MHz: met" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["build", "--board", "arty"], "invalid choice"),
    (["build", "--board", "icebreaker", "--clock", "400"], "SB_PLL40_PAD: the output must be"),
    (["build", "--board", "ulx3s", "--clock", "fast"], "expected a clock in MHz"),
    (["build", "--board", "ulx3s", "--timeout", "-1"], "seconds >= 0"),
])
def test_npu_build_bad_arguments(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_programming_without_a_board_is_one_clear_line(tmp_path, monkeypatch):
    bitstream = tmp_path / "npu_board.bit"
    bitstream.write_bytes(b"\0")
    fake = _script(tmp_path / "openFPGALoader",
                   "echo 'unable to open ftdi device: -3 (device not found)' >&2\nexit 1\n")
    monkeypatch.setenv("OPENFPGALOADER", fake)
    with pytest.raises(ProgramError, match=r"could not program the ulx3s \(is the board "
                                           r"attached over USB\?\): unable to open ftdi"):
        program_board("ulx3s", str(bitstream))
    monkeypatch.setenv("ICEPROG", str(tmp_path / "no-such-iceprog"))
    with pytest.raises(ProgramError, match=r"iceprog is not installed \(apt-get install "
                                           r"fpga-icestorm"):
        program_board("icebreaker", str(bitstream))


@pytest.mark.synth
@pytest.mark.parametrize("board,mhz", [("icebreaker", 25), ("ulx3s", 60)])
def test_a_small_board_top_builds_with_the_real_tools(board, mhz, tmp_path):
    """The board top with its PLL, the bridge, 4 KiB of memory and a stand-in NPU through Yosys,
    nextpnr and the packer: it fits, meets the PLL's clock, and the bitstream is written."""
    config = preset(board).replace(npu_impl="blocks")       # the stand-in is a bus master
    report = build_board(board, config, clk_mhz=mhz, build_dir=tmp_path,
                         npu=StandInNPU(config), mem_bytes=4096)
    print(report.format())
    assert report.fits and report.met and os.path.getsize(report.bitstream) > 1000
    assert report.target_mhz == pytest.approx(mhz, rel=0.01)


ECP5_NO_FIT_LOG = """Info: Device utilisation:
Info: \t        TRELLIS_COMB: 150000/ 83640   179%
Info: \t          TRELLIS_FF:  40000/ 83640    47%
Info: \t          MULT18X18D:    100/   156    64%
Info: \t              DP16KD:    150/   208    72%
ERROR: Unable to place cell 'x', no BELs remaining to implement cell type 'TRELLIS_COMB'
"""


@pytest.fixture
def ecp5_tools(tmp_path, monkeypatch):
    """Stand-in Yosys and nextpnr-ecp5 (the design does not fit) for the ``ulx3s``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("YOSYS", _script(bin_dir / "yosys",
                                        "echo '{\"modules\": {}}' > npu_board.json\n"))
    monkeypatch.setenv("NEXTPNR_ECP5", _script(
        bin_dir / "nextpnr-ecp5", f"cat <<'EOF'\n{ECP5_NO_FIT_LOG}EOF\nexit 1\n"))
    monkeypatch.setenv("ECPPACK", _script(bin_dir / "ecppack", "exit 1\n"))
    monkeypatch.setattr(npu_fpga.boards, "NPUTop", StandInNPU)


def _yosys_script(directory):
    # The script's commands, spaces normalised, without comments and the reading of files.
    return [" ".join(line.split()) for line in (directory / "npu_board.ys").read_text()
            .splitlines() if line.strip() and not line.strip().startswith(("#", "read_"))]


def test_the_ulx3s_maps_luts_with_the_classic_abc(ecp5_tools, tmp_path):
    """The ``ulx3s`` build runs ``synth_ecp5`` up to its LUT mapping, maps with ``abc`` and
    finishes ``synth_ecp5`` from ``map_cells``, then writes the netlist; ``lut_mapper="abc9"``
    gives the platform's plain ``synth_ecp5``."""
    report = build_board("ulx3s", preset("ulx3s"), clk_mhz=60, build_dir=tmp_path / "a")
    assert not report.fits and "TRELLIS_COMB 150000/83640" in report.message
    # The board's router (router1, not its ECP5 target's router2) reaches nextpnr.
    assert report.router == "router1"
    assert "--router router1" in (tmp_path / "a" / "build_npu_board.sh").read_text()
    assert report.luts == 150000 and report.dsps == 100 and report.brams == 150
    assert _yosys_script(tmp_path / "a") == [
        "synth_ecp5 -run :map_luts -top npu_board",
        "check -latchonly -assert",
        "techmap -map +/lattice/latches_map.v",
        "abc -dress -lut 4",
        "clean",
        "synth_ecp5 -run map_cells: -top npu_board",
        "write_json npu_board.json"]
    build_board("ulx3s", preset("ulx3s"), clk_mhz=60, build_dir=tmp_path / "b",
                lut_mapper="abc9")
    assert _yosys_script(tmp_path / "b") == ["synth_ecp5 -top npu_board",
                                             "write_json npu_board.json"]


def test_the_classic_lut_mapper_is_for_the_ecp5_only(capsys):
    with pytest.raises(ValueError, match="ECP5 only"):
        build_board("icebreaker", preset("icebreaker"), lut_mapper="abc")
    with pytest.raises(ValueError, match="LUT mapper must be one of abc9, abc"):
        build_board("ulx3s", preset("ulx3s"), lut_mapper="abc10")
    assert main(["build", "--board", "icebreaker", "--lut-mapper", "abc"]) == 2
    err = capsys.readouterr().err
    assert "ECP5 only" in err and err.count("\n") == 1


#: Largest share of the device's LUTs a board's whole NPU may take (issue 15: at most 85% of
#: the LFE5U-85F's); a board not listed only has to fit.
LUT_SHARE_LIMIT = {"ulx3s": ("TRELLIS_COMB", 0.85)}


@pytest.mark.synth
@pytest.mark.parametrize("board", ["icebreaker", "ulx3s"])
def test_the_whole_board_fits_and_meets_its_clock(board, tmp_path):
    """``npu build --board BOARD``: the board's own preset, PLL clock and flow (LUT mapper,
    router, place-and-route time limit) with the real tools. The whole NPU must fit the device
    (on the ULX3S within :data:`LUT_SHARE_LIMIT`), meet the clock and get a bitstream; the test
    fails when a change makes the board's NPU too large or too slow (and while it still is:
    ``docs/synthesis.md`` has the figures). Takes from minutes (iCEBreaker) to over an hour
    (ULX3S)."""
    report = build_board(board, preset(board), clk_mhz=npu_fpga.boards.BOARDS[board].default_mhz,
                         build_dir=tmp_path, progress=print)
    print(report.format())
    assert report.fits, f"the {board}'s NPU does not fit: {report.message}"
    assert report.met, (f"the {board}'s NPU misses its clock: {report.fmax_mhz} MHz, target "
                        f"{report.target_mhz} MHz")
    assert os.path.getsize(report.bitstream) > 1000
    if board in LUT_SHARE_LIMIT:
        cell, share = LUT_SHARE_LIMIT[board]
        used = report.utilization[cell]
        assert used["used"] <= share * used["available"], (
            f"the {board}'s NPU takes {used['used']} of {used['available']} {cell}, more than "
            f"{share:.0%}")


def test_place_and_route_past_the_time_limit_is_reported(tools, tmp_path, capsys):
    """A router that never finishes is stopped at ``--timeout``: the report says ``fits``
    false and ``timed_out`` with the one-line reason, ``npu build`` prints it and exits 1."""
    bin_dir = tools(fits=True)
    _script(bin_dir / "nextpnr-ice40",
            "echo 'Info: Running router1...'\n"
            "printf 'Info: Running router1...\\n%s\\n%s\\n' "
            "'Info:       1000 |       49        950 |   49   950 |     54568|  10.47  10.47|' "
            "'Info:       2000 |       63       1936 |   14   986 |     53583|   3.34  13.81|' "
            "> npu_board.tim\nexec sleep 60\n")
    report = build_board("icebreaker", preset("icebreaker"), clk_mhz=25, timeout=1,
                         build_dir=tmp_path / "a")
    assert not report.fits and report.timed_out and report.bitstream is None
    assert "stopped after 1 s (time limit)" in report.message and "router1" in report.message
    # Where it was: the router's last progress line in nextpnr's log.
    assert report.message.endswith("(router1 had 53,583 arcs left to route after 2,000)")
    assert 1 <= report.pnr_seconds < 30
    rc = main(["build", "--board", "icebreaker", "--json", "--timeout", "1",
               "--build-dir", str(tmp_path / "b")])
    out, err = capsys.readouterr()
    assert rc == 1 and json.loads(out)["timed_out"] is True
    assert err.splitlines()[-1].startswith("npu build: nextpnr-ice40, seed 1, router1 stopped")


def test_nextpnr_over_capacity_after_packing_is_stopped(ecp5_tools, tmp_path, monkeypatch):
    """nextpnr's placer can work for a long time on a design with more cells than the device
    has: once its log's utilisation table (after packing) shows that, it is stopped and the
    design reported as not fitting, long before the time limit."""
    import npu_fpga.synth
    monkeypatch.setattr(npu_fpga.synth, "POLL_INTERVAL", 0.1)
    bin_dir = tmp_path / "bin"
    table = ECP5_NO_FIT_LOG.split("ERROR")[0]
    monkeypatch.setenv("NEXTPNR_ECP5", _script(bin_dir / "nextpnr-ecp5", (
        'while [ "$1" != "--log" ]; do shift; done\n'
        f"cat > \"$2\" <<'EOF'\n{table}Info: Creating initial analytic placement\nEOF\n"
        "exec sleep 60\n")))
    report = build_board("ulx3s", preset("ulx3s"), clk_mhz=60, build_dir=tmp_path / "a",
                         timeout=50)
    assert not report.fits and not report.timed_out and report.bitstream is None
    assert report.message == ("more cells than the device has: TRELLIS_COMB 150000/83640 "
                              "(nextpnr stopped after packing)")
    assert report.utilization["DP16KD"] == {"used": 150, "available": 208}
    assert report.luts == 150000 and report.pnr_seconds < 30


def test_an_earlier_builds_log_does_not_stop_nextpnr(ecp5_tools, tmp_path, monkeypatch):
    """The over-capacity check reads this run's log only: a log left in the build directory
    by an earlier build that did not fit does not stop a design that fits."""
    import npu_fpga.synth
    monkeypatch.setattr(npu_fpga.synth, "POLL_INTERVAL", 0.1)
    bin_dir, build_dir = tmp_path / "bin", tmp_path / "a"
    build_dir.mkdir()
    (build_dir / "npu_board.tim").write_text(ECP5_NO_FIT_LOG)
    report = {"utilization": {"TRELLIS_COMB": {"used": 50000, "available": 83640}},
              "fmax": {"clk": {"achieved": 64.5, "constraint": 60.0}}}
    monkeypatch.setenv("NEXTPNR_ECP5", _script(bin_dir / "nextpnr-ecp5", (
        f"sleep 1\necho '{json.dumps(report)}' > npu_board.report.json\n"
        "touch npu_board.config\n")))
    monkeypatch.setenv("ECPPACK", _script(bin_dir / "ecppack", "echo bits > npu_board.bit\n"))
    result = build_board("ulx3s", preset("ulx3s"), clk_mhz=60, build_dir=build_dir)
    assert result.fits and result.met and result.luts == 50000
    assert result.bitstream == str(build_dir / "npu_board.bit")


@pytest.mark.parametrize("log,where", [
    ("Info: Running router2...\nInfo:     iter=1 wires=1264265 overused=109471 overuse=132368 "
     "archfail=NA\nInfo:     iter=2 wires=1201000 overused=80123 overuse=90000 archfail=NA\n",
     "router2 was at iteration 2 with 80,123 overused wires"),
    ("Info:     at iteration #13, type ALL: wirelen solved = 484377, spread = 728695\n"
     "Info:     at iteration #14, type ALL: wirelen solved = 489790, spread = 726890\n",
     "the placer was at its HeAP iteration 14"),
    ("Info:     at iteration #14, type ALL: wirelen solved = 489790, spread = 726890\n"
     "Info: Running simulated annealing placer for refinement.\n"
     "Info:   at iteration #5: temp = 0.000000, timing cost = 6200, wirelen = 748970\n",
     "the placer was refining (annealing iteration 5)"),
    ("Info: Packing IOs..\n", ""),
])
def test_a_stopped_place_and_route_says_where_it_was(log, where):
    """The message of a run stopped at the time limit names nextpnr's last progress: the
    router's iteration and overuse, or the placer's step."""
    assert _pnr_where(log) == where
