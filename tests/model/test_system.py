"""The golden system model (``npu_model.system``) on programs built by ``npu_model.builder``,
against direct compositions of the engine models."""

import time

import numpy as np
import pytest

from npu_model import planar as pl
from npu_model.builder import BuildError, ProgramBuilder
from npu_model.conv import ConvLayer, engine_output
from npu_model.kernel_codec import encode as kernel_encode
from npu_model.mac import FMT
from npu_model.postproc import PostprocConfig
from npu_model.system import read_tensor, run_program
from npu_spec import dma
from npu_spec.config import preset
from npu_spec.engine import Engine
from npu_spec.neural import best_log2w, make_layer
from npu_spec.postproc import Act
from npu_spec.program import Program, QueueSetup
from npu_spec.taskman import Cause

CFG = preset("small")


def _int8(rng, shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


def _int_params(rng, k, taps):
    bias = rng.integers(-(1 << 12), 1 << 12, k)
    scale = rng.integers(1 << 28, 1 << 30, k)
    shift = np.full(k, min(63, round(36.5 + 0.5 * np.log2(taps))))
    return bias, scale, shift


def direct_conv(x, w, bias, scale, shift, *, pad=0, stride=1, fmt="int8", act=0,
                out_fp16=False, lo=0, hi=0, stochastic=False, seed=1, config=CFG):
    """The neural engine's outputs from the engine model (``npu_model.conv.engine_output``,
    result order and per-beat post-processing), without any program."""
    c, h, wd = x.shape
    k, _, kh, kw = w.shape
    layer = ConvLayer(c, h, wd, k, kh, kw, stride=stride, pad=pad, fmt=fmt)
    coef_fp16 = fmt in ("fp16", "i8f16")
    groups = [kernel_encode(w[b:b + config.acc_slots], coef_fp16=coef_fp16, sparse=False,
                            palette_bits=0, bias=bias[b:b + config.acc_slots],
                            scale=scale[b:b + config.acc_slots],
                            shift=shift[b:b + config.acc_slots])
              for b in range(0, k, config.acc_slots)]
    post = PostprocConfig(out_fp16=out_fp16, act=act, lo=lo, hi=hi, stochastic=stochastic,
                          seed=seed)
    fields = make_layer(fmt=FMT[fmt], log2w=best_log2w(config, layer.out_width, kw, stride),
                        groups=1, icpg=c, ocpg=k, in_h=h, in_w=wd, out_h=layer.out_height,
                        out_w=layer.out_width, kh=kh, kw=kw, stride=stride, pad=pad)
    weights = np.concatenate([g.weights for g in groups])
    out, _ = engine_output(layer, config, fields, x, weights, np.asarray(bias, np.uint32),
                           np.asarray(scale, np.uint32), np.asarray(shift), post, groups)
    return out


def _as_int8(values16):
    return (np.asarray(values16) & 0xFF).astype(np.uint8).view(np.int8)


def test_conv_relu_pool_equals_the_engine_models():
    rng = np.random.default_rng(7)
    x = _int8(rng, (5, 11, 9))
    w = _int8(rng, (12, 5, 3, 3))
    bias, scale, shift = _int_params(rng, 12, 45)
    b = ProgramBuilder(CFG)
    xd = b.load(b.input("x", x))
    placement = b.dma_kernels(0, b.kernels(w, bias=bias, scale=scale, shift=shift))
    y = b.conv(xd, placement, pad=1)
    r = b.relu(y)
    p = b.max_pool(r, 2)
    b.store(p, b.output("out", p.shape))
    program = b.build()
    assert [t.dep for t in b.tasks] == [0, 0, 1, 1, 0, 1]
    res = run_program(program)
    assert [q.completed for q in res.queues] == [6] and not res.queues[0].retired

    conv = _as_int8(direct_conv(x, w, bias, scale, shift, pad=1))
    expect = pl.pool(pl.eltwise("relu", conv), "max", 2, 2, 2, 2)
    got = read_tensor(res.memory, program.tensor("out"))
    assert got.dtype == np.int8 and got.shape == expect.shape == (12, 5, 4)
    np.testing.assert_array_equal(got, expect)
    # The builder's convenience chain builds the same program.
    b2 = ProgramBuilder(CFG)
    p2 = b2.conv_relu_pool(b2.load(b2.input("x", x)), w, bias=bias, scale=scale, shift=shift,
                           pad=1)
    b2.store(p2, b2.output("out", p2.shape))
    prog2 = b2.build()
    np.testing.assert_array_equal(
        read_tensor(run_program(prog2).memory, prog2.tensor("out")), expect)


@pytest.mark.parametrize("stochastic", [False, True])
def test_fp16_conv_equals_the_engine_model(stochastic):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 6, 7))).astype(np.float16).view(np.uint16)
    w = (rng.standard_normal((9, 3, 3, 3)) * 0.25).astype(np.float16).view(np.uint16)
    bias = np.asarray(rng.standard_normal(9), np.float32).view(np.uint32)
    scale = np.asarray(rng.random(9) * 0.5 + 0.25, np.float32).view(np.uint32)
    shift = np.zeros(9, np.int64)
    b = ProgramBuilder(CFG)
    xd = b.load(b.input("x", x, fmt="fp16"))
    placement = b.dma_kernels(0, b.kernels(w, bias=bias, scale=scale, shift=shift, fmt="fp16"))
    y = b.conv(xd, placement, stride=2, pad=1, stochastic=stochastic, seed=12345)
    b.store(y, b.output("y", y.shape, "fp16"))
    program = b.build()
    res = run_program(program)
    expect = direct_conv(x, w, bias, scale, shift, pad=1, stride=2, fmt="fp16", out_fp16=True,
                         lo=0xFF800000, hi=0x7F800000, stochastic=stochastic, seed=12345)
    np.testing.assert_array_equal(read_tensor(res.memory, program.tensor("y")), expect)


