"""Yosys-only LUTs of each register file of a preset with both read paths
(``npu.lib.csr.RegisterFile``'s ``read_path``, ``NPUConfig.csr_read``).

Usage: ``python scripts/csr_read_paths.py [--preset ulx3s] [--lut-mapper abc|abc9]``. Each
register map the preset's blocks build is synthesised alone for the ECP5 in the out-of-context
harness (``npu_fpga.synth``, no placement); the columns are LUT4 (``LUT4`` + 2 ``CCU2C``,
harness subtracted) and ``TRELLIS_DPR16X4`` (LUT RAM, 16 words x 4 bits each) per read path.
"""

import argparse
import sys

from npu.dataproc.dataproc import register_map
from npu.lib.csr import READ_PATHS, RegisterFile
from npu_fpga.synth import synthesize
from npu_spec.config import preset
from npu_spec.dma import DMA
from npu_spec.neural import core_register_map
from npu_spec.planar import PLANAR_ENGINE
from npu_spec.taskman import address_bits, base_table_size, task_manager_map


def register_maps(cfg):
    """The register maps of the blocks of ``cfg``, by name."""
    return {
        "DATA_PROCESSOR": register_map(cfg.cores),
        "DMA": DMA,
        "NEURAL_ENGINE": core_register_map(cfg),
        "PLANAR_ENGINE": PLANAR_ENGINE,
        "TASK_MANAGER": task_manager_map(cfg.task_queues, base_entries=base_table_size(cfg),
                                         address_width=address_bits(cfg)),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ulx3s")
    parser.add_argument("--lut-mapper", choices=("abc", "abc9"), default="abc")
    args = parser.parse_args(argv)
    print("| map | " + " | ".join(f"{p} LUT4 | {p} LUT RAM" for p in READ_PATHS) + " |")
    print("|---" * (1 + 2 * len(READ_PATHS)) + "|")
    for name, regmap in register_maps(preset(args.preset)).items():
        row = [name]
        for path in READ_PATHS:
            r = synthesize(RegisterFile(regmap, read_path=path), "ecp5-85f", place=False,
                           lut_mapper=args.lut_mapper, progress=None)
            row += [f"{r.luts - r.harness_luts:,}", f"{r.lutram or 0}"]
        print("| " + " | ".join(row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
