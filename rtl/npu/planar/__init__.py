"""The planar engine: pooling, elementwise and reduction modes (``docs/planar.md``).

:mod:`npu.planar.engine` composes the sub-units, one module each (control, line buffer,
filters, lane pipeline, reduction, ...); :mod:`npu_spec.planar` is plain Python (no Amaranth)
so that the compiler, the golden model and the harnesses share the codes, the register map
and the task rules.
"""
