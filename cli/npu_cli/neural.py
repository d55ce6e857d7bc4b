"""``npu sim conv``, ``npu sim fc`` and ``npu bench neural``: layers on the RTL neural engine.

Each run builds a random layer (inputs, weights with the requested sparsity and encoding,
biases, scales), computes the expected output with the golden model, runs the RTL engine on the
engine bench with its data side (``npu_sim.conv_harness.conv_bench``) and compares every output
bit for bit.
"""

import json
import time

from npu_cli.util import CLIError, add_sim_options, positive, progress

__all__ = ["BLOCKS", "add_sim_commands", "add_bench_commands", "run_layer"]


def _neural_engine(config):
    from npu.neural.engine import NeuralEngine
    return NeuralEngine(config)


def _kernel_extract(config):
    from npu.neural.kernel_extract import kernel_extractor
    return kernel_extractor(config)


def _postproc(config):
    from npu.neural.postproc_seq import post_processor
    from npu_spec.neural import post_lanes
    return post_processor(config, lanes_per_cycle=post_lanes(config))


def _postproc_sequential(config):
    """The sequential int8 post-processor of the preset (``postproc_impl="sequential"``)."""
    from npu.neural.postproc_seq import post_processor
    return post_processor(_lean(config, postproc_impl="sequential"))


def _lean(config, **changes):
    """``config`` with lean block options; a preset they do not suit is a one-line error."""
    try:
        return config.replace(**changes)
    except ValueError as e:
        raise CLIError(f"preset {config.name}: {e}", status=2) from None


def _kernel_extract_dense(config):
    """The dense int8 kernel extractor of the preset (``kernel_extract="dense_int8"``)."""
    from npu.neural.kernel_extract import kernel_extractor
    return kernel_extractor(_lean(config, kernel_extract="dense_int8"))


BLOCKS = {"neural_engine": _neural_engine, "kernel_extract": _kernel_extract,
          "kernel_extract_dense": _kernel_extract_dense, "postproc": _postproc,
          "postproc_sequential": _postproc_sequential}


def _shape(text, count, name):
    parts = text.lower().split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise CLIError(f"{name} must be {'x'.join(['N'] * count)}, not {text!r}", 2) from None
    if len(values) != count or any(v <= 0 for v in values):
        raise CLIError(f"{name} must be {count} positive numbers joined by x, not {text!r}", 2)
    return values


