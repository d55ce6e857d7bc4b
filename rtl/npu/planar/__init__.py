"""The planar engine: pooling, elementwise and reduction modes (``docs/planar.md``).

The RTL is in :mod:`npu.planar.engine`; :mod:`npu_spec.planar` is plain Python (no
Amaranth) so that the compiler and the golden model can import the register map.
"""
