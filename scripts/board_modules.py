# amaranth: UnusedElaboratable=no
"""Per-part resources of the micro board system on the iCE40UP5K without its NPU (Yosys only).

Usage: ``python scripts/board_modules.py [--clock-mhz 25.125] [--preset icebreaker]
[--keep DIR]``. ``npu_fpga.boards.BoardSystem`` of the preset (``npu_impl="micro"``) is built
around a stand-in micro NPU whose register bus and system-memory port are ports of the
out-of-context harness, and synthesised by ``synth_ice40 -dsp`` (the SPRAMs are instances) with
``keep_hierarchy`` on the bridge, its parts and the system memory, so each row is that part's
own cells (its share of the whole board; ``docs/bridge.md``, "Size of the board top").
``board glue`` is what the board system adds itself (LED stretcher, wiring).
"""

import argparse
import sys

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from core_modules import _row, _total, kept_stat, print_header, work_directory

from npu.lib.csr import CSRSignature
from npu_fpga.boards import BoardSystem
from npu_spec.config import preset

PARTS = ("bridge.uart_rx", "bridge.uart_tx", "bridge.rx_queue", "bridge.core", "memory")
COMMAND = "synth_ice40 -dsp"
COLUMNS = (("LUT4", ("SB_LUT4",)), ("FF", ("SB_DFF*",)), ("carry", ("SB_CARRY",)),
           ("EBR", ("SB_RAM40_4K",)), ("SPRAM", ("SB_SPRAM256KA",)))


class _StandIn(wiring.Component):
    """The micro NPU's ports, passed through to the harness (``_System``)."""

    def __init__(self, outer, addr_bits):
        self._outer = outer
        super().__init__({
            "bus": In(CSRSignature(16)), "mem_addr": Out(addr_bits), "mem_re": Out(1),
            "mem_rdata": In(32), "mem_wdata": Out(32), "mem_we": Out(4)})

    def elaborate(self, platform):
        from amaranth.hdl import Module
        m = Module()
        o = self._outer
        wiring.connect(m, wiring.flipped(self.bus), wiring.flipped(o.npu_bus))
        m.d.comb += [self.mem_addr.eq(o.mem_addr), self.mem_re.eq(o.mem_re),
                     o.mem_rdata.eq(self.mem_rdata), self.mem_wdata.eq(o.mem_wdata),
                     self.mem_we.eq(o.mem_we)]
        return m


class _System(wiring.Component):
    def __init__(self, config, clk_freq):
        self._config = config
        self._clk_freq = clk_freq
        self._addr_bits = ((config.mem_kib * 256) - 1).bit_length()
        super().__init__({
            "rx": In(1), "tx": Out(1), "busy": Out(1), "error": Out(1),
            "npu_bus": Out(CSRSignature(16)), "mem_addr": In(self._addr_bits),
            "mem_re": In(1), "mem_rdata": Out(32), "mem_wdata": In(32), "mem_we": In(4)})

    def elaborate(self, platform):
        from amaranth.hdl import Module
        m = Module()
        m.submodules.system = system = BoardSystem(
            self._config, clk_freq=self._clk_freq, npu=_StandIn(self, self._addr_bits))
        m.d.comb += [system.rx.eq(self.rx), self.tx.eq(system.tx),
                     self.busy.eq(system.busy), self.error.eq(system.error)]
        return m


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="icebreaker")
    parser.add_argument("--clock-mhz", type=float, default=25.125)
    parser.add_argument("--keep", help="directory for the RTLIL, script, log and stat")
    args = parser.parse_args(argv)
    config = preset(args.preset)
    if config.npu_impl != "micro":
        print(f"error: preset {args.preset} is not a micro build", file=sys.stderr)
        return 2
    directory = work_directory(args.keep, "npu-board-modules-")
    system = _System(config, args.clock_mhz * 1e6)
    kept = ["top.dut.system", "top.dut.system.bridge"]
    kept += [f"top.dut.system.{p}" for p in PARTS]
    modules = kept_stat(system, "top", "ice40-up5k", directory, lambda text: kept)
    print_header(f"micro board system without its NPU, preset {args.preset}, "
                 f"{args.clock_mhz:g} MHz, {COMMAND}", COLUMNS)
    glue = _total(modules, "top.dut.system")
    for part in PARTS:
        cells = _total(modules, f"top.dut.system.{part}")
        print(_row(part, cells, COLUMNS))
        glue.subtract(cells)
    bridge_glue = _total(modules, "top.dut.system.bridge")
    for part in PARTS[:-1]:
        bridge_glue.subtract(_total(modules, f"top.dut.system.{part}"))
    glue.subtract(bridge_glue)
    print(_row("bridge glue", bridge_glue, COLUMNS))
    print(_row("board glue", glue, COLUMNS))
    print(_row("board system", _total(modules, "top.dut.system"), COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
