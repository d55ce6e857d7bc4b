"""``npu build``: a board's bitstream, and ``--program`` to flash it (``docs/boards.md``).

``npu build --board icebreaker|ulx3s [--preset P] [--seed N] [--router R] [--timeout S]
[--clock MHZ|osc] [--lut-mapper abc9|abc] [--program] [--json]``

Progress lines (``[npu] ...``) go to stderr, also with ``--json``; a tool that runs long
prints a line every minute with its time so far and the step its log last named.

Exit status: 0 the bitstream was written (and flashed with ``--program``); 3 the design does
not fit the device (the report says which cells overflow; no bitstream); 1 a tool failed, place
and route ran past ``--timeout``, or programming failed; 2 bad arguments.
"""

import argparse

from npu_cli.util import CLIError, preset_arg, progress, seconds

__all__ = ["EXIT_NO_FIT", "add_commands"]

#: Exit status of ``npu build`` when the design does not fit the board's device.
EXIT_NO_FIT = 3


def _clock_arg(text):
    if text == "osc":
        return "osc"
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1000:
        raise argparse.ArgumentTypeError(f"expected a clock in MHz or 'osc', got {text!r}")
    return value


def cmd_build(args):
    from npu_fpga.boards import BOARDS
    from npu_fpga.build import ProgramError, build_board, program_board
    from npu_fpga.synth import SynthError
    from npu_fpga.toolenv import apply_tool_env
    from npu_spec.config import preset

    apply_tool_env()
    board = BOARDS[args.board]
    config = args.preset if args.preset is not None else preset(args.board)
    clk_mhz = board.default_mhz if args.clock is None else \
        (None if args.clock == "osc" else args.clock)
    # Progress goes to stderr even with --json (stdout has the report only): a whole-board
    # build can take an hour.
    say = progress(False)
    try:
        report = build_board(args.board, config, seed=args.seed, router=args.router,
                             timeout=args.timeout, clk_mhz=clk_mhz, build_dir=args.build_dir,
                             progress=say, lut_mapper=args.lut_mapper)
    except ValueError as e:
        raise CLIError(f"npu build: {e}", status=2) from None
    except SynthError as e:
        raise CLIError(f"npu build: {str(e).splitlines()[0]}") from None
    print(report.to_json() if args.json else report.format())
    if report.timed_out:
        raise CLIError(f"npu build: {report.message}")
    if not report.fits:
        return EXIT_NO_FIT
    if args.program:
        try:
            program_board(args.board, report.bitstream, progress=say)
        except ProgramError as e:
            raise CLIError(f"npu build: {e}") from None
        say(f"programmed the {args.board} with {report.bitstream}")
    return 0


def add_commands(sub):
    from npu_fpga.boards import BOARDS
    from npu_fpga.synth import DEFAULT_PNR_TIMEOUT
    from npu_spec.config import PRESETS

    clocks = ", ".join(f"{name} {b.default_mhz:g}" for name, b in BOARDS.items())
    b = sub.add_parser(
        "build", help="build a board's bitstream (and flash it with --program)",
        description="Build the NPU with its UART bridge and on-chip system memory for a board "
        "(amaranth-boards, Yosys, nextpnr) and print Fmax, resources and place-and-route time. "
        "Exit status 3 when the design does not fit the device, 1 when a tool fails or "
        "programming fails.")
    b.add_argument("--board", choices=tuple(BOARDS), required=True)
    b.add_argument("--preset", type=preset_arg, default=None,
                   help=f"one of {', '.join(PRESETS)} (default: the board's own preset)")
    b.add_argument("--seed", type=int, default=1, help="nextpnr placement seed (default 1)")
    b.add_argument("--router", choices=("router1", "router2"), default=None,
                   help="nextpnr router (default router1: the iCEBreaker's iCE40 and the whole "
                   "ULX3S NPU)")
    b.add_argument("--timeout", type=seconds, default=DEFAULT_PNR_TIMEOUT, metavar="SECONDS",
                   help=f"stop place and route after this many seconds with an error "
                   f"(default {DEFAULT_PNR_TIMEOUT}; 0 for no limit)")
    b.add_argument("--clock", type=_clock_arg, default=None, metavar="MHZ|osc",
                   help=f"clock made by the PLL, or 'osc' for the board's oscillator without "
                   f"a PLL (default MHz: {clocks})")
    b.add_argument("--lut-mapper", choices=("abc9", "abc"), default=None,
                   help="Yosys LUT mapper (default: abc for the ulx3s, whose whole NPU stops "
                   "Yosys 0.70's abc9; abc9 for the icebreaker; abc is for the ECP5 only; see "
                   "docs/synthesis.md)")
    b.add_argument("--build-dir", default=None,
                   help="where the files and the bitstream go (default build/BOARD)")
    b.add_argument("--program", action="store_true",
                   help="flash the bitstream (iceprog / openFPGALoader)")
    b.add_argument("--json", action="store_true", help="print the report as one JSON object")
    b.set_defaults(func=cmd_build)
