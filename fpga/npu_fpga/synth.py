"""Out-of-context synthesis and place-and-route of one block, for Fmax and resource figures.

:func:`synthesize` takes any block (normally a :class:`wiring.Component`), wraps it in a small
generated harness, and runs Yosys and nextpnr for one of :data:`TARGETS`:

* ``"ecp5-85f"``: LFE5U-85F, package CABGA381, speed grade 6 (``synth_ecp5``,
  ``nextpnr-ecp5 --85k --package CABGA381 --speed 6``), 125 MHz by default;
* ``"ice40-up5k"``: iCE40UP5K, package SG48 (``synth_ice40 -dsp``,
  ``nextpnr-ice40 --up5k --package sg48``), 50 MHz by default.

It returns a :class:`SynthReport` with the achieved Fmax of the block's clock, the resources
used, and nextpnr's critical path.

The harness
-----------
A block's ports are far wider than any package's pins, and a port left unconnected lets the
tools remove the logic behind it. :class:`OutOfContextHarness` therefore puts the block between
four pins (``clk``, ``rst``, ``din``, ``dout``) and registers everything at its boundary:

* **Inputs.** All input ports of the block, concatenated, are the bits of one shift register
  (``ooc_in``) that ``din`` feeds one bit per cycle. Every input bit is thus driven straight by a
  flip-flop that the tools cannot predict. Cost: one flip-flop per input bit, no logic.
* **Outputs.** All output ports are captured, without any logic in between, in one register
  (``ooc_out``), which a pipelined tree of 4-input XORs (``ooc_xor*``, one LUT4 and one
  flip-flop per node) reduces to the one flip-flop that drives ``dout``. Every output bit thus
  reaches a pin, so nothing is optimised away. Cost: about 1.33 flip-flops and 0.33 LUTs per
  output bit.
* **Clock and reset.** ``clk`` drives the ``sync`` domain directly (through the global clock
  network); ``rst`` passes two flip-flops and is the ``sync`` domain's reset, so the block's reset
  logic is synthesised as it would be in a real top. A block that uses other clock domains must
  be given only ``sync`` (for example with :class:`DomainRenamer`).

Every path of the harness itself is a flip-flop, at most one LUT, and a flip-flop, and paths
from and to the pins are not timed against the clock, so the reported Fmax is that of the
block's own register-to-register paths plus its combinational paths from input ports and to
output ports (a harness flip-flop at each end).

Yosys synthesises the block as a module of its own (``keep_hierarchy`` on ``<name>.dut``; the
block's own submodules are still flattened into it), so no optimisation crosses the boundary:
the harness cannot, for example, share a flip-flop with a reset-less input register of the
block (Yosys merges flip-flops with equal inputs), and a constant output still costs its
harness flip-flops. The resources of the harness are therefore known exactly: the totals of
:class:`SynthReport` include them and :attr:`SynthReport.harness_luts` and
:attr:`~SynthReport.harness_ffs` (counted in the netlist, equal to
:attr:`OutOfContextHarness.luts` and :attr:`~OutOfContextHarness.ffs`) say how much they are.

The block is elaborated for an :class:`OutOfContextPlatform`, which names the device (as
Amaranth's vendor platforms do) and nothing else, so a block with a vendor primitive and a
behavioural twin (the iCE40 MAC array's ``SB_MAC16``) is synthesised with the primitive.

Pins are real pins of real boards (ULX3S for the ECP5, iCEBreaker for the UP5K) so the clock
enters on a global clock input. nextpnr-ecp5 has an ``--out-of-context`` mode, but it also
removes the global clock network, and nextpnr-ice40 has none, so the pin harness is used for
both.

Tools
-----
The tools are found through the environment variables ``YOSYS``, ``NEXTPNR_ECP5`` and
``NEXTPNR_ICE40`` (defaults in :data:`npu_fpga.toolenv.TOOL_DEFAULTS`: the YoWASP builds), looked
up on ``PATH`` and then in the directory of the running Python (the venv's ``bin``). A tool that
cannot be found or that fails raises :class:`SynthError`.
"""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from amaranth.back import rtlil
from amaranth.hdl import Cat, ClockDomain, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .toolenv import TOOL_DEFAULTS, venv_bin_dir

__all__ = ["DEFAULT_PNR_TIMEOUT", "LUT_MAPPERS", "ROUTERS", "TARGETS", "Target", "SynthError",
           "SynthReport", "SynthStopped", "SynthTimeout", "OutOfContextHarness",
           "OutOfContextPlatform", "find_tool", "lut_mapper_steps", "synthesize"]


@dataclass(frozen=True)
class Target:
    """One FPGA that :func:`synthesize` can target.

    Attributes
    ----------
    name : str
        The key in :data:`TARGETS`.
    device : str
        Human-readable device, package and speed grade.
    family : str
        ``"ecp5"`` or ``"ice40"``.
    default_mhz : float
        Clock constraint when :func:`synthesize` is given none.
    synth_command : str
        Yosys synthesis command.
    synth_opts : str
        Default options of :attr:`synth_command`.
    nextpnr_var : str
        Environment variable that names the nextpnr binary.
    nextpnr_args : tuple of str
        Device options of nextpnr.
    pins : dict of str to str
        Package pin of each harness port.
    cells : dict of str to str
        nextpnr cell type counted as each of ``luts``, ``ffs``, ``dsps``, ``brams``, and
        ``lutram``, ``spram`` or ``logic_cells`` where the device has them.
    router : str
        Default nextpnr router (``docs/synthesis.md`` records the measurements behind it).
    part : str
        Device name as Amaranth's vendor platforms spell it (their ``device`` attribute), given
        to the block's ``elaborate`` through :class:`OutOfContextPlatform` so that a block can
        choose the device's primitives.
    capacity : dict of str to int
        Cells of the device by nextpnr cell type, for the utilisation of a Yosys-only run
        (``place=False`` of :func:`synthesize`), which has no nextpnr report.
    """

    name: str
    device: str
    family: str
    default_mhz: float
    synth_command: str
    synth_opts: str
    nextpnr_var: str
    nextpnr_args: tuple
    pins: dict
    cells: dict
    router: str
    part: str
    capacity: dict = field(default_factory=dict)


