"""The ECP5 ``MULT18X18D`` multiplier with its input and output registers, and its twin.

Yosys maps an inferred ``*`` to a ``MULT18X18D`` without registers, and nextpnr then times the
multiplier as a combinational path (2.9-3.9 ns on speed grade 6) between fabric flip-flops.
With the cell's own input registers (``REG_INPUTA_CLK``, ``REG_INPUTB_CLK``) and output
register (``REG_OUTPUT_CLK``) set to ``CLK0``, nextpnr uses the registered timing (a setup time
at the inputs, 0.6-0.7 ns clock-to-out at ``P``) and the multiply happens inside the block
between the two registers. Only an instantiated cell carries these parameters, so
:class:`Mult18x18D` instantiates it.

The Amaranth simulator cannot run an :class:`~amaranth.hdl.Instance`; with ``primitive=False``
the same component is built from ordinary registers and a multiply with the same two-cycle
latency (the behavioural twin). Simulating the instantiated cell in Verilator or Icarus needs a
model of it: Yosys ships only a black box of ``MULT18X18D`` (``share/ecp5/cells_bb.v``), so the
project's own model is :data:`npu_sim.ecp5_cells.MULT18X18D_MODEL`.
"""

from amaranth.hdl import ClockSignal, Const, Instance, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Mult18x18D", "is_ecp5_platform"]


def is_ecp5_platform(platform):
    """True if ``platform`` is an Amaranth platform for an ECP5 device (``device`` LFE5U...)."""
    return str(getattr(platform, "device", "")).startswith("LFE5U")


class Mult18x18D(wiring.Component):
    """Unsigned ``a * b`` of two 18-bit operands, registered at the inputs and the output.

    ``p`` is the product of the ``a`` and ``b`` presented ``LATENCY`` (2) cycles earlier. The
    registers have no clock enable and no reset: the pipeline around them never stalls.

    Parameters
    ----------
    primitive : bool or None
        ``True``: instantiate ``MULT18X18D`` (synthesis, and Verilog simulation with a cell
        model). ``False``: registers and an inferred multiply (the Amaranth simulator).
        ``None``: the cell when elaborated for an ECP5 platform (:func:`is_ecp5_platform`),
        else the twin.

    Members
    -------
    a, b : In(18)
        Operands.
    p : Out(36)
        Product.
    """

    a: In(18)
    b: In(18)
    p: Out(36)

    LATENCY = 2

    #: Parameters of the instantiated cell: input A, input B and output registers on ``CLK0``
    #: (nextpnr takes the timing of every registered port from ``CLK0``), the pipeline
    #: register bypassed.
    PARAMETERS = {
        "REG_INPUTA_CLK": "CLK0", "REG_INPUTA_CE": "CE0", "REG_INPUTA_RST": "RST0",
        "REG_INPUTB_CLK": "CLK0", "REG_INPUTB_CE": "CE0", "REG_INPUTB_RST": "RST0",
        "REG_INPUTC_CLK": "NONE",
        "REG_PIPELINE_CLK": "NONE",
        "REG_OUTPUT_CLK": "CLK0", "REG_OUTPUT_CE": "CE0", "REG_OUTPUT_RST": "RST0",
        "CLK0_DIV": "ENABLED", "GSR": "DISABLED", "RESETMODE": "SYNC",
        "SOURCEB_MODE": "B_SHIFT", "MULT_BYPASS": "DISABLED",
    }

    def __init__(self, *, primitive=True):
        self._primitive = None if primitive is None else bool(primitive)
        super().__init__()

    @property
    def primitive(self):
        return self._primitive

    def elaborate(self, platform):
        m = Module()
        primitive = self._primitive
        if primitive is None:
            primitive = is_ecp5_platform(platform)
        if not primitive:
            a1 = Signal(18, reset_less=True)
            b1 = Signal(18, reset_less=True)
            p2 = Signal(36, reset_less=True)
            m.d.sync += [a1.eq(self.a), b1.eq(self.b), p2.eq(a1 * b1)]
            m.d.comb += self.p.eq(p2)
            return m

        ports = {f"p_{name}": value for name, value in self.PARAMETERS.items()}
        ports.update({f"i_A{i}": self.a[i] for i in range(18)})
        ports.update({f"i_B{i}": self.b[i] for i in range(18)})
        ports.update({f"i_C{i}": Const(0, 1) for i in range(18)})
        ports.update({f"o_P{i}": self.p[i] for i in range(36)})
        ports.update({
            "i_CLK0": ClockSignal("sync"), "i_CE0": Const(1, 1), "i_RST0": Const(0, 1),
            "i_SIGNEDA": Const(0, 1), "i_SIGNEDB": Const(0, 1),
            "i_SOURCEA": Const(0, 1), "i_SOURCEB": Const(0, 1),
        })
        m.submodules.mult = Instance("MULT18X18D", **ports)
        return m
