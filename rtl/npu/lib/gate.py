"""Clock gating of idle blocks, for the system simulation's speed (``docs/system.md``,
"Gated clocks in the system simulation").

A Verilator model evaluates a clock domain's logic only on that domain's edges. An engine in a
domain of its own whose clock stops while the engine cannot change state costs nothing while
it is idle, and computes exactly what it computes on the free-running clock, provided the
enable is high on every edge at which the engine's state could change. The synthesised design
and the Amaranth simulator do not use this (``NPUTop(gate_clocks=False)``).
"""

from amaranth.hdl import ClockDomain, ClockSignal, ResetSignal, Signal

__all__ = ["GATE_TAIL", "gated_domain"]

#: Cycles the clock keeps running after the last cycle of activity: longer than any
#: pipeline of an engine that drains after its task's ``done`` or a read answered a cycle late.
GATE_TAIL = 64


def gated_domain(m, name, activity, *, tail=GATE_TAIL, power_on=False):
    """Add to module ``m`` the local clock domain ``name``: the ``sync`` clock, running in the
    cycles in which ``activity`` is high, in the first ``tail`` cycles after such a cycle, and
    during the reset; stopped otherwise. Its reset is the ``sync`` reset.

    With ``power_on`` the domain's reset is never asserted and its clock stays stopped during
    the ``sync`` reset instead: its registers keep their initial values, which is what a
    reset gives them when the ``sync`` reset is a power-on reset (high only until the first
    clock edge, as :class:`npu_sim.verilator.PowerOnReset` makes it). No register of the
    domain then depends on the ``sync`` reset, which would make Verilator evaluate its
    next-state logic on every ``sync`` edge.

    The enable is taken while the ``sync`` clock is low (a register on the falling edge, the
    form of a latch-based clock gate): it settles after the rising edge and the inputs of the
    cycle, and holds through the next rising edge, so the gated clock has no glitch and rises
    together with ``sync``. Returns the enable, which is high on the rising edges the domain
    sees."""
    left = Signal(range(tail + 1), name=f"{name}_tail")
    with m.If(activity):
        m.d.sync += left.eq(tail)
    with m.Elif(left != 0):
        m.d.sync += left.eq(left - 1)
    enable = Signal(name=f"{name}_enable")
    if power_on:
        m.d.comb += enable.eq(activity | (left != 0))
    else:
        m.d.comb += enable.eq(activity | (left != 0) | ResetSignal("sync"))

    latch = f"{name}_gate"
    m.domains += ClockDomain(latch, clk_edge="neg", reset_less=True, local=True)
    held = Signal(init=not power_on, name=f"{name}_enable_held")
    m.d[latch] += held.eq(enable)
    domain = ClockDomain(name, local=True)
    m.domains += domain
    m.d.comb += [
        ClockSignal(latch).eq(ClockSignal("sync")),
        domain.clk.eq(ClockSignal("sync") & held),
        domain.rst.eq(0 if power_on else ResetSignal("sync")),
    ]
    return held
