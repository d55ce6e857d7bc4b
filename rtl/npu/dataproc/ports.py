"""The port signatures of the buffer and the kernel memories (``docs/system.md``).

Every access to the buffer is a run of ``lanes`` consecutive 16-bit elements from an element
address (modulo the buffer size). Reads are a request stream and a response stream, answered in
request order; writes are one stream with a mask of the lanes to write.
"""

from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from npu_spec.dataproc import ADDR_BITS, FLOW_BITS, SHAPE_BITS

__all__ = [
    "ELEMENT_BITS", "KMEM_ADDR_BITS", "BufferReadSignature", "DatasetLayout",
    "KernelWriteLayout", "buffer_write_layout", "read_request_layout", "read_response_layout",
    "wrap_address",
]

#: Width of a buffer element.
ELEMENT_BITS = 16
#: Width of a kernel-memory word address.
KMEM_ADDR_BITS = 16


def read_request_layout():
    """A read of a run of elements from element ``addr``."""
    return data.StructLayout({"addr": ADDR_BITS})


def read_response_layout(lanes):
    """The answer to a read: ``data[j]`` is element ``addr + j``."""
    return data.StructLayout({"data": data.ArrayLayout(ELEMENT_BITS, lanes)})


def buffer_write_layout(lanes):
    """A write of a run: ``data[j]`` goes to element ``addr + j`` when ``mask[j]`` is set."""
    return data.StructLayout({"addr": ADDR_BITS, "data": data.ArrayLayout(ELEMENT_BITS, lanes),
                              "mask": lanes})


class BufferReadSignature(wiring.Signature):
    """A read port of the buffer, from the reader's side.

    Members
    -------
    req : Out(stream.Signature(read_request_layout()))
        Runs wanted.
    resp : In(stream.Signature(read_response_layout(lanes)))
        Their elements, in request order.
    """

    def __init__(self, lanes):
        self.lanes = lanes
        super().__init__({
            "req":  Out(stream.Signature(read_request_layout())),
            "resp": In(stream.Signature(read_response_layout(lanes))),
        })


#: A write of one kernel-memory word: word ``addr`` of core ``core``'s kernel memory.
KernelWriteLayout = data.StructLayout({"core": 6, "addr": KMEM_ADDR_BITS, "data": 32})


#: A dataset as the ports read it from the register file: ``(C, H, W)`` at element ``addr``,
#: element ``(c, y, x)`` at ``addr + c * cstride + y * rstride + x`` (``npu_spec.dataproc``);
#: with flow control (``slots`` M > 0) plane ``c`` is at ring plane ``c mod (M * planes)``.
DatasetLayout = data.StructLayout({
    "addr": ADDR_BITS, "width": SHAPE_BITS, "height": SHAPE_BITS, "channels": SHAPE_BITS,
    "cstride": ADDR_BITS, "rstride": ADDR_BITS, "slots": FLOW_BITS, "planes": FLOW_BITS,
})


def wrap_address(value, elements):
    """``value`` (signed or unsigned) modulo ``elements`` as an unsigned element address:
    the low bits when ``elements`` is a power of two, else a modulo (a divider)."""
    bits = ceil_log2(elements)
    if elements == 1 << bits:
        return value.as_unsigned()[:bits] if bits else value.as_unsigned()[:0]
    return (value % elements).as_unsigned()[:bits]
