# amaranth: UnusedElaboratable=no
"""The micro neural unit with its pooling mode as the iCEBreaker board builds it: Yosys
``synth_ice40 -dsp -spram`` of the unit, the mapped netlist (``SB_MAC16``, ``SB_RAM40_4K``,
LUTs, carries and flip-flops) simulated under Icarus Verilog with the cell models Yosys ships
(``npu_sim.micro_netlist``), against the golden model's task bit for bit: the error code and
the whole buffer after the task.

The netlist is built once and cached (``~/.cache/open-npu``); the first run synthesises it
(about 10 s of CPU). Icarus runs the gate-level netlist at about 700 cycles a CPU second after
about 1 s of loading it, so the quick suite keeps one short task of each kind (a convolution,
a pooling, the unsupported fields) and the rest is marked slow.
"""

import re
import shutil

import numpy as np
import pytest

from npu.micro.ne import CACHE_DEPTH, SLOTS, UNSUPPORTED, MicroNeural
from npu_model.kernel_codec import encode, kernel_memory
from npu_sim.micro_netlist import TOP, cell_counts, compile_netlist, micro_ne_netlist, run_netlist
from npu_sim.micro_units import run_unit
from npu_spec.neural import NeuralError
from npu_spec.planar import Mode, PlanarError, PoolOp

from . import test_ne, test_pe


@pytest.fixture(scope="module")
def netlist():
    return micro_ne_netlist()


def test_dsp_and_ebr_cells_are_inferred(netlist):
    """Yosys maps the eight lanes' multiply-accumulates to one ``SB_MAC16`` each and the weight
    cache (64 bits x 512) to eight ``SB_RAM40_4K``: the netlist the tests below simulate has
    them (a build that stopped inferring them would simulate fabric instead)."""
    cells = cell_counts((netlist / "netlist.v").read_text())
    assert cells["SB_MAC16"] == SLOTS == 8
    assert cells["SB_RAM40_4K"] == 8 * SLOTS * CACHE_DEPTH // 4096
    assert cells["SB_LUT4"] > 1000 and cells["SB_CARRY"] > 0
    assert f"module {TOP}(" in (netlist / "netlist.v").read_text()


def _compare(code, want, got, buffer=None):
    err, buf, _ = got
    assert err == code
    buf = np.array(buf, np.uint16)
    bad = np.nonzero(buf != want)[0]
    assert not bad.size, f"{bad.size} elements differ, first at {bad[0]}"
    if buffer is not None:
        assert np.count_nonzero(buf != buffer) > 0, "the task wrote nothing"


def check_conv(netlist, tmp_path, seed, expect=0, **kw):
    task = test_ne.build(np.random.default_rng(seed), **kw)
    code, want = test_ne.golden(*task)
    assert code == expect
    buffer, kmem, regs = task
    got = run_netlist(buffer, regs, kmem, work_dir=tmp_path, netlist=netlist)
    _compare(code, want, got, buffer if code == 0 else None)
    return got


def check_pool(netlist, tmp_path, seed, expect=0, **kw):
    buffer, regs, flow = test_pe.build(np.random.default_rng(seed), **kw)
    code, want = test_pe.golden(buffer, regs, flow)
    assert code == expect
    got = run_netlist(buffer, regs, np.zeros(1024, np.uint32), pool=True, work_dir=tmp_path,
                      netlist=netlist)
    _compare(code, want, got, buffer if code == 0 else None)


#: Short enough for the quick suite (a few thousand cycles).
QUICK_CONV = dict(icpg=2, k=9, kh=3, kw=3, out_h=2, out_w=3, pad=1, act=1, zero_point=3)

#: The digits CNN's layers (``docs/micro.md``) and other shapes of ``test_ne``.
SLOW_CONVS = {
    "digits_conv1": dict(icpg=1, k=8, kh=3, kw=3, out_h=8, out_w=8, pad=1, act=1),
    "digits_conv2": dict(icpg=8, k=16, kh=3, kw=3, out_h=4, out_w=4, pad=1, act=1),
    "digits_fc": dict(icpg=16, k=10, kh=2, kw=2, out_h=1, out_w=1),
    "2x2_s2_clamp": test_ne.CONVS["2x2_s2_clamp"],
    "dilation2_pad": test_ne.CONVS["dilation2_pad"],
    "ring_output": test_ne.CONVS["ring_output"],
}


