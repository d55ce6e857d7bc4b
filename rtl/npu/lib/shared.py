"""One design, converted to Verilog once, instantiated many times.

Amaranth elaborates and converts every instance of a component separately; for a build with
many identical blocks (the ``ane`` preset's 16 neural engine cores) that costs time and
memory in proportion to the count. :class:`SharedModule` converts the block once, under a
module name, and places it by name (an ``Instance``) wherever it is needed: the design that
holds the instances is converted without the block, and the two Verilog texts together are
the whole design. The
Amaranth simulator cannot run such a design; use it for Verilog output and Verilator builds.
"""

from amaranth.hdl import ClockSignal, Instance, ResetSignal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In

__all__ = ["SharedModule", "SharedModules", "place"]


class SharedModule:
    """A component standing for every instance of ``name``.

    Parameters
    ----------
    component : wiring.Component
        The block (its ports are those of every instance).
    name : str
        Verilog module name.
    """

    def __init__(self, component, name):
        if not isinstance(component, wiring.Component):
            raise TypeError(f"component must be a wiring.Component, not {component!r}")
        self.component = component
        self.name = name
        self._verilog = None

    @property
    def signature(self):
        return self.component.signature

    def verilog(self):
        """The block's Verilog (converted on first use)."""
        if self._verilog is None:
            from amaranth.back import verilog
            self._verilog = verilog.convert(self.component, name=self.name, emit_src=False)
        return self._verilog

    def instance(self, m, inst_name, *, reset=None):
        """Add an instance called ``inst_name`` to module ``m``; returns an interface object
        with the block's signature (its members are the instance's ports).

        ``reset`` is a synchronous reset of the instance besides the domain's: a
        ``ResetInserter`` around ``m`` does not reach into an instance, so a block that stands
        where an inserter's clear would have reset it gets the clear here.
        """
        iface = self.component.signature.create(path=(inst_name,))
        rst = ResetSignal() if reset is None else ResetSignal() | reset
        ports = {"i_clk": ClockSignal(), "i_rst": rst}
        for path, member, value in self.component.signature.flatten(iface):
            port = "__".join(str(part) for part in path)
            prefix = "i_" if member.flow == In else "o_"
            ports[prefix + port] = Value.cast(value)
        m.submodules[inst_name] = Instance(self.name, **ports)
        return iface


class SharedModules:
    """The shared blocks of one design, each built and converted once, by module name."""

    def __init__(self):
        self._modules = {}

    def get(self, name, build):
        """The :class:`SharedModule` called ``name``; ``build()`` makes its component when the
        name is first asked for."""
        module = self._modules.get(name)
        if module is None:
            module = self._modules[name] = SharedModule(build(), name)
        return module

    def names(self):
        """Module names of the blocks asked for so far."""
        return list(self._modules)

    def verilog(self):
        """The Verilog of every shared block, converting blocks that the conversion of others
        asks for (a core's MAC unit) until none is left."""
        texts = []
        while len(texts) < len(self._modules):
            texts.append(list(self._modules.values())[len(texts)].verilog())
        return "\n".join(texts)


def place(m, inst_name, shared, module_name, build, *, reset=None):
    """Add a block called ``inst_name`` to module ``m``: ``build()`` itself without a library,
    else an instance of the library ``shared``'s module ``module_name`` (built by ``build`` on
    first use) with the extra synchronous ``reset`` (:meth:`SharedModule.instance`). Returns
    the block, or the instance's interface; both have the block's signature."""
    if shared is None:
        block = build()
        m.submodules[inst_name] = block
        return block
    return shared.get(module_name, build).instance(m, inst_name, reset=reset)
