"""Running convolution and fully connected layers on the RTL neural engine and the golden model.

A :class:`ConvCase` is everything a layer needs: shape, inputs, weights (as the kernel encoding
stores them), per-channel bias / scale / shift, the post-processor configuration and the
work-unit shape. :func:`golden_output` computes the expected output with the golden model
(:mod:`npu_model.conv`, :mod:`npu_model.kernel_codec`, :mod:`npu_model.postproc`) in the
engine's order; :func:`run_rtl` runs the same case on the engine bench
(:func:`npu_sim.conv_harness.conv_bench`) in ``amaranth.sim`` or Verilator.
"""

from dataclasses import dataclass, field

import numpy as np

from npu_model import fp
from npu_model.conv import ConvLayer, engine_output, layer_macs
from npu_model.kernel_codec import encode as kernel_encode
from npu_model.kernel_codec import kernel_memory
from npu_model.mac import FMT
from npu_model.postproc import Act, PostprocConfig
from npu_spec.neural import NEURAL_ENGINE, best_log2w, layer_writes, make_layer

__all__ = ["ACTIVATIONS", "ConvCase", "commands", "golden_output", "input_commands",
           "kernel_commands", "kernel_image", "layer_fields", "load_commands", "parse_run",
           "random_case", "register_commands", "run_rtl", "run_rtl_many", "run_rtl_overlapped"]

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
    kernel_addr: int = 0          # kernel-memory word of the group table (KTABLE.addr)
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
        dilation=L.dilation, pad=L.pad, addr=case.kernel_addr, out_fp16=int(p.out_fp16),
        stochastic=int(p.stochastic), act=int(p.act), zero_point=int(p.zero_point) & 0xFF,
        lo=p.lo, hi=p.hi, alpha=p.alpha, seed=p.seed)


def golden_output(case, config):
    """Expected outputs ``[K, OH, OW]`` (uint16) and accumulators ``[K, OH, OW]`` (uint32)
    of ``case`` on a core of ``config`` (:func:`npu_model.conv.engine_output`)."""
    return engine_output(case.layer, config, layer_fields(case), case.inputs,
                         case.effective_weights, case.bias, case.scale, case.shift, case.post,
                         case.groups_enc)


def kernel_image(case):
    """The kernel-memory words of ``case`` from word ``case.kernel_addr`` on: the group table,
    then each group's header and body (:func:`npu_model.kernel_codec.kernel_memory`)."""
    return kernel_memory(case.groups_enc, base=case.kernel_addr)


def load_commands(case, config, bench, program, stall=0.0, overrides=None, kernel_patch=None):
    """Append to ``program`` the commands that load ``case`` into ``bench``
    (:func:`npu_sim.conv_harness.conv_bench`) and program its layer, up to the start: the
    data side's stall probability ``stall``, the kernel memory, the input memory, the layer
    registers and ``overrides`` (see :func:`commands`)."""
    program.stall(stall)
    kernel_commands(case, bench, program, kernel_patch)
    input_commands(case, bench, program)
    register_commands(case, bench, program, overrides)
    return program


def kernel_commands(case, bench, program, kernel_patch=None):
    """Append the loads of ``case``'s kernel image (at ``case.kernel_addr``; ``kernel_patch``
    maps offsets in the image to replacement words)."""
    from npu_sim.conv_harness import MemorySel

    kwords = kernel_image(case)
    for addr, word in (kernel_patch or {}).items():
        kwords[addr] = word
    if case.kernel_addr + len(kwords) > bench.data_side.kernel_words:
        raise ValueError(f"kernels need words up to {case.kernel_addr + len(kwords)}, the "
                         f"harness has {bench.data_side.kernel_words}")
    for addr, word in enumerate(kwords):
        program.load(MemorySel.KERNEL, int(word), case.kernel_addr + addr)
    return program


def input_commands(case, bench, program):
    """Append the loads of ``case``'s inputs into the input memory."""
    from npu_sim.conv_harness import MemorySel, input_address

    side = bench.data_side
    L = case.layer
    rv = side.row_values
    inputs = np.asarray(case.inputs).astype(np.uint16)
    n_in = input_address(rv, L.width, L.channels - 1, L.height - 1, L.width - 1, L.height) + 1
    if n_in > side.input_depth * rv:
        raise ValueError(f"the input needs {n_in} input-memory places, the harness has "
                         f"{side.input_depth * rv}")
    for c in range(L.channels):
        for y in range(L.height):
            for x in range(L.width):
                program.load(MemorySel.INPUT, int(inputs[c, y, x]),
                             input_address(rv, L.width, c, y, x, L.height))
    return program


