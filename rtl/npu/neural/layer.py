"""Layer setup: the values every sub-unit derives from the layer registers, and the checks
made when a layer starts (``docs/neural_engine.md``, "Errors")."""

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from npu_spec import neural as neural_spec
from npu_spec.config import NPUConfig

from ..lib.arith import narrow_mul
from ..lib.enums import hw_enum
from .layouts import MAX_KERNEL, MacFormat, geometry_layout, layer_layout
from .mac import format_supported

__all__ = ["EngineError", "LayerSetup"]

#: ``STATUS.error_code`` of a neural engine core (0: no error).
EngineError = hw_enum(neural_spec.NeuralError)


class LayerSetup(wiring.Component):
    """The layer's geometry and its start-time check.

    Parameters
    ----------
    config : NPUConfig
    max_rows : int
        The largest work-unit height the build offers (``npu_spec.neural.engine_geometry``).

    Members
    -------
    layer : In(layer_layout())
        The layer registers: read at ``go`` only in the full build (everything derived from
        them is registered then); in the lean layer control they must hold until ``ready``.
    go : In(1)
        A layer starts: the registered members of ``geometry`` take the layer's values.
    ready : Out(1)
        ``geometry`` and ``check`` hold the layer's values in this cycle (one cycle,
        registered): the cycle after ``go`` in the full build; in the lean layer control
        (``ne_control="lean"``) once ``groups x ocpg`` has been summed by shifts and adds, up
        to 13 cycles later (the layer registers must hold meanwhile).
    geometry : Out(geometry_layout(macs))
        Work-unit shape, output channels, operand formats, tile counts and halo width, all
        registered at ``go`` (``out_channels`` in the lean layer control: by ``ready``).
    check : Out(EngineError)
        Valid with ``ready`` (registered at ``go`` in the full build, combinational in the
        lean one): ``FORMAT`` (the MAC format is not built),
        ``SHAPE`` (a zero-sized loop, more output channels than ``out_channel_limit(config)``
        or more output rows or columns than ``out_size_limit(config)``)
        or ``KERNEL`` (a kernel side above 16, or a work-unit shape the build does not offer),
        in that order of precedence; ``NONE`` otherwise. The halo and buffer checks need the
        registered shape and are made by the sequencer.
    """

    def __init__(self, config, max_rows):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self._config = config
        self._max_rows = max_rows
        super().__init__({
            "layer":    In(layer_layout()),
            "go":       In(1),
            "ready":    Out(1),
            "geometry": Out(geometry_layout(config.macs)),
            "check":    Out(EngineError),
        })

    def elaborate(self, platform):
        m = Module()
        n = self._config.macs
        log2n = exact_log2(n)
        layer = self.layer
        geo = self.geometry

        # Output channels, checked against the build's limit (its output-channel counters are
        # no wider than the limit needs).
        limit = neural_spec.out_channel_limit(self._config)
        over = self._out_channels(m, limit)
        # Registered at the start: the work-unit shape, the operand formats, the work-unit
        # tiles (ceil(out / H) rows, ceil(out / W) columns) and the halo row's width. The
        # tiles are the loop limits of every process: as registers, the start's path (the
        # core's `go` through the layer copy's multiplexer) ends here, not in the loops.
        unit_w = Signal.like(geo.unit_w)
        unit_h = Signal.like(geo.unit_h)
        log2h = Signal.like(geo.log2h)
        m.d.comb += [
            unit_w.eq(Const(1, 1) << layer.log2w),
            unit_h.eq(Const(n, n.bit_length() + 1) >> layer.log2w),
            log2h.eq(log2n - layer.log2w),
        ]
        with m.If(self.go):
            m.d.sync += [
                geo.unit_w.eq(unit_w),
                geo.unit_h.eq(unit_h),
                geo.log2h.eq(log2h),
                geo.fp_data.eq((layer.fmt == MacFormat.FP16) | (layer.fmt == MacFormat.F16I8)),
                geo.fp_coef.eq((layer.fmt == MacFormat.FP16) | (layer.fmt == MacFormat.I8F16)),
                geo.is_int.eq(layer.fmt == MacFormat.INT8),
                geo.tiles_y.eq((layer.out_h + unit_h - 1) >> log2h),
                geo.tiles_x.eq((layer.out_w + unit_w - 1) >> layer.log2w),
                geo.halo_w.eq(narrow_mul(unit_w - 1, layer.stride, len(geo.halo_w))
                              + narrow_mul(layer.kw - 1, layer.dilation, len(geo.halo_w)) + 1),
            ]

        # The checks that need only the registers.
        size_limit = neural_spec.out_size_limit(self._config)
        supported = format_supported(m, self._config, layer.fmt)
        zero_loop = ((layer.groups == 0) | (layer.icpg == 0) | (layer.ocpg == 0)
                     | (layer.out_h == 0) | (layer.out_w == 0) | (layer.in_h == 0)
                     | (layer.in_w == 0) | (layer.kh == 0) | (layer.kw == 0)
                     | (layer.stride == 0) | (layer.dilation == 0) | over
                     | (layer.out_h > size_limit) | (layer.out_w > size_limit))
        shape_built = Signal()
        m.d.comb += shape_built.eq((layer.log2w <= log2n)
                                   & (log2n - layer.log2w <= exact_log2(self._max_rows)))
        check = Signal(EngineError)
        with m.If(~supported):
            m.d.comb += check.eq(EngineError.FORMAT)
        with m.Elif(zero_loop):
            m.d.comb += check.eq(EngineError.SHAPE)
        with m.Elif((layer.kh > MAX_KERNEL) | (layer.kw > MAX_KERNEL) | ~shape_built):
            m.d.comb += check.eq(EngineError.KERNEL)
        if self._config.ne_control == "lean":
            m.d.comb += self.check.eq(check)
        else:
            with m.If(self.go):
                m.d.sync += self.check.eq(check)
        return m

    def _out_channels(self, m, limit):
        """``K = groups x ocpg`` into ``geometry.out_channels``, and ``ready``; returns ``K >
        limit``, valid with ``ready``."""
        layer, geo = self.layer, self.geometry
        bits = limit.bit_length()
        if self._config.ne_control != "lean":
            product = Signal(24)
            m.d.comb += product.eq(layer.groups * layer.ocpg)
            m.d.sync += self.ready.eq(self.go)
            with m.If(self.go):
                m.d.sync += geo.out_channels.eq(product[:bits])
            return product > limit
        # Lean: one shift-and-add step a cycle over the bits of `ocpg`, sums held at
        # 2**bits (any value there is above the limit), so no adder is wider than bits + 1.
        top = 1 << bits
        acc = Signal(range(top + 1))
        addend = Signal(range(top + 1))
        rest = Signal(len(layer.ocpg))
        running = Signal()
        total = Signal(range(2 * top + 1))
        doubled = Signal(range(2 * top + 1))
        m.d.comb += [total.eq(acc + Mux(rest[0], addend, 0)), doubled.eq(addend << 1)]
        with m.If(self.go):
            m.d.sync += [acc.eq(0), addend.eq(Mux(layer.groups >= top, top, layer.groups)),
                         rest.eq(layer.ocpg), running.eq(1)]
        with m.Elif(running):
            summed = Mux(total >= top, top, total)
            m.d.sync += [acc.eq(summed), geo.out_channels.eq(summed[:bits]),
                         addend.eq(Mux(doubled >= top, top, doubled)), rest.eq(rest >> 1)]
            with m.If(rest == 0):
                m.d.sync += running.eq(0)
        m.d.comb += self.ready.eq(running & (rest == 0))
        return acc > limit
