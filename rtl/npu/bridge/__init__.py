"""The host bridge of a board (``docs/bridge.md``): a UART and the frame engine that reads and
writes system memory and the NPU's host registers for a host (``npu_spec.bridge``)."""

from .bridge import UARTBridge
from .core import BridgeCore
from .sram import WishboneSRAM
from .uart import UARTRx, UARTTx

__all__ = ["BridgeCore", "UARTBridge", "UARTRx", "UARTTx", "WishboneSRAM"]
