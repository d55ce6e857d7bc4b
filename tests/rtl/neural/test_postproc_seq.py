# amaranth: UnusedElaboratable=no
"""The sequential int8 post-processor (npu.neural.postproc_seq, ``postproc_impl="sequential"``)
against the golden model (npu_model.postproc), bit for bit, with random stalls on the result,
parameter and output streams; its rate."""

import numpy as np
import pytest
from amaranth.hdl import Fragment

from npu.neural.postproc import PostProcessor
from npu.neural.postproc_seq import SequentialPostProcessor, post_processor
from npu_model import postproc as gm
from npu_model.postproc import Act, PostprocConfig
from npu_sim.streams import run_simulation
from npu_spec.config import NPUConfig, preset
from tests.rtl.neural.test_postproc import check, pack, random_layer

#: The iCE40 build with the sequential post-processor, and a small odd one.
SEQ = preset("ice40").replace(postproc_impl="sequential")
SEQ3 = NPUConfig(macs=2, acc_slots=3, formats=("int8",), postproc_impl="sequential")


def int_layers(config, rng, groups=3):
    layers = []
    for act in (Act.NONE, Act.RELU, Act.CLAMP):
        cfg = PostprocConfig(act=act, zero_point=int(rng.integers(-128, 128)),
                             lo=int(rng.integers(0, 256)), hi=int(rng.integers(0, 256)))
        layers.append((cfg, *random_layer(config, cfg, groups, rng, fmts=[gm.FMT_INT8])))
    return layers


def test_selected_by_config():
    for config, cls in ((SEQ, SequentialPostProcessor), (preset("ice40"), PostProcessor)):
        block = post_processor(config, 2)
        assert type(block) is cls
        Fragment.get(block, None)
    with pytest.raises(ValueError, match="int8 only"):
        SequentialPostProcessor(NPUConfig(macs=2, acc_slots=1))
    with pytest.raises(ValueError, match="postproc_impl"):
        NPUConfig(postproc_impl="sequential")
    with pytest.raises(TypeError, match="NPUConfig"):
        SequentialPostProcessor("ice40")


@pytest.mark.parametrize("config", [SEQ, SEQ3], ids=["ice40", "2x3"])
def test_random_int_layers(config):
    """None, ReLU and clamp with random zero points and bounds; multipliers and shifts of every
    kind (rand_int_params: typical, any pattern, 0, 1, +-2**31, shifts 0..63); accumulators
    typical, extreme (+-2**31) and any; random stalls on every stream."""
    rng = np.random.default_rng(41 + config.macs)
    check(config, int_layers(config, rng), seed=config.macs, stall=0.3)


def test_corner_products():
    """Every pairing of the extreme accumulators and multipliers with shifts at the edges:
    the largest products (2**62), rounding ties, shift 0 and 63."""
    config = SEQ3
    edges = np.array([-(1 << 31), (1 << 31) - 1, 0, -1, 1, 3, -3, 1 << 30, -(1 << 30), 5],
                     np.int64) & 0xFFFFFFFF
    layers = []
    for shift in (0, 1, 2, 31, 32, 33, 61, 62, 63):
        cfg = PostprocConfig(act=Act.NONE, zero_point=[-128, 0, 127][shift % 3])
        groups, results = [], []
        for scale in (0x80000000, 0x7FFFFFFF, 1, 0xFFFFFFFF, 0x40000000, 3):
            for a in range(0, len(edges), config.macs):
                # One parameter and one result per group: the bank turns over every beat.
                groups.append([(0, scale, shift)])
                results.append((gm.FMT_INT8, 0, edges[a:a + config.macs]))
        layers.append((cfg, groups, results))
    check(config, layers, seed=3, stall=0.2)


def test_errors_give_zeros():
    """binary16 output, a float activation, and non-int8 result formats are errors: zeros and
    the sticky flag, as the golden model says."""
    rng = np.random.default_rng(5)
    layers = []
    for cfg in (PostprocConfig(out_fp16=True), PostprocConfig(act=Act.LEAKY),
                PostprocConfig(act=Act.TANH)):
        layers.append((cfg, *random_layer(SEQ3, cfg, 1, rng, fmts=[gm.FMT_INT8])))
    cfg = PostprocConfig()
    layers.append((cfg, *random_layer(SEQ3, cfg, 1, rng, fmts=[gm.FMT_FP16])))
    report = check(SEQ3, layers, seed=5)
    for got, want_err, errs in report:
        assert all(want_err) and errs[-1] == 1 and all((v == 0).all() for _, v in got)


def test_bank_double_buffering_stalls():
    """Many small groups, heavy stalls on each stream in turn."""
    rng = np.random.default_rng(6)
    cfg = PostprocConfig(act=Act.CLAMP, zero_point=-7, lo=0xF0, hi=0x50)
    layers = [(cfg, *random_layer(SEQ3, cfg, 4, rng, fmts=[gm.FMT_INT8]))]
    for k, stalls in enumerate([(0.8, 0.1, 0.1), (0.1, 0.8, 0.1), (0.1, 0.1, 0.8)]):
        check(SEQ3, layers, seed=60 + k, stalls=stalls)


def test_rate():
    """Results back to back, parameters in advance, output always ready: one result beat every
    ``cycles_per_beat`` = 4 * lanes + 5 cycles."""
    config = SEQ
    dut = SequentialPostProcessor(config)
    p_layout, r_layout = dut.params.payload.shape(), dut.res.payload.shape()
    slots, n_groups = config.acc_slots, 2
    accepted = []

    async def params(ctx):
        for _ in range(n_groups):
            for s in range(slots):
                ctx.set(dut.params.valid, 1)
                ctx.set(dut.params.payload.as_value(), pack(p_layout, {
                    "slot": s, "scale": 1 << 30, "shift": 30,
                    "group_last": s == slots - 1}))
                await ctx.tick().until(dut.params.ready)
        ctx.set(dut.params.valid, 0)

    async def res(ctx):
        cycle = 0
        for k in range(n_groups * slots):
            ctx.set(dut.res.valid, 1)
            ctx.set(dut.res.payload.as_value(), pack(r_layout, {
                "fmt": 0, "slot": k % slots, "acc": list(range(config.macs))}))
            while True:
                _, _, ready = await ctx.tick().sample(dut.res.ready)
                cycle += 1
                if ready:
                    accepted.append(cycle)
                    break
        ctx.set(dut.res.valid, 0)

    async def out(ctx):
        ctx.set(dut.out.ready, 1)

    run_simulation(dut, [params, res, out])
    gaps = np.diff(accepted)
    assert (gaps == dut.cycles_per_beat).all(), gaps
    assert dut.cycles_per_beat == 4 * config.macs + 5


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_random_sweep_slow(seed):
    rng = np.random.default_rng(300 + seed)
    config = [SEQ, SEQ3, NPUConfig(macs=4, acc_slots=5, formats=("int8",),
                                   postproc_impl="sequential")][seed]
    check(config, int_layers(config, rng, groups=6), seed=seed,
          stall=float(rng.choice([0.0, 0.3, 0.6])))
