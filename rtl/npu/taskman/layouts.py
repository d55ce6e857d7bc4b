"""Interface signatures of the task manager (its engine and register-write ports are the
shared ones of :mod:`npu.lib.engine`)."""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..lib.engine import ADDR_WIDTH

__all__ = ["MemReadSignature"]


class MemReadSignature(wiring.Signature):
    """Read port to system memory (the task-manager DMA), from the initiator's side.

    ``data`` holds the word at ``addr`` in the cycle after ``en``.
    """

    def __init__(self):
        super().__init__({
            "addr": Out(ADDR_WIDTH),
            "en":   Out(1),
            "data": In(32),
        })
