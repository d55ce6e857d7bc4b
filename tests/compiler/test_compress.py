"""Kernel compression (``npu_compiler.compress``; ``docs/compiler.md``, "Kernel compression"):
the size model against the encoder, the lossless choice (bit-identical outputs to raw
kernels), ``--prune`` and ``--palette`` against onnxruntime, the CLI report, and the RTL on a
sparse and a palettized model."""

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_cli.main import main
from npu_compiler.compile import compile_model
from npu_compiler.compress import (
    Compression,
    choices,
    encode_kernels,
    encoding_sizes,
    palettize,
    prune,
)
from npu_compiler.graph import CompileError
from npu_model.kernel_codec import PALETTE_BITS, compressed_size, is_zero
from npu_model.kernel_codec import encode as kernel_encode
from npu_runtime.runtime import compare, reference, run, session
from npu_spec.config import preset

from .cases import COS_TOL, REL_TOL
from .models import small_cnn
from .test_digits import MODEL as DIGITS
from .test_digits import load_train_module

CFG = preset("small")


def conv_model(w1, w2, wfc, size=6):
    """Conv 3x3 (pad 1) + ReLU, max pool 2, conv 3x3 (pad 1) + ReLU, flatten, Gemm: weights
    given, biases seeded."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in
             (("w1", w1), ("w2", w2), ("wfc", wfc),
              ("b1", rng.standard_normal(w1.shape[0]) * 0.1),
              ("b2", rng.standard_normal(w2.shape[0]) * 0.1),
              ("bfc", rng.standard_normal(wfc.shape[0]) * 0.1))]
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), n("Relu", ["c2"], ["r2"]),
             n("Flatten", ["r2"], ["f"]), n("Gemm", ["f", "wfc", "bfc"], ["y"], transB=1)]
    graph = helper.make_graph(
        nodes, "conv_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, w1.shape[1], size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, wfc.shape[0]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _shapes(size=6):
    return (8, 3, 3, 3), (8, 8, 3, 3), (10, 8 * (size // 2) ** 2)


def sparse_model(seed=0):
    """80% of the weights zero (and the rest random): the sparse encoding is smaller."""
    rng = np.random.default_rng(seed)
    ws = [rng.standard_normal(s) * 0.4 for s in _shapes()]
    for w in ws:
        w[rng.random(w.shape) < 0.8] = 0
    return conv_model(*ws)


def few_values_model(seed=0):
    """Weights from {-0.5, -0.25, 0.25, 0.5} (and a few zeros): a palette is smaller."""
    rng = np.random.default_rng(seed)
    levels = np.array([-0.5, -0.25, 0.25, 0.5])
    ws = [levels[rng.integers(0, 4, s)] for s in _shapes()]
    for w in ws:
        w[rng.random(w.shape) < 0.05] = 0
    return conv_model(*ws)


def _inputs(model, seed, n=1):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(seed).random((n,) + tuple(shape[1:])).astype(np.float32)
    return {model.graph.input[0].name: x}


def _compile(model, fmt, inputs, **kw):
    extra = {"shapes": {k: v.shape for k, v in inputs.items()}}
    if fmt == "int8":
        extra.update(calibration=inputs, evaluator=session)
    return compile_model(model, CFG, fmt=fmt, **extra, **kw)


# ---- the size model and the choice -------------------------------------------------------

@pytest.mark.parametrize("coef_fp16", [False, True])
@pytest.mark.parametrize("shape", [(8, 3, 3, 3), (5, 7, 1, 1), (3, 2, 5, 4)])
def test_sizes_equal_the_encoders(coef_fp16, shape):
    """``encoding_sizes`` (the formulas of docs/kernel_format.md) equals the bytes the
    codec's encoder makes, for every encoding, zero density and palette width."""
    rng = np.random.default_rng(sum(shape))
    for density in (0.0, 0.3, 1.0):
        w = rng.integers(-3, 4, shape)
        w[rng.random(shape) > density] = 0
        codes = w.astype(np.float16).view(np.uint16) if coef_fp16 else w.astype(np.int8)
        for bits in PALETTE_BITS:
            for sparse in (False, True):
                g = kernel_encode(codes, coef_fp16=coef_fp16, sparse=sparse, palette_bits=bits)
                # (of the weights the blob holds: a lossy palette may map some to zero)
                assert (encoding_sizes(g.weights, coef_fp16, bits, sparse=sparse)
                        == compressed_size(g.header, g.body)), (density, bits, sparse)