def test_residual_block():
    rng = np.random.default_rng(11)
    x = _int8(rng, (8, 10, 10))
    w1, w2 = _int8(rng, (8, 8, 3, 3)), _int8(rng, (8, 8, 3, 3))
    p1, p2 = _int_params(rng, 8, 72), _int_params(rng, 8, 72)
    b = ProgramBuilder(CFG)
    xd = b.load(b.input("x", x))
    k1 = b.dma_kernels(0, b.kernels(w1, bias=p1[0], scale=p1[1], shift=p1[2]))
    k2 = b.dma_kernels(0, b.kernels(w2, bias=p2[0], scale=p2[1], shift=p2[2]))
    h1 = b.conv(xd, k1, pad=1, act="relu")
    h2 = b.conv(h1, k2, pad=1)
    s = b.add(h2, xd)
    out = b.relu(s)
    b.store(out, b.output("out", out.shape))
    program = b.build()
    res = run_program(program)
    assert res.queues[0].completed == len(b.tasks)

    a1 = _as_int8(direct_conv(x, w1, *p1, pad=1, act=Act.RELU, lo=0x80, hi=0x7F))
    a2 = _as_int8(direct_conv(a1, w2, *p2, pad=1, lo=0x80, hi=0x7F))
    expect = pl.eltwise("relu", pl.eltwise("add", a2, x))
    np.testing.assert_array_equal(read_tensor(res.memory, program.tensor("out")), expect)


def _dma_program(transfers, init=None):
    """A program of raw DMA tasks; ``init`` bytes at the start of memory."""
    b = ProgramBuilder(CFG)
    if init is not None:
        b.memory[:len(init)] = np.frombuffer(bytes(init), np.uint8)
        b._mem.alloc(len(init))
    for t in transfers:
        b.dma(t)
    return b.build()


