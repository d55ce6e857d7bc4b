"""The neural engine: kernel extract, input buffer and shifter, rasterizer, MAC array,
post-processor and output circuit (``docs/neural_engine.md``)."""
