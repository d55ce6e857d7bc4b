"""Cycles of the micro build on the digits CNN (``docs/micro.md``, "Measured cycles").

Usage: ``python scripts/micro_cycles.py [--whole]``. Compiles
``models/digits/digits_cnn.onnx`` for the ``icebreaker`` preset (int8, calibrated on the
first 50 training images) and runs the first ``n`` tasks of its queue on the micro NPU in the
Amaranth simulator (``npu_sim.micro``), for each ``n`` up to the first neural task; prints
each DMA task's cycles (from ``CTRL.enable`` to ``STATUS.idle``, the host polling every
cycle, less the run of the tasks before it) and its element count. ``--whole`` also runs the
whole program with the micro neural and planar units (``npu.micro.ne``, ``npu.micro.pe``) and
prints its cycles and whether system memory equals the golden model's.
"""

import argparse
import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path

from npu_compiler.compile import compile_model
from npu_model.system import run_program
from npu_runtime.runtime import session
from npu_sim.micro import run_micro
from npu_spec.config import preset
from npu_spec.descriptors import HEADER
from npu_spec.dma import DMA
from npu_spec.engine import Engine

ROOT = Path(__file__).resolve().parents[1]


def _tasks(program):
    (q,) = program.queues
    address, tasks = q.head, []
    for _ in range(q.tasks):
        words = [int.from_bytes(program.memory[4 * a:4 * a + 4], "little")
                 for a in range(address, address + 64)]
        h0 = HEADER[0].unpack(words[0], strict=False)
        tasks.append((h0["engine"], words[:h0["length"]]))
        address += h0["length"]
    return tasks


def _elements(words):
    """Elements of the DMA task whose descriptor is ``words`` (one entry from MODE on)."""
    first, count = words[4] & 0xFFFF, words[4] >> 16
    if count != len(words) - 5:
        raise SystemExit("a DMA descriptor of more than one entry; this script reads one")
    regs = dict(zip(range(first, first + len(words) - 5), words[5:]))
    n = 1
    for name, fields in (("SIZE0", ("n0", "n1")), ("SIZE1", ("n2", "n3")), ("SIZE2", ("n4",))):
        value = DMA[name].unpack(regs[DMA.address(name)], strict=False)
        for f in fields:
            n *= value[f]
    return n


def _whole(program):
    try:
        ne = importlib.import_module("npu.micro.ne")
        pe = importlib.import_module("npu.micro.pe")
    except ImportError as error:
        print(f"micro_cycles: --whole needs the micro neural and planar units ({error})",
              file=sys.stderr)
        sys.exit(2)
    got = run_micro(program, neural=ne.MicroNeural(), planar=pe.MicroPlanar())
    same = got["memory"] == run_program(program).memory
    print(f"whole program: {got['cycles']} cycles, system memory equals the golden model's: "
          f"{same}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--whole", action="store_true", help="also run the whole program")
    args = parser.parse_args(argv)
    spec = importlib.util.spec_from_file_location("train", ROOT / "models/digits/train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    x_train = train.load_split()[0]
    program = compile_model(str(ROOT / "models/digits/digits_cnn.onnx"), preset("icebreaker"),
                            fmt="int8", calibration={"input": x_train[:50]},
                            evaluator=session).program
    (q,) = program.queues
    before = 0
    print("task  engine  elements  cycles  cycles/element")
    for n, (engine, words) in enumerate(_tasks(program), start=1):
        if engine != Engine.DMA:
            break
        run = dataclasses.replace(program, queues=(dataclasses.replace(q, tasks=n),))
        cycles = run_micro(run)["cycles"]
        elements = _elements(words)
        print(f"{n - 1:<5} DMA     {elements:<9} {cycles - before:<7} "
              f"{(cycles - before) / elements:.1f}")
        before = cycles
    if args.whole:
        _whole(program)


if __name__ == "__main__":
    main()
