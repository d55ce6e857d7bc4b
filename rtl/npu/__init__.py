"""Amaranth gateware of the open neural processor.

``npu.lib`` holds what the blocks share (the CSR bus and register files, loop-nest counters,
pipeline helpers, binary32 units, the engine interface); ``npu.neural``, ``npu.planar`` and
``npu.taskman`` are the blocks, one sub-unit a file; ``npu.top`` composes the NPU. Every fact the
gateware shares with the golden model and the compiler comes from ``npu_spec``.
"""
