"""Gateware shared by the blocks: enums from the specification, the CSR bus and register
files, loop-nest counters, pipeline helpers, binary32 units, and the engine interface."""
