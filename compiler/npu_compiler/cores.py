"""Several neural-engine cores on one layer.

A layer's output channels are dealt to the cores in runs of whole output-channel groups
(``acc_slots`` channels, the unit the kernel blob is encoded in): core ``i`` gets the groups
``G i / n`` to ``G (i + 1) / n`` of the layer's ``G`` groups, its own kernel blob (unicast into
its kernel memory), and all cores read the same input dataset (broadcast) and write their
channels into one output dataset, in one neural-engine task (``NE_CORES``). The parts are cut
from the layer's encoded blob, so every group keeps the encoding (and, with ``--palette``,
the palette) it has on one core: the results are those of one core bit for bit.

A grouped or depthwise layer (the builder runs those on one core) and a layer of one group
run on core 0.
"""

import functools

import numpy as np

from npu_model.builder import BuildError, KernelBlob, ProgramBuilder

from .graph import CompileError

__all__ = ["check_cores", "core_blobs", "place", "task_cores"]


def check_cores(config, cores):
    """The number of cores the compiler splits a layer over on ``config``: ``cores`` (None:
    all of them), at most :func:`task_cores`; a :class:`~npu_compiler.graph.CompileError`
    naming the range when ``cores`` is outside ``1 .. config.cores``."""
    if cores is None:
        cores = config.cores
    elif not isinstance(cores, int) or not 1 <= cores <= config.cores:
        raise CompileError(f"--cores must be 1 to {config.cores} on preset {config.name!r}, "
                           f"not {cores}")
    return min(cores, task_cores(config))


@functools.lru_cache(maxsize=None)
def task_cores(config):
    """The most cores one neural-engine task can name on ``config``: each core adds its
    layer registers and its input and output datasets to the task's descriptor, which must
    fit the task manager's slot (measured by building one such task)."""
    fmt = "int8" if "int8" in config.formats else "fp16"
    for n in range(config.cores, 1, -1):
        b = ProgramBuilder(config)
        src = b.buffer((1, 1, 1), fmt)
        blob = b.kernels(np.zeros((1, 1, 1, 1), np.int8 if fmt == "int8" else np.uint16),
                         fmt=fmt)
        b.conv(src, [b.dma_kernels(i, blob) for i in range(n)])
        try:
            b.build()
        except BuildError:
            continue
        return n
    return 1


def core_blobs(blob, cores):
    """``blob`` cut into at most ``cores`` blobs of consecutive output-channel groups, as
    even as the groups allow (the later ones get the larger parts)."""
    n = min(cores, len(blob.groups)) if blob.conv_groups == 1 else 1
    if n <= 1:
        return [blob]
    g = len(blob.groups)
    parts = []
    for i in range(n):
        groups = blob.groups[g * i // n:g * (i + 1) // n]
        k = sum(part.weights.shape[0] for part in groups)
        name = None if blob.name is None else f"{blob.name}.{i}"
        parts.append(KernelBlob(tuple(groups), blob.fmt, (k,) + tuple(blob.weight_shape[1:]),
                                blob.conv_groups, name))
    return parts


def place(builder, blobs, **kwargs):
    """Load blob ``i`` of ``blobs`` into core ``i``'s kernel memory
    (:meth:`~npu_model.builder.ProgramBuilder.dma_kernels`); the placements, in order, for
    :meth:`~npu_model.builder.ProgramBuilder.conv`."""
    return [builder.dma_kernels(i, part, **kwargs) for i, part in enumerate(blobs)]