@pytest.mark.parametrize("fmt", [0, 1, 3])
@pytest.mark.parametrize("kind", ["dense", "zeros", "few", "few_zeros"])
def test_choice_is_the_smallest_lossless_encoding(fmt, kind):
    """The encoded blob is no larger than any lossless encoding the builder makes (every
    sparse flag, every palette width that holds the distinct values), and decodes to the
    same weights."""
    from npu_model.builder import ProgramBuilder
    from npu_spec.mac import MacFormat
    rng = np.random.default_rng(3)
    w = rng.standard_normal((20, 6, 3, 3))
    if "zeros" in kind:
        w[rng.random(w.shape) < 0.7] = 0
    if "few" in kind:
        w = np.round(w * 2) / 2
    coef_fp16 = MacFormat(fmt).coef_fp16
    codes = (w.astype(np.float16).view(np.uint16) if coef_fp16
             else np.clip(np.round(w * 20), -127, 127).astype(np.int8))
    blob, raw_bytes, choice = encode_kernels(codes, fmt=fmt, bias=0, scale=0, slots=8)
    b = ProgramBuilder(CFG)
    raw = b.kernels(codes, fmt=MacFormat(fmt).name.lower())
    assert raw_bytes == 4 * raw.words
    def nonzero(c):
        c = np.asarray(c).astype(np.int64) & 0xFFFF
        return np.where(is_zero(c, coef_fp16), 0, c)

    for sparse in (False, True):
        for bits in PALETTE_BITS:
            other = b.kernels(codes, fmt=MacFormat(fmt).name.lower(), sparse=sparse,
                              palette_bits=bits)
            got = np.concatenate([g.weights for g in other.groups])
            if np.array_equal(nonzero(got), nonzero(codes)):
                assert blob.words <= other.words, (sparse, bits)
    got = np.concatenate([g.weights for g in blob.groups])
    assert np.array_equal(nonzero(got), nonzero(codes))
    expect = {"dense": "raw", "zeros": "sparse", "few": "palette", "few_zeros": "sparse+palette"}
    assert choice.name(fmt).split()[0].rstrip("0123456789") == expect[kind]
    assert choices(codes, fmt, 8)[0] == choice


@pytest.mark.parametrize("kind", ["zeros", "few", "few_zeros"])
def test_dense_int8_extractor_gets_raw_kernels(kind):
    """A build whose kernel extractor decodes only dense raw int8 bodies
    (``kernel_extract="dense_int8"``) is given raw kernels even where sparse or palettized
    encodings are smaller, and the program builder accepts them."""
    from npu_model.builder import ProgramBuilder
    rng = np.random.default_rng(4)
    w = rng.standard_normal((12, 5, 3, 3))
    if "zeros" in kind:
        w[rng.random(w.shape) < 0.7] = 0
    if "few" in kind:
        w = np.round(w * 2) / 2
    codes = np.clip(np.round(w * 20), -127, 127).astype(np.int8)
    assert encode_kernels(codes, fmt=0, bias=0, scale=0, slots=8)[2].name(0) != "raw"
    blob, raw_bytes, choice = encode_kernels(codes, fmt=0, bias=0, scale=0, slots=8,
                                             extract="dense_int8")
    assert choice.name(0).startswith("raw") and 4 * blob.words == raw_bytes
    assert [c.name(0) for c in choices(codes, 0, 8, "dense_int8")] == [choice.name(0)]
    lean = preset("icebreaker")
    assert lean.kernel_extract == "dense_int8"
    ProgramBuilder(lean).kernels(codes, fmt="int8")


# ---- lossless: the same outputs as raw kernels -------------------------------------------

LOSSLESS = [("sparse", "fp16"), ("sparse", "int8"), ("sparse", "mixed"), ("few", "fp16"),
            ("few", "int8"), ("few", "mixed"), ("digits", "fp16"), ("digits", "int8"),
            pytest.param("cnn", "fp16", marks=pytest.mark.slow)]


def _model(name):
    return {"sparse": sparse_model, "few": few_values_model, "cnn": small_cnn,
            "digits": lambda: onnx.load(str(DIGITS))}[name]()


