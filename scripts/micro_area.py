# amaranth: UnusedElaboratable=no
"""Area of the micro build's parts on the iCE40UP5K (``docs/micro.md``, "Measured area").

Usage: ``python scripts/micro_area.py [--part dma runner top sysmem] [--seed 1]
[--synth-opts OPTS]``.
Each part is synthesised and placed out of context with ``npu_fpga.synth.synthesize`` on
``ice40-up5k`` (Yosys ``-dsp -spram`` unless ``--synth-opts`` says otherwise; nextpnr, the
target's default router); one row a part: logic cells, EBR, DSP, SPRAM, the harness's own
flip-flops (a flip-flop a port bit, included in the logic cells) and Fmax. ``runner`` is the
task runner with the register file; ``top`` the micro NPU with no engine units (their tasks
end with ``UNSUPPORTED``): runner, register file, DMA unit, buffer and kernel memory;
``sysmem`` the board's system memory with its two ports (``npu.micro.sysmem``).
"""

import argparse

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.lib.csr import CSRSignature
from npu.micro.dma import MicroDMA
from npu.micro.regfile import MicroRegisterFile
from npu.micro.runner import MicroRunner
from npu.micro.sysmem import MicroSystemMemory
from npu.micro.top import MicroNPU
from npu_fpga.synth import SynthError, synthesize
from npu_spec.config import preset


class RunnerWithRegisters(wiring.Component):
    """The task runner and the register file, with the unit side as ports."""

    def __init__(self, config):
        self._config = config
        runner = MicroRunner(config)
        super().__init__({
            "bus": In(CSRSignature(16)), "irq": Out(1),
            "mem_addr": Out(runner.mem_addr_bits), "mem_re": Out(1), "mem_rdata": In(32),
            "engine": Out(2), "running": Out(1), "start": Out(1), "done": In(1),
            "error": In(4), "reg_addr": In(16), "reg_data": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        runner = m.submodules.runner = MicroRunner(self._config)
        regs = m.submodules.regs = MicroRegisterFile()
        wiring.connect(m, wiring.flipped(self.bus), runner.bus)
        m.d.comb += [self.irq.eq(runner.irq), self.mem_addr.eq(runner.mem_addr),
                     self.mem_re.eq(runner.mem_re), runner.mem_rdata.eq(self.mem_rdata),
                     self.engine.eq(runner.engine), self.running.eq(runner.running),
                     self.start.eq(runner.start), runner.done.eq(self.done),
                     runner.error.eq(self.error), regs.w_addr.eq(runner.reg_w_addr),
                     regs.w_data.eq(runner.reg_w_data), regs.w_en.eq(runner.reg_w_en),
                     runner.ne_core0.eq(regs.ne_core0), regs.r_addr.eq(self.reg_addr),
                     self.reg_data.eq(regs.r_data)]
        return m


PARTS = {"dma": MicroDMA, "runner": RunnerWithRegisters, "top": MicroNPU,
         "sysmem": lambda config: MicroSystemMemory(config.mem_kib * 256)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--preset", default="icebreaker")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--synth-opts", default="-dsp -spram")
    args = parser.parse_args(argv)
    config = preset(args.preset)
    print("part     LC      EBR  DSP  SPRAM  harness FF  Fmax MHz")
    for name in args.part:
        try:
            r = synthesize(PARTS[name](config), "ice40-up5k", name=f"micro_{name}",
                           seed=args.seed, progress=None, synth_opts=args.synth_opts)
        except SynthError as error:
            print(f"{name:8} failed: {error.args[0].splitlines()[0]}")
            continue
        fmax = f"{r.fmax_mhz:.1f}" if r.fmax_mhz else "-"
        print(f"{name:8} {r.logic_cells:<7} {r.brams:<4} {r.dsps:<4} {r.spram:<6} "
              f"{r.harness_ffs:<11} {fmax}", flush=True)


if __name__ == "__main__":
    main()
