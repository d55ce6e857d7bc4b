"""The loop-nest counter: the hardware form of nested ``for`` loops."""

from amaranth.hdl import Const, Module, Shape, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["LoopNest"]


class LoopNest(wiring.Component):
    """Counters of a loop nest, advanced one innermost step at a time.

    The nest ``LoopNest([("ty", 12), ("tx", 12)])`` counts like::

        for ty in range(0, limit.ty):
            for tx in range(0, limit.tx):
                ...

    and a level may step by a constant: ``("base", 24, 8)`` counts ``0, 8, 16, ...`` while the
    value is below its limit. Limits are read combinationally and must hold while the nest
    runs; a limit of 0 behaves like one iteration.

    Parameters
    ----------
    levels : list of (name, shape) or (name, shape, step)
        Outermost level first. ``shape`` is the counter's (unsigned) shape; ``step`` a positive
        integer (default 1).

    Members
    -------
    limit : In(StructLayout({name: shape}))
        Bound of each level (exclusive).
    restart : In(1)
        Set every counter to 0 (wins over ``advance``).
    advance : In(1)
        Step the innermost counter; a counter at its last value returns to 0 and carries into
        the level outside it. Advancing from the nest's last position returns to all zeros.
    index : Out(StructLayout({name: shape}))
        The counters.
    next : Out(StructLayout({name: shape}))
        The counters after an advance (combinational), whether or not ``advance`` is high.
    last : Out(StructLayout({name: 1}))
        Per level: the counter is at its last value (``index + step >= limit``).
    done : Out(1)
        Every level is at its last value: this is the nest's final iteration.
    """

    def __init__(self, levels):
        levels = list(levels)
        if not levels:
            raise ValueError("a loop nest needs at least one level")
        parsed = []
        names = set()
        for level in levels:
            if not isinstance(level, tuple) or len(level) not in (2, 3):
                raise TypeError(f"a level must be (name, shape) or (name, shape, step), "
                                f"not {level!r}")
            name, shape, *rest = level
            step = rest[0] if rest else 1
            if not isinstance(name, str) or not name.isidentifier() or name in names:
                raise ValueError(f"level names must be distinct identifiers, not {name!r}")
            shape = Shape.cast(shape)
            if shape.signed:
                raise ValueError(f"level {name!r} must have an unsigned shape, not {shape!r}")
            if not isinstance(step, int) or isinstance(step, bool) or step < 1:
                raise ValueError(f"step of level {name!r} must be a positive integer, "
                                 f"not {step!r}")
            names.add(name)
            parsed.append((name, shape, step))
        self._levels = tuple(parsed)
        values = data.StructLayout({name: shape for name, shape, _ in parsed})
        super().__init__({
            "limit": In(values),
            "restart": In(1),
            "advance": In(1),
            "index": Out(values),
            "next": Out(values),
            "last": Out(data.StructLayout({name: 1 for name, _, _ in parsed})),
            "done": Out(1),
        })

    @property
    def levels(self):
        """``(name, shape, step)`` of each level, outermost first."""
        return self._levels

    def elaborate(self, platform):
        m = Module()
        # Innermost level first: a level steps when every level inside it is at its last
        # value (``carry``), and returns to 0 when it is at its own.
        carry = Const(1)
        for name, shape, step in reversed(self._levels):
            index = getattr(self.index, name)
            last = getattr(self.last, name)
            m.d.comb += last.eq(index + step >= getattr(self.limit, name))
            nxt = getattr(self.next, name)
            with m.If(carry):
                m.d.comb += nxt.eq(0)
                with m.If(~last):
                    m.d.comb += nxt.eq(index + step)
            with m.Else():
                m.d.comb += nxt.eq(index)
            outer = Signal(name=f"carry_{name}")
            m.d.comb += outer.eq(carry & last)
            carry = outer
        m.d.comb += self.done.eq(carry)

        with m.If(self.restart):
            m.d.sync += self.index.eq(0)
        with m.Elif(self.advance):
            m.d.sync += self.index.eq(self.next)
        return m