@pytest.mark.parametrize("name,fmt", LOSSLESS)
def test_lossless_compression_gives_the_outputs_of_raw_kernels(name, fmt):
    model = _model(name)
    inputs = _inputs(model, 5)
    raw = _compile(model, fmt, inputs, raw_kernels=True)
    packed = _compile(model, fmt, inputs)
    a = run(raw.program, inputs, "golden").outputs
    b = run(packed.program, inputs, "golden").outputs
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    enc = {r["kernel_encoding"] for r in packed.plan if r["kernel_bytes"]}
    raw_enc = {r["kernel_encoding"] for r in raw.plan if r["kernel_bytes"]}
    assert all(e.startswith("raw") for e in raw_enc)
    before = sum(r["kernel_raw_bytes"] for r in packed.plan)
    after = sum(r["kernel_bytes"] for r in packed.plan)
    assert before == sum(r["kernel_bytes"] for r in raw.plan)
    assert after <= before
    if name == "sparse":
        assert all("sparse" in e for e in enc), enc
        assert after < 0.6 * before
    if name == "few":
        assert all("palette" in e for e in enc), enc
        # 4-bit indices are half an int8 weight, a quarter of a binary16 one (plus headers)
        assert after < (0.6 if fmt != "fp16" else 0.35) * before


# ---- lossy: --prune and --palette --------------------------------------------------------

def test_prune_zeroes_the_smallest_magnitudes():
    w = np.random.default_rng(0).standard_normal((6, 5, 3, 3)).astype(np.float32)
    p = prune(w, 0.5)
    n = int(round(0.5 * w.size))
    assert int((p == 0).sum()) == n
    kept = np.abs(w[p != 0])
    assert kept.min() >= np.abs(w[p == 0]).max()
    assert np.array_equal(p[p != 0], w[p != 0])


@pytest.mark.parametrize("coef_fp16", [False, True])
@pytest.mark.parametrize("bits", [1, 2, 4])
def test_palettize_beats_uniform_levels(coef_fp16, bits):
    """At most 2**bits distinct values; zeros stay zero; each weight is the nearest level;
    the squared error is at most that of 2**bits evenly spaced levels (k-means starts from
    them and Lloyd steps do not increase it)."""
    rng = np.random.default_rng(bits)
    w = rng.standard_normal((16, 8, 3, 3)) * (0.3 if coef_fp16 else 30)
    w[rng.random(w.shape) < 0.2] = 0
    codes = (w.astype(np.float16).view(np.uint16) if coef_fp16
             else np.clip(np.rint(w), -127, 127).astype(np.int8))
    vals = codes.view(np.float16).astype(np.float64) if coef_fp16 else codes.astype(np.float64)
    p = palettize(codes, bits, coef_fp16)
    pv = p.view(np.float16).astype(np.float64) if coef_fp16 else p.astype(np.float64)
    levels = np.unique(pv)
    assert len(levels) <= 1 << bits
    assert np.all(pv[vals == 0] == 0)
    nearest = levels[np.argmin(np.abs(vals.ravel()[:, None] - levels[None, :]), axis=1)]
    assert np.array_equal(np.abs(nearest - vals.ravel()), np.abs(pv.ravel() - vals.ravel()))
    uniform = np.linspace(vals.min(), vals.max(), 1 << bits)
    u = uniform[np.argmin(np.abs(vals.ravel()[:, None] - uniform[None, :]), axis=1)]
    assert ((pv.ravel() - vals.ravel()) ** 2).sum() <= 1.01 * ((u - vals.ravel()) ** 2).sum()


def _with_weights(model, transform):
    """``model`` with every Conv and Gemm weight initializer replaced by ``transform(w)``."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    weights = {node.input[1] for node in m.graph.node if node.op_type in ("Conv", "Gemm")}
    for init in m.graph.initializer:
        if init.name in weights:
            w = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array(transform(w).astype(np.float32), init.name))
    return m


def _pruned(w):
    """Magnitude pruning written out: zero the 50% smallest |w| of the layer."""
    flat = w.ravel().copy()
    n = int(round(0.5 * flat.size))
    flat[np.argsort(np.abs(flat), kind="stable")[:n]] = 0
    return flat.reshape(w.shape)


def _palettized(w):
    """The layer's weights in binary16, palettized to 16 levels (the lossy step; its own
    properties are tested above); as a Gemm weight ``(N, K)`` the layout is the compiler's."""
    return palettize(w.astype(np.float16).view(np.uint16), 4, True).view(np.float16)


