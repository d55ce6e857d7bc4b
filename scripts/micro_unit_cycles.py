# amaranth: UnusedElaboratable=no
"""Cycles of the micro engine units on the digits CNN's layer shapes (``docs/micro.md``,
"Cycles").

Usage: ``python scripts/micro_unit_cycles.py [--seed 1]``. Each task is built with the
digits program's shapes (``npu compile models/digits/digits_cnn.onnx --preset icebreaker``,
``npu disasm``), random int8 data and kernels, and a rescale shift of 38 (the digits
program's kernel headers carry shifts of 37 to 40), run on the unit in the Amaranth
simulator and checked bit for bit against the golden model's task; one row a task: the
cycles from start to done, the multiply-add cycles among them and the output elements.
"""

import argparse

import numpy as np

from npu.micro.ne import MicroNeural
from npu.micro.pe import MicroPlanar
from npu_model.kernel_codec import encode, kernel_memory
from npu_model.system import run_neural_task, run_planar_task
from npu_sim.micro_units import PoolingAsPlanar, run_unit
from npu_spec import dataproc, neural
from npu_spec import planar as planar_spec
from npu_spec.config import preset
from npu_spec.planar import Mode, PoolOp

CONFIG = preset("icebreaker")
BUF = dataproc.buffer_elements(CONFIG)
SHIFT = 38

#: (name, input channels, output channels, input H x W, kernel, pad, output H x W, act)
CONVS = [
    ("conv1", 1, 8, 8, 3, 1, 8, 1),
    ("conv2", 8, 16, 4, 3, 1, 4, 1),
    ("fc", 16, 10, 2, 2, 0, 1, 0),
]
#: (name, channels, input H x W, window and stride)
POOLS = [("pool1", 8, 8, 2), ("pool2", 16, 4, 2)]


def conv_task(rng, c, k, size, kernel, pad, out, act):
    weights = rng.integers(-127, 128, (k, c, kernel, kernel)).astype(np.int8)
    groups = [encode(weights[b:b + 8], coef_fp16=False, sparse=False, palette_bits=0,
                     bias=rng.integers(-2000, 2000, min(8, k - b)),
                     scale=rng.integers(1 << 29, 1 << 31, min(8, k - b)), shift=SHIFT)
              for b in range(0, k, 8)]
    kmem = np.zeros(CONFIG.kernel_kib * 256, np.uint32)
    words = kernel_memory(groups)
    kmem[:len(words)] = words
    layer = neural.make_layer(fmt=0, log2w=2, groups=1, icpg=c, ocpg=k, in_h=size,
                              in_w=size, out_h=out, out_w=out, kh=kernel, kw=kernel,
                              stride=1, dilation=1, pad=pad, act=act)
    regs = dict(neural.layer_writes(layer))
    regs.update(dataproc.dataset_writes(dataproc.ne_port_base(0, "IN"),
                                        dataproc.make_dataset(0, (c, size, size))))
    regs.update(dataproc.dataset_writes(dataproc.ne_port_base(0, "OUT"),
                                        dataproc.make_dataset(4096, (k, out, out))))
    return regs, kmem, c * kernel * kernel * k * out * out, k * out * out


def pool_task(c, size, window):
    task = {f.name: 0 for reg in planar_spec.TASK_REGISTERS for f in reg.fields}
    task.update(mode=Mode.POOL, op=PoolOp.MAX, width=size, height=size, channels=c,
                kh=window, kw=window, sy=window, sx=window)
    regs = {planar_spec.BASE + reg.offset: reg.pack(**{f.name: int(task[f.name])
                                                       for f in reg.fields})
            for reg in planar_spec.TASK_REGISTERS}
    out = size // window
    regs.update(dataproc.dataset_writes(dataproc.pe_port_base("A"),
                                        dataproc.make_dataset(0, (c, size, size))))
    regs.update(dataproc.dataset_writes(dataproc.pe_port_base("OUT"),
                                        dataproc.make_dataset(4096, (c, out, out))))
    return regs, c * out * out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"{'task':<8} {'cycles':>8} {'MAC cycles':>11} {'outputs':>8}  golden")
    total = 0
    for name, *shape in CONVS:
        regs, kmem, macs, outputs = conv_task(rng, *shape)
        buffer = rng.integers(0, 1 << 16, BUF).astype(np.uint16)
        code, want = run_neural_task(CONFIG, regs, buffer, kmem)
        err, got, cycles = run_unit(MicroNeural(), buffer, regs, kmem)
        same = code == err == 0 and np.array_equal(np.array(got, np.uint16), want)
        total += cycles
        print(f"{name:<8} {cycles:>8,} {macs:>11,} {outputs:>8,}  {'same' if same else 'DIFFER'}")
    for name, *shape in POOLS:
        regs, outputs = pool_task(*shape)
        buffer = rng.integers(0, 1 << 16, BUF).astype(np.uint16)
        code, want = run_planar_task(CONFIG, regs, buffer)
        err, got, cycles = run_unit(MicroPlanar(), buffer, regs)
        same = code == err == 0 and np.array_equal(np.array(got, np.uint16), want)
        total += cycles
        print(f"{name:<8} {cycles:>8,} {'-':>11} {outputs:>8,}  {'same' if same else 'DIFFER'}")
        # the same task on the neural unit's pooling mode (not in the total)
        err, got, cycles = run_unit(PoolingAsPlanar(), buffer, regs)
        same = code == err == 0 and np.array_equal(np.array(got, np.uint16), want)
        print(f"{name + '/ne':<8} {cycles:>8,} {'-':>11} {outputs:>8,}  "
              f"{'same' if same else 'DIFFER'}")
    print(f"{'all':<8} {total:>8,}")


if __name__ == "__main__":
    main()