def run_layer(config, layer, *, seed, sparsity=0.0, palette=0, activation="none",
              backend="verilator", stall=0.0, say=None, log2w=None):
    """Run one random layer on the RTL and the golden model; returns a summary dict (and the
    case, golden and RTL outputs)."""
    import numpy as np

    from npu_model.conv import layer_macs
    from npu_sim.conv import golden_output, random_case, run_rtl
    from npu_sim.verilator import VerilatorError

    say = say or (lambda msg: None)
    fmt_family = {"int8": "int8", "fp16": "fp16", "f16i8": "mixed", "i8f16": "mixed"}
    if fmt_family[layer.fmt] not in config.formats:
        raise CLIError(f"preset {config.name!r} has no {fmt_family[layer.fmt]} hardware "
                       f"(formats: {', '.join(config.formats)})", 2)
    case = random_case(config, layer, seed=seed, sparsity=sparsity, palette_bits=palette,
                       activation=activation, log2w=log2w)
    say(f"golden model: {layer.out_channels}x{layer.out_height}x{layer.out_width} outputs, "
        f"{layer_macs(layer)} MACs")
    expected, _ = golden_output(case, config)
    say(f"RTL on {backend} (work unit {case.width}x{config.macs // case.width})")
    t0 = time.perf_counter()
    try:
        got, stats = run_rtl(case, config, backend=backend, stall=stall, seed=seed, progress=say)
    except VerilatorError as e:
        raise CLIError(str(e).splitlines()[0]) from None
    except ValueError as e:
        raise CLIError(str(e), 2) from None
    seconds = time.perf_counter() - t0
    bad = int(np.count_nonzero(expected != got))
    dense = layer_macs(layer)
    positions = layer.out_channels * layer.out_height * layer.out_width
    useful = case.nonzero_weights * layer.out_height * layer.out_width
    cycles = max(1, stats["cycles"])
    summary = {
        "preset": config.name, "backend": backend, "seed": seed, "format": layer.fmt,
        "input": [layer.channels, layer.height, layer.width],
        "output": [layer.out_channels, layer.out_height, layer.out_width],
        "kernel": [layer.kh, layer.kw], "stride": layer.stride, "pad": layer.pad,
        "dilation": layer.dilation, "groups": layer.groups, "sparsity": sparsity,
        "palette": palette, "activation": activation,
        "work_unit": [case.width, config.macs // case.width],
        "match": bad == 0 and not stats["error"], "mismatched_outputs": bad,
        "outputs": positions, "error": stats["error"], "error_code": stats["error_code"],
        "cycles": stats["cycles"], "mac_active_cycles": stats["mac_active"],
        "dense_macs": dense, "useful_macs": useful,
        "utilization": round(useful / (config.macs * cycles), 4),
        "dense_utilization": round(dense / (config.macs * cycles), 4),
        "zero_skip_saving": round(1 - case.nonzero_weights / max(1, case.weights.size), 4),
        "rtl_wall_seconds": round(seconds, 2),
    }
    return summary, case, expected, got


def _report(summary, args, what):
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        verdict = ("RTL equals golden model" if summary["match"] else
                   f"RTL DIFFERS from golden model ({summary['mismatched_outputs']} of "
                   f"{summary['outputs']} outputs" +
                   (f", error code {summary['error_code']}" if summary["error"] else "") + ")")
        print(f"{verdict}: {what}, {summary['format']}, preset {summary['preset']}, "
              f"seed {summary['seed']}")
        print(f"cycles {summary['cycles']}, MAC utilization {summary['utilization']:.1%} "
              f"(useful MACs {summary['useful_macs']} / ({args.preset.macs} MACs x cycles)), "
              f"dense-equivalent {summary['dense_utilization']:.1%}, zero-skip saving "
              f"{summary['zero_skip_saving']:.1%} of coefficients")
    return 0 if summary["match"] else 1


def _dump(path, case, expected, got, summary):
    import numpy as np
    np.savez_compressed(
        path, inputs=case.inputs, weights=case.effective_weights, bias=case.bias,
        scale=case.scale, shift=case.shift, golden=expected, rtl=got,
        post=np.array([case.post.out_fp16, case.post.act, case.post.zero_point, case.post.lo,
                       case.post.hi, case.post.alpha, case.post.stochastic, case.post.seed],
                      np.int64),
        summary=json.dumps(summary))


def cmd_sim_conv(args):
    from npu_model.conv import ConvLayer

    c, h, w = _shape(args.input, 3, "--input")
    kh, kw = _shape(args.kernel, 2, "--kernel")
    try:
        layer = ConvLayer(c, h, w, args.out_channels, kh, kw, stride=args.stride, pad=args.pad,
                          dilation=args.dilation, groups=args.groups, fmt=_fmt(args.format))
    except ValueError as e:
        raise CLIError(str(e), 2) from None
    return _run(args, layer, f"conv {c}x{h}x{w} -> {args.out_channels}, {kh}x{kw} kernel")


def cmd_sim_fc(args):
    from npu_model.conv import fc_as_conv

    try:
        layer = fc_as_conv(args.in_features, args.out_features, args.batch, _fmt(args.format),
                           args.mapping)
    except ValueError as e:
        raise CLIError(str(e), 2) from None
    return _run(args, layer, f"fully connected {args.in_features} -> {args.out_features}, "
                f"batch {args.batch}, mapping {args.mapping}")


def _fmt(name):
    return {"int8": "int8", "fp16": "fp16", "mixed": "f16i8"}[name]


def _run(args, layer, what):
    say = progress(args.json)
    if args.backend == "verilator":
        from npu_fpga.toolenv import apply_tool_env
        apply_tool_env()
    summary, case, expected, got = run_layer(
        args.preset, layer, seed=args.seed, sparsity=args.sparsity, palette=args.palette,
        activation=args.activation, backend=args.backend, stall=args.stall, say=say)
    if args.dump:
        _dump(args.dump, case, expected, got, summary)
        say(f"wrote {args.dump}")
    return _report(summary, args, what)


def _sparsity(text):
    import argparse
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], not {value}")
    return value


def _layer_options(p):
    from npu_sim.conv import ACTIVATIONS
    p.add_argument("--format", choices=("int8", "fp16", "mixed"), required=True,
                   help="int8 x int8, fp16 x fp16, or mixed (fp16 data x int8 weights)")
    p.add_argument("--sparsity", type=_sparsity, default=0.0,
                   help="fraction of zero weights (default 0); > 0 uses sparse kernels")
    p.add_argument("--palette", type=int, choices=(0, 1, 2, 4, 6, 8), default=0,
                   help="palette index bits (0: raw weights)")
    p.add_argument("--activation", choices=tuple(ACTIVATIONS), default="none")


