"""Board tops (``docs/bridge.md``): the NPU, its host bridge and on-chip system memory on the
iCEBreaker (iCE40UP5K) and the ULX3S (LFE5U-85F).

:class:`BoardSystem` is the board-independent part, plain gateware with two serial pins and
two LEDs, which a Verilator simulation runs as it is:

```
 uart rx/tx -- UARTBridge --csr--> NPUTop (host register bus)
                    |                 |
                    | mem (master 1)  | mem (master 0)
                    v                 v
                  Arbiter (fixed priority, npu.lib.wishbone)
                    |
                  WishboneSRAM (system memory, mem_bytes)
```

:class:`BoardTop` puts it on a board through ``amaranth-boards``: the board's clock as the
``sync`` domain (the platform's own, with the iCE40's power-on reset), a user button as reset,
the FTDI UART, a busy LED (the bridge in a frame or the NPU on the bus, stretched to be seen)
and an error LED (a flag of the bridge's ``STATUS``), and on the ULX3S the ESP32's ``GPIO0``
driven high so that the ESP32 does not reset the FPGA. :func:`board_files` elaborates a board
top and returns the files the toolchain would get (``platform.prepare``): no synthesis.
"""

from dataclasses import dataclass

from amaranth.build import Attrs, Pins, Resource
from amaranth.hdl import Elaboratable, Module, ResetInserter, Signal
from amaranth.lib import io, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from npu.bridge import UARTBridge, WishboneSRAM
from npu.lib.wishbone import ADDR_BITS, Arbiter
from npu.top import NPUTop
from npu_spec.bridge import DEFAULT_BAUD, DEFAULT_TIMEOUT_BITS
from npu_spec.config import NPUConfig

__all__ = ["BOARDS", "Board", "BoardSystem", "BoardTop", "board_files", "make_platform"]


class BoardSystem(wiring.Component):
    """The NPU, the UART bridge and ``mem_bytes`` of on-chip system memory.

    Parameters
    ----------
    config : NPUConfig
    clk_freq : int or float
        Clock frequency in Hz (for the baud rate divisor).
    mem_bytes : int or None
        System memory in bytes (default: ``config.mem_kib`` KiB); a multiple of the bus word.
    baud : int or float
        Baud rate of the bridge.
    timeout_bits : int
        The bridge's idle timeout in bit times.
    led_bits : int
        The busy LED stays on ``2 ** led_bits`` cycles after the last activity.
    npu : wiring.Component or None
        The NPU (default ``NPUTop(config)``); anything with its ``bus`` and ``mem`` members.

    Members
    -------
    rx : In(1)
        Serial line from the host.
    tx : Out(1)
        Serial line to the host.
    busy : Out(1)
        The bridge is in a frame or the NPU uses the bus (stretched).
    error : Out(1)
        A flag of the bridge's ``STATUS`` is set.
    """

    def __init__(self, config, *, clk_freq, mem_bytes=None, baud=DEFAULT_BAUD,
                 timeout_bits=DEFAULT_TIMEOUT_BITS, led_bits=20, npu=None):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        step = config.mem_width // 8
        if mem_bytes is None:
            mem_bytes = config.mem_kib * 1024
        if not isinstance(mem_bytes, int) or mem_bytes < step or mem_bytes % step:
            raise ValueError(f"mem_bytes must be a positive multiple of {step} (the bus word), "
                             f"not {mem_bytes!r}")
        self._config = config
        self._mem_bytes = mem_bytes
        self._led_bits = led_bits
        self._npu = npu
        # The bridge is made in ``elaborate``; its parameters are checked here.
        self._bridge_args = dict(clk_freq=clk_freq, baud=baud, mem_bytes=mem_bytes,
                                 mem_width=config.mem_width, timeout_bits=timeout_bits)
        UARTBridge.check(**self._bridge_args)
        super().__init__({
            "rx":    In(1, init=1),
            "tx":    Out(1, init=1),
            "busy":  Out(1),
            "error": Out(1),
        })

    @property
    def config(self):
        return self._config

    @property
    def mem_bytes(self):
        return self._mem_bytes

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        m.submodules.npu = npu = self._npu if self._npu is not None else NPUTop(cfg)
        m.submodules.bridge = bridge = UARTBridge(**self._bridge_args)
        m.submodules.arbiter = arbiter = Arbiter(2, ADDR_BITS, cfg.mem_width)
        words = self._mem_bytes * 8 // cfg.mem_width
        m.submodules.memory = memory = WishboneSRAM(words, cfg.mem_width)

        m.d.comb += [bridge.rx.eq(self.rx), self.tx.eq(bridge.tx)]
        wiring.connect(m, bridge.csr, npu.bus)
        wiring.connect(m, npu.mem, arbiter.masters[0])
        wiring.connect(m, bridge.mem, arbiter.masters[1])
        wiring.connect(m, arbiter.bus, memory.bus)

        # LEDs: activity stretched so that a person sees it.
        stretch = Signal(self._led_bits + 1)
        with m.If(bridge.busy | npu.mem.cyc):
            m.d.sync += stretch.eq(0)
        with m.Elif(~stretch[-1]):
            m.d.sync += stretch.eq(stretch + 1)
        m.d.comb += [self.busy.eq(~stretch[-1]), self.error.eq(bridge.error)]
        return m