def test_dma_every_direction_and_format():
    data = bytes(range(0x70, 0x90)) + bytes(range(32))     # 64 bytes; 0x80.. negative
    t = [
        # 16 int8 bytes (0x78..0x87) -> buffer 100.. (sign-extended)
        dma.make_transfer(dir=dma.DmaDir.MEM_TO_BUF, fmt=dma.DmaFormat.INT8, mem_addr=8,
                          buf_addr=100, sizes=[16], mem_strides=[1], buf_strides=[1]),
        # 8 halves -> buffer 200.., transposed 2 x 4 (rows of the buffer are memory columns)
        dma.make_transfer(dir=dma.DmaDir.MEM_TO_BUF, fmt=dma.DmaFormat.HALF, mem_addr=32,
                          buf_addr=200, sizes=[4, 2], mem_strides=[2, 8], buf_strides=[2, 1]),
        # 4 words -> kernel memory 10..
        dma.make_transfer(dir=dma.DmaDir.MEM_TO_KMEM, fmt=dma.DmaFormat.WORD, core=0,
                          mem_addr=48, buf_addr=10, sizes=[4], mem_strides=[4],
                          buf_strides=[1]),
        # buffer 100..115 -> memory 64.. as int8 (low bytes), reversed
        dma.make_transfer(dir=dma.DmaDir.BUF_TO_MEM, fmt=dma.DmaFormat.INT8, mem_addr=64 + 15,
                          buf_addr=100, sizes=[16], mem_strides=[-1], buf_strides=[1]),
        # buffer 200..207 -> memory 96.. as halves
        dma.make_transfer(dir=dma.DmaDir.BUF_TO_MEM, fmt=dma.DmaFormat.HALF, mem_addr=96,
                          buf_addr=200, sizes=[8], mem_strides=[2], buf_strides=[1]),
    ]
    program = _dma_program(t, data + bytes(64))
    res = run_program(program)
    assert [(r.engine, r.code) for r in res.tasks] == [(Engine.DMA, 0)] * 5
    sext = np.frombuffer(data[8:24], np.int8).astype(np.int16).view(np.uint16)
    np.testing.assert_array_equal(res.buffer[100:116], sext)
    assert res.buffer[107] == 0x007F and res.buffer[108] == 0xFF80
    halves = np.frombuffer(data[32:48], "<u2")
    np.testing.assert_array_equal(res.buffer[200:208], halves.reshape(2, 4).T.ravel())
    np.testing.assert_array_equal(res.kernel_memories[0][10:14],
                                  np.frombuffer(data[48:64], "<u4"))
    mem = np.frombuffer(res.memory, np.uint8)
    np.testing.assert_array_equal(mem[64:80], np.frombuffer(data[8:24], np.uint8)[::-1])
    assert mem[80] == 0                    # the int8 store wrote one byte an element
    np.testing.assert_array_equal(mem[96:112].view("<u2"), halves.reshape(2, 4).T.ravel())


def test_dma_outside_the_window_retires_the_queue():
    rng = np.random.default_rng(5)
    x = _int8(rng, (2, 4, 4))
    b = ProgramBuilder(CFG, base=64)
    xd = b.load(b.input("x", x))
    limit_bytes = CFG.mem_kib * 1024 - 4 * 64
    b.dma(dma.make_transfer(dir=dma.DmaDir.BUF_TO_MEM, fmt=dma.DmaFormat.HALF,
                            mem_addr=limit_bytes, buf_addr=xd.addr, sizes=[1],
                            mem_strides=[0], buf_strides=[0]))
    b.store(xd, b.output("y", x.shape))
    program = b.build()
    res = run_program(program)
    q = res.queues[0]
    assert (q.retired, q.cause, q.engine, q.code) == (True, Cause.ENGINE, Engine.DMA,
                                                       dma.DmaError.WINDOW)
    assert q.completed == 1 and [r.code for r in res.tasks] == [0, dma.DmaError.WINDOW]
    initial = program.memory + bytes(CFG.mem_kib * 1024 - len(program.memory))
    assert res.memory == initial


def test_descriptor_errors_and_queue_order():
    b = ProgramBuilder(CFG, network=3)
    x = b.input("x", np.zeros((1, 1, 4), np.int8))
    b.load(x)
    program = b.build()
    q = program.queues[0]
    # Queue 1 (priority 5) runs before queue 0; queue 2 has the wrong network ID.
    queues = (q, QueueSetup(1, 5, 3, 0, q.head, q.tail, 1), QueueSetup(2, 9, 4, 0, q.head,
                                                                        q.tail, 1))
    res = run_program(Program(CFG, program.base_table, queues, program.tensors,
                              program.memory))
    assert [r.queue for r in res.tasks] == [1, 0]
    assert res.queue(2).retired and res.queue(2).cause == Cause.DECODE
    assert res.queue(2).address == q.head and res.queue(2).completed == 0