def register_commands(case, bench, program, overrides=None):
    """Append the writes of ``case``'s layer registers, then ``overrides`` (see
    :func:`commands`)."""
    engine = bench.engine
    program.writes(layer_writes(layer_fields(case), engine.core))
    for name, fields in (overrides or {}).items():
        if isinstance(fields, int):
            word = fields
        else:
            _, word = NEURAL_ENGINE.encode(name, **fields)
        program.write(engine.base + NEURAL_ENGINE[name].offset, word)
    return program


def commands(case, config, bench, stall=0.0, overrides=None, kernel_patch=None, program=None):
    """Append to ``program`` (a new :class:`npu_sim.engine_bench.BenchProgram` if None) the
    commands that load and run ``case`` on ``bench`` (:func:`npu_sim.conv_harness.conv_bench`)
    and read back its status, counters and output; returns ``(program, output-memory words)``.

    ``stall`` is the probability that the data side's input and output memories refuse a
    request in a cycle (1.0: always). ``overrides`` maps register names to fields (a dict) or
    to a raw word (an int, which may hold codes the encoder refuses), written after the layer's
    own values (to test bad programs); ``kernel_patch`` maps offsets in the kernel image
    (kernel-memory addresses from ``case.kernel_addr``) to replacement words."""
    from npu_sim.conv_harness import DATA_WIDTH, MemorySel, output_words
    from npu_sim.engine_bench import BenchProgram

    engine, side = bench.engine, bench.data_side
    program = program or BenchProgram(DATA_WIDTH)
    L = case.layer
    load_commands(case, config, bench, program, stall, overrides, kernel_patch)
    words = output_words(config.macs, L.out_channels, L.out_height, L.out_width)
    if words > side.output_depth:
        raise ValueError(f"the output needs {words} output-memory words, the harness has "
                         f"{side.output_depth}")
    program.start().wait()
    for name in ("STATUS", "CYCLES", "MAC_ACTIVE"):
        program.read(engine.base + NEURAL_ENGINE[name].offset)
    program.dump(MemorySel.OUTPUT, 0, words * (config.macs // 2))
    return program, words


def parse_run(records, case, config):
    """``(outputs [K, OH, OW], stats)`` of one run of ``case`` from its five bench records
    (the WAIT, three READs, the DUMP of :func:`commands`)."""
    from npu_sim.conv_harness import output_words
    L = case.layer
    return _parse(records, case, config,
                  output_words(config.macs, L.out_channels, L.out_height, L.out_width))


def _parse(records, case, config, n_words):
    """Outputs ``[K, OH, OW]`` and stats of one run from its bench records (a WAIT, three
    READs, a DUMP)."""
    (_, code, _), (_, status), (_, cycles), (_, mac_active), (_, words_out) = records
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
    fields = NEURAL_ENGINE.decode(NEURAL_ENGINE.address("STATUS"), status)
    if fields["error_code"] != code:
        raise RuntimeError(f"the engine ended with code {code}, STATUS says "
                           f"{fields['error_code']}")
    return out, {"busy": int(fields["busy"]), "error": int(fields["error"]),
                 "error_code": int(fields["error_code"]), "cycles": int(cycles),
                 "mac_active": int(mac_active)}


def run_rtl(case, config, *, backend="amaranth", stall=0.0, seed=0, progress=None,
            harness_args=None, max_cycles=None, vcd=None, overrides=None, kernel_patch=None):
    """Run ``case``; returns ``(outputs [K, OH, OW] uint16, stats)``; stats has ``cycles`` and
    ``mac_active`` (the engine's own counters), ``error`` and ``error_code``."""
    return run_rtl_many([dict(case=case, stall=stall, overrides=overrides,
                              kernel_patch=kernel_patch)], config, backend=backend,
                        stall=stall, seed=seed, progress=progress, harness_args=harness_args,
                        max_cycles=max_cycles, vcd=vcd)[0]


def run_rtl_overlapped(cases, config, *, backend="amaranth", stall=0.0, seed=0,
                       harness_args=None, max_cycles=None, vcd=None):
    """Run ``cases`` one after the other on one engine bench the way the task manager programs a
    core: each layer's kernels (at its ``kernel_addr``, clear of the running layer's) and
    registers are loaded and written while the layer before it runs, its inputs once that layer
    has ended (the bench has one input memory). Returns a list of ``(outputs, stats)``."""
    from npu_sim.conv_harness import DATA_WIDTH, MemorySel, conv_bench, output_words
    from npu_sim.engine_bench import BenchProgram, run_bench

    verilator = None
    if backend == "verilator":
        bench, verilator = _verilator_bench(config, harness_args, None)
    else:
        bench = conv_bench(config, **(harness_args or {}))
    engine = bench.engine
    program = BenchProgram(DATA_WIDTH)

    def results(case):
        L = case.layer
        program.wait()
        for name in ("STATUS", "CYCLES", "MAC_ACTIVE"):
            program.read(engine.base + NEURAL_ENGINE[name].offset)
        words = output_words(config.macs, L.out_channels, L.out_height, L.out_width)
        program.dump(MemorySel.OUTPUT, 0, words * (config.macs // 2))

    for i, case in enumerate(cases):
        kernel_commands(case, bench, program)
        register_commands(case, bench, program)
        if i:
            results(cases[i - 1])
        input_commands(case, bench, program)
        program.start()
    results(cases[-1])
    if backend == "verilator" and max_cycles is None:
        max_cycles = (200_000 * len(cases) + 40 * len(program.beats) + 50 * program.expected
                      + sum(4 * layer_macs(c.layer) // config.macs for c in cases))
    records = run_bench(bench, program, backend=backend, stall=stall, seed=seed,
                        max_cycles=max_cycles, verilator=verilator, vcd=vcd)
    return [parse_run(records[5 * i:5 * i + 5], case, config) for i, case in enumerate(cases)]


#: Verilator benches already converted in this process, by (config, harness arguments):
#: converting a 256-MAC engine bench to Verilog takes minutes, running a layer seconds.
_BENCHES = {}


def _verilator_bench(config, harness_args, progress):
    from npu_sim.conv_harness import conv_bench
    from npu_sim.verilator import StreamBench

    key = (config, tuple(sorted((harness_args or {}).items())))
    if key not in _BENCHES:
        bench = conv_bench(config, **(harness_args or {}))
        _BENCHES[key] = bench, StreamBench(bench, in_name="cmd", out_name="res",
                                           key=("conv_bench", key))
    bench, verilator = _BENCHES[key]
    verilator.progress = progress or (lambda msg: None)
    return bench, verilator


def run_rtl_many(runs, config, *, backend="amaranth", stall=0.0, seed=0, progress=None,
                 harness_args=None, max_cycles=None, vcd=None):
    """Run several layers one after the other on one engine bench (each ``runs`` entry: a dict
    of ``case`` and optional ``stall``, ``overrides``, ``kernel_patch``); returns a list of
    ``(outputs, stats)``. ``stall`` here is the probability of stalls on the bench's command
    and response streams."""
    from npu_sim.conv_harness import conv_bench
    from npu_sim.engine_bench import run_bench

    verilator = None
    if backend == "verilator":
        bench, verilator = _verilator_bench(config, harness_args, progress)
    else:
        bench = conv_bench(config, **(harness_args or {}))
    program = None
    for run in runs:
        program, _ = commands(run["case"], config, bench, run.get("stall", 0.0),
                              run.get("overrides"), run.get("kernel_patch"), program)
    if backend == "verilator" and max_cycles is None:
        max_cycles = (200_000 * len(runs) + 40 * len(program.beats) + 50 * program.expected
                      + sum(4 * layer_macs(r["case"].layer) // config.macs for r in runs))
    records = run_bench(bench, program, backend=backend, stall=stall, seed=seed,
                        max_cycles=max_cycles, verilator=verilator, vcd=vcd)
    return [parse_run(records[5 * i:5 * i + 5], run["case"], config)
            for i, run in enumerate(runs)]
