"""Running convolution and fully connected layers on the RTL neural engine and the golden model.

A :class:`ConvCase` is everything a layer needs: shape, inputs, weights (as the kernel encoding
stores them), per-channel bias / scale / shift, the post-processor configuration and the
work-unit shape. :func:`golden_output` computes the expected output with the golden model
(:mod:`npu_model.conv`, :mod:`npu_model.kernel_codec`, :mod:`npu_model.postproc`) in the
engine's order; :func:`run_rtl` runs the same case on :class:`npu_sim.conv_harness.ConvHarness`
in ``amaranth.sim`` or Verilator.
"""

from dataclasses import dataclass, field

import numpy as np

from npu_model import fp
from npu_model.conv import ConvLayer, engine_output, layer_macs
from npu_model.kernel_codec import encode as kernel_encode
from npu_model.kernel_codec import pack_words
from npu_model.mac import FMT
from npu_model.postproc import Act, PostprocConfig
from npu_spec.neural import best_log2w, layer_writes, make_layer

__all__ = ["ACTIVATIONS", "ConvCase", "commands", "golden_output", "layer_fields", "random_case",
           "run_rtl", "run_rtl_many"]

#: Activation names of ``--activation``.
ACTIVATIONS = {a.name.lower(): a for a in Act}


@dataclass
class ConvCase:
    layer: ConvLayer
    inputs: np.ndarray            # [C, IH, IW] int8 values or binary16 codes
    weights: np.ndarray           # [K, C/G, KH, KW], as requested (before palettization)
    bias: np.ndarray              # [K] uint32 bit patterns
    scale: np.ndarray             # [K] uint32
    shift: np.ndarray             # [K] 0..63
    post: PostprocConfig
    sparse: bool = False
    palette_bits: int = 0
    log2w: int = 0
    slots: int = 8
    groups_enc: list = field(default_factory=list)   # kernel_codec.EncodedGroup per group

    def __post_init__(self):
        if not self.groups_enc:
            k = self.layer.out_channels
            for base in range(0, k, self.slots):
                sl = slice(base, min(k, base + self.slots))
                self.groups_enc.append(kernel_encode(
                    self.weights[sl], coef_fp16=self.layer.coef_fp16, sparse=self.sparse,
                    palette_bits=self.palette_bits, bias=self.bias[sl], scale=self.scale[sl],
                    shift=self.shift[sl]))

    @property
    def effective_weights(self):
        """The weights the kernel blobs encode (palette-quantized if palettized)."""
        return np.concatenate([g.weights for g in self.groups_enc]).astype(
            np.uint16 if self.layer.coef_fp16 else np.int8)

    @property
    def nonzero_weights(self):
        return int(sum(int(g.nnz.sum()) for g in self.groups_enc))

    @property
    def width(self):
        return 1 << self.log2w


def _random_f16(rng, shape, scale=1.0):
    v = (rng.standard_normal(shape) * scale).astype(np.float16)
    return v.view(np.uint16)


def random_case(config, layer, *, seed, sparsity=0.0, palette_bits=0, sparse=None,
                activation="none", out_fp16=None, stochastic=False, log2w=None):
    """A random case of ``layer`` for a build ``config``: inputs, weights with the given
    fraction of zeros, biases, scales and a post-processor configuration."""
    rng = np.random.default_rng(seed)
    L = layer
    if sparse is None:
        sparse = sparsity > 0
    if L.data_fp16:
        inputs = _random_f16(rng, (L.channels, L.height, L.width))
    else:
        inputs = rng.integers(-128, 128, (L.channels, L.height, L.width)).astype(np.int8)
    if L.coef_fp16:
        weights = _random_f16(rng, L.weight_shape, 0.25)
        weights[rng.random(L.weight_shape) < sparsity] = 0
    else:
        weights = rng.integers(-128, 128, L.weight_shape).astype(np.int8)
        weights[rng.random(L.weight_shape) < sparsity] = 0
    k = L.out_channels
    act = ACTIVATIONS[activation]
    if L.fmt == "int8":
        bias = rng.integers(-(1 << 14), 1 << 14, k).astype(np.int64) & 0xFFFFFFFF
        scale = rng.integers(1 << 28, 1 << 30, k)
        # Outputs of roughly +-100: acc ~ 128 * 128 * sqrt(taps) / 2, multiplier ~ 2**29.
        taps = L.icpg * L.kh * L.kw
        shift = np.full(k, min(63, round(36.5 + 0.5 * np.log2(taps))), np.int64)
        zp = int(rng.integers(-10, 10))
        lo, hi = (int(rng.integers(-128, -60)) & 0xFF, int(rng.integers(60, 128)) & 0xFF)
        post = PostprocConfig(out_fp16=False, act=act, zero_point=zp, lo=lo, hi=hi)
    else:
        bias = fp.f32_bits(rng.standard_normal(k).astype(np.float32))
        scale = fp.f32_bits((rng.random(k) * 0.5 + 0.25).astype(np.float32))
        shift = np.zeros(k, np.int64)
        post = PostprocConfig(
            out_fp16=True if out_fp16 is None else out_fp16, act=act,
            lo=int(fp.f32_bits(np.float32(-1.5))), hi=int(fp.f32_bits(np.float32(2.0))),
            alpha=int(fp.f32_bits(np.float32(0.125))), stochastic=stochastic,
            seed=int(rng.integers(1, 1 << 32)))
    if log2w is None:
        log2w = best_log2w(config, L.out_width, L.kw, L.stride, L.dilation)
    return ConvCase(L, inputs, weights, np.asarray(bias, np.uint32), np.asarray(scale, np.uint32),
                    np.asarray(shift, np.int64), post, sparse=sparse, palette_bits=palette_bits,
                    log2w=log2w, slots=config.acc_slots)