def test_planar_dataset_too_short_times_out():
    b = ProgramBuilder(CFG)
    a = b.load(b.input("a", np.ones((2, 3, 5), np.int8)))
    short = b.buffer((1, 3, 5))
    b.add(a, short)                     # B has one plane, the task two: the engine waits
    b.store(a, b.output("y", a.shape))  # not run: the queue is retired
    res = run_program(b.build())
    q = res.queues[0]
    assert (q.retired, q.cause, q.engine, q.completed) == (True, Cause.TIMEOUT, Engine.PLANAR,
                                                           1)
    assert [r.code for r in res.tasks] == [0, None]


def test_memory_size_check_names_the_size():
    b = ProgramBuilder(CFG.replace(mem_kib=1))
    with pytest.raises(BuildError, match=r"at least 2048 bytes \(2 KiB\).*mem_kib=1"):
        b.input("x", np.zeros(2048, np.int8))


def test_dependencies():
    b = ProgramBuilder(CFG)
    a = b.load(b.input("a", np.ones((1, 4, 4), np.int8)))           # 0 DMA
    k = b.dma_kernels(0, b.kernels(np.ones((1, 1, 1, 1), np.int8), scale=1 << 30, shift=30))
    y = b.conv(a, k)                                                 # 2 NE: waits for 1 (and 0)
    r = b.relu(a)                                                    # 3 PE: waits for 0
    b.planar(r, out=a, mode="eltwise", op="copy")                    # 4 PE: overwrites a, read
    assert [t.dep for t in b.tasks] == [0, 0, 1, 3, 2]               # by the NE (2)
    c = b.load(b.input("c", np.ones((1, 4, 4), np.int8)))            # 5 DMA
    b.add(y, c)             # 6 PE: waits for the DMA (5); the PE's task 4 waited for the NE
    assert b.tasks[-1].dep == 1

    b = ProgramBuilder(CFG)
    a = b.load(b.input("a", np.ones((1, 4, 4), np.int8)))           # 0 DMA
    k = b.dma_kernels(0, b.kernels(np.ones((1, 1, 1, 1), np.int8), scale=1 << 30, shift=30))
    y = b.conv(a, k)                                                 # 2 NE
    c = b.load(b.input("c", np.ones((1, 4, 4), np.int8)))            # 3 DMA
    b.add(y, c)             # 4 PE needs the NE's y (2) and the DMA's c (3): neither waits, so
    assert [t.dep for t in b.tasks] == [0, 0, 1, 1, 1]   # the DMA (3) is made to wait for 2

    b = ProgramBuilder(CFG)
    a = b.load(b.input("a", np.ones((1, 4, 4), np.int8)))           # 0 DMA
    k = b.dma_kernels(0, b.kernels(np.ones((1, 1, 1, 1), np.int8), scale=1 << 30, shift=30))
    b.conv(a, k)                                                     # 2 NE waits for 1
    e = b.load(b.input("e", np.ones((1, 4, 4), np.int8)))            # 3 DMA
    b.relu(e)                                                        # 4 PE waits for 3
    with pytest.raises(BuildError, match="two other engines"):
        # Reads everything: needs the NE (2) and the PE (4); the PE's task already waits
        # for the DMA (3), which does not cover the NE.
        b.dma(dma.make_transfer(dir=0, fmt=0, mem_addr=0, buf_addr=0, sizes=[1],
                                mem_strides=[1], buf_strides=[1]))


def test_ten_layers_in_under_two_seconds(capsys):
    rng = np.random.default_rng(1)
    b = ProgramBuilder(CFG)
    h = b.load(b.input("x", _int8(rng, (16, 32, 32))))
    for _ in range(10):
        bias, scale, shift = _int_params(rng, 16, 144)
        k = b.dma_kernels(0, b.kernels(_int8(rng, (16, 16, 3, 3)), bias=bias, scale=scale,
                                       shift=shift))
        y = b.conv(h, k, pad=1, act="relu")
        b.release(h)
        h = y
    b.store(h, b.output("y", h.shape))
    program = b.build()
    # CPU time of this process, not wall time: the figure must not depend on the machine's
    # other load (the limit is twice the 2 s goal).
    t0 = time.process_time()
    res = run_program(program)
    seconds = time.process_time() - t0
    with capsys.disabled():
        print(f"\n10 layers of 16x32x32 (3x3, int8): run_program {seconds:.3f} s of CPU")
    assert res.queues[0].completed == 22
    assert seconds < 4.0


