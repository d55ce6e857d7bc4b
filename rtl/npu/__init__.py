"""Amaranth gateware of the open neural processor.

Importing ``npu`` itself pulls in nothing heavy: ``npu_spec.config`` is plain Python and is shared
with the golden model (``npu_model``) and the compiler.
"""
