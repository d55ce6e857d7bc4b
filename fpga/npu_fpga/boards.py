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

For a configuration with ``npu_impl="micro"`` (the ``icebreaker`` preset) the NPU is the micro
build (``npu.micro.top.MicroNPU`` with its neural and planar units, ``docs/micro.md``) and the
memory and arbiter are one ``npu.micro.sysmem.MicroSystemMemory``: the micro NPU's port first,
the bridge's Wishbone master in the cycles it leaves free.

With ``clk_mhz`` the ``sync`` domain runs from the device's PLL instead of the oscillator
(``docs/boards.md``): ``SB_PLL40_PAD`` on the iCE40 (fed straight from the clock pad) and
``EHXPLLL`` on the ECP5, both through ``Instance`` with dividers from :func:`ice40_pll` and
:func:`ecp5_pll`; the domain is held in reset until the PLL reports lock.
"""

from dataclasses import dataclass

from amaranth.build import Attrs, Pins, Resource
from amaranth.hdl import ClockDomain, Const, Elaboratable, Instance, Module, ResetInserter, Signal
from amaranth.lib import io, wiring
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from amaranth.lib.wiring import In, Out

from npu.bridge import UARTBridge, WishboneSRAM
from npu.bridge.sram import SPRAM_WORDS
from npu.lib.wishbone import ADDR_BITS, Arbiter
from npu.micro.ne import MicroNeural
from npu.micro.sysmem import MicroSystemMemory
from npu.micro.top import MicroNPU
from npu.top import NPUTop
from npu_spec.bridge import DEFAULT_BAUD, DEFAULT_TIMEOUT_BITS
from npu_spec.config import NPUConfig

__all__ = ["BOARDS", "Board", "BoardSystem", "BoardTop", "PLLSetting", "board_files", "ecp5_pll",
           "board_plan", "board_pll", "ice40_pll", "make_platform", "micro_npu"]


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
        With ``config.npu_impl == "micro"`` the default is :func:`micro_npu` and the NPU is
        anything with ``MicroNPU``'s ``bus`` and system-memory port.
    mem_request_register : bool
        The system memory's request register (:class:`~npu.bridge.WishboneSRAM`
        ``request_register``): the masters' requests, through the NPU's and the board's
        arbiters, end at a flip-flop; every access is answered a cycle later (the blocks build
        only; the micro build's memory has its own fixed latency).

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
                 timeout_bits=DEFAULT_TIMEOUT_BITS, led_bits=20, npu=None,
                 mem_request_register=False):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        step = config.mem_width // 8
        if mem_bytes is None:
            mem_bytes = config.mem_kib * 1024
        if not isinstance(mem_bytes, int) or mem_bytes < step or mem_bytes % step:
            raise ValueError(f"mem_bytes must be a positive multiple of {step} (the bus word), "
                             f"not {mem_bytes!r}")
        if config.npu_impl == "micro" and mem_bytes > 8 * SPRAM_WORDS:
            raise ValueError(f"mem_bytes of the micro build must be at most {8 * SPRAM_WORDS} "
                             f"(two SPRAM pairs), not {mem_bytes!r}")
        self._config = config
        self._mem_bytes = mem_bytes
        self._led_bits = led_bits
        self._npu = npu
        self._mem_request_register = bool(mem_request_register)
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
        m.submodules.bridge = bridge = UARTBridge(**self._bridge_args)
        words = self._mem_bytes * 8 // cfg.mem_width
        if cfg.npu_impl == "micro":
            m.submodules.npu = npu = self._npu if self._npu is not None else micro_npu(cfg)
            m.submodules.memory = memory = MicroSystemMemory(words)
            m.d.comb += [memory.addr.eq(npu.mem_addr), memory.re.eq(npu.mem_re),
                         npu.mem_rdata.eq(memory.rdata), memory.wdata.eq(npu.mem_wdata),
                         memory.we.eq(npu.mem_we)]
            wiring.connect(m, bridge.mem, memory.bus)
            npu_active = npu.mem_re | npu.mem_we.any()
        else:
            m.submodules.npu = npu = self._npu if self._npu is not None else NPUTop(cfg)
            m.submodules.arbiter = arbiter = Arbiter(2, ADDR_BITS, cfg.mem_width)
            m.submodules.memory = memory = WishboneSRAM(
                words, cfg.mem_width, request_register=self._mem_request_register)
            wiring.connect(m, npu.mem, arbiter.masters[0])
            wiring.connect(m, bridge.mem, arbiter.masters[1])
            wiring.connect(m, arbiter.bus, memory.bus)
            npu_active = npu.mem.cyc

        m.d.comb += [bridge.rx.eq(self.rx), self.tx.eq(bridge.tx)]
        wiring.connect(m, bridge.csr, npu.bus)

        # LEDs: activity stretched so that a person sees it.
        stretch = Signal(self._led_bits + 1)
        with m.If(bridge.busy | npu_active):
            m.d.sync += stretch.eq(0)
        with m.Elif(~stretch[-1]):
            m.d.sync += stretch.eq(stretch + 1)
        m.d.comb += [self.busy.eq(~stretch[-1]), self.error.eq(bridge.error)]
        return m


def micro_npu(config):
    """The micro NPU of ``config``: one neural unit with the pooling mode runs the neural and
    the planar tasks (``docs/micro.md``, "Pooling in the neural unit")."""
    unit = MicroNeural(pooling=True)
    return MicroNPU(config, neural=unit, planar=unit)


@dataclass(frozen=True)
class PLLSetting:
    """Dividers of one PLL: ``params`` for the primitive and the frequency they give."""
    primitive: str
    in_mhz: float
    out_mhz: float
    vco_mhz: float
    params: dict


#: A PLL whose output is further than this from the frequency asked for is refused.
PLL_TOLERANCE = 0.01


def _check_pll_request(in_mhz, out_mhz, lo, hi, primitive):
    for name, value in (("input", in_mhz), ("output", out_mhz)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{primitive}: the {name} frequency must be a positive number of "
                             f"MHz, not {value!r}")
    if not lo <= out_mhz <= hi:
        raise ValueError(f"{primitive}: the output must be {lo:g} to {hi:g} MHz, "
                         f"not {out_mhz:g}")


def _best(candidates, in_mhz, out_mhz, primitive):
    if not candidates:
        raise ValueError(f"{primitive}: no divider setting makes {out_mhz:g} MHz from "
                         f"{in_mhz:g} MHz")
    error, _, setting = min(candidates, key=lambda c: c[:2])
    if error > PLL_TOLERANCE * out_mhz:
        raise ValueError(f"{primitive}: the nearest to {out_mhz:g} MHz from {in_mhz:g} MHz is "
                         f"{setting.out_mhz:.4g} MHz (more than {PLL_TOLERANCE:.0%} off)")
    return setting


def ice40_pll(in_mhz, out_mhz):
    """Dividers of the iCE40 ``SB_PLL40_PAD`` (simple feedback) for ``out_mhz`` from ``in_mhz``.

    ``out = in * (DIVF + 1) / ((DIVR + 1) * 2 ** DIVQ)`` with the phase detector at 10 to 133
    MHz, the VCO at 533 to 1066 MHz and the output at 16 to 275 MHz (iCE40 sysCLOCK PLL
    design guide); ``FILTER_RANGE`` follows the phase-detector frequency. The setting nearest
    to ``out_mhz`` is chosen; :class:`ValueError` when none is within 1%.
    """
    _check_pll_request(in_mhz, out_mhz, 16, 275, "SB_PLL40_PAD")
    candidates = []
    for divr in range(16):
        pfd = in_mhz / (divr + 1)
        if not 10 <= pfd <= 133:
            continue
        for divf in range(128):
            vco = pfd * (divf + 1)
            if not 533 <= vco <= 1066:
                continue
            for divq in range(1, 7):
                out = vco / 2 ** divq
                if not 16 <= out <= 275:
                    continue
                filter_range = next(k for k, top in enumerate((17, 26, 44, 66, 101, 1e9), 1)
                                    if pfd < top)
                params = {"FEEDBACK_PATH": "SIMPLE", "DIVR": divr, "DIVF": divf, "DIVQ": divq,
                          "FILTER_RANGE": filter_range}
                candidates.append((abs(out - out_mhz), divr,
                                   PLLSetting("SB_PLL40_PAD", in_mhz, out, vco, params)))
    return _best(candidates, in_mhz, out_mhz, "SB_PLL40_PAD")


def ecp5_pll(in_mhz, out_mhz):
    """Dividers of the ECP5 ``EHXPLLL`` (feedback from ``CLKOP``) for ``out_mhz`` from
    ``in_mhz``.

    ``out = in * CLKFB_DIV / CLKI_DIV`` and ``VCO = out * CLKOP_DIV``, with the phase
    detector at 3.125 to 400 MHz, the VCO at 400 to 800 MHz and the output at 3.125 to 400 MHz
    (ECP5 sysCLOCK PLL usage guide). Among the settings nearest to ``out_mhz`` the one with
    the VCO nearest 600 MHz is chosen; :class:`ValueError` when none is within 1%.
    """
    _check_pll_request(in_mhz, out_mhz, 3.125, 400, "EHXPLLL")
    candidates = []
    for clki_div in range(1, 129):
        pfd = in_mhz / clki_div
        if not 3.125 <= pfd <= 400:
            continue
        for clkfb_div in range(1, 81):
            out = pfd * clkfb_div
            if not 3.125 <= out <= 400:
                continue
            for clkop_div in range(1, 129):
                vco = out * clkop_div
                if not 400 <= vco <= 800:
                    continue
                params = {"CLKI_DIV": clki_div, "CLKFB_DIV": clkfb_div, "CLKOP_DIV": clkop_div,
                          "CLKOP_CPHASE": clkop_div // 2, "CLKOP_FPHASE": 0}
                candidates.append((round(abs(out - out_mhz), 9), abs(vco - 600),
                                   PLLSetting("EHXPLLL", in_mhz, out, vco, params)))
    return _best(candidates, in_mhz, out_mhz, "EHXPLLL")


def board_pll(board, in_mhz, clk_mhz):
    """The :class:`PLLSetting` of ``board``'s device for ``clk_mhz`` from ``in_mhz`` (``None``
    when ``clk_mhz`` is ``None``: no PLL)."""
    if clk_mhz is None:
        return None
    return (ice40_pll if BOARDS[board].family == "ice40" else ecp5_pll)(in_mhz, clk_mhz)


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
    family: str = "ice40"               # "ice40" or "ecp5": which PLL
    default_mhz: float | None = None    # clock of ``npu build`` (PLL); None: the oscillator
    mem_request_register: bool = False  # BoardSystem(mem_request_register=)

    def make_platform(self):
        import importlib
        cls = getattr(importlib.import_module(f"amaranth_boards.{self.module}"), self.platform)
        return cls()


BOARDS = {
    "icebreaker": Board("icebreaker", "ICEBreakerPlatform", "icebreaker", reset=("button", 0),
                        busy_led=("led_g", 0), error_led=("led_r", 0), family="ice40",
                        default_mhz=25.0),
    "ulx3s": Board("ulx3s", "ULX3S_85F_Platform", "ulx3s", reset=("button_pwr", 0),
                   busy_led=("led", 0), error_led=("led", 1), esp32_gpio0="L2", family="ecp5",
                   default_mhz=60.0, mem_request_register=True),
}


class BoardTop(Elaboratable):
    """A :class:`BoardSystem` on a board's pins (see the module documentation).

    Parameters
    ----------
    board : str
        A key of :data:`BOARDS`.
    config : NPUConfig
    clk_mhz : float or None
        Clock of the ``sync`` domain made by the device's PLL from the board's oscillator;
        ``None`` runs from the oscillator itself (12 MHz iCEBreaker, 25 MHz ULX3S).
    **kwargs
        Passed to :class:`BoardSystem` (``mem_bytes``, ``baud``, ``timeout_bits``, ``npu``,
        ``mem_request_register``, by default the board's); the clock frequency is the board's,
        or the PLL's.
    """

    def __init__(self, board, config, *, clk_mhz=None, **kwargs):
        if board not in BOARDS:
            raise ValueError(f"unknown board {board!r}; choose from {', '.join(BOARDS)}")
        self.board = BOARDS[board]
        self.config = config
        self.clk_mhz = clk_mhz
        self.kwargs = {"mem_request_register": self.board.mem_request_register, **kwargs}

    def pll(self, in_mhz):
        """The :class:`PLLSetting` for :attr:`clk_mhz` from ``in_mhz``, or ``None``."""
        return board_pll(self.board.name, in_mhz, self.clk_mhz)

    def _pll_domain(self, m, platform, setting, button):
        # The sync domain from the PLL, in reset until the PLL locks and while ``button``
        # (the reset button's pin, not synchronised) is pressed.
        m.domains.sync = sync = ClockDomain("sync")
        locked = Signal()
        clk_pin = platform.request(platform.default_clk, 0, dir="-")
        if setting.primitive == "SB_PLL40_PAD":
            p = setting.params
            m.submodules.pll = Instance(
                "SB_PLL40_PAD",
                p_FEEDBACK_PATH=p["FEEDBACK_PATH"], p_DIVR=p["DIVR"], p_DIVF=p["DIVF"],
                p_DIVQ=p["DIVQ"], p_FILTER_RANGE=p["FILTER_RANGE"],
                i_PACKAGEPIN=clk_pin.io, i_RESETB=Const(1), i_BYPASS=Const(0),
                o_PLLOUTGLOBAL=sync.clk, o_LOCK=locked)
        else:
            m.submodules.clk_buf = clk_buf = io.Buffer("i", clk_pin)
            p = setting.params
            m.submodules.pll = Instance(
                "EHXPLLL",
                a_FREQUENCY_PIN_CLKI=f"{setting.in_mhz:g}",
                a_FREQUENCY_PIN_CLKOP=f"{setting.out_mhz:g}",
                a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
                a_MFG_GMCREF_SEL="2",
                p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
                p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA",
                p_CLKOP_ENABLE="ENABLED", p_FEEDBK_PATH="CLKOP",
                p_CLKI_DIV=p["CLKI_DIV"], p_CLKFB_DIV=p["CLKFB_DIV"],
                p_CLKOP_DIV=p["CLKOP_DIV"], p_CLKOP_CPHASE=p["CLKOP_CPHASE"],
                p_CLKOP_FPHASE=p["CLKOP_FPHASE"],
                i_CLKI=clk_buf.i, i_CLKFB=sync.clk, i_RST=Const(0), i_STDBY=Const(0),
                i_PHASESEL0=Const(0), i_PHASESEL1=Const(0), i_PHASEDIR=Const(1),
                i_PHASESTEP=Const(1), i_PHASELOADREG=Const(1), i_PLLWAKESYNC=Const(0),
                i_ENCLKOP=Const(0), o_CLKOP=sync.clk, o_LOCK=locked)
        platform.add_clock_constraint(sync.clk, setting.out_mhz * 1e6)
        # One synchroniser for both reasons to reset (PLL not locked, button pressed): the
        # domain's reset is then the output of its last flip-flop, with no gate between it and
        # the thousands of flip-flops it resets (docs/boards.md, "Reset").
        m.submodules.pll_reset = ResetSynchronizer(~locked | button, domain="sync")

    def elaborate(self, platform):
        m = Module()
        board = self.board
        in_mhz = platform.default_clk_frequency / 1e6
        setting = self.pll(in_mhz)

        def buffer(direction, port, name):
            m.submodules[name] = buf = io.Buffer(direction, port)
            return buf

        def pin(direction, name, number):
            return buffer(direction, platform.request(name, number, dir="-"), f"{name}_{number}")

        button = pin("i", *board.reset).i
        if setting is not None:
            self._pll_domain(m, platform, setting, button)
        clk_freq = setting.out_mhz * 1e6 if setting is not None else \
            platform.default_clk_frequency
        system = BoardSystem(self.config, clk_freq=clk_freq, **self.kwargs)

        if setting is not None:
            m.submodules.system = system
        else:
            # The platform's own domain: the button, synchronised, resets everything but the
            # platform's clock logic.
            reset = Signal()
            m.submodules.reset_sync = FFSynchronizer(button, reset)
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


def board_plan(board, config, *, name="npu_board", clk_mhz=None, prepare_opts=None, **kwargs):
    """Elaborate the board top of ``board`` for the toolchain: the ``amaranth.build``
    ``BuildPlan`` (``prepare_opts`` are the platform's toolchain overrides, such as
    ``nextpnr_opts``)."""
    platform = make_platform(board)
    top = BoardTop(board, config, clk_mhz=clk_mhz, **kwargs)
    return platform.prepare(top, name=name, **(prepare_opts or {}))


def board_files(board, config, *, name="npu_board", **kwargs):
    """Elaborate the board top of ``board`` and return the toolchain's input files
    (``{filename: text or bytes}``: the design as RTLIL, the pin constraints, the scripts)."""
    return dict(board_plan(board, config, name=name, **kwargs).files)
