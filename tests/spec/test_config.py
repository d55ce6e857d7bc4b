"""The lean neural engine core's configuration fields (``npu_spec.config``) and how
``npu_spec.neural.engine_geometry`` and ``layer_error`` follow them."""

import pytest

from npu_spec.config import PRESETS, preset
from npu_spec.neural import (
    NeuralError,
    engine_geometry,
    layer_error,
    make_layer,
    out_channel_limit,
    out_size_limit,
    post_lanes,
)


def test_defaults_keep_the_presets_geometry():
    for name, config in PRESETS.items():
        if name in ("icebreaker", "icebreaker_blocks", "ulx3s"):
            continue
        assert (config.result_queue, config.ne_row_values, config.ne_buffer_rows,
                config.ne_out_channels, config.ne_kernel_queue, config.ne_out_size,
                config.ne_control) == (0, 0, 0, 0, 0, 0, "full")
        assert out_channel_limit(config).bit_length() == 24
        assert out_size_limit(config) == 4095
        n = config.macs
        assert engine_geometry(config)[1:] == (min(2 * n, 64), 256 if n <= 64 else 1024)


def test_post_lanes():
    """A quarter of the MACs unless ``ne_post_lanes`` says otherwise; it must divide them."""
    assert post_lanes(preset("small")) == 4
    assert post_lanes(preset("small").replace(ne_post_lanes=1)) == 1
    assert post_lanes(preset("small").replace(ne_post_lanes=16)) == 16
    assert post_lanes(preset("small").replace(macs=2)) == 1


def test_ulx3s_geometry():
    """The ``ulx3s`` core: 32-value halo rows, 13-bit channel counters, one post-processor
    lane (32 cycles a result beat), a register inside the shifter."""
    config = preset("ulx3s")
    assert engine_geometry(config) == (4, 32, 256)
    assert out_channel_limit(config).bit_length() == 13
    assert post_lanes(config) == 1
    assert config.ne_shift_stages == 1 and preset("small").ne_shift_stages == 0
    assert config.dispatch_regs == 1 and preset("small").dispatch_regs == 0


def test_icebreaker_geometry():
    config = preset("icebreaker")
    assert engine_geometry(config) == (2, 8, 128)
    # Arguments still win over the configuration.
    assert engine_geometry(config, 16, 64) == (2, 16, 64)


@pytest.mark.parametrize("field, value", [
    ("result_queue", -1), ("result_queue", 65), ("ne_row_values", 12), ("ne_row_values", 2048),
    ("ne_buffer_rows", -1), ("ne_buffer_rows", 4097), ("ne_out_channels", -1),
    ("ne_out_channels", 4095 * 4095 + 1), ("ne_kernel_queue", 1), ("ne_kernel_queue", 65),
    ("ne_out_size", -1), ("ne_out_size", 4096), ("ne_control", "small"),
    ("ne_post_lanes", -1), ("ne_post_lanes", 3), ("ne_post_lanes", 32),
    ("ne_shift_stages", -1), ("ne_shift_stages", 2), ("dispatch_regs", 2),
    ("dp_banks", -1), ("dp_banks", 8), ("dp_banks", 24), ("dp_banks", 2048),
    ("csr_read", "ram")])
def test_bad_values_are_refused(field, value):
    with pytest.raises(ValueError, match=f"NPUConfig.{field}"):
        preset("small").replace(**{field: value})


def test_layer_rules_follow_the_buffer_fields():
    """A layer the default geometry runs ends with HALO or BUFFER on a narrower one."""
    base = preset("ice40")
    lean = base.replace(ne_row_values=8, ne_buffer_rows=128)
    # W = 8, 3x3: a halo row of 10 values.
    wide = make_layer(fmt=0, log2w=3, groups=1, icpg=1, ocpg=2, in_h=3, in_w=10, out_h=1,
                      out_w=8, kh=3, kw=3, stride=1, dilation=1, pad=0)
    # 43 channels x 3 kernel rows = 129 rows.
    deep = make_layer(fmt=0, log2w=2, groups=1, icpg=43, ocpg=2, in_h=3, in_w=3, out_h=1,
                      out_w=1, kh=3, kw=3, stride=1, dilation=1, pad=0)
    fits = dict(deep, icpg=42)
    assert layer_error(wide, base) == layer_error(deep, base) == NeuralError.NONE
    assert layer_error(wide, lean) == NeuralError.HALO
    assert layer_error(deep, lean) == NeuralError.BUFFER
    assert layer_error(fits, lean) == NeuralError.NONE