def test_conv_relu(netlist, tmp_path):
    """A dense int8 3 x 3 convolution with padding, requantized (per-channel bias, scale,
    shift, zero point) and ReLU, two kernel groups (9 channels). The netlist takes as many
    cycles from ``start`` to ``done`` as the Amaranth design in the Amaranth simulator."""
    _, _, cycles = check_conv(netlist, tmp_path, 11, **QUICK_CONV)
    buffer, kmem, regs = test_ne.build(np.random.default_rng(11), **QUICK_CONV)
    _, _, amaranth_cycles = run_unit(MicroNeural(pooling=True), buffer, regs, kmem)
    assert cycles == amaranth_cycles > 1000


@pytest.mark.slow
def test_a_wrong_lane_is_seen(netlist, tmp_path):
    """The comparison can fail: the netlist with one ``SB_MAC16`` made unsigned (``A_SIGNED``
    and ``B_SIGNED`` 0, so its 16 x 16 product of the sign-extended operands is wrong for
    negative ones) leaves another buffer than the golden task's."""
    altered = tmp_path / "altered"
    altered.mkdir()
    for name in ("netlist.v", "ice40_cells_sim.v"):
        shutil.copy(netlist / name, altered / name)
    text = (altered / "netlist.v").read_text()
    first = re.search(r"SB_MAC16 #\((.*?)\) \S+ \(", text, re.S)
    params = re.sub(r"\.(A|B)_SIGNED\(32'd1\)", r".\1_SIGNED(32'd0)", first.group(1))
    assert params != first.group(1)
    (altered / "netlist.v").write_text(text[:first.start(1)] + params + text[first.end(1):])
    compile_netlist(altered)
    buffer, kmem, regs = test_ne.build(np.random.default_rng(11), **QUICK_CONV)
    code, want = test_ne.golden(buffer, kmem, regs)
    err, got, _ = run_netlist(buffer, regs, kmem, work_dir=tmp_path / "run", netlist=altered)
    assert err == code == 0
    assert np.count_nonzero(np.array(got, np.uint16) != want) > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_CONVS)
def test_conv_slow(netlist, tmp_path, name):
    check_conv(netlist, tmp_path, 20 + list(SLOW_CONVS).index(name), **SLOW_CONVS[name])


def _extreme_weights(rng, icpg, kh, kw):
    """Eight channels' weights at the int8 extremes: all -128, all 127, a mix of the two, all
    -128 but one, random; then the same again for the channels whose rescale shows the high
    part of the sum."""
    shape = (icpg, kh, kw)
    mix = rng.choice(np.array([-128, 127]), shape)
    one = np.full(shape, -128)
    one[0, 0, 0] = 127
    w = [np.full(shape, -128), np.full(shape, 127), mix, one, rng.integers(-128, 128, shape),
         np.full(shape, -128), mix, np.full(shape, 127)]
    return np.array(w, np.int8)


def extreme_task(rng, *, icpg, kh, kw):
    """A convolution whose every input is -128 (``test_ne.build``'s layout, its buffer and
    kernel memory replaced): each product of a -128 weight is -128 x -128 = 16384, the sums
    up to ``icpg kh kw`` of them. Channels 0..4 get the bias that cancels their sum to a small
    residue and the exact rescale (scale ``2**30``, shift 30), so the output is the int32 sum
    plus the bias itself: a wrong bit of the accumulator shows; channels 5..7 a shift that shows
    the sum's high bits."""
    buffer, _, regs = test_ne.build(rng, icpg=icpg, k=8, kh=kh, kw=kw, out_h=2, out_w=2)
    weights = _extreme_weights(rng, icpg, kh, kw)
    sums = (-128 * weights.astype(np.int64)).reshape(8, -1).sum(axis=1)    # inputs all -128
    residue = rng.integers(-100, 101, 8)
    bias = np.where(np.arange(8) < 5, residue - sums, 0)
    shift = np.where(np.arange(8) < 5, 30, 30 + np.array([0, 0, 0, 0, 0, 16, 15, 16]))
    scale = np.full(8, 1 << 30)
    scale[6] = -(1 << 30)
    group = encode(weights, coef_fp16=False, sparse=False, palette_bits=0, bias=bias,
                   scale=scale, shift=shift)
    kmem = np.zeros(test_ne.KWORDS, np.uint32)
    words = kernel_memory([group], base=7)
    kmem[7:7 + len(words)] = words
    buffer = np.full_like(buffer, 0xFF80)
    return buffer, kmem, regs, residue[:5]