#: nextpnr routers that :func:`synthesize` accepts.
ROUTERS = ("router1", "router2")

#: LUT mappers of the Yosys flow (``lut_mapper=`` of :func:`synthesize` and
#: :func:`npu_fpga.build.build_board`): ``"abc9"`` is the synthesis command's own flow;
#: ``"abc"`` (ECP5 only) runs ``synth_ecp5`` up to its LUT mapping (``-run :map_luts``), maps
#: with Yosys's classic ``abc -dress -lut 4`` (LUT4s only: the wide LUTs of ``-lut 4:7``, with
#: the PFU multiplexers, cost a third more LUT4s on the DMA) and finishes with its remaining
#: steps (``-run map_cells:``). Yosys 0.70's ABC9 stops with an internal assertion on some
#: large designs; ``docs/synthesis.md`` compares the two.
LUT_MAPPERS = ("abc9", "abc")

#: Default time limit of place and route in seconds (``timeout=`` of :func:`synthesize`): the
#: flow is meant to stay usable on a 2-core machine, so a router that does not converge is
#: stopped rather than left to spin.
DEFAULT_PNR_TIMEOUT = 1800

#: The supported targets, by name.
TARGETS = {
    "ecp5-85f": Target(
        name="ecp5-85f",
        device="LFE5U-85F-6BG381 (ECP5, CABGA381, speed 6)",
        family="ecp5",
        default_mhz=125.0,
        synth_command="synth_ecp5",
        synth_opts="",
        nextpnr_var="NEXTPNR_ECP5",
        nextpnr_args=("--85k", "--package", "CABGA381", "--speed", "6"),
        # ULX3S: 25 MHz oscillator, PWR button, F1 button, LED 0.
        pins={"clk": "G2", "rst": "D6", "din": "R1", "dout": "B2"},
        cells={"luts": "TRELLIS_COMB", "ffs": "TRELLIS_FF", "dsps": "MULT18X18D",
               "brams": "DP16KD", "lutram": "TRELLIS_RAMW"},
        router="router2",
        part="LFE5U-85F",
        capacity={"TRELLIS_COMB": 83640, "TRELLIS_FF": 83640, "MULT18X18D": 156,
                  "DP16KD": 208, "TRELLIS_RAMW": 10455},
    ),
    "ice40-up5k": Target(
        name="ice40-up5k",
        device="iCE40UP5K-SG48",
        family="ice40",
        default_mhz=50.0,
        synth_command="synth_ice40",
        synth_opts="-dsp",
        nextpnr_var="NEXTPNR_ICE40",
        nextpnr_args=("--up5k", "--package", "sg48"),
        # iCEBreaker: 12 MHz oscillator, user button, PMOD1A pin 1, red LED.
        pins={"clk": "35", "rst": "10", "din": "4", "dout": "11"},
        cells={"logic_cells": "ICESTORM_LC", "dsps": "ICESTORM_DSP", "brams": "ICESTORM_RAM",
               "spram": "ICESTORM_SPRAM"},
        # router2 can circle for tens of minutes on a nearly full UP5K (docs/synthesis.md).
        router="router1",
        part="iCE40UP5K",
        capacity={"ICESTORM_LC": 5280, "ICESTORM_DSP": 8, "ICESTORM_RAM": 30,
                  "ICESTORM_SPRAM": 4},
    ),
}


class OutOfContextPlatform:
    """The ``platform`` that :func:`synthesize` elaborates a block for: not a build platform,
    only the device's name (:attr:`device`, as Amaranth's vendor platforms spell it, e.g.
    ``"iCE40UP5K"``) and :attr:`family`, so that a block that has a vendor primitive (such as
    ``SB_MAC16``) and a behavioural twin instantiates the primitive."""

    def __init__(self, target):
        self.device = target.part
        self.family = target.family

    def __repr__(self):
        return f"OutOfContextPlatform({self.device!r})"


class SynthError(Exception):
    """A synthesis tool is missing or failed.

    The first line of the message says what failed; the following lines, if any, are the tail
    of the tool's log.

    Attributes
    ----------
    step : str
        The step that failed (``"yosys"``, ``"nextpnr-ecp5"``, ...).
    log_tail : str
        The last lines of the tool's log, or ``""``.
    log_path : str or None
        The full log, if it was kept.
    """

    def __init__(self, message, *, step="", log_tail="", log_path=None):
        self.step = step
        self.log_tail = log_tail
        self.log_path = log_path
        text = message
        if log_path is not None:
            text += f" (log: {log_path})"
        if log_tail:
            text += "\n" + log_tail
        super().__init__(text)


class SynthTimeout(SynthError):
    """A tool ran past its time limit and was stopped (normally a router that does not
    converge). :attr:`seconds` is the limit."""

    def __init__(self, message, *, seconds, **kwargs):
        self.seconds = seconds
        super().__init__(message, **kwargs)