def test_layer_rules_follow_the_channel_limit():
    """More output channels than ``ne_out_channels`` is ``SHAPE``, after ``FORMAT``."""
    lean = preset("icebreaker")
    assert out_channel_limit(lean) == 1024
    layer = make_layer(fmt=0, log2w=2, groups=4, icpg=1, ocpg=256, in_h=3, in_w=3, out_h=1,
                       out_w=1, kh=3, kw=3, stride=1, dilation=1, pad=0)
    assert layer_error(layer, lean) == NeuralError.NONE
    assert layer_error(dict(layer, ocpg=257), lean) == NeuralError.SHAPE
    assert layer_error(dict(layer, ocpg=257), preset("ice40")) == NeuralError.NONE
    assert layer_error(dict(layer, ocpg=257, fmt=1), lean) == NeuralError.FORMAT


def test_layer_rules_follow_the_output_size_limit():
    """More output rows or columns than ``ne_out_size`` is ``SHAPE``, after ``FORMAT``."""
    lean = preset("icebreaker")
    assert out_size_limit(lean) == 255
    layer = make_layer(fmt=0, log2w=2, groups=1, icpg=1, ocpg=2, in_h=255, in_w=255,
                       out_h=255, out_w=255, kh=1, kw=1, stride=1, dilation=1, pad=0)
    assert layer_error(layer, lean) == NeuralError.NONE
    for field in ("out_h", "out_w"):
        assert layer_error(dict(layer, **{field: 256}), lean) == NeuralError.SHAPE
        assert layer_error(dict(layer, **{field: 256}), preset("ice40")) == NeuralError.NONE
        assert layer_error(dict(layer, **{field: 256}, fmt=1), lean) == NeuralError.FORMAT


def test_lean_core_register_map():
    """The lean layer control with the sequential post-processor (``icebreaker``) builds the
    core's register map with the same registers and field places, storing only the bits its
    core reads (``LEAN_UNSTORED``: the clamp bounds' int8 bits, no stochastic rounding, slope
    or seed); every other build builds ``NEURAL_ENGINE`` itself."""
    from npu_spec.neural import LEAN_UNSTORED, NEURAL_ENGINE, core_register_map

    for name in ("small", "ice40", "ulx3s"):
        assert core_register_map(preset(name)) is NEURAL_ENGINE
    assert core_register_map(preset("icebreaker").replace(ne_control="full")) is NEURAL_ENGINE
    lean = core_register_map(preset("icebreaker"))
    assert [(r.name, r.offset) for r in lean.registers] == [
        (r.name, r.offset) for r in NEURAL_ENGINE.registers]
    stored = 0
    for full_reg, lean_reg in zip(NEURAL_ENGINE.registers, lean.registers):
        for f, g in zip(full_reg.fields, lean_reg.fields, strict=True):
            assert (f.name, f.offset) == (g.name, g.offset)
            if f.name not in LEAN_UNSTORED:
                assert (g.width, g.access) == (f.width, f.access)
            elif LEAN_UNSTORED[f.name]:
                assert (g.width, g.access) == (LEAN_UNSTORED[f.name], "rw")
            else:
                assert g.access == "ro"
            stored += g.width if g.access == "rw" else 0
    assert stored == sum(f.width for r in NEURAL_ENGINE.registers for f in r.fields
                         if f.access == "rw") - 1 - 24 - 24 - 32 - 32


def test_buffer_banks():
    """``dp_banks`` 0 keeps the widest access as the bank count; the board presets narrow it,
    and a width it does not divide is refused."""
    from npu_spec.dataproc import buffer_banks
    for name, config in PRESETS.items():
        if name not in ("icebreaker", "icebreaker_blocks", "ulx3s"):
            assert config.dp_banks == 0
            row_values = engine_geometry(config)[1]
            assert buffer_banks(config, row_values) == max(row_values, config.macs,
                                                           config.planar_lanes ** 2)
    assert buffer_banks(preset("ulx3s"), 32) == 8
    assert buffer_banks(preset("icebreaker"), 8) == 4
    with pytest.raises(ValueError, match="divide the cores' input row of 20"):
        buffer_banks(preset("small").replace(dp_banks=16), 20)