def add_sim_commands(ssub):
    conv = ssub.add_parser(
        "conv", help="a random convolution layer through the RTL neural engine",
        description="Run a random convolution layer (inputs, weights with the given sparsity "
        "and encoding, biases, scales, activation) through the RTL neural engine and the "
        "golden model, compare every output bit for bit, and print the cycle count, MAC "
        "utilization and the zero-skip saving.")
    add_sim_options(conv)
    conv.add_argument("--input", required=True, metavar="CxHxW", help="input shape")
    conv.add_argument("--out-channels", type=positive, required=True)
    conv.add_argument("--kernel", default="3x3", metavar="KHxKW", help="default 3x3")
    conv.add_argument("--stride", type=positive, default=1)
    conv.add_argument("--pad", type=int, default=0)
    conv.add_argument("--dilation", type=positive, default=1)
    conv.add_argument("--groups", type=positive, default=1)
    _layer_options(conv)
    conv.set_defaults(func=cmd_sim_conv)

    fc = ssub.add_parser(
        "fc", help="a random fully connected layer through the RTL neural engine",
        description="Run a random fully connected layer, mapped to a 1x1 convolution, through "
        "the RTL neural engine and the golden model. Mapping 'batch': the batch is the "
        "spatial axis and the weight matrix the kernels; 'weights': the weight matrix is the "
        "data (one output neuron per lane) and each batch row a kernel.")
    add_sim_options(fc)
    fc.add_argument("--in-features", type=positive, required=True)
    fc.add_argument("--out-features", type=positive, required=True)
    fc.add_argument("--batch", type=positive, default=1)
    fc.add_argument("--mapping", choices=("batch", "weights"), default="weights")
    _layer_options(fc)
    fc.set_defaults(func=cmd_sim_fc)


# ---- npu bench neural ----------------------------------------------------------------------

def bench_layers(config):
    """The benchmark layers: (name, ConvLayer, sparsity)."""
    from npu_model.conv import ConvLayer, fc_as_conv
    side = 16 if config.macs <= 64 else 32
    layers = [
        ("conv3x3 16->16", ConvLayer(16, side, side, 16, 3, 3, pad=1, fmt="int8"), 0.0),
        ("conv1x1 32->32", ConvLayer(32, side, side, 32, 1, 1, fmt="int8"), 0.0),
        ("depthwise3x3 32", ConvLayer(32, side, side, 32, 3, 3, pad=1, groups=32,
                                      fmt="int8"), 0.0),
        ("fc 128->128 batch 8", fc_as_conv(128, 128, 8, "int8", "weights"), 0.0),
        ("fc 128->128 batch 1", fc_as_conv(128, 128, 1, "int8", "weights"), 0.0),
    ]
    for sp in (0.25, 0.5, 0.75, 0.9):
        layers.append((f"conv3x3 16->16 sparsity {sp}",
                       ConvLayer(16, side, side, 16, 3, 3, pad=1, fmt="int8"), sp))
    return layers


def cmd_bench_neural(args):
    from npu_spec.config import NPUConfig
    say = progress(args.json)
    from npu_fpga.toolenv import apply_tool_env
    apply_tool_env()
    cfg = args.preset
    if args.cores_one and cfg.cores != 1:
        cfg = NPUConfig(**{**cfg.__dict__, "cores": 1, "name": f"{cfg.name}-1core"})
    if args.int8_only and cfg.formats != ("int8",):
        # The benchmark layers are int8; the MAC array and post-processor without the
        # binary16 paths are a fraction of the model. The schedule is the same; the shorter
        # pipelines end each layer a few cycles earlier (9 on the `small` preset).
        cfg = NPUConfig(**{**cfg.__dict__, "formats": ("int8",), "name": f"{cfg.name}-int8"})
    rows = []
    for name, layer, sp in bench_layers(cfg):
        if args.only and args.only not in name:
            continue
        say(f"{name}")
        summary, *_ = run_layer(cfg, layer, seed=args.seed, sparsity=sp, backend="verilator",
                                stall=0.0, say=say)
        summary["name"] = name
        rows.append(summary)
        if not args.json:
            print(f"{name:32s} cycles {summary['cycles']:8d}  utilization "
                  f"{summary['utilization']:6.1%}  dense-equivalent "
                  f"{summary['dense_utilization']:6.1%}  match {summary['match']}", flush=True)
    dense = next((r for r in rows if r["name"] == "conv3x3 16->16"), None)
    if dense:
        for r in rows:
            if r["name"].startswith("conv3x3 16->16 sparsity"):
                r["cycles_vs_dense"] = round(r["cycles"] / dense["cycles"], 3)
                if not args.json:
                    print(f"{r['name']:32s} cycles / dense = {r['cycles_vs_dense']}")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0 if all(r["match"] for r in rows) else 1


def add_bench_commands(bsub):
    from npu_cli.util import preset_arg
    b = bsub.add_parser(
        "neural", help="MAC utilization of the neural engine on standard layers",
        description="Run the benchmark layers (dense 3x3 and 1x1 convolutions, depthwise 3x3, "
        "fully connected, 3x3 at 25-90%% kernel sparsity) on the RTL neural engine under "
        "Verilator, check each against the golden model, and print cycles and MAC "
        "utilization (useful MACs / (MACs x cycles)).")
    b.add_argument("--preset", type=preset_arg, default="small")
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--only", default=None, help="run only layers whose name contains this")
    b.add_argument("--cores-one", action="store_true",
                   help="bench one core of the preset (e.g. a 256-MAC ane-shaped engine)")
    b.add_argument("--int8-only", action="store_true",
                   help="build the engine with the int8 format only: the benchmark layers are "
                   "int8, and the simulation model is much smaller. Same schedule; shorter "
                   "pipelines end each layer a few cycles earlier")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bench_neural)
