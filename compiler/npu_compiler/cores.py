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

from npu_model.builder import KernelBlob

from .graph import CompileError

__all__ = ["check_cores", "core_blobs", "place"]


def check_cores(config, cores):
    """The number of cores the compiler uses on ``config``: ``cores`` (None: all of them);
    a :class:`~npu_compiler.graph.CompileError` naming the range otherwise."""
    if cores is None:
        return config.cores
    if not isinstance(cores, int) or not 1 <= cores <= config.cores:
        raise CompileError(f"--cores must be 1 to {config.cores} on preset {config.name!r}, "
                         f"not {cores}")
    return cores


def core_blobs(blob, cores):
    """``blob`` cut into at most ``cores`` blobs of consecutive output-channel groups, as
    even as the groups allow (the first ones get the larger parts)."""
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
