"""Pipeline building blocks: delay lines, a typed queue and a skid buffer."""

from amaranth.hdl import Module, Shape, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["DelayLine", "Queue", "SkidBuffer", "delay"]


def _check_shape(shape):
    try:
        Shape.cast(shape)
    except TypeError:
        raise TypeError(f"shape must be shape-castable, not {shape!r}") from None
    return shape


def delay(m, value, depth, *, en=None, name, reset_less=False):
    """``depth`` registers after ``value``, advancing when ``en`` is high (every cycle when
    ``en`` is None); returns the stages, ``[value delayed by 1, ..., value delayed by depth]``.
    ``reset_less``: registers without a reset (data whose validity travels elsewhere).

    For a delay inside an ``elaborate()`` that needs no ports of its own; :class:`DelayLine` is
    the same as a component.
    """
    stages = []
    prev = value
    for k in range(depth):
        stage = Signal.like(value, name=f"{name}_d{k + 1}", reset_less=reset_less)
        if en is None:
            m.d.sync += stage.eq(prev)
        else:
            with m.If(en):
                m.d.sync += stage.eq(prev)
        stages.append(stage)
        prev = stage
    return stages


class DelayLine(wiring.Component):
    """A chain of ``depth`` registers.

    Parameters
    ----------
    shape : shape-castable
        What each stage holds.
    depth : int
        Number of registers (at least 1).
    enable : bool
        With an ``en`` port: the chain advances only while it is high.

    Members
    -------
    i : In(shape)
        The value entering the chain.
    en : In(1)
        Advance (only with ``enable``).
    taps : Out(shape).array(depth)
        ``taps[k]`` is ``i`` delayed by ``k + 1`` advancing cycles.
    o : Out(shape)
        The last tap.
    """

    def __init__(self, shape, depth, *, enable=False):
        _check_shape(shape)
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self._shape = shape
        self._depth = depth
        self._enable = bool(enable)
        members = {"i": In(shape), "taps": Out(shape).array(depth), "o": Out(shape)}
        if enable:
            members["en"] = In(1)
        super().__init__(members)

    @property
    def depth(self):
        return self._depth

    def elaborate(self, platform):
        m = Module()
        prev = self.i
        for tap in self.taps:
            if self._enable:
                with m.If(self.en):
                    m.d.sync += tap.eq(prev)
            else:
                m.d.sync += tap.eq(prev)
            prev = tap
        m.d.comb += self.o.eq(prev)
        return m


class Queue(wiring.Component):
    """A first-in first-out queue of ``shape`` values on stream ports.

    Built on :class:`amaranth.lib.fifo.SyncFIFOBuffered`: the head is registered, so a value
    written in cycle ``n`` can be read from cycle ``n + 2`` on, and ``depth`` values fit.

    Members
    -------
    w : In(stream.Signature(shape))
        Values in; ``ready`` while there is room.
    r : Out(stream.Signature(shape))
        The head.
    level : Out(range(depth + 1))
        Values held.
    """

    def __init__(self, shape, depth):
        _check_shape(shape)
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self._shape = shape
        self._depth = depth
        super().__init__({
            "w": In(stream.Signature(shape)),
            "r": Out(stream.Signature(shape)),
            "level": Out(range(depth + 1)),
        })

    @property
    def depth(self):
        return self._depth

    def elaborate(self, platform):
        m = Module()
        width = Shape.cast(self._shape).width
        m.submodules.fifo = q = fifo.SyncFIFOBuffered(width=width, depth=self._depth)
        m.d.comb += [
            q.w_data.eq(self.w.payload),
            q.w_en.eq(self.w.valid),
            self.w.ready.eq(q.w_rdy),
            self.r.payload.eq(q.r_data),
            self.r.valid.eq(q.r_rdy),
            q.r_en.eq(self.r.ready),
            self.level.eq(q.level),
        ]
        return m


class SkidBuffer(wiring.Component):
    """A register slice on a stream that keeps full throughput: ``i.ready`` and ``o.valid``
    are registered, so neither path crosses the slice combinationally. Holds up to two
    values; a value entering in cycle ``n`` leaves from cycle ``n + 1`` on.

    Members
    -------
    i : In(stream.Signature(shape))
    o : Out(stream.Signature(shape))
    """

    def __init__(self, shape):
        _check_shape(shape)
        self._shape = shape
        super().__init__({
            "i": In(stream.Signature(shape)),
            "o": Out(stream.Signature(shape)),
        })

    def elaborate(self, platform):
        m = Module()
        # ``o`` is the main register; ``skid`` catches the value accepted in the cycle the
        # output stalls (``i.ready`` was already high).
        skid = Signal(self._shape)
        skid_valid = Signal()
        m.d.comb += self.i.ready.eq(~skid_valid)
        with m.If(self.o.ready | ~self.o.valid):
            with m.If(skid_valid):
                m.d.sync += [self.o.payload.eq(skid), self.o.valid.eq(1), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.payload.eq(self.i.payload), self.o.valid.eq(self.i.valid)]
        with m.Elif(self.i.valid & self.i.ready):
            m.d.sync += [skid.eq(self.i.payload), skid_valid.eq(1)]
        return m