class SynthStopped(SynthError):
    """A tool was stopped early because its log showed that it could not succeed (for
    example nextpnr with more cells than the device has). :attr:`reason` says why."""

    def __init__(self, message, *, reason, **kwargs):
        self.reason = reason
        super().__init__(message, **kwargs)


def find_tool(var):
    """Path of the tool named by environment variable ``var``.

    The variable (or its default from :data:`~npu_fpga.toolenv.TOOL_DEFAULTS`) may be a path or a
    command name; a name is looked up on ``PATH`` and then next to the running Python.

    Raises
    ------
    SynthError
        If the tool cannot be found.
    """
    command = os.environ.get(var) or TOOL_DEFAULTS[var]
    found = shutil.which(command)
    if found is None and os.path.dirname(command) == "":
        found = shutil.which(command, path=venv_bin_dir())
    if found is None:
        raise SynthError(f"{var}: cannot find the tool {command!r}; install the FPGA tools "
                         f"(pip install -e '.[fpga]') or set {var} to its path", step=var)
    return found


def _xor_reduce(m, bits, fan_in=4):
    # A pipelined XOR tree of `fan_in`-input nodes (a LUT and a flip-flop each); returns the root.
    level, depth = list(bits), 0
    while len(level) > 1:
        next_level = []
        for index in range(0, len(level), fan_in):
            group = level[index:index + fan_in]
            if len(group) == 1:
                next_level.append(group[0])
                continue
            node = Signal(name=f"ooc_xor{depth}_{index // fan_in}", reset_less=True)
            m.d.sync += node.eq(Cat(*group).xor())
            next_level.append(node)
        level, depth = next_level, depth + 1
    return level[0]


class OutOfContextHarness(wiring.Component):
    """Registered pin harness around one block, for out-of-context synthesis.

    See the module documentation for what it builds and what it costs.

    Parameters
    ----------
    block : Elaboratable
        The block. Its ``signature`` gives its ports unless ``ports`` is given.
    ports : dict of str to (Value, Flow), optional
        Ports of a block without a signature: name to ``(value, In or Out)`` as seen from the
        block. Input values must not be driven by the block.

    Members
    -------
    clk : In(1)
        Clock of the ``sync`` domain.
    rst : In(1)
        Reset of the ``sync`` domain, through two flip-flops.
    din : In(1)
        Serial input of the input shift register; only present if the block has inputs.
    dout : Out(1)
        Registered XOR of all output bits, a few cycles late.

    Attributes
    ----------
    in_width, out_width : int
        Total width of the block's input and output ports.
    ffs, luts : int
        Flip-flops and LUT4s of the harness itself.
    """

    def __init__(self, block, *, ports=None):
        self._block = block
        self._inputs, self._outputs = [], []
        for port_name, flow, value in self._block_ports(block, ports):
            if len(value) == 0:
                continue
            (self._inputs if flow == In else self._outputs).append((port_name, value))
        if not self._outputs:
            raise ValueError(f"Block {block!r} has no output ports, so synthesis would remove "
                             f"all of it")
        self._in_width = sum(len(value) for _, value in self._inputs)
        self._out_width = sum(len(value) for _, value in self._outputs)

        # Harness cost, counted the way elaborate() and _xor_reduce() build it: a node for
        # every group of 2 to 4 bits, a group of one bit passes to the next level.
        xor_nodes, count = 0, self._out_width
        while count > 1:
            xor_nodes += count // 4 + (1 if count % 4 > 1 else 0)
            count = (count + 3) // 4
        self._luts = xor_nodes
        self._ffs = 2 + self._in_width + self._out_width + xor_nodes

        members = {"clk": In(1), "rst": In(1)}
        if self._in_width:
            members["din"] = In(1)
        members["dout"] = Out(1)
        super().__init__(members)

    @staticmethod
    def _block_ports(block, ports):
        if ports is None:
            signature = getattr(block, "signature", None)
            if not isinstance(signature, wiring.Signature):
                raise TypeError(f"Block must have a wiring signature or be given ports=, "
                                f"not {block!r}")
            for path, member, value in signature.flatten(block):
                yield "__".join(map(str, path)), member.flow, Value.cast(value)
        else:
            for port_name, (value, flow) in ports.items():
                if flow not in (In, Out):
                    raise ValueError(f"Direction of port {port_name!r} must be In or Out, "
                                     f"not {flow!r}")
                yield port_name, flow, Value.cast(value)

    @property
    def in_width(self):
        return self._in_width

    @property
    def out_width(self):
        return self._out_width

    @property
    def ffs(self):
        return self._ffs

    @property
    def luts(self):
        return self._luts

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self._block

        # Clock straight from its pin; reset through two flip-flops.
        m.domains.sync = cd_sync = ClockDomain()
        ooc_rst = Signal(2, reset_less=True)
        m.d.comb += cd_sync.clk.eq(self.clk)
        m.d.sync += ooc_rst.eq(Cat(self.rst, ooc_rst[0]))
        m.d.comb += cd_sync.rst.eq(ooc_rst[1])

        # Inputs: one shift register fed from `din`.
        if self._in_width:
            ooc_in = Signal(self._in_width, reset_less=True)
            m.d.sync += ooc_in.eq(Cat(self.din, ooc_in[:-1]))
            offset = 0
            for _, value in self._inputs:
                m.d.comb += value.eq(ooc_in[offset:offset + len(value)])
                offset += len(value)

        # Outputs: captured as they are, then a pipelined XOR tree into `dout`.
        ooc_out = Signal(self._out_width, reset_less=True)
        m.d.sync += ooc_out.eq(Cat(*(value for _, value in self._outputs)))
        m.d.comb += self.dout.eq(_xor_reduce(m, ooc_out))

        return m


