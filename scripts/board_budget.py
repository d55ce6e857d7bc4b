# amaranth: UnusedElaboratable=no
"""Blocks of a board build beside the neural engine core, placed out of context on one target.

Usage: ``python scripts/board_budget.py [--preset icebreaker] [--target ice40-up5k]
[--block data_processor dma bridge] [--synth-opts "-dsp -spram"] [--keep DIR]``. Each block is
synthesised with ``npu_fpga.synth.synthesize`` (Yosys, then nextpnr, seed 1, the target's
default router; Yosys options the target's default unless ``--synth-opts`` is given, e.g. with
``-spram`` as ``npu build`` passes on the iCE40) in the out-of-context harness; a block that
does not fit stops at placement, and its figures are then the utilisation nextpnr printed
before it stopped (the log is kept for that). Prints one row a
block: logic cells (LUT4 on ECP5), EBR, DSP, SPRAM, the harness's own flip-flops, and how the
run ended. ``bridge`` is the board system without the NPU (``npu_fpga.boards.BoardSystem`` with
an empty NPU whose register bus and memory master are ports): the UART bridge, the memory
arbiter, the on-chip system memory and the LED logic (``docs/synthesis.md``, "iCEBreaker
budget").
"""

import argparse
import re
import sys
import tempfile
from pathlib import Path

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.dataproc.dataproc import DataProcessor
from npu.dma.engine import DMAEngine
from npu.lib.csr import CSRSignature
from npu.lib.wishbone import WishboneSignature
from npu.top import HOST_ADDR_BITS, MEM_ADDR_BITS
from npu_fpga.boards import BoardSystem
from npu_fpga.synth import TARGETS, OutOfContextHarness, SynthError, synthesize
from npu_spec.config import preset

# Cell types of the utilisation columns, per family: logic, block RAM, multiplier, large RAM.
COLUMNS = {"ice40": ("ICESTORM_LC", "ICESTORM_RAM", "ICESTORM_DSP", "ICESTORM_SPRAM"),
           "ecp5": ("TRELLIS_COMB", "DP16KD", "MULT18X18D", None)}


class _NoNPU(wiring.Component):
    """A stand-in for the NPU in a board system: its host register bus and memory master
    pass through to ports of :class:`_BridgeSystem`, so the harness keeps them."""

    def __init__(self, config, outer):
        self._outer = outer
        super().__init__({"bus": In(CSRSignature(HOST_ADDR_BITS)),
                          "mem": Out(WishboneSignature(MEM_ADDR_BITS, config.mem_width))})

    def elaborate(self, platform):
        m = Module()
        wiring.connect(m, wiring.flipped(self.bus), wiring.flipped(self._outer.npu_bus))
        wiring.connect(m, wiring.flipped(self.mem), wiring.flipped(self._outer.npu_mem))
        return m


class _BridgeSystem(wiring.Component):
    """The board system of ``config`` around :class:`_NoNPU`."""

    def __init__(self, config, clk_freq):
        self._config = config
        self._clk_freq = clk_freq
        super().__init__({
            "rx": In(1), "tx": Out(1), "busy": Out(1), "error": Out(1),
            "npu_bus": Out(CSRSignature(HOST_ADDR_BITS)),
            "npu_mem": In(WishboneSignature(MEM_ADDR_BITS, config.mem_width)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.system = system = BoardSystem(
            self._config, clk_freq=self._clk_freq, npu=_NoNPU(self._config, self))
        m.d.comb += [system.rx.eq(self.rx), self.tx.eq(system.tx),
                     self.busy.eq(system.busy), self.error.eq(system.error)]
        return m


BLOCKS = {
    "data_processor": lambda cfg: DataProcessor(cfg),
    "dma": lambda cfg: DMAEngine(cfg),
    "bridge": lambda cfg: _BridgeSystem(cfg, clk_freq=12_000_000),
}

_UTIL = re.compile(r"Info:\s+(\w+):\s+(\d+)/\s*(\d+)")


def _utilisation(log_text):
    """``{cell type: used}`` of the last utilisation report in a nextpnr log."""
    used = {}
    for match in _UTIL.finditer(log_text):
        used[match.group(1)] = int(match.group(2))
    return used


def measure(name, config, target, directory, synth_opts=None):
    """``(used cells by type, harness flip-flops, how the run ended)`` of one block."""
    block = BLOCKS[name](config)
    harness_ffs = OutOfContextHarness(block).ffs
    build = Path(directory) / name
    try:
        report = synthesize(block, target, name=name, build_dir=build, keep_files=True,
                            progress=None, synth_opts=synth_opts)
    except SynthError as error:
        log = build / f"{name}.nextpnr.log"
        if not log.exists():
            raise
        return _utilisation(log.read_text()), harness_ffs, error.args[0].splitlines()[0]
    used = {kind: counts["used"] for kind, counts in report.utilization.items()}
    return used, harness_ffs, f"placed and routed, {report.fmax_mhz:.1f} MHz"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="icebreaker")
    parser.add_argument("--target", default="ice40-up5k", choices=sorted(TARGETS))
    parser.add_argument("--block", nargs="+", default=list(BLOCKS), choices=list(BLOCKS))
    parser.add_argument("--synth-opts", help="Yosys synthesis options (default: the target's)")
    parser.add_argument("--keep", help="directory for the tool files")
    args = parser.parse_args(argv)
    try:
        config = preset(args.preset)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    directory = args.keep or tempfile.mkdtemp(prefix="npu-board-budget-")
    columns = COLUMNS[TARGETS[args.target].family]
    print(f"| block | {' | '.join(c or '-' for c in columns)} | harness FF | run |")
    print("|---|" + "---|" * (len(columns) + 2))
    for name in args.block:
        used, harness_ffs, how = measure(name, config, args.target, directory,
                                         args.synth_opts)
        cells = " | ".join(f"{used.get(c, 0):,}" if c else "-" for c in columns)
        print(f"| {name} | {cells} | {harness_ffs:,} | {how} |", flush=True)
    print(f"(tool files in {directory})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
