"""One design, converted to Verilog once, instantiated many times.

Amaranth elaborates and converts every instance of a component separately; for a build with
many identical blocks (the ``ane`` preset's 16 neural engine cores) that costs time and
memory in proportion to the count. :class:`SharedModule` converts the block once, under a
module name, and places it by name (an ``Instance``) wherever it is needed: the design that
holds the instances is converted without the block, and the two Verilog texts together are
the whole design. Shared blocks nest: a shared block lists the shared blocks it instantiates
(``parts``), and its Verilog includes theirs (the neural engine core and its MAC unit). The
Amaranth simulator cannot run such a design; use it for Verilog output and Verilator builds.
"""

from amaranth.hdl import ClockSignal, Instance, ResetSignal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In

__all__ = ["SharedModule"]


class SharedModule:
    """A component standing for every instance of ``name``.

    Parameters
    ----------
    component : wiring.Component
        The block (its ports are those of every instance).
    name : str
        Verilog module name.
    parts : iterable of SharedModule
        Shared blocks that ``component`` instantiates (``None`` entries are left out): their
        Verilog goes with this block's.
    """

    def __init__(self, component, name, *, parts=()):
        if not isinstance(component, wiring.Component):
            raise TypeError(f"component must be a wiring.Component, not {component!r}")
        parts = tuple(part for part in parts if part is not None)
        for part in parts:
            if not isinstance(part, SharedModule):
                raise TypeError(f"parts must be SharedModules, not {part!r}")
        self.component = component
        self.name = name
        self.parts = parts
        self._verilog = None

    @property
    def signature(self):
        return self.component.signature

    def verilog(self):
        """The Verilog of the block and of its parts, each module once (converted on first
        use)."""
        texts = {}
        self._collect(texts)
        return "\n".join(texts.values())

    def _collect(self, texts):
        if self.name in texts:
            return
        if self._verilog is None:
            from amaranth.back import verilog
            self._verilog = verilog.convert(self.component, name=self.name, emit_src=False)
        texts[self.name] = self._verilog
        for part in self.parts:
            part._collect(texts)

    def instance(self, m, inst_name):
        """Add an instance called ``inst_name`` to module ``m``; returns an interface object
        with the block's signature (its members are the instance's ports)."""
        iface = self.component.signature.create(path=(inst_name,))
        ports = {"i_clk": ClockSignal(), "i_rst": ResetSignal()}
        for path, member, value in self.component.signature.flatten(iface):
            port = "__".join(str(part) for part in path)
            prefix = "i_" if member.flow == In else "o_"
            ports[prefix + port] = Value.cast(value)
        m.submodules[inst_name] = Instance(self.name, **ports)
        return iface
