"""Simulation harnesses: amaranth.sim helpers, cocotb runners, Verilator harnesses, and the `npu` CLI."""