@dataclass
class SynthReport:
    """Result of one :func:`synthesize` run.

    Resource totals include the harness; :attr:`harness_luts` and :attr:`harness_ffs` say how
    much of them it is.

    Attributes
    ----------
    target : str
        Target name (a key of :data:`TARGETS`).
    device : str
        Device description.
    name : str
        Top-level module name.
    seed : int
        nextpnr placement seed.
    target_mhz : float
        Clock constraint given to nextpnr.
    fmax_mhz : float or None
        Achieved Fmax of the block's clock, ``None`` if nextpnr timed no path on it.
    met : bool
        Whether ``fmax_mhz`` reaches ``target_mhz``.
    luts : int
        LUT4s. ECP5: nextpnr's ``TRELLIS_COMB`` (LUT4s, including the two halves of each carry
        cell and LUTs used as LUT-RAM). iCE40: ``SB_LUT4`` cells of the Yosys netlist (before
        nextpnr adds pass-through LUTs; see :attr:`logic_cells`).
    ffs : int
        Flip-flops. ECP5: nextpnr's ``TRELLIS_FF``. iCE40: ``SB_DFF*`` cells of the Yosys netlist.
    dsps : int
        ``MULT18X18D`` (ECP5) or ``ICESTORM_DSP`` (iCE40).
    brams : int
        Block RAMs: ``DP16KD`` (ECP5) or ``ICESTORM_RAM`` (iCE40).
    lutram : int or None
        ECP5 only: ``TRELLIS_RAMW`` (write ports of distributed RAM, one per 16x4 bits).
    spram : int or None
        iCE40 only: ``ICESTORM_SPRAM``.
    logic_cells : int or None
        iCE40 only: ``ICESTORM_LC`` (a LUT4, a flip-flop and carry logic each; what limits the
        device).
    harness_luts, harness_ffs : int
        LUT4s and flip-flops of the harness, included in :attr:`luts` and :attr:`ffs`.
    utilization : dict of str to dict
        Every line of nextpnr's utilisation report: cell type to ``{"used", "available"}``.
    netlist_cells : dict of str to int
        Cell types of the Yosys netlist and their counts.
    clock : str
        nextpnr's name of the block's clock net.
    critical_path : str
        The "Critical path report" section of nextpnr's log.
    files : dict of str to str
        Paths of the kept files (empty unless files were kept).
    router : str
        The nextpnr router used.
    pnr_seconds : float or None
        Wall time of place and route.
    placed : bool
        False for a Yosys-only run (``place=False`` of :func:`synthesize`): no Fmax
        (``fmax_mhz`` is None), and the resources are the Yosys netlist's, before nextpnr packs
        it. ECP5: ``luts`` is ``LUT4`` plus two per ``CCU2C`` (nextpnr also adds LUTs for
        distributed RAM and route-throughs, so its ``TRELLIS_COMB`` is somewhat higher),
        ``ffs`` ``TRELLIS_FF``, ``lutram`` ``TRELLIS_DPR16X4``; ``utilization`` is against
        :attr:`Target.capacity`.
    """

    target: str
    device: str
    name: str
    seed: int
    target_mhz: float
    fmax_mhz: float | None
    met: bool
    luts: int
    ffs: int
    dsps: int
    brams: int
    lutram: int | None = None
    spram: int | None = None
    logic_cells: int | None = None
    harness_luts: int = 0
    harness_ffs: int = 0
    utilization: dict = field(default_factory=dict)
    netlist_cells: dict = field(default_factory=dict)
    clock: str = ""
    critical_path: str = ""
    files: dict = field(default_factory=dict)
    router: str = ""
    pnr_seconds: float | None = None
    placed: bool = True

    def format(self):
        """A short human-readable table."""
        cells = TARGETS[self.target].cells if self.target in TARGETS else {}

        def available(kind, fallback=None):
            cell = cells.get(kind, fallback)
            if cell in self.utilization:
                total = self.utilization[cell]["available"]
                used = self.utilization[cell]["used"]
                return f" / {total:<6} {100 * used / total:5.1f}%" if total else ""
            return ""

        if self.fmax_mhz is None:
            fmax = "n/a"
        else:
            fmax = f"{self.fmax_mhz:.1f} MHz"
        if not self.placed:
            lines = [f"{self.name} on {self.target}: {self.device}, Yosys only (no place and "
                     f"route, no Fmax; cell counts before nextpnr packing)"]
        else:
            lines = [
                f"{self.name} on {self.target}: {self.device}, seed {self.seed}"
                + (f", {self.router}" if self.router else "")
                + (f", place and route {self.pnr_seconds:.0f} s"
                   if self.pnr_seconds is not None else ""),
                f"  {'Fmax':<12} {fmax:>10}   target {self.target_mhz:g} MHz: "
                f"{'met' if self.met else 'NOT MET'}",
            ]
        if self.logic_cells is not None:
            lines.append(f"  {'logic cells':<12} {self.logic_cells:>10}"
                         f"{available('logic_cells')}")
            lines.append(f"  {'LUT4':<12} {self.luts:>10}   (harness {self.harness_luts})")
            lines.append(f"  {'FF':<12} {self.ffs:>10}   (harness {self.harness_ffs})")
        else:
            lines.append(f"  {'LUT4':<12} {self.luts:>10}{available('luts')}"
                         f"   (harness {self.harness_luts})")
            lines.append(f"  {'FF':<12} {self.ffs:>10}{available('ffs')}"
                         f"   (harness {self.harness_ffs})")
        lines.append(f"  {'DSP':<12} {self.dsps:>10}{available('dsps')}")
        lines.append(f"  {'BRAM':<12} {self.brams:>10}{available('brams')}")
        if self.lutram is not None:
            lines.append(f"  {'LUT-RAM':<12} {self.lutram:>10}{available('lutram')}")
        if self.spram is not None:
            lines.append(f"  {'SPRAM':<12} {self.spram:>10}{available('spram')}")
        return "\n".join(lines)

    def to_json(self):
        """The report as a JSON string."""
        return json.dumps(dataclasses.asdict(self), indent=2)