@dataclass(frozen=True)
class Board:
    """A board: its ``amaranth-boards`` platform and the pins the top uses."""
    name: str
    platform: str           # class name in amaranth_boards.<module>
    module: str
    reset: tuple            # (resource, number) of the reset button
    busy_led: tuple
    error_led: tuple
    esp32_gpio0: str | None = None      # pin of the ESP32's GPIO0, driven high

    def make_platform(self):
        import importlib
        cls = getattr(importlib.import_module(f"amaranth_boards.{self.module}"), self.platform)
        return cls()


BOARDS = {
    "icebreaker": Board("icebreaker", "ICEBreakerPlatform", "icebreaker", reset=("button", 0),
                        busy_led=("led_g", 0), error_led=("led_r", 0)),
    "ulx3s": Board("ulx3s", "ULX3S_85F_Platform", "ulx3s", reset=("button_pwr", 0),
                   busy_led=("led", 0), error_led=("led", 1), esp32_gpio0="L2"),
}


class BoardTop(Elaboratable):
    """A :class:`BoardSystem` on a board's pins (see the module documentation).

    Parameters
    ----------
    board : str
        A key of :data:`BOARDS`.
    config : NPUConfig
    **kwargs
        Passed to :class:`BoardSystem` (``mem_bytes``, ``baud``, ``timeout_bits``, ``npu``);
        the clock frequency is the board's.
    """

    def __init__(self, board, config, **kwargs):
        if board not in BOARDS:
            raise ValueError(f"unknown board {board!r}; choose from {', '.join(BOARDS)}")
        self.board = BOARDS[board]
        self.config = config
        self.kwargs = kwargs

    def elaborate(self, platform):
        m = Module()
        board = self.board
        system = BoardSystem(self.config, clk_freq=platform.default_clk_frequency,
                             **self.kwargs)

        def buffer(direction, port, name):
            m.submodules[name] = buf = io.Buffer(direction, port)
            return buf

        def pin(direction, name, number):
            return buffer(direction, platform.request(name, number, dir="-"), f"{name}_{number}")

        # The reset button, synchronised, resets everything but the platform's clock logic.
        reset = Signal()
        m.submodules.reset_sync = FFSynchronizer(pin("i", *board.reset).i, reset)
        m.submodules.system = ResetInserter(reset)(system)

        uart = platform.request("uart", 0, dir="-")
        m.d.comb += [
            system.rx.eq(buffer("i", uart.rx, "uart_rx").i),
            buffer("o", uart.tx, "uart_tx").o.eq(system.tx),
            pin("o", *board.busy_led).o.eq(system.busy),
            pin("o", *board.error_led).o.eq(system.error),
        ]
        if board.esp32_gpio0 is not None:
            m.d.comb += pin("o", "wifi_gpio0", 0).o.eq(1)
        return m


def make_platform(board):
    """The board's platform, with the extra resources the top uses."""
    if board not in BOARDS:
        raise ValueError(f"unknown board {board!r}; choose from {', '.join(BOARDS)}")
    b = BOARDS[board]
    platform = b.make_platform()
    if b.esp32_gpio0 is not None:
        # Only GPIO0 of the ESP32 resource: requesting the whole resource would also drive
        # its enable pin.
        platform.add_resources([Resource("wifi_gpio0", 0, Pins(b.esp32_gpio0, dir="o"),
                                         Attrs(IO_TYPE="LVCMOS33", DRIVE="4"))])
    return platform


def board_files(board, config, *, name="npu_board", **kwargs):
    """Elaborate the board top of ``board`` and return the toolchain's input files
    (``{filename: text or bytes}``: the design as RTLIL, the pin constraints, the scripts)."""
    platform = make_platform(board)
    top = BoardTop(board, config, **kwargs)
    plan = platform.prepare(top, name=name)
    return dict(plan.files)
