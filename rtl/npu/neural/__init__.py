"""The neural engine: one core per ``engine.NeuralEngine``, composed of its sub-units (layer
setup, kernel DMA, kernel extract, loader and input buffer, shifter, sequencer, MAC array,
parameter replay, post-processor, output circuit, watchdog; ``docs/neural_engine.md``)."""