def layer_fields(case):
    """The layer-register fields of ``case`` (:func:`npu_spec.neural.make_layer`)."""
    L = case.layer
    p = case.post
    return make_layer(
        fmt=FMT[L.fmt], log2w=case.log2w, sparse=int(case.sparse), palette=case.palette_bits,
        groups=L.groups, icpg=L.icpg, ocpg=L.ocpg, in_h=L.height, in_w=L.width,
        out_h=L.out_height, out_w=L.out_width, kh=L.kh, kw=L.kw, stride=L.stride,
        dilation=L.dilation, pad=L.pad, addr=0, out_fp16=int(p.out_fp16),
        stochastic=int(p.stochastic), act=int(p.act), zero_point=int(p.zero_point) & 0xFF,
        lo=p.lo, hi=p.hi, alpha=p.alpha, seed=p.seed)


def golden_output(case, config):
    """Expected outputs ``[K, OH, OW]`` (uint16) and accumulators ``[K, OH, OW]`` (uint32)
    of ``case`` on a core of ``config`` (:func:`npu_model.conv.engine_output`)."""
    return engine_output(case.layer, config, layer_fields(case), case.inputs,
                         case.effective_weights, case.bias, case.scale, case.shift, case.post,
                         case.groups_enc)


def commands(case, config, harness, stall=0.0, overrides=None, kernel_patch=None):
    """Command beats (``CMD_LAYOUT`` ints) that load and run ``case`` on ``harness``; and the
    number of output-memory words the run sends back. ``stall`` is the probability that the
    harness's input and output memories refuse a request in a cycle (1.0: always).
    ``overrides`` maps register names to fields (a dict) or to a raw word (an int, which may
    hold codes the encoder refuses), written after the layer's own values (to test bad
    programs); ``kernel_patch`` maps kernel-memory addresses to replacement words."""
    from npu_spec.neural import NEURAL_ENGINE as R
    from npu_sim.conv_harness import STALL_ADDR, input_address, output_words

    L = case.layer
    beats = []

    def cmd(op, addr, value):
        beats.append(op | (addr << 2) | ((int(value) & 0xFFFFFFFF) << 24))

    def reg(name, **fields):
        addr, word = R.encode(name, **fields)
        cmd(0, addr, word)

    cmd(0, STALL_ADDR, min(256, int(round(stall * 256))))
    # Kernel memory: the group table, then each group's header and body.
    ntab = 4 * len(case.groups_enc)
    kwords = []
    table = []
    for g in case.groups_enc:
        hw, bw = pack_words(g.header), pack_words(g.body)
        table += [ntab + len(kwords), len(hw)]
        kwords += list(hw)
        table += [ntab + len(kwords), len(bw)]
        kwords += list(bw)
    kwords = table + kwords
    for addr, word in (kernel_patch or {}).items():
        kwords[addr] = word
    if len(kwords) > harness.kernel_words:
        raise ValueError(f"kernels need {len(kwords)} words, the harness has "
                         f"{harness.kernel_words}")
    for i, w in enumerate(kwords):
        cmd(2, i, w)

    rv = harness.row_values
    inputs = np.asarray(case.inputs).astype(np.uint16)
    n_in = input_address(rv, L.width, L.channels - 1, L.height - 1, L.width - 1, L.height) + 1
    if n_in > harness.input_depth * rv:
        raise ValueError(f"the input needs {n_in} input-memory places, the harness has "
                         f"{harness.input_depth * rv}")
    for c in range(L.channels):
        for y in range(L.height):
            for x in range(L.width):
                cmd(1, input_address(rv, L.width, c, y, x, L.height), inputs[c, y, x])

    for addr, word in layer_writes(layer_fields(case)):
        cmd(0, addr, word)
    for name, fields in (overrides or {}).items():
        if isinstance(fields, int):
            cmd(0, R.address(name), fields)
        else:
            reg(name, **fields)
    words = output_words(config.macs, L.out_channels, L.out_height, L.out_width)
    if words > harness.output_depth:
        raise ValueError(f"the output needs {words} output-memory words, the harness has "
                         f"{harness.output_depth}")
    cmd(3, 0, words)
    return beats, words