def lut_mapper_steps(tgt, lut_mapper, synth_opts, top):
    """The Yosys steps of ``lut_mapper`` (:data:`LUT_MAPPERS`) for target ``tgt``: the options of
    its synthesis command and the list of commands to run after it (empty for ``"abc9"``).

    Raises
    ------
    ValueError
        Unknown mapper, or ``"abc"`` on a target other than the ECP5.
    """
    if lut_mapper not in LUT_MAPPERS:
        raise ValueError(f"LUT mapper must be one of {', '.join(LUT_MAPPERS)}, not "
                         f"{lut_mapper!r}")
    if lut_mapper == "abc9":
        return synth_opts, []
    if tgt.family != "ecp5":
        raise ValueError(f"the classic LUT mapper (abc) is supported on the ECP5 only, not on "
                         f"the {tgt.device}")
    # synth_lattice's map_luts step, with abc in place of abc9.
    return " ".join(filter(None, (synth_opts, "-run :map_luts"))), [
        "check -latchonly -assert",
        "techmap -map +/lattice/latches_map.v",
        "abc -dress -lut 4",
        "clean",
        " ".join(filter(None, (tgt.synth_command, synth_opts, "-run map_cells:", f"-top {top}")))]


def _missing_domain(domain_name):
    raise ValueError(f"The block uses clock domain {domain_name!r}, but the out-of-context "
                     f"harness provides only 'sync'; rename it with DomainRenamer")


def _tail(path, lines=20):
    try:
        with open(path, errors="replace") as file:
            text = file.read()
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _first_error(tail):
    for line in tail.splitlines():
        # "wasm trap: ...": a YoWASP tool ran out of stack or memory.
        if "ERROR" in line or "Error" in line or "wasm trap" in line:
            return line.strip()
    return ""


#: Seconds between the progress lines of a tool that is still running (:func:`_run`).
PROGRESS_INTERVAL = 60.0

# A Yosys pass starting ("12.3. Executing ABC pass.") or a nextpnr step ("Info: Running
# router2..."): the last one in a log says where a long run is.
_LOG_STEP = re.compile(r"^(?:\d+(?:\.\d+)*\. Executing (.+?)\.?|Info:\s+(\S.*?))\s*$",
                       re.MULTILINE)


def _last_step(path):
    # The last step that the log at `path` names, from its final MiB ("" if none).
    try:
        with open(path, "rb") as file:
            file.seek(max(0, os.path.getsize(path) - (1 << 20)))
            text = file.read().decode(errors="replace")
    except OSError:
        return ""
    steps = _LOG_STEP.findall(text)
    if not steps:
        return ""
    executing, info = steps[-1]
    return (executing or info)[:100]


#: Seconds between two checks of a running tool's log by :func:`_run`'s ``stop``.
POLL_INTERVAL = 2.0


class _Stopped(Exception):
    # _wait's way out when `stop` names a reason.
    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


def _wait(process, step, start, *, timeout, progress, watch, stop):
    # Waits for the tool, saying every PROGRESS_INTERVAL seconds how long it has run and its
    # log's last step; raises subprocess.TimeoutExpired at `timeout` seconds, and _Stopped
    # when stop(watch), checked every POLL_INTERVAL seconds, returns a reason.
    next_progress, where = start + PROGRESS_INTERVAL, ""
    while True:
        now = time.monotonic()
        until = [next_progress] + ([start + timeout] if timeout is not None else []) + \
            ([now + POLL_INTERVAL] if stop is not None else [])
        try:
            return process.wait(timeout=max(min(until) - now, 0))
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if timeout is not None and now - start >= timeout:
                raise
            reason = stop(watch) if stop is not None else None
            if reason:
                raise _Stopped(reason) from None
            if now >= next_progress:
                next_progress = now + PROGRESS_INTERVAL
                # A pass that prints much (Yosys's share) can push its own name out of the
                # log's tail: then the step named last time still holds.
                where = (_last_step(watch) if watch else "") or where
                progress(f"synth: {step}: running for {(now - start) / 60:.0f} min"
                         + (f", at: {where}" if where else ""))


