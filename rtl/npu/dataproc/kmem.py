"""The kernel memories: one per neural engine core, written by the DMA, read by the core."""

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from npu_spec.config import NPUConfig

from ..neural.layouts import KernelReadSignature
from .ports import KernelWriteLayout

__all__ = ["KernelMemories"]


class KernelMemories(wiring.Component):
    """``config.cores`` memories of ``config.kernel_kib * 256`` 32-bit words.

    Parameters
    ----------
    config : NPUConfig

    Members
    -------
    write : In(stream.Signature(KernelWriteLayout))
        Word ``addr`` of core ``core``'s memory gets ``data`` (always taken; a core number
        without a memory, or an address beyond it, writes nothing, resp. wraps).
    read : In(KernelReadSignature()).array(cores)
        Core ``i``'s read port: the word at ``addr`` the cycle after ``en``.
    """

    def __init__(self, config):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self._cores = config.cores
        self._words = config.kernel_kib * 256
        super().__init__({
            "write": In(stream.Signature(KernelWriteLayout)),
            "read":  In(KernelReadSignature()).array(config.cores),
        })

    @property
    def words(self):
        """Words of each memory."""
        return self._words

    def elaborate(self, platform):
        m = Module()
        w = self.write.payload
        m.d.comb += self.write.ready.eq(1)
        for i in range(self._cores):
            mem = Memory(shape=32, depth=self._words, init=[])
            m.submodules[f"core{i}"] = mem
            wp = mem.write_port()
            rp = mem.read_port()
            port = self.read[i]
            m.d.comb += [
                wp.addr.eq(w.addr), wp.data.eq(w.data),
                wp.en.eq(self.write.valid & (w.core == i)),
                rp.addr.eq(port.addr), rp.en.eq(port.en), port.data.eq(rp.data),
            ]
        return m
