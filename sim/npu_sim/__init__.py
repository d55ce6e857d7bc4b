"""Simulation harnesses: amaranth.sim helpers, cocotb runners, Verilator benches, the `npu` CLI."""