def _run(step, command, *, cwd, log_path, progress, keep, timeout=None, hint="", watch=None,
         stop=None):
    # Runs one tool; returns its wall time. With `timeout` (seconds), a tool still running
    # then is killed (its whole process group) and SynthTimeout raised. Progress lines come
    # every PROGRESS_INTERVAL seconds, naming the last step of log `watch` (default: the
    # tool's own log). With `stop`, a function of the path of `watch` that returns a reason
    # or None, the tool is also killed as soon as it returns a reason, and SynthStopped
    # raised with it.
    progress(f"synth: {step} ...")
    start = time.monotonic()
    try:
        with open(log_path, "w") as log:
            process = subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
            try:
                returncode = _wait(process, step, start, timeout=timeout, progress=progress,
                                   watch=watch or log_path, stop=stop)
            except _Stopped as stopped:
                _kill_group(process)
                raise SynthStopped(f"{step} stopped: {stopped.reason}", reason=stopped.reason,
                                   step=step, log_path=log_path if keep else None) from None
            except subprocess.TimeoutExpired:
                _kill_group(process)
                raise SynthTimeout(
                    f"{step} stopped after {timeout:g} s (time limit): it did not finish; "
                    f"{hint}", seconds=timeout, step=step, log_tail=_tail(log_path, 5),
                    log_path=log_path if keep else None) from None
            except BaseException:
                _kill_group(process)
                raise
    except OSError as error:
        raise SynthError(f"{step}: cannot run {command[0]}: {error}", step=step) from None
    if returncode != 0:
        tail = _tail(log_path)
        first = _first_error(tail)
        raise SynthError(f"{step} failed with exit code {returncode}"
                         + (f": {first}" if first else ""),
                         step=step, log_tail=tail, log_path=log_path if keep else None)
    seconds = time.monotonic() - start
    progress(f"synth: {step} done in {seconds:.1f} s")
    return seconds


def _kill_group(process):
    # The tool and anything it started (a YoWASP tool is a Python process) run in a session
    # of their own: stop them all, then reap the tool.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        process.kill()
    process.wait()


def _critical_path(log_text):
    # nextpnr prints a "Critical path report for clock '...'" section per clock (one after
    # routing; older versions also one after placement): "Info: " lines up to an empty "Info:"
    # line. Keep the last section of each clock, without the "Info: " prefixes; cross-domain
    # paths (to and from the pins) are left out.
    sections, current = {}, None
    for line in log_text.splitlines():
        if current is None:
            if line.startswith("Info: Critical path report for clock "):
                current = sections[line] = []
        elif line.rstrip() == "Info:" or not line.startswith("Info: "):
            current = None
            continue
        if current is not None:
            current.append(line[len("Info: "):])
    return "\n\n".join("\n".join(lines) for lines in sections.values())


def _write(directory, file_name, text):
    path = os.path.join(directory, file_name)
    with open(path, "w") as file:
        file.write(text)
    return path


def _constraints(target, harness, freq_mhz):
    ports = [name for name in ("clk", "rst", "din", "dout") if name in harness.signature.members]
    if target.family == "ecp5":
        lines = [f"# Out-of-context harness pins (ULX3S) for {target.device}"]
        for port in ports:
            lines.append(f'LOCATE COMP "{port}" SITE "{target.pins[port]}";')
            lines.append(f'IOBUF PORT "{port}" IO_TYPE=LVCMOS33;')
        lines.append(f'FREQUENCY PORT "clk" {freq_mhz:g} MHZ;')
        return "lpf", "\n".join(lines) + "\n"
    else:
        lines = [f"# Out-of-context harness pins (iCEBreaker) for {target.device}"]
        for port in ports:
            lines.append(f"set_io {port} {target.pins[port]}")
        return "pcf", "\n".join(lines) + "\n"