def _run_variants(x, lean, variants, task):
    """Run ``task(builder, loaded x, arg)`` for each ``(name, config, arg)`` of ``variants``
    on the golden system model; the last variant is built for its own config but run on
    ``lean`` (a task the lean build does not compute). ``{name: (result, y)}``."""
    import dataclasses

    outs = {}
    for i, (name, config, arg) in enumerate(variants):
        b = ProgramBuilder(config)
        y = task(b, b.load(b.input("x", x)), arg)
        b.store(y, b.output("y", y.shape))
        program = b.build()
        if i == len(variants) - 1:
            program = dataclasses.replace(program, config=lean)
        res = run_program(program)
        outs[name] = (res, read_tensor(res.memory, program.tensor("y")))
    return outs


def test_integer_planar_engine_build():
    """With ``planar_impl="int8"`` the builder refuses planar tasks outside the integer
    build's subset (``npu_spec.planar.int8_supported``), max pooling and ReLU run as on the
    binary32 build, and an average pooling (built for the binary32 engine) ends with the
    engine error UNSUPPORTED on the golden model, the queue retired."""
    from npu_spec.planar import PlanarError

    lean = preset("icebreaker")
    full = lean.replace(planar_impl="float")
    rng = np.random.default_rng(12)
    x = _int8(rng, (3, 6, 7))
    pool = {"mode": "pool", "kh": 3, "kw": 3, "sy": 2, "sx": 2, "py": 1, "px": 1}
    for fields in ({**pool, "op": "avg"}, {"mode": "eltwise", "op": "mul"},
                   {"mode": "eltwise", "op": "gain_bias", "scale": 0.5},
                   {"mode": "reduce", "op": "sum", "scale": 1 / 42}):
        b = ProgramBuilder(lean)
        with pytest.raises(BuildError, match="does not compute this task .* UNSUPPORTED"):
            b.planar(b.load(b.input("x", x)), **fields)
    outs = _run_variants(x, lean, (("full", full, "max"), ("lean", lean, "max"),
                                   ("avg", full, "avg")),
                         lambda b, xd, op: b.planar(b.relu(xd), **pool, op=op))
    np.testing.assert_array_equal(outs["full"][1], outs["lean"][1])
    assert not outs["lean"][0].queues[0].retired
    q = outs["avg"][0].queues[0]
    assert (q.retired, q.cause, q.engine, q.code) == (True, Cause.ENGINE, Engine.PLANAR,
                                                      PlanarError.UNSUPPORTED)


def test_dense_int8_extractor_build():
    """With ``kernel_extract="dense_int8"`` the builder refuses other kernel encodings, dense
    int8 layers run as on the full build, and a sparse layer (built for the full extractor)
    ends with the engine error EXTRACT on the golden model."""
    from npu_spec.neural import NeuralError

    ice40 = preset("ice40")
    dense = ice40.replace(kernel_extract="dense_int8")
    rng = np.random.default_rng(9)
    x = _int8(rng, (3, 6, 6))
    w = _int8(rng, (4, 3, 3, 3))
    w[w % 3 == 0] = 0
    bias, scale, shift = _int_params(rng, 4, 27)
    with pytest.raises(BuildError, match="dense_int8"):
        ProgramBuilder(dense).kernels(w, sparse=True)
    with pytest.raises(BuildError, match="dense_int8"):
        ProgramBuilder(dense).kernels(w, palette_bits=4)
    outs = _run_variants(x, dense, (("full", ice40, False), ("dense", dense, False),
                                    ("sparse", ice40, True)),
                         lambda b, xd, sparse: b.conv(xd, b.dma_kernels(0, b.kernels(
                             w, bias=bias, scale=scale, shift=shift, sparse=sparse)), pad=1))
    np.testing.assert_array_equal(outs["full"][1], outs["dense"][1])
    assert not outs["dense"][0].queues[0].retired
    q = outs["sparse"][0].queues[0]
    assert (q.retired, q.cause, q.engine, q.code) == (True, Cause.ENGINE, Engine.NEURAL,
                                                      NeuralError.EXTRACT)
