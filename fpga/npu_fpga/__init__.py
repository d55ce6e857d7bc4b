"""FPGA flows: out-of-context synthesis, board tops, build and program."""