def synthesize(elaboratable, target, *, name="top", freq_mhz=None, seed=1, build_dir=None,
               keep_files=False, progress=print, synth_opts=None, ports=None, nextpnr_opts=(),
               router=None, timeout=DEFAULT_PNR_TIMEOUT, place=True, lut_mapper="abc9"):
    """Synthesise, place and route ``elaboratable`` out of context and report Fmax and resources.

    Parameters
    ----------
    elaboratable : Elaboratable
        The block; normally a :class:`wiring.Component`, whose signature gives its ports. It may
        use only the ``sync`` clock domain.
    target : str
        A key of :data:`TARGETS`: ``"ecp5-85f"`` or ``"ice40-up5k"``.
    name : str
        Name of the top-level module and of the generated files.
    freq_mhz : float, optional
        Clock constraint; the target's default (125 MHz ECP5, 50 MHz iCE40) if not given.
    seed : int
        nextpnr placement seed.
    build_dir : str or path, optional
        Directory for the generated files (created if missing); a new temporary directory if not
        given.
    keep_files : bool
        Keep the generated files and list them in :attr:`SynthReport.files`. If false, a
        temporary directory is removed afterwards, and in a given ``build_dir`` the files this
        function wrote are removed.
    progress : callable or None
        Called with a line of text as each step starts and ends.
    synth_opts : str, optional
        Options of the Yosys synthesis command instead of the target's default (``"-dsp"`` on
        iCE40, none on ECP5).
    ports : dict, optional
        Ports of a block without a signature; see :class:`OutOfContextHarness`.
    nextpnr_opts : sequence of str, optional
        Extra nextpnr arguments, for example ``("--placer", "sa")``.
    router : str, optional
        nextpnr router, one of :data:`ROUTERS`; the target's :attr:`Target.router` if not given.
    timeout : float or None
        Time limit of place and route in seconds (:data:`DEFAULT_PNR_TIMEOUT` by default;
        ``None`` or 0 for none). nextpnr's routers have no iteration limit of their own, so a
        run that does not converge is stopped by this limit and :class:`SynthTimeout` is
        raised.
    place : bool
        False: Yosys only, no place and route; the report has the netlist's cells and no Fmax
        (:attr:`SynthReport.placed`). Much faster for a large block's area estimate.
    lut_mapper : str
        ``"abc9"`` (default) or ``"abc"`` (ECP5 only), see :data:`LUT_MAPPERS`.

    Returns
    -------
    SynthReport

    Raises
    ------
    ValueError
        If ``target`` is unknown, or another argument is invalid.
    SynthError
        If a tool is missing or fails.
    SynthTimeout
        If place and route ran past ``timeout``.
    """
    if target not in TARGETS:
        raise ValueError(f"Unknown target {target!r}; choose one of "
                         f"{', '.join(map(repr, TARGETS))}")
    tgt = TARGETS[target]
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"Name must be an identifier, not {name!r}")
    freq_mhz = tgt.default_mhz if freq_mhz is None else freq_mhz
    if not isinstance(freq_mhz, (int, float)) or isinstance(freq_mhz, bool) or freq_mhz <= 0:
        raise ValueError(f"Clock frequency must be a positive number of MHz, not {freq_mhz!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"Seed must be an integer, not {seed!r}")
    synth_opts = tgt.synth_opts if synth_opts is None else synth_opts
    router = tgt.router if router is None else router
    if router not in ROUTERS:
        raise ValueError(f"Router must be one of {', '.join(ROUTERS)}, not {router!r}")
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                or timeout < 0):
        raise ValueError(f"Timeout must be a number of seconds >= 0 or None, not {timeout!r}")
    timeout = timeout or None
    lut_mapper_steps(tgt, lut_mapper, synth_opts, name)     # refuses a bad mapper early
    if progress is None:
        def progress(text):
            pass
    nextpnr_step = f"nextpnr-{tgt.family}"

    yosys = find_tool("YOSYS")
    nextpnr = find_tool(tgt.nextpnr_var) if place else None
    harness = OutOfContextHarness(elaboratable, ports=ports)

    temporary = build_dir is None
    if temporary:
        directory = tempfile.mkdtemp(prefix=f"npu-synth-{name}-")
    else:
        directory = os.path.abspath(os.fspath(build_dir))
        created = not os.path.isdir(directory)
        os.makedirs(directory, exist_ok=True)
    files = {}
    try:
        start = time.monotonic()
        progress(f"synth: {name} for {tgt.device}: {harness.in_width} input and "
                 f"{harness.out_width} output bits")

        # Amaranth to RTLIL.
        progress("synth: converting to RTLIL ...")
        il_text = rtlil.convert(harness, name=name, platform=OutOfContextPlatform(tgt),
                                missing_domain=_missing_domain)
        files["rtlil"] = _write(directory, f"{name}.il", il_text)
        kind, constraints = _constraints(tgt, harness, freq_mhz)
        files["constraints"] = _write(directory, f"{name}.{kind}", constraints)

        # Yosys.
        netlist_name = f"{name}.json"
        mapper_opts, after = lut_mapper_steps(tgt, lut_mapper, synth_opts, name)
        synth_step = " ".join(filter(None, (tgt.synth_command, mapper_opts)))
        script = (f"read_rtlil {name}.il\n"
                  f"setattr -mod -set keep_hierarchy 1 {name}.dut\n"
                  f"{synth_step} -top {name}\n"
                  + "".join(f"{line}\n" for line in after)
                  + f"write_json {netlist_name}\n")
        files["yosys_script"] = _write(directory, f"{name}.ys", script)
        files["netlist"] = os.path.join(directory, netlist_name)
        files["yosys_log"] = os.path.join(directory, f"{name}.yosys.log")
        _run(f"yosys {synth_step}",
             [yosys, "-s", f"{name}.ys"],
             cwd=directory, log_path=files["yosys_log"], progress=progress, keep=keep_files)
        if not place:
            report = _netlist_report(tgt, harness, name=name, seed=seed, freq_mhz=freq_mhz,
                                     files=files)
            progress(f"synth: finished in {time.monotonic() - start:.1f} s (Yosys only)")
            if keep_files:
                report.files = dict(files)
                progress(f"synth: files kept in {directory}")
            return report

        # nextpnr.
        report_name = f"{name}.report.json"
        files["nextpnr_log"] = os.path.join(directory, f"{name}.nextpnr.log")
        files["report"] = os.path.join(directory, report_name)
        other = "router2" if router == "router1" else "router1"
        pnr_seconds = _run(
            f"{nextpnr_step} place and route at {freq_mhz:g} MHz, seed {seed}, {router}",
            [nextpnr, *tgt.nextpnr_args, "--json", netlist_name, f"--{kind}", f"{name}.{kind}",
             "--freq", f"{freq_mhz:g}", "--seed", str(seed), "--timing-allow-fail",
             "--report", report_name, "--router", router, *nextpnr_opts],
            cwd=directory, log_path=files["nextpnr_log"], progress=progress, keep=keep_files,
            timeout=timeout, hint=f"try the other router ({other}), another seed, or a larger "
                                  f"time limit")

        report = _make_report(tgt, harness, name=name, seed=seed, freq_mhz=freq_mhz,
                              files=files)
        report.router, report.pnr_seconds = router, round(pnr_seconds, 1)
        progress(f"synth: finished in {time.monotonic() - start:.1f} s")
        if keep_files:
            report.files = dict(files)
            progress(f"synth: files kept in {directory}")
        return report
    finally:
        if not keep_files:
            if temporary:
                shutil.rmtree(directory, ignore_errors=True)
            else:
                for path in files.values():
                    if os.path.exists(path):
                        os.remove(path)
                if created and not os.listdir(directory):
                    os.rmdir(directory)


