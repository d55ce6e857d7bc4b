# amaranth: UnusedElaboratable=no
"""Kernel extract (npu.neural.kernel_extract) against the codec's golden model
(npu_model.kernel_codec): beats and params bit for bit, errors, throughput."""

import dataclasses

import numpy as np
import pytest
from amaranth.sim import Simulator

from npu.neural.kernel_extract import KernelError, kernel_extractor
from npu.neural.layouts import coef_beat_layout, param_beat_layout
from npu_model import kernel_codec as kc
from npu_sim.streams import seeded_rng, stream_put
from npu_spec.config import NPUConfig, preset


def unpack(layout, word):
    return {name: (word >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


@dataclasses.dataclass
class Op:
    """One start of the extractor: ``part`` "header" or "body", the config and the bytes."""
    part: str
    config: kc.KernelConfig
    data: bytes
    words: list = None

    def __post_init__(self):
        if self.words is None:
            self.words = kc.word_stream(self.data)


@dataclasses.dataclass
class Outcome:
    params: list
    beats: list
    done: int
    error: int
    code: int
    cycles: int


def run(config, ops, *, seed=0, stall=0.3, out_stall=None, gap=True):
    """Run ``ops`` in order on a KernelExtract; returns one :class:`Outcome` per op.

    ``cycles`` counts from the cycle after the start pulse to the cycle busy falls.
    """
    dut = kernel_extractor(config)
    slots = config.acc_slots
    out_stall = stall if out_stall is None else out_stall
    coef_layout = coef_beat_layout(slots)
    param_layout = param_beat_layout(slots)
    queues = {"header": [], "body": []}
    finished = False
    got = {"params": [], "coefs": []}
    outcomes = []

    def producer(part):
        stream = getattr(dut, part)

        async def tb(ctx):
            rng = seeded_rng(seed, part)
            while not finished:
                if not queues[part]:
                    await ctx.tick()
                    continue
                word, last = queues[part].pop(0)
                await stream_put(ctx, stream, word | (last << 32), rng, stall)
        return tb

    def consumer(name, layout):
        stream = getattr(dut, name)

        async def tb(ctx):
            rng = seeded_rng(seed, name)
            while not finished:
                ready = not (out_stall and rng.random() < out_stall)
                ctx.set(stream.ready, ready)
                _, _, valid, word = await ctx.tick().sample(stream.valid,
                                                            stream.payload.as_value())
                if valid and ready:
                    got[name].append(unpack(layout, word))
        return tb

    async def controller(ctx):
        nonlocal finished
        rng = seeded_rng(seed, "controller")
        for op in ops:
            ctx.set(dut.cfg, op.config.as_dict())
            for _ in range(rng.randrange(3) if gap else 0):
                await ctx.tick()
            start = dut.start_header if op.part == "header" else dut.start_body
            ctx.set(start, 1)
            queues[op.part].extend(op.words)
            await ctx.tick()
            ctx.set(start, 0)
            cycles = 0
            while True:
                cycles += 1
                if not ctx.get(dut.busy):
                    break
                await ctx.tick()
                assert cycles < 20000 + 20 * len(op.words), "extractor hangs"
            status = ctx.get(dut.done), ctx.get(dut.error), ctx.get(dut.error_code).value
            # A beat accepted on the edge busy fell at may be recorded after this testbench
            # ran: give the consumers one cycle.
            await ctx.tick()
            outcomes.append(Outcome(got["params"][:], got["coefs"][:], *status, cycles))
            got["params"].clear()
            got["coefs"].clear()
            assert not queues[op.part], "part not consumed to its last word"
        finished = True

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(controller)
    for part in ("header", "body"):
        sim.add_testbench(producer(part))
    sim.add_testbench(consumer("params", param_layout))
    sim.add_testbench(consumer("coefs", coef_layout))
    sim.run()
    return outcomes


def expected_params(header, cfg):
    p = kc.parse_header(header, cfg)
    return [{"slot": o, "bias": int(p.bias[o]), "scale": int(p.scale[o]),
             "shift": int(p.shift[o]), "group_last": int(o == cfg.ocg - 1)}
            for o in range(cfg.ocg)]


def expected_beats(header, body, cfg):
    return [b._asdict() for b in kc.beats(header, body, cfg)]


def random_encoded(rng, slots, *, coef_fp16, sparse, bits, sparsity, shape=None):
    if shape is None:
        shape = (int(rng.integers(1, slots + 1)), int(rng.integers(1, 5)),
                 int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    if coef_fp16:
        w = rng.normal(0, 1, size=shape).astype(np.float16).view(np.uint16)
        zero = rng.choice(np.array([0, 0x8000], np.uint16), size=shape)
    else:
        w = rng.integers(-128, 128, size=shape).astype(np.int8)
        zero = np.zeros(shape, np.int8)
    if bits and rng.random() < 0.5:  # few distinct values: some lossless palettes
        w = rng.choice(w.ravel()[: 1 << bits], size=shape)
    w = np.where(rng.random(shape) < sparsity, zero, w)
    ocg = shape[0]
    return kc.encode(w, coef_fp16=coef_fp16, sparse=sparse, palette_bits=bits,
                     bias=rng.integers(0, 1 << 32, ocg), scale=rng.integers(0, 1 << 32, ocg),
                     shift=rng.integers(0, 64, ocg))


def group_ops(enc, replays=2):
    ops = [Op("header", enc.config, enc.header)]
    ops += [Op("body", enc.config, enc.body) for _ in range(replays)]
    return ops


def check_groups(config, encs, *, seed, stall=0.3, replays=2):
    ops = [op for enc in encs for op in group_ops(enc, replays)]
    outs = run(config, ops, seed=seed, stall=stall)
    for op, out in zip(ops, outs):
        assert (out.done, out.error, out.code) == (1, 0, 0), (op.part, op.config, out)
        if op.part == "header":
            assert out.params == expected_params(op.data, op.config)
            assert out.beats == []
            header = op.data
        else:
            assert out.beats == expected_beats(header, op.data, op.config), op.config
            assert out.params == []
    return outs


ENCODINGS = [(sparse, bits) for sparse in (False, True) for bits in (0, 1, 2, 4, 6, 8)]


@pytest.mark.parametrize("coef_fp16", [False, True], ids=["int8", "fp16"])
def test_random_groups(coef_fp16):
    """Every encoding and index width, sparsity 0-100%, odd shapes, random stalls, each body
    replayed after its header."""
    config = preset("small")
    rng = np.random.default_rng(11 + coef_fp16)
    encs = []
    for k, (sparse, bits) in enumerate(ENCODINGS):
        sparsity = [0.0, 0.5, 0.9, 1.0, 0.3, 0.7][k % 6]
        encs.append(random_encoded(rng, config.acc_slots, coef_fp16=coef_fp16, sparse=sparse,
                                   bits=bits, sparsity=sparsity))
    check_groups(config, encs, seed=int(coef_fp16))


def test_other_configs():
    """Three slots (non-power-of-two) and the int8-only ice40 build."""
    rng = np.random.default_rng(5)
    cfg3 = NPUConfig(macs=4, acc_slots=3, formats=("int8", "fp16", "mixed"))
    encs = [random_encoded(rng, 3, coef_fp16=bool(i % 2), sparse=bool(i // 2 % 2),
                           bits=(0, 4, 1, 6)[i], sparsity=0.4) for i in range(4)]
    check_groups(cfg3, encs, seed=3, replays=1)
    one = NPUConfig(macs=2, acc_slots=1, formats=("int8", "fp16", "mixed"))
    encs = [random_encoded(rng, 1, coef_fp16=bool(i % 2), sparse=bool(i // 2), bits=(0, 2)[i % 2],
                           sparsity=0.5) for i in range(3)]
    check_groups(one, encs, seed=5, replays=1)
    ice40 = preset("ice40")
    encs = [random_encoded(rng, 8, coef_fp16=False, sparse=bool(i % 2), bits=(0, 2, 8, 0)[i],
                           sparsity=0.5) for i in range(4)]
    check_groups(ice40, encs, seed=4, replays=1)


def test_directed_shapes():
    """1x1 kernels with one channel (the adder carries 8 positions into ic), 16x16 kernels,
    a single position, a lone nonzero at the very end."""
    config = preset("small")
    rng = np.random.default_rng(2)
    encs = []
    w = rng.integers(-5, 6, size=(1, 19, 1, 1)).astype(np.int8)
    encs.append(kc.encode(w, coef_fp16=False, sparse=True, palette_bits=0))
    encs.append(kc.encode(w, coef_fp16=False, sparse=False, palette_bits=4))
    w = rng.integers(-2, 3, size=(2, 1, 16, 16)).astype(np.int8)
    encs.append(kc.encode(w, coef_fp16=False, sparse=True, palette_bits=2))
    encs.append(kc.encode(np.array([[[[7]]]], np.int8), coef_fp16=False, sparse=False,
                          palette_bits=0))
    w = np.zeros((8, 3, 3, 3), np.int8)
    w[7, 2, 2, 2] = -1
    encs.append(kc.encode(w, coef_fp16=False, sparse=True, palette_bits=0))
    encs.append(kc.encode(w, coef_fp16=False, sparse=False, palette_bits=6))
    check_groups(config, encs, seed=9, stall=0.2, replays=1)


def _cfg(enc, **changes):
    return dataclasses.replace(enc.config, **changes)


def _word_bytes(words):
    return b"".join(int(w).to_bytes(4, "little") for w, _ in words)


def test_errors():
    """Every error code, each followed by a clean header and body (the golden model gives the
    expected code of every malformed part)."""
    config = preset("small")
    rng = np.random.default_rng(4)
    w = rng.integers(-3, 4, size=(3, 2, 3, 3)).astype(np.int8)
    w[1] = 0
    w[0, 0, 0, 0] = 0
    good = kc.encode(w, coef_fp16=False, sparse=True, palette_bits=2)
    raw = kc.encode(w, coef_fp16=False, sparse=False, palette_bits=0)
    codes = np.where(w == 0, 0, 0x3C00 + w.astype(np.int64) + 8).astype(np.uint16)
    fp = kc.encode(codes, coef_fp16=True, sparse=False, palette_bits=0)
    h, b = good.header, good.body
    cases = []

    def case(part, cfg, data, code, header=None):
        cases.append((Op(part, cfg, data), code, header))

    for bad in (_cfg(good, palette=3), _cfg(good, icg=0), _cfg(good, kh=0), _cfg(good, kw=17),
                _cfg(good, ocg=0), _cfg(good, ocg=9)):
        case("header", bad, h, "bad_config")
        case("body", bad, b, "bad_config")
    case("header", good.config, h[:-4], "early_end")
    case("header", good.config, h[:12], "early_end")
    case("header", good.config, h + bytes(8), "trailing")
    case("header", raw.config, raw.header + bytes(4), "trailing")
    for byte, value in ((9, 1), (8, 64), (33, 0x80)):
        bad = bytearray(h)
        bad[byte] = value
        case("header", good.config, bytes(bad), "reserved")
    case("body", good.config, b[:-4], "early_end", h)
    case("body", good.config, b + bytes(4), "trailing", h)
    case("body", raw.config, raw.body + bytes(12), "trailing", raw.header)
    case("body", raw.config, raw.body[:8], "early_end", raw.header)
    for delta in (-1, 1, -int(good.nnz[0])):
        bad = bytearray(h)
        bad[10] = (bad[10] + delta) % 256
        case("body", good.config, b, "nnz_mismatch", bytes(bad))
    # A channel with nnz 0 in the header but a nonzero in the body.
    bad = bytearray(raw.header)
    bad[10:12] = bytes(2)
    case("body", raw.config, raw.body, "nnz_mismatch", bytes(bad))
    # A bitmap bit set on a zero value (the encoder never does it) is no error and no beat.
    odd = kc.KernelConfig(False, True, 0, 1, 1, 2, 1)
    odd_header = kc.encode(np.array([[[[0, 5]]]], np.int8), coef_fp16=False, sparse=True,
                           palette_bits=0).header
    assert kc.beats(odd_header, bytes([0b11, 0, 5, 0]), odd) == [kc.Beat(5, 0, 0, 0, 1, 1, 1, 0)]
    case("body", odd, bytes([0b11, 0, 5, 0]), "none", odd_header)
    # Bitmap bits beyond the end of the final chunk are ignored.
    assert kc.beats(odd_header, bytes([0b1111_0010, 5, 0, 0]), odd) == [
        kc.Beat(5, 0, 0, 0, 1, 1, 1, 0)]
    case("body", odd, bytes([0b1111_0010, 5, 0, 0]), "none", odd_header)
    ops, codes = [], []
    for op, code, header in cases:
        if header is not None:
            ops.append(Op("header", op.config, header))
            codes.append(None)
        ops.append(op)
        codes.append(code)
        for clean in (Op("header", fp.config, fp.header), Op("body", fp.config, fp.body)):
            ops.append(clean)
            codes.append("none")
    # The golden model agrees on every code.
    for i, (op, code) in enumerate(zip(ops, codes)):
        if code in (None, "none"):
            continue
        hdr = next((o.data for o in reversed(ops[:i]) if o.part == "header"), None)
        with pytest.raises(kc.KernelFormatError) as info:
            if op.part == "header":
                kc.parse_header(op.data, op.config, slots=config.acc_slots)
            else:
                kc.beats(hdr, op.data, op.config, slots=config.acc_slots)
        assert info.value.code == code, (op.part, op.config, code)
    outs = run(config, ops, seed=2, stall=0.3)
    prev_header = None
    seen = set()
    for i, (op, code, out) in enumerate(zip(ops, codes, outs)):
        if code is None:
            assert (out.done, out.error) == (1, 0)
            prev_header = op.data
        elif code == "none":
            assert (out.done, out.error, out.code) == (1, 0, 0)
            if op.part == "header":
                prev_header = op.data
                assert out.params == expected_params(op.data, op.config), (i, ops[i - 1])
            else:
                assert out.beats == expected_beats(prev_header, op.data, op.config), i
        else:
            assert (out.done, out.error, out.code) == (0, 1, kc.ERRORS[code]), (op, out)
            assert KernelError(out.code).name.lower() == code
            seen.add(code)
    assert seen == set(kc.ERRORS) - {"none"}


def test_fp16_in_int8_build():
    rng = np.random.default_rng(1)
    enc = random_encoded(rng, 8, coef_fp16=True, sparse=False, bits=0, sparsity=0.2)
    ok = random_encoded(rng, 8, coef_fp16=False, sparse=True, bits=4, sparsity=0.2)
    ops = [Op("header", enc.config, enc.header), Op("body", enc.config, enc.body)]
    ops += group_ops(ok, 1)
    outs = run(preset("ice40"), ops, seed=1)
    for out in outs[:2]:
        assert (out.done, out.error, out.code) == (0, 1, KernelError.BAD_CONFIG.value)
    assert outs[3].beats == expected_beats(ok.header, ok.body, ok.config)


def _stated_cycles(enc):
    """Cycles the body walk needs by the stated rates: dense, one per position; sparse,
    max(1, k) per chunk of k nonzeros; plus a hold beat per zero channel."""
    cfg = enc.config
    scan = ~kc.is_zero(enc.weights, cfg.coef_fp16).transpose(1, 2, 3, 0).reshape(-1)
    holds = int(np.sum(enc.nnz == 0))
    if not cfg.sparse:
        return len(scan) + holds
    return holds + sum(max(1, int(scan[c:c + kc.CHUNK].sum()))
                       for c in range(0, len(scan), kc.CHUNK))


#: Cycles of a body besides the walk: start, two setup cycles, three pipeline stages, output
#: register, done.
BODY_OVERHEAD = 8


@pytest.mark.parametrize("coef_fp16", [False, True], ids=["int8", "fp16"])
def test_throughput(coef_fp16):
    """Dense raw: one position per cycle; sparse (raw and 4-bit palettized): max(1, k)
    cycles per chunk of k nonzeros; no stalls anywhere."""
    rng = np.random.default_rng(8)
    encs = [random_encoded(rng, 8, coef_fp16=coef_fp16, sparse=sparse, bits=bits,
                           sparsity=sparsity, shape=(8, 6, 3, 3))
            for sparse, bits, sparsity in ((False, 0, 0.0), (False, 0, 0.5), (True, 0, 0.5),
                                           (True, 4, 0.8), (True, 0, 1.0), (False, 8, 0.0))]
    ops = [op for enc in encs for op in group_ops(enc, 1)]
    outs = run(preset("small"), ops, seed=0, stall=0.0, gap=False)
    for enc, out in zip(encs, outs[1::2]):
        assert out.beats == expected_beats(enc.header, enc.body, enc.config)
        stated = _stated_cycles(enc)
        assert stated <= out.cycles <= stated + BODY_OVERHEAD, (enc.config, stated, out.cycles)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_random_sweep(seed):
    """Larger random sweep: random configs, all encodings, ocg 1..slots, random stalls."""
    rng = np.random.default_rng(1000 + seed)
    config = [preset("small"), NPUConfig(macs=4, acc_slots=5), preset("ice40"),
              NPUConfig(macs=4, acc_slots=16, formats=("fp16",))][seed % 4]
    encs = []
    for _ in range(16):
        coef_fp16 = (bool(rng.integers(2)) and config.has_fp16) or not config.has_int8
        sparse, bits = ENCODINGS[rng.integers(len(ENCODINGS))]
        shape = (int(rng.integers(1, config.acc_slots + 1)), int(rng.integers(1, 9)),
                 int(rng.integers(1, 6)), int(rng.integers(1, 6)))
        encs.append(random_encoded(rng, config.acc_slots, coef_fp16=coef_fp16,
                                   sparse=sparse, bits=bits, sparsity=float(rng.random()),
                                   shape=shape))
    check_groups(config, encs, seed=seed, stall=float(rng.choice([0.0, 0.3, 0.6])),
                 replays=int(rng.integers(1, 4)))
