"""The data processor: the on-chip buffer, its datasets and ports, the kernel memories
(``docs/system.md``).

:mod:`npu.dataproc.dataproc` composes the sub-units, one module each: the banked buffer
(``buffer``, with its round-robin ``arbiter``), a neural engine core's input and output ports
(``ne_port``), the planar engine's operand readers and result writer (``pe_port``), the kernel
memories (``kmem``); ``ports`` holds the port signatures the DMA and the ports share.
"""
