"""Layer setup: the values every sub-unit derives from the layer registers, and the checks
made when a layer starts (``docs/neural_engine.md``, "Errors")."""

from amaranth.hdl import Const, Module, Signal
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
        The layer registers.
    go : In(1)
        A layer starts: the registered members of ``geometry`` take the layer's values.
    geometry : Out(geometry_layout(macs))
        Work-unit shape, output channels, operand formats (registered at ``go``), tile counts
        and halo width (combinational, from the registered shape and the layer registers).
    check : Out(EngineError)
        Combinational: ``FORMAT`` (the MAC format is not built), ``SHAPE`` (a zero-sized loop,
        or more output channels than ``out_channel_limit(config)``)
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
            "geometry": Out(geometry_layout(config.macs)),
            "check":    Out(EngineError),
        })

    def elaborate(self, platform):
        m = Module()
        n = self._config.macs
        log2n = exact_log2(n)
        layer = self.layer
        geo = self.geometry

        # Output channels: one product, registered at the start and checked against the
        # build's limit (its output-channel counters are no wider than the limit needs).
        limit = neural_spec.out_channel_limit(self._config)
        out_channels = Signal(24)
        m.d.comb += out_channels.eq(layer.groups * layer.ocpg)

        # Registered at the start: the work-unit shape and the operand formats.
        with m.If(self.go):
            m.d.sync += [
                geo.unit_w.eq(Const(1, 1) << layer.log2w),
                geo.unit_h.eq(Const(n, n.bit_length() + 1) >> layer.log2w),
                geo.log2h.eq(log2n - layer.log2w),
                geo.out_channels.eq(out_channels[:limit.bit_length()]),
                geo.fp_data.eq((layer.fmt == MacFormat.FP16) | (layer.fmt == MacFormat.F16I8)),
                geo.fp_coef.eq((layer.fmt == MacFormat.FP16) | (layer.fmt == MacFormat.I8F16)),
                geo.is_int.eq(layer.fmt == MacFormat.INT8),
            ]

        # Work-unit tiles: ceil(out / H) rows, ceil(out / W) columns; the halo row's width.
        m.d.comb += [
            geo.tiles_y.eq((layer.out_h + geo.unit_h - 1) >> geo.log2h),
            geo.tiles_x.eq((layer.out_w + geo.unit_w - 1) >> layer.log2w),
            geo.halo_w.eq(narrow_mul(geo.unit_w - 1, layer.stride, len(geo.halo_w))
                          + narrow_mul(layer.kw - 1, layer.dilation, len(geo.halo_w)) + 1),
        ]

        # The checks that need only the registers.
        supported = format_supported(m, self._config, layer.fmt)
        zero_loop = ((layer.groups == 0) | (layer.icpg == 0) | (layer.ocpg == 0)
                     | (layer.out_h == 0) | (layer.out_w == 0) | (layer.in_h == 0)
                     | (layer.in_w == 0) | (layer.kh == 0) | (layer.kw == 0)
                     | (layer.stride == 0) | (layer.dilation == 0) | (out_channels > limit))
        shape_built = Signal()
        m.d.comb += shape_built.eq((layer.log2w <= log2n)
                                   & (log2n - layer.log2w <= exact_log2(self._max_rows)))
        with m.If(~supported):
            m.d.comb += self.check.eq(EngineError.FORMAT)
        with m.Elif(zero_loop):
            m.d.comb += self.check.eq(EngineError.SHAPE)
        with m.Elif((layer.kh > MAX_KERNEL) | (layer.kw > MAX_KERNEL) | ~shape_built):
            m.d.comb += self.check.eq(EngineError.KERNEL)
        return m
