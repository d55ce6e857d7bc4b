"""The ``npu`` command line: ``generate``, ``sim``, ``bench``, ``synth`` (``npu --help``).

It sits above every other package: it reads the specification, builds gateware, runs the
harnesses and the golden model, and drives the FPGA flow.
"""
