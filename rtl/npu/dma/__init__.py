"""The DMA engine: strided copies between system memory, the buffer and the kernel memories
(``docs/system.md``, "DMA engine").

:mod:`npu.dma.engine` composes the sub-units, one module each: the transfer check
(:mod:`~.check`), the address generator (:mod:`~.address`), the memory reader
(:mod:`~.reader`) and the memory writer (:mod:`~.writer`). :mod:`npu_spec.dma` is the
specification they implement bit for bit (register map, codes, checks, element order).
"""
