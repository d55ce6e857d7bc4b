"""The runtime: runs a compiled program (:mod:`npu_compiler`) on a backend (``golden``: the
golden system model; ``rtl``: the Verilator system simulation) with named inputs and returns
named outputs, cycles and the per-task trace (``docs/compiler.md``)."""