def _count_cells(modules, module_name, counts):
    # Cell types of one module of a Yosys JSON netlist, with its submodules' cells counted in.
    for cell in modules[module_name]["cells"].values():
        cell_type = cell["type"]
        if cell_type.startswith("$scopeinfo"):
            continue
        submodule = modules.get(cell_type)
        if submodule is not None and not submodule.get("attributes", {}).get("blackbox"):
            _count_cells(modules, cell_type, counts)
        else:
            counts[cell_type] = counts.get(cell_type, 0) + 1
    return counts


def _netlist_luts_ffs(family, counts):
    if family == "ice40":
        luts = counts.get("SB_LUT4", 0)
        ffs = sum(n for cell_type, n in counts.items() if cell_type.startswith("SB_DFF"))
    else:
        luts = counts.get("LUT4", 0) + 2 * counts.get("CCU2C", 0)
        ffs = counts.get("TRELLIS_FF", 0)
    return luts, ffs


def _netlist_report(tgt, harness, *, name, seed, freq_mhz, files):
    # A Yosys-only run: the netlist's cells, utilisation against the device's capacity.
    try:
        with open(files["netlist"]) as file:
            modules = json.load(file)["modules"]
        netlist_cells = dict(sorted(_count_cells(modules, name, {}).items()))
        harness_cells = _harness_cells(modules, name)
    except (OSError, ValueError, KeyError) as error:
        raise SynthError(f"cannot read the tool results: {error!r}", step="report") from None
    harness_luts, harness_ffs = _netlist_luts_ffs(tgt.family, harness_cells)
    luts, ffs = _netlist_luts_ffs(tgt.family, netlist_cells)
    if tgt.family == "ice40":
        netlist_type = {"dsps": "SB_MAC16", "brams": "SB_RAM40_4K", "spram": "SB_SPRAM256KA"}
        extra = {"spram": netlist_cells.get("SB_SPRAM256KA", 0)}
    else:
        netlist_type = {"dsps": "MULT18X18D", "brams": "DP16KD"}
        extra = {"lutram": netlist_cells.get("TRELLIS_DPR16X4", 0)}
    used = {"luts": luts, "ffs": ffs, **{kind: netlist_cells.get(cell, 0)
                                        for kind, cell in netlist_type.items()}}
    utilization = {tgt.cells[kind]: {"used": n, "available": tgt.capacity[tgt.cells[kind]]}
                   for kind, n in used.items()
                   if kind in tgt.cells and tgt.cells[kind] in tgt.capacity}
    return SynthReport(
        target=tgt.name, device=tgt.device, name=name, seed=seed,
        target_mhz=float(freq_mhz), fmax_mhz=None, met=False,
        luts=luts, ffs=ffs, dsps=used["dsps"], brams=used["brams"], **extra,
        harness_luts=harness_luts, harness_ffs=harness_ffs,
        utilization=utilization, netlist_cells=netlist_cells, placed=False)


def _harness_cells(modules, name):
    # The harness is the top module itself; the block is a submodule kept apart.
    cells = {}
    for cell in modules[name]["cells"].values():
        if cell["type"] not in modules or modules[cell["type"]].get("attributes", {}).get(
                "blackbox"):
            cells[cell["type"]] = cells.get(cell["type"], 0) + 1
    return cells


def _make_report(tgt, harness, *, name, seed, freq_mhz, files):
    try:
        with open(files["report"]) as file:
            pnr = json.load(file)
        with open(files["netlist"]) as file:
            modules = json.load(file)["modules"]
        with open(files["nextpnr_log"], errors="replace") as file:
            log_text = file.read()
        netlist_cells = dict(sorted(_count_cells(modules, name, {}).items()))
        harness_cells = _harness_cells(modules, name)
    except (OSError, ValueError, KeyError) as error:
        raise SynthError(f"cannot read the tool results: {error!r}", step="report") from None
    harness_luts, harness_ffs = _netlist_luts_ffs(tgt.family, harness_cells)

    utilization = {cell: {"used": int(entry["used"]), "available": int(entry["available"])}
                   for cell, entry in pnr.get("utilization", {}).items()}

    def used(kind):
        cell = tgt.cells.get(kind)
        return utilization.get(cell, {}).get("used", 0)

    # The harness has one clock; nextpnr names it after the pin and its buffers, e.g.
    # "$glbnet$clk$TRELLIS_IO_IN" or "clk$SB_IO_IN_$glb_clk".
    clocks = pnr.get("fmax", {})
    clock = next((net for net in clocks if "clk" in net), next(iter(clocks), ""))
    fmax = float(clocks[clock]["achieved"]) if clock else None

    if tgt.family == "ice40":
        luts, ffs = _netlist_luts_ffs(tgt.family, netlist_cells)
        extra = {"spram": used("spram"), "logic_cells": used("logic_cells")}
    else:
        luts, ffs = used("luts"), used("ffs")
        extra = {"lutram": used("lutram")}

    return SynthReport(
        target=tgt.name, device=tgt.device, name=name, seed=seed,
        target_mhz=float(freq_mhz), fmax_mhz=fmax, met=fmax is not None and fmax >= freq_mhz,
        luts=luts, ffs=ffs, dsps=used("dsps"), brams=used("brams"), **extra,
        harness_luts=harness_luts, harness_ffs=harness_ffs,
        utilization=utilization, netlist_cells=netlist_cells, clock=clock,
        critical_path=_critical_path(log_text))