def _parse(words_out, case, config, n_words):
    L = case.layer
    n = config.macs
    per = n // 2
    vals = np.zeros((n_words, n), np.uint16)
    for i in range(n_words):
        for k in range(per):
            w = words_out[i * per + k]
            vals[i, 2 * k] = w & 0xFFFF
            vals[i, 2 * k + 1] = w >> 16
    opr = -(-L.out_width // n)
    out = np.zeros(L.output_shape, np.uint16)
    for oc in range(L.out_channels):
        for y in range(L.out_height):
            for x in range(L.out_width):
                out[oc, y, x] = vals[(oc * L.out_height + y) * opr + x // n, x % n]
    status = words_out[n_words * per:]
    return out, {"busy": status[0] & 1, "error": (status[0] >> 1) & 1,
                 "error_code": (status[0] >> 4) & 0xF, "cycles": int(status[1]),
                 "mac_active": int(status[2])}


def run_rtl(case, config, *, backend="amaranth", stall=0.0, seed=0, progress=None,
            harness_args=None, max_cycles=None, vcd=None, overrides=None, kernel_patch=None):
    """Run ``case``; returns ``(outputs [K, OH, OW] uint16, stats)``; stats has ``cycles`` and
    ``mac_active`` (the engine's own counters), ``error`` and ``error_code``."""
    return run_rtl_many([dict(case=case, stall=stall, overrides=overrides,
                              kernel_patch=kernel_patch)], config, backend=backend,
                        stall=stall, seed=seed, progress=progress, harness_args=harness_args,
                        max_cycles=max_cycles, vcd=vcd)[0]


#: Verilator benches already converted in this process, by (config, harness arguments):
#: converting a 256-MAC harness to Verilog takes minutes, running a layer seconds.
_BENCHES = {}


def _verilator_bench(config, harness_args, progress):
    from npu_sim.conv_harness import ConvHarness
    from npu_sim.verilator import StreamBench

    key = (config, tuple(sorted((harness_args or {}).items())))
    if key not in _BENCHES:
        harness = ConvHarness(config, **(harness_args or {}))
        _BENCHES[key] = harness, StreamBench(harness, in_name="cmd", out_name="res")
    harness, bench = _BENCHES[key]
    bench.progress = progress or (lambda msg: None)
    return harness, bench


def run_rtl_many(runs, config, *, backend="amaranth", stall=0.0, seed=0, progress=None,
                 harness_args=None, max_cycles=None, vcd=None):
    """Run several layers one after the other on one harness (each ``runs`` entry: a dict of
    ``case`` and optional ``stall``, ``overrides``, ``kernel_patch``); returns a list of
    ``(outputs, stats)``. ``stall`` here is the probability of stalls on the command and
    result streams."""
    from npu_sim.conv_harness import ConvHarness

    if backend == "verilator":
        harness, bench = _verilator_bench(config, harness_args, progress)
    else:
        harness = ConvHarness(config, **(harness_args or {}))
    beats, sizes = [], []
    for run in runs:
        b, n_words = commands(run["case"], config, harness, run.get("stall", 0.0),
                              run.get("overrides"), run.get("kernel_patch"))
        beats += b
        sizes.append(n_words)
    per = config.macs // 2
    expected = sum(n * per + 3 for n in sizes)
    if backend == "verilator":
        if max_cycles is None:
            max_cycles = 200_000 * len(runs) + 40 * len(beats) + 50 * expected + sum(
                4 * layer_macs(r["case"].layer) // config.macs for r in runs)
        out_words, _ = bench.run(beats, expected, stall=stall, seed=seed, max_cycles=max_cycles)
    else:
        from npu_sim.streams import run_simulation, seeded_rng, stream_get, stream_put
        out_words = []

        async def producer(ctx):
            rng = seeded_rng(seed, "cmd")
            for b in beats:
                await stream_put(ctx, harness.cmd, b, rng, stall)

        async def consumer(ctx):
            rng = seeded_rng(seed, "res")
            for _ in range(expected):
                out_words.append(await stream_get(ctx, harness.res, rng, stall))

        run_simulation(harness, [producer, consumer], vcd=vcd)
        out_words = [int(w) for w in out_words]
    results, pos = [], 0
    for run, n in zip(runs, sizes):
        results.append(_parse(out_words[pos:pos + n * per + 3], run["case"], config, n))
        pos += n * per + 3
    return results
