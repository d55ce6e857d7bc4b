"""``npu build``: a board's bitstream (``docs/boards.md``).

:func:`build_board` elaborates :class:`npu_fpga.boards.BoardTop` for a board through its
``amaranth-boards`` platform (``platform.prepare``), writes the toolchain's files into a build
directory and runs the commands of the platform's build plan (Yosys, nextpnr, the packer) one by
one, so that place and route gets the seed, the router and a time limit, and so that a design
that does not fit the device is reported rather than raised:

* Yosys synthesises the whole board top (``synth_ice40 -dsp`` / ``synth_ecp5``);
* nextpnr places and routes it with ``--seed``, ``--router``, ``--timing-allow-fail`` and
  ``--report``; a run past the time limit is stopped and reported (``timed_out``, no
  bitstream);
* when nextpnr fails because the device is too small (more cells of a type than it has, or no
  legal placement), :class:`BoardReport` says ``fits=False`` with the utilisation nextpnr
  printed and no bitstream; when its utilisation table after packing already shows more
  cells of a type than the device has, nextpnr is stopped there rather than left to its
  placer;
* otherwise the packer (``icepack`` / ``ecppack``) writes the bitstream.

:func:`program_board` flashes a bitstream with the board's programmer (``iceprog`` for the
iCEBreaker, ``openFPGALoader -b ulx3s`` for the ULX3S) and raises :class:`ProgramError` with
one line when the tool is missing or finds no board.
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field

from .boards import BOARDS, board_plan
from .synth import (
    ROUTERS,
    TARGETS,
    SynthError,
    SynthStopped,
    SynthTimeout,
    _count_cells,
    _critical_path,
    _netlist_luts_ffs,
    _run,
    _tail,
    find_tool,
    lut_mapper_steps,
)

__all__ = ["BOARD_LUT_MAPPER", "BOARD_ROUTER", "BOARD_TARGETS", "BoardReport", "ProgramError",
           "build_board", "program_board"]

#: The synthesis target (:data:`npu_fpga.synth.TARGETS`) of each board: its device, cell
#: names and default router.
BOARD_TARGETS = {"icebreaker": "ice40-up5k", "ulx3s": "ecp5-85f"}

#: Yosys options a board build adds to its target's (``-dsp`` on the iCE40): the UP5K's
#: single-port RAMs (``SB_SPRAM256KA``, 4 x 32 KiB) are inferred for memories that fit them.
BOARD_SYNTH_OPTS = {"icebreaker": "-spram"}

#: LUT mapper of each board by default (:data:`npu_fpga.synth.LUT_MAPPERS`): Yosys 0.70's
#: ABC9 stops with an internal assertion on the whole ``ulx3s`` NPU (``docs/synthesis.md``).
BOARD_LUT_MAPPER = {"icebreaker": "abc9", "ulx3s": "abc"}

#: nextpnr router of each board by default, where it is not its target's
#: (:data:`npu_fpga.synth.TARGETS`): the whole ULX3S NPU takes router1, which routed every
#: ECP5 design it was given and, from the same placements, to a higher Fmax than router2 (and
#: sooner on the fuller device), while router2 has not finished the board
#: (``docs/synthesis.md``, "The whole ULX3S board routed").
BOARD_ROUTER = {"ulx3s": "router1"}

#: Tool of each command of an Amaranth build plan, as the environment variable that names it.
_TOOL_VARS = {"yosys": "YOSYS", "nextpnr-ice40": "NEXTPNR_ICE40", "nextpnr-ecp5": "NEXTPNR_ECP5",
              "icepack": "ICEPACK", "ecppack": "ECPPACK"}

#: nextpnr messages that mean the design does not fit the device.
_NO_FIT = re.compile(r"no Bels remaining|Unable to find legal placement|"
                     r"design is probably at utilisation limit|Failed to place|"
                     r"[Uu]nable to place cell|too many|not enough", re.IGNORECASE)


@dataclass
class BoardReport:
    """Result of one :func:`build_board`.

    The keys of :class:`npu_fpga.synth.SynthReport`'s JSON that ``npu build --json`` shares
    (``fmax_mhz``, ``target_mhz``, ``met``, ``luts``, ``logic_cells``, ``dsps``, ``brams``,
    ``utilization``) mean the same here, for the whole board top; ``fits`` is true when the
    design was placed and routed with no overuse, ``bitstream`` the path of the bitstream
    (``None`` when it does not fit or the build failed), ``pnr_seconds`` the wall time of
    place and route, ``message`` nextpnr's reason when it does not fit. ``timed_out`` is true
    when place and route ran past the time limit and was stopped (``fits`` false, ``message``
    the one-line reason). ``critical_path`` is what nextpnr printed after routing: its
    "Critical path report" section of each clock, without the ``Info:`` prefixes (``""`` when
    the design was not routed); the build directory keeps it as ``<name>.paths.txt``.
    """

    board: str
    preset: str
    device: str
    seed: int
    router: str
    clock: str
    target_mhz: float
    fits: bool
    fmax_mhz: float | None = None
    met: bool = False
    luts: int | None = None
    ffs: int | None = None
    logic_cells: int | None = None
    dsps: int | None = None
    brams: int | None = None
    spram: int | None = None
    utilization: dict = field(default_factory=dict)
    synth_seconds: float | None = None
    pnr_seconds: float | None = None
    bitstream: str | None = None
    build_dir: str = ""
    message: str = ""
    timed_out: bool = False
    critical_path: str = ""

    def to_dict(self):
        return dataclasses.asdict(self)

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2)

    def format(self):
        """A few human-readable lines."""
        head = (f"{self.board} ({self.device}), preset {self.preset}, seed {self.seed}, "
                f"{self.router}, clock {self.clock}")
        lines = [head]
        if self.timed_out:
            lines.append(f"  STOPPED: {self.message}")
        elif not self.fits:
            lines.append(f"  DOES NOT FIT: {self.message}")
        else:
            fmax = "n/a" if self.fmax_mhz is None else f"{self.fmax_mhz:.1f} MHz"
            lines.append(f"  Fmax {fmax}, target {self.target_mhz:g} MHz: "
                         f"{'met' if self.met else 'NOT MET'}")
            if _path_summary(self.critical_path):
                lines.append(f"  critical path: {_path_summary(self.critical_path)}")
        for cell, u in self.utilization.items():
            if u["used"]:
                pct = 100 * u["used"] / u["available"] if u["available"] else 0
                lines.append(f"  {cell:<16} {u['used']:>7} / {u['available']:<7} {pct:6.1f}%")
        times = [f"synthesis {self.synth_seconds:.0f} s" if self.synth_seconds is not None
                 else None,
                 f"place and route {self.pnr_seconds:.0f} s" if self.pnr_seconds is not None
                 else None]
        lines.append("  " + ", ".join(t for t in times if t))
        lines.append(f"  bitstream: {self.bitstream or 'none'}")
        return "\n".join(lines)


# nextpnr's progress lines (its --log): router2 "iter=6 wires=1264265 overused=42568 ...",
# router1's table rows "      6000 |      409       5590 |  113   887 |     50135| ...", the
# HeAP placer's "at iteration #5, type ALL: ..." and the annealer's "at iteration #10: temp".
_ROUTER2_ITER = re.compile(r"iter=(\d+) wires=\d+ overused=(\d+)")
_ROUTER1_ROW = re.compile(r"^Info:\s+(\d+) \|\s+\d+\s+\d+ \|\s+\d+\s+\d+ \|\s+(\d+)\|",
                          re.MULTILINE)
_HEAP_ITER = re.compile(r"at iteration #(\d+), type ALL")
_ANNEAL_ITER = re.compile(r"at iteration #(\d+): temp")


def _pnr_where(log_text):
    # Where nextpnr was, from its log, as a clause for a stopped run's message ("" if unknown).
    for pattern, say in ((_ROUTER2_ITER, "router2 was at iteration {} with {} overused wires"),
                         (_ROUTER1_ROW, "router1 had {1} arcs left to route after {0}"),
                         (_ANNEAL_ITER, "the placer was refining (annealing iteration {})"),
                         (_HEAP_ITER, "the placer was at its HeAP iteration {}")):
        found = pattern.findall(log_text)
        if found:
            last = found[-1] if isinstance(found[-1], tuple) else (found[-1],)
            return say.format(*(f"{int(n):,}" for n in last))
    return ""


def _path_summary(critical_path):
    # "<ns> ns (<logic> logic, <routing> routing) from <first cell> to <last cell>" of the
    # first clock's section of a critical_path text; "" when it has none.
    section = critical_path.split("\n\n")[0]
    sources = re.findall(r"\bSource (\S+)", section)
    sinks = re.findall(r"\bSink (\S+)", section)
    split = re.search(r"([\d.]+) ns logic, ([\d.]+) ns routing", section)
    if not (sources and sinks and split):
        return ""
    total = float(split[1]) + float(split[2])
    return (f"{total:.2f} ns ({split[1]} logic, {split[2]} routing) from {sources[0]} to "
            f"{sinks[-1]}")


def _log_utilization(text):
    # nextpnr's "Device utilisation:" block: "Info:  ICESTORM_LC:  6012/  5280   113%".
    util = {}
    for cell, used, available in re.findall(r"Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", text):
        util[cell] = {"used": int(used), "available": int(available)}
    return util


def _no_fit_reason(text, utilization):
    over = [f"{cell} {u['used']}/{u['available']}" for cell, u in utilization.items()
            if u["available"] and u["used"] > u["available"]]
    if over:
        return "more cells than the device has: " + ", ".join(over)
    for line in text.splitlines():
        if "ERROR" in line and _NO_FIT.search(line):
            return line.split("ERROR:", 1)[-1].strip()
    return ""


def _over_capacity(log_path):
    # The no-fit reason once nextpnr's log has its "Device utilisation" table (after packing)
    # and a cell type in it is used beyond what the device has; else None.
    text = _tail(log_path, 100_000)
    if "Device utilisation" not in text:
        return None
    table = text[text.index("Device utilisation"):]
    return _no_fit_reason("", _log_utilization(table)) or None


def _command(argv):
    var = _TOOL_VARS.get(argv[0])
    if var is None:
        raise SynthError(f"unexpected command in the build plan: {argv[0]}", step=argv[0])
    return [find_tool(var), *argv[1:]]


def build_board(board, config, *, seed=1, router=None, timeout=1800, clk_mhz=None,
                build_dir=None, name="npu_board", progress=None, lut_mapper=None, **kwargs):
    """Build the bitstream of ``board`` with the NPU of ``config``; a :class:`BoardReport`.

    Parameters
    ----------
    board : str
        A key of :data:`npu_fpga.boards.BOARDS`.
    config : NPUConfig
    seed : int
        nextpnr placement seed.
    router : str or None
        nextpnr router; the board's default (:data:`BOARD_ROUTER`, else its target's,
        :data:`npu_fpga.synth.TARGETS`).
    timeout : float or None
        Time limit of place and route in seconds (``None`` or 0: none).
    clk_mhz : float or None
        Clock from the PLL (:class:`npu_fpga.boards.BoardTop`); ``None``: the oscillator.
    build_dir : str or None
        Where the files go (default ``build/<board>``); the bitstream stays there.
    lut_mapper : str or None
        ``"abc9"`` or ``"abc"`` (:data:`npu_fpga.synth.LUT_MAPPERS`); the board's default
        (:data:`BOARD_LUT_MAPPER`) if ``None``. ``"abc"`` is for the ECP5 only.
    **kwargs
        Passed to :class:`npu_fpga.boards.BoardTop` (``baud``, ``mem_bytes``, ...).

    Raises
    ------
    ValueError
        Unknown board or router, or a clock the PLL cannot make.
    SynthError
        A tool is missing or fails for another reason than the design's size.

    Place and route that runs past ``timeout`` is stopped; the report then has ``fits`` false
    and ``timed_out`` true.
    """
    if board not in BOARDS:
        raise ValueError(f"unknown board {board!r}; choose from {', '.join(BOARDS)}")
    tgt = TARGETS[BOARD_TARGETS[board]]
    router = BOARD_ROUTER.get(board, tgt.router) if router is None else router
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}, not {router!r}")
    say = progress or (lambda msg: None)
    directory = os.path.abspath(build_dir or os.path.join("build", board))
    os.makedirs(directory, exist_ok=True)
    report_name = f"{name}.report.json"
    nextpnr_opts = ["--seed", str(seed), "--router", router, "--timing-allow-fail",
                    "--report", report_name]
    opts = {"nextpnr_opts": " ".join(nextpnr_opts)}
    lut_mapper = BOARD_LUT_MAPPER[board] if lut_mapper is None else lut_mapper
    synth_opts = " ".join(filter(None, (tgt.synth_opts, BOARD_SYNTH_OPTS.get(board))))
    opts.update(_lut_mapper_overrides(tgt, lut_mapper, synth_opts, name))
    clock, target_mhz = _clock(board, clk_mhz)     # refuses a clock the PLL cannot make
    say(f"build: elaborating the {board} top with preset {config.name}, clock {clock}")
    plan = board_plan(board, config, name=name, clk_mhz=clk_mhz, prepare_opts=opts, **kwargs)
    plan.extract(directory)
    commands = json.loads(plan.files[f"build_{name}.json"])["commands"]
    report = BoardReport(board=board, preset=config.name, device=tgt.device, seed=seed,
                         router=router, clock=clock, target_mhz=target_mhz, fits=False,
                         build_dir=directory)

    synth, pnr, pack = (_command(c) for c in commands)
    report.synth_seconds = round(_run("yosys", synth, cwd=directory,
                                      log_path=os.path.join(directory, f"{name}.yosys.log"),
                                      progress=say, keep=True,
                                      watch=os.path.join(directory, f"{name}.rpt")), 1)
    pnr_log = os.path.join(directory, f"{name}.nextpnr.log")
    other = "router2" if router == "router1" else "router1"
    pnr_tim = os.path.join(directory, f"{name}.tim")     # nextpnr's --log
    if os.path.exists(pnr_tim):
        os.remove(pnr_tim)      # an earlier build's log must not stop this one
    start = time.monotonic()
    try:
        _run(f"nextpnr-{tgt.family}, seed {seed}, {router}", pnr, cwd=directory,
             log_path=pnr_log, progress=say, keep=True, timeout=timeout or None,
             hint=f"try the other router ({other}), another seed, or a larger time limit",
             watch=pnr_tim, stop=_over_capacity)
        failed = None
    except SynthStopped as e:
        # More cells than the device has after packing: placement cannot succeed, and
        # nextpnr's placer can take a long time to find that out.
        report.pnr_seconds = round(time.monotonic() - start, 1)
        _resources(report, tgt, directory, name, _tail(pnr_tim, 100_000))
        report.message = e.reason + " (nextpnr stopped after packing)"
        say(f"build: the design does not fit: {report.message}")
        return report
    except SynthTimeout as e:
        # A router that does not converge: no bitstream, and the report says why.
        report.pnr_seconds = round(time.monotonic() - start, 1)
        report.timed_out, report.message = True, str(e).splitlines()[0]
        where = _pnr_where(_tail(pnr_tim, 5_000))
        if where:
            report.message += f" ({where})"
        _resources(report, tgt, directory, name, _tail(pnr_log, 100_000))
        say(f"build: {report.message}")
        return report
    except SynthError as e:
        failed = e
    report.pnr_seconds = round(time.monotonic() - start, 1)
    text = _tail(pnr_log, 100_000) + "\n" + _tail(pnr_tim, 100_000)
    _resources(report, tgt, directory, name, text)
    if failed is not None:
        reason = _no_fit_reason(text, report.utilization)
        if not reason:
            raise failed
        report.message = reason
        say(f"build: the design does not fit: {reason}")
        return report
    report.fits = True
    _timing(report, directory, report_name)
    report.critical_path = _critical_path(_tail(pnr_tim, 1_000_000))
    with open(os.path.join(directory, f"{name}.paths.txt"), "w") as f:
        f.write(report.critical_path + "\n")
    _run(os.path.basename(pack[0]), pack, cwd=directory,
         log_path=os.path.join(directory, f"{name}.pack.log"), progress=say, keep=True)
    bitstream = os.path.join(directory, f"{name}.{'bin' if tgt.family == 'ice40' else 'bit'}")
    if not os.path.exists(bitstream):
        raise SynthError(f"the packer wrote no {bitstream}", step="pack")
    report.bitstream = bitstream
    return report


def _lut_mapper_overrides(tgt, lut_mapper, synth_opts, name):
    # The platform's Yosys script is "synth_* <synth_opts> -top <name>", then the
    # script_after_synth override, then write_json.
    opts, after = lut_mapper_steps(tgt, lut_mapper, synth_opts, name)
    overrides = {"synth_opts": opts} if opts else {}
    if after:
        overrides["script_after_synth"] = "\n".join(after)
    return overrides


def _clock(board, clk_mhz):
    from .boards import board_pll, make_platform
    platform_mhz = make_platform(board).default_clk_frequency / 1e6
    setting = board_pll(board, platform_mhz, clk_mhz)
    if setting is None:
        return f"oscillator {platform_mhz:g} MHz", platform_mhz
    return (f"{setting.primitive} {setting.out_mhz:.4g} MHz from {platform_mhz:g} MHz",
            round(setting.out_mhz, 3))


def _resources(report, tgt, directory, name, log_text):
    # Cell counts: from nextpnr's report when it finished, else from its log; LUT4 and
    # flip-flops from the Yosys netlist.
    path = os.path.join(directory, f"{name}.report.json")
    util = {}
    if os.path.exists(path) and os.path.getmtime(path) >= os.path.getmtime(
            os.path.join(directory, f"{name}.json")):
        with open(path) as f:
            util = {cell: {"used": int(u["used"]), "available": int(u["available"])}
                    for cell, u in json.load(f).get("utilization", {}).items()}
    report.utilization = util or _log_utilization(log_text)

    def used(kind):
        cell = tgt.cells.get(kind)
        return report.utilization.get(cell, {}).get("used") if cell else None

    try:
        with open(os.path.join(directory, f"{name}.json")) as f:
            modules = json.load(f)["modules"]
        counts = _count_cells(modules, name, {})
        report.luts, report.ffs = _netlist_luts_ffs(tgt.family, counts)
    except (OSError, ValueError, KeyError):
        pass
    if tgt.family == "ecp5" and used("luts") is not None:
        report.luts = used("luts")
    report.logic_cells = used("logic_cells")
    report.dsps = used("dsps")
    report.brams = used("brams")
    report.spram = used("spram")


def _timing(report, directory, report_name):
    with open(os.path.join(directory, report_name)) as f:
        fmax = json.load(f).get("fmax", {})
    # The NPU's clock: the PLL output, or the oscillator; the slowest if several.
    if fmax:
        worst = min(fmax.values(), key=lambda c: c["achieved"])
        report.fmax_mhz = round(float(worst["achieved"]), 2)
        report.met = report.fmax_mhz >= report.target_mhz


class ProgramError(RuntimeError):
    """Flashing the board failed (one line: the tool missing, no board, the tool's error)."""


#: Programmer of each board: the command (``{bitstream}`` replaced) and its Debian package.
PROGRAMMERS = {
    "icebreaker": (("iceprog", "{bitstream}"), "fpga-icestorm"),
    "ulx3s": (("openFPGALoader", "-b", "ulx3s", "{bitstream}"), "openfpgaloader"),
}


def program_board(board, bitstream, *, timeout=120, progress=None):
    """Flash ``bitstream`` onto the board with its programmer (``OPENFPGALOADER`` / ``ICEPROG``
    name another binary); :class:`ProgramError` with one line when it fails."""
    argv, package = PROGRAMMERS[board]
    var = "OPENFPGALOADER" if argv[0] == "openFPGALoader" else "ICEPROG"
    tool = shutil.which(os.environ.get(var) or argv[0])
    if tool is None:
        raise ProgramError(f"{argv[0]} is not installed (apt-get install {package}, or run "
                           f"scripts/setup.sh)")
    command = [tool, *(a.format(bitstream=bitstream) for a in argv[1:])]
    (progress or (lambda msg: None))(f"program: {' '.join(command)}")
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ProgramError(f"{argv[0]} did not finish in {timeout} s") from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr + "\n" + done.stdout).splitlines()
                 if ln.strip()]
        hint = next((ln for ln in lines if re.search(r"error|fail|can't|cannot|unable|not "
                                                     r"found", ln, re.IGNORECASE)),
                    lines[-1] if lines else f"exit status {done.returncode}")
        raise ProgramError(f"{argv[0]} could not program the {board} (is the board attached "
                           f"over USB?): {hint}")
    return done.stdout
