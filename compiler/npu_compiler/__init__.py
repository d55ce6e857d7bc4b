"""The ONNX compiler: a model in, an NPU program (:class:`npu_spec.program.Program`) out.

``frontend`` reads, checks and simplifies the model into a :class:`graph.Graph`; ``lower``
maps the graph onto the engines through :class:`npu_model.builder.ProgramBuilder`
(``docs/compiler.md``).
"""