def _run_extremes(netlist, tmp_path, icpg):
    buffer, kmem, regs, residues = extreme_task(np.random.default_rng(icpg), icpg=icpg,
                                                kh=3, kw=3)
    code, want = test_ne.golden(buffer, kmem, regs)
    assert code == 0
    # The task is what it claims: channels 0..4 come out as their residues (the sums of
    # -128 x w cancelled by the bias).
    assert set(residues.tolist()) <= set(want.view(np.int16).tolist())
    got = run_netlist(buffer, regs, kmem, work_dir=tmp_path, netlist=netlist)
    _compare(code, want, got, buffer)


@pytest.mark.slow
def test_negative_extremes(netlist, tmp_path):
    """-128 x -128 products, 72 a sum (8 input channels, 3 x 3)."""
    _run_extremes(netlist, tmp_path, 8)


@pytest.mark.slow
def test_negative_extremes_long_sums(netlist, tmp_path):
    """-128 x -128 products, 378 a sum (42 input channels, 3 x 3: the most input channels a
    3-row kernel may have, ``icpg kh`` at most 128; the sum 378 x 16384 = 6,193,152)."""
    _run_extremes(netlist, tmp_path, 42)


def test_pool(netlist, tmp_path):
    """Max pooling 2 x 2 stride 2 through ``pool_start`` (the planar task on the unit's
    pooling mode)."""
    check_pool(netlist, tmp_path, 0, **test_pe.POOLS["max_2x2_s2"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["min_3x3_s1_pad", "max_3x2_s2x1_odd", "max_ring"])
def test_pool_slow(netlist, tmp_path, name):
    check_pool(netlist, tmp_path, 1 + list(test_pe.POOLS).index(name), **test_pe.POOLS[name])


@pytest.mark.slow
def test_pool_digits(netlist, tmp_path):
    """The digits CNN's first pooling: 8 channels, 8 x 8, 2 x 2 stride 2."""
    check_pool(netlist, tmp_path, 9, c=8, h=8, w=8, kh=2, kw=2, sy=2, sx=2)


@pytest.mark.slow
@pytest.mark.parametrize("fields, expect", [
    (dict(fmt=1), NeuralError.FORMAT),
    (dict(sparse=1), NeuralError.EXTRACT),
    (dict(act=3), NeuralError.POSTPROC),
])
def test_conv_error(netlist, tmp_path, fields, expect):
    """Fields the golden model refuses: the same code, nothing written."""
    check_conv(netlist, tmp_path, 3, expect=expect, **test_ne.BASE, fields=fields)


def test_unsupported(netlist, tmp_path):
    """Fields the micro unit leaves out (a grouped convolution, which the golden model runs; an
    elementwise planar task): ``UNSUPPORTED``, as the generic build ends them, nothing
    written."""
    buffer, kmem, regs = test_ne.build(np.random.default_rng(1), **test_ne.BASE,
                                       fields=dict(groups=2, ocpg=5))
    assert test_ne.golden(buffer, kmem, regs)[0] == 0
    err, got, _ = run_netlist(buffer, regs, kmem, work_dir=tmp_path / "ne", netlist=netlist)
    assert err == UNSUPPORTED
    assert np.array_equal(np.array(got, np.uint16), buffer)
    buffer, regs, _ = test_pe.build(np.random.default_rng(3), **test_pe.BASE,
                                    fields=dict(mode=Mode.ELTWISE))
    err, got, _ = run_netlist(buffer, regs, np.zeros(1024, np.uint32), pool=True,
                              work_dir=tmp_path / "pe", netlist=netlist)
    assert err == UNSUPPORTED
    assert np.array_equal(np.array(got, np.uint16), buffer)


@pytest.mark.slow
def test_pool_error(netlist, tmp_path):
    """Average pooling, which the golden planar engine refuses on this build: its code."""
    check_pool(netlist, tmp_path, 4, expect=PlanarError.UNSUPPORTED, **test_pe.BASE,
               fields=dict(op=PoolOp.AVG))