@pytest.mark.parametrize("option", ["prune", "palette"])
def test_lossy_options_against_onnxruntime_with_the_same_weights(option):
    """``--prune 0.5`` and ``--palette 4`` on the digits CNN: the outputs are within the
    binary16 tolerance (``cases.REL_TOL``: the arithmetic is the plain fp16 path) of
    onnxruntime running the model whose weights were pruned / palettized the same way, so
    the program computes exactly with the smaller weights; and the kernels are smaller."""
    model = onnx.load(str(DIGITS))
    digits = load_train_module()
    x = digits.load_split()[2][:1]
    kw = {"prune": 0.5} if option == "prune" else {"palette": 4}
    compiled = compile_model(model, CFG, **kw)
    got = run(compiled.program, {"input": x}, "golden").outputs
    want = reference(_with_weights(model, _pruned if option == "prune" else _palettized),
                     {"input": x})
    for name, e in compare(got, want).items():
        assert e["rel_err"] <= REL_TOL and e["cosine"] >= COS_TOL, (name, e)
    enc = [r["kernel_encoding"] for r in compiled.plan if r["kernel_bytes"]]
    assert all(("sparse" if option == "prune" else "palette4") in e for e in enc), enc
    before = sum(r["kernel_raw_bytes"] for r in compiled.plan)
    assert sum(r["kernel_bytes"] for r in compiled.plan) < 0.7 * before


@pytest.mark.parametrize("kw,message", [
    ({"palette": 3}, "--palette must be one of 1, 2, 4, 6, 8"),
    ({"palette": 0}, "--palette must be one of"),
    ({"prune": 1.0}, "--prune must be a fraction in [0, 1)"),
    ({"prune": -0.1}, "--prune must be a fraction"),
])
def test_bad_compression_options(kw, message):
    with pytest.raises(CompileError, match=re.escape(message)):
        Compression(**kw)


# ---- CLI ---------------------------------------------------------------------------------

def test_cli_reports_encodings_and_bytes(tmp_path, capsys):
    path = tmp_path / "sparse.onnx"
    onnx.save(sparse_model(), str(path))
    capsys.readouterr()
    assert main(["compile", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    conv = [line for line in out if " Conv " in line or " Gemm " in line]
    assert len(conv) == 3 and all("kernels sparse fp16 " in line for line in conv), out
    total = [line for line in out if line.startswith("kernels: ")]
    assert len(total) == 1
    words = total[0].split()
    before, after = int(words[1]), int(words[5])
    rows = [line.split("kernels sparse fp16 ")[1].split() for line in conv]
    assert before == sum(int(r[0]) for r in rows) and after == sum(int(r[2]) for r in rows)
    assert after < before


@pytest.mark.parametrize("args,message", [
    (["--palette", "3"], "--palette must be one of 1, 2, 4, 6, 8"),
    (["--prune", "1.5"], "--prune must be a fraction"),
    (["--format", "mixed", "--preset", "ice40"], "has no fp16 datapath"),
])
def test_cli_bad_compression_options(args, message, tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(few_values_model(), str(path))
    for cmd in (["compile"], ["run"]):
        capsys.readouterr()
        assert main(cmd + [str(path)] + args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert message in err[-1] and "Traceback" not in "".join(err), err


def test_compile_and_run_take_the_same_compile_options():
    import argparse

    from npu_cli.compiler import add_commands
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    opts = {name: {o for a in sub.choices[name]._actions for o in a.option_strings}
            for name in ("compile", "run")}
    shared = {"--preset", "--format", "--calibration", "--palette", "--prune", "--fallback",
              "--mem-kib", "--shape"}
    assert shared <= opts["compile"] and shared <= opts["run"]


# ---- RTL ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name,fmt,encoding", [("sparse", "fp16", "sparse"),
                                               ("few", "int8", "palette")])
def test_compressed_kernels_rtl_equals_golden(name, fmt, encoding):
    model = _model(name)
    inputs = _inputs(model, 9, n=1)
    compiled = _compile(model, fmt, inputs)
    assert all(encoding in r["kernel_encoding"] for r in compiled.plan if r["kernel_bytes"])
    golden = run(compiled.program, inputs, "golden")
    rtl = run(compiled.program, inputs, "rtl")
    for k in golden.outputs:
        assert golden.outputs[k].tobytes() == rtl.outputs[k].tobytes(), k
