"""Pieces shared by every ``npu`` subcommand: errors, argument types and common options.

The command modules (:mod:`npu_cli.main`, :mod:`npu_cli.neural`, :mod:`npu_cli.planar`,
:mod:`npu_cli.tasks`) build their parsers with these so that every command behaves the same way:
bad arguments print one line on stderr and exit with status 2, a failed run exits with status 1,
progress goes to stderr and is silenced by ``--json``.
"""

import argparse
import sys

__all__ = [
    "CLIError", "Parser", "preset_arg", "positive", "probability", "progress",
    "add_sim_options",
]


class CLIError(Exception):
    """An error reported as one line, with an exit status (2: bad input, 1: failed run)."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = status


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are :class:`CLIError` (one line, status 2)."""

    def error(self, message):
        raise CLIError(f"{self.prog}: {message} (see --help)", status=2)


def preset_arg(name):
    """``type=`` for ``--preset``: the :class:`npu_spec.config.NPUConfig` of a preset name,
    optionally with integer or string fields changed: ``NAME:FIELD=VALUE[,FIELD=VALUE...]``
    (for example ``ulx3s:ne_post_lanes=2``), to measure a variant without a new preset."""
    import dataclasses

    from npu_spec.config import NPUConfig, preset
    base, _, overrides = name.partition(":")
    try:
        config = preset(base)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not overrides:
        return config
    types = {f.name: f.type for f in dataclasses.fields(NPUConfig)}
    changes = {}
    for item in overrides.split(","):
        key, eq, text = item.partition("=")
        if not eq or types.get(key) not in (int, str) or key in ("name", "target"):
            raise argparse.ArgumentTypeError(
                f"bad preset change {item!r}: expected FIELD=VALUE with an integer or string "
                f"field of NPUConfig")
        changes[key] = _int(text) if types[key] is int else text
    try:
        return config.replace(name=name, **changes)
    except (TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _int(text):
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def positive(text):
    """``type=`` for a positive integer (decimal or 0x...)."""
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {value}")
    return value


def seconds(text):
    """``type=`` for a number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def probability(text):
    """``type=`` for a probability in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), not {value}")
    return value


def progress(quiet):
    """A ``say(message)`` function printing ``[npu] message`` on stderr, or nothing."""
    if quiet:
        return lambda msg: None
    return lambda msg: print(f"[npu] {msg}", file=sys.stderr, flush=True)


def add_sim_options(parser, *, backend_default="verilator", stall=True):
    """The options every ``npu sim`` command has: ``--preset --seed --backend --dump --json``
    (and ``--stall`` unless ``stall=False``)."""
    from npu_spec.config import PRESETS
    parser.add_argument("--preset", type=preset_arg, default="small",
                        help=f"one of {', '.join(PRESETS)} (default small)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--backend", choices=("amaranth", "verilator"), default=backend_default,
                        help=f"simulator (default {backend_default}; amaranth is slower)")
    if stall:
        parser.add_argument("--stall", type=probability, default=0.2,
                            help="probability of a stall cycle on each stream (default 0.2)")
    parser.add_argument("--dump", metavar="FILE.npz",
                        help="write inputs, parameters and RTL outputs to FILE.npz")
    parser.add_argument("--json", action="store_true", help="print a JSON summary only")
