# amaranth: UnusedElaboratable=no
"""The data processor with real engines: a neural engine core and the planar engine on the
buffer, loaded and read back through the DMA ports, programmed only by register writes, against
the golden model bit for bit."""

import numpy as np
import pytest

from npu.dataproc.dataproc import DataProcessor, register_map
from npu.neural.engine import NeuralEngine
from npu.planar.engine import PlanarEngine
from npu_fpga.toolenv import apply_tool_env
from npu_model.conv import ConvLayer
from npu_sim.conv import golden_output, kernel_image, layer_fields, random_case
from npu_sim.dataproc_bench import LoadSel, buffer_bench
from npu_sim.engine_bench import BenchProgram, run_bench
from npu_sim.planar import compare, golden, make_task, random_operands
from npu_spec.config import preset
from npu_spec.dataproc import (
    DATA_PROCESSOR,
    buffer_elements,
    dataset_address,
    dataset_writes,
    make_dataset,
    ne_port_base,
    pe_port_base,
)
from npu_spec.neural import NEURAL_ENGINE, layer_writes
from npu_spec.planar import (
    PLANAR_ENGINE,
    Axis,
    Bcast,
    EltOp,
    Fmt,
    Mode,
    PoolOp,
    RedOp,
    output_shape,
    task_error,
    task_writes,
    vector_length,
)

SMALL = preset("small")
ELEMENTS = buffer_elements(SMALL)


@pytest.fixture(autouse=True)
def _tools():
    apply_tool_env()


def _load_tensor(program, ds, tensor):
    """LOAD commands putting ``tensor`` (C, H, W) into dataset ``ds`` (int8 sign-extended)."""
    t = np.asarray(tensor)
    values = t.astype(np.int64) & 0xFFFF
    c_, h_, w_ = t.shape
    for c in range(c_):
        for y in range(h_):
            for x in range(w_):
                program.load(LoadSel.BUFFER, int(values[c, y, x]),
                             dataset_address(ds, c, y, x, ELEMENTS))


def _dump_tensor(program, ds):
    """DUMP commands reading dataset ``ds`` back row by row."""
    for c in range(ds["channels"]):
        for y in range(ds["height"]):
            program.dump(LoadSel.BUFFER, dataset_address(ds, c, y, 0, ELEMENTS), ds["width"])


def _dumped(records, ds):
    rows = [record[1] for record in records if record[0] == "dump"]
    return np.array(rows, np.int64).reshape(ds["channels"], ds["height"], ds["width"])


# ---------------------------------------------------------------------------------------------
# neural engine


def run_conv(case, ds_in, ds_out, *, backend="amaranth", stall=0.0, seed=0, config=SMALL):
    engine = NeuralEngine(config)
    bench = buffer_bench(engine, config)
    program = BenchProgram(32).stall(stall)
    for addr, word in enumerate(kernel_image(case)):
        program.load(LoadSel.KERNEL, int(word), addr)
    _load_tensor(program, ds_in, case.inputs)
    program.writes(layer_writes(layer_fields(case), 0))
    program.writes(dataset_writes(ne_port_base(0, "IN"), ds_in))
    program.writes(dataset_writes(ne_port_base(0, "OUT"), ds_out))
    program.start().wait().read(NEURAL_ENGINE.address("STATUS"))
    _dump_tensor(program, ds_out)
    verilator = None
    if backend == "verilator":
        from npu_sim.verilator import StreamBench
        verilator = StreamBench(bench, in_name="cmd", out_name="res")
    records = run_bench(bench, program, backend=backend, stall=stall, seed=seed,
                        verilator=verilator)
    (_, code, _), (_, status) = records[:2]
    assert code == 0 and status == 0, (code, status)
    return _dumped(records, ds_out).astype(np.uint16)


def _conv_datasets(layer, out_base):
    """Input and output datasets with gaps between rows and planes; the output wraps past the
    end of the buffer."""
    c, h, w = layer.channels, layer.height, layer.width
    ds_in = make_dataset(2000, (c, h, w), rstride=w + 3, cstride=(w + 3) * h + 7)
    k, oh, ow = layer.output_shape
    ds_out = make_dataset(out_base, (k, oh, ow), rstride=ow + 1, cstride=(ow + 1) * oh + 2)
    return ds_in, ds_out


def test_conv_3x3_8_channels():
    layer = ConvLayer(8, 8, 8, 8, 3, 3, pad=1, fmt="int8")
    case = random_case(SMALL, layer, seed=1, activation="relu")
    ds_in, ds_out = _conv_datasets(layer, ELEMENTS - 300)
    got = run_conv(case, ds_in, ds_out, backend="verilator", stall=0.2, seed=1)
    exp, _ = golden_output(case, SMALL)
    assert np.array_equal(got, exp)


def test_conv_on_narrow_banks():
    """Four banks under a core of 16 MACs reading 32-value rows: each row read is gathered
    from 8 runs and each row write split into 4, with stalls; the results do not change."""
    config = SMALL.replace(planar_lanes=2, dp_banks=4)
    assert DataProcessor(config).width == 4
    layer = ConvLayer(3, 7, 37, 8, 3, 3, pad=1, stride=1, fmt="int8")
    case = random_case(config, layer, seed=3, activation="relu")
    ds_in, ds_out = _conv_datasets(layer, ELEMENTS - 150)
    got = run_conv(case, ds_in, ds_out, backend="verilator", stall=0.2, seed=3, config=config)
    exp, _ = golden_output(case, config)
    assert np.array_equal(got, exp)


def test_bank_rules():
    """The bank count is a power of two, at least the planar lanes, dividing wider rows."""
    with pytest.raises(ValueError, match="NPUConfig.dp_banks"):
        SMALL.replace(dp_banks=24)
    with pytest.raises(ValueError, match="NPUConfig.dp_banks"):
        SMALL.replace(dp_banks=8)          # 16 planar lanes
    with pytest.raises(ValueError, match="divide the cores' MAC row of 12"):
        DataProcessor(SMALL.replace(macs=12, ne_row_values=16, planar_lanes=2, dp_banks=8))
    assert DataProcessor(SMALL).width == 32
    assert DataProcessor(SMALL.replace(dp_banks=64)).width == 64


@pytest.mark.slow
@pytest.mark.parametrize("seed, layer", [
    (2, ConvLayer(16, 12, 20, 12, 3, 3, pad=1, stride=2, fmt="fp16")),
    (3, ConvLayer(6, 17, 9, 10, 5, 5, pad=2, dilation=1, groups=2, fmt="f16i8")),
    (4, ConvLayer(8, 10, 33, 16, 3, 3, pad=1, fmt="int8")),
])
def test_conv_larger_on_verilator(seed, layer):
    case = random_case(SMALL, layer, seed=seed, sparsity=0.3)
    ds_in, ds_out = _conv_datasets(layer, 9000 + seed)
    got = run_conv(case, ds_in, ds_out, backend="verilator", stall=0.3, seed=seed)
    exp, _ = golden_output(case, SMALL)
    assert np.array_equal(got, exp)


# ---------------------------------------------------------------------------------------------
# planar engine


def _planar_datasets(task, base=200):
    """Datasets of a task's operands and result, with padding between rows and planes."""
    c, h, w = task["channels"], task["height"], task["width"]
    a = make_dataset(base, (c, h, w), rstride=w + 2, cstride=(w + 2) * h + 3)
    n = vector_length(task)
    b_shape = (1, 1, n) if n else (c, h, w)
    b = make_dataset(base + 4000, b_shape, rstride=b_shape[2] + 1)
    cc = make_dataset(base + 8000, (c, h, w))
    oc, *rest = output_shape(task)
    oshape = (oc, 1, 1) if len(rest) == 1 else (oc, *rest)
    out = make_dataset(base + 12000, oshape, rstride=oshape[2] + 5)
    uses = {"A": True, "B": task["mode"] == Mode.ELTWISE and task["op"] >= EltOp.ADD
            and task["bcast"] != Bcast.SCALAR,
            "C": task["mode"] == Mode.ELTWISE and task["op"] >= EltOp.FMA}
    empty = make_dataset(0, (0, 0, 0))
    return {"A": a, "B": b if uses["B"] else empty, "C": cc if uses["C"] else empty,
            "OUT": out}


def _program_task(program, task, operands, datasets, *, load=True):
    a, b, c = operands
    if load:
        _load_tensor(program, datasets["A"], a)
        if datasets["B"]["channels"]:
            shape = (datasets["B"]["channels"], datasets["B"]["height"],
                     datasets["B"]["width"])
            _load_tensor(program, datasets["B"], np.asarray(b).reshape(shape))
        if datasets["C"]["channels"]:
            _load_tensor(program, datasets["C"], c)
    program.writes(task_writes(task))
    for port, ds in datasets.items():
        program.writes(dataset_writes(pe_port_base(port), ds))
    program.start().wait().read(PLANAR_ENGINE.address("STATUS"))


def run_planar(jobs, *, backend="amaranth", stall=0.0, seed=0):
    """Run ``(task, operands, datasets)`` jobs in order; returns each task's result array
    (read back from its result dataset) or None for a rejected task."""
    engine = PlanarEngine(SMALL)
    bench = buffer_bench(engine, SMALL)
    program = BenchProgram(32).stall(stall)
    for task, operands, datasets in jobs:
        _program_task(program, task, operands, datasets)
        if not task_error(task, SMALL):
            _dump_tensor(program, datasets["OUT"])
    verilator = None
    if backend == "verilator":
        from npu_sim.verilator import StreamBench
        verilator = StreamBench(bench, in_name="cmd", out_name="res")
    records = run_bench(bench, program, backend=backend, stall=stall, seed=seed,
                        verilator=verilator)
    results = []
    k = 0
    for task, _, datasets in jobs:
        (_, code, _), (_, status) = records[k:k + 2]
        k += 2
        if task_error(task, SMALL):
            assert code != 0
            results.append(None)
            continue
        assert code == 0 and status == 0, (code, status)
        ds = datasets["OUT"]
        n = ds["channels"] * ds["height"]
        results.append(_dumped(records[k:k + n], ds))
        k += n
    return results


def _check_planar(task, operands, got):
    lanes = SMALL.planar_lanes ** 2
    exp = np.asarray(golden(task, *operands, lanes=lanes))
    got = got.astype(np.uint16)
    if task["out_fmt"] == Fmt.INT8:
        got = (got & 0xFF).astype(np.uint8).view(np.int8)
    bad = compare(exp.reshape(-1), got.reshape(-1), task["out_fmt"])
    assert bad.size == 0, (task, bad[:8], exp.reshape(-1)[bad[:8]], got.reshape(-1)[bad[:8]])


def _f32(x):
    return int(np.float32(x).view(np.uint32))


PLANAR_TASKS = [
    # Elementwise with a broadcast row vector, and with a channel vector (fp16).
    make_task(mode=Mode.ELTWISE, op=EltOp.ADD, bcast=Bcast.ROW, in_fmt=Fmt.INT8,
              out_fmt=Fmt.INT8, channels=3, height=5, width=21, scale=_f32(1.0), bias=0),
    make_task(mode=Mode.ELTWISE, op=EltOp.FMA, bcast=Bcast.CHANNEL, in_fmt=Fmt.FP16,
              out_fmt=Fmt.FP16, channels=4, height=3, width=7, scale=_f32(1.0)),
    # 3x3 max pooling, stride 2, padding 1.
    make_task(mode=Mode.POOL, op=PoolOp.MAX, in_fmt=Fmt.INT8, out_fmt=Fmt.INT8, channels=2,
              height=9, width=18, kh=3, kw=3, sy=2, sx=2, py=1, px=1),
    # A sum over each plane.
    make_task(mode=Mode.REDUCE, op=RedOp.SUM, axis=Axis.PLANE, in_fmt=Fmt.FP16,
              out_fmt=Fmt.FP16, channels=3, height=4, width=19, scale=_f32(1.0)),
]


def test_planar_tasks_with_stalls():
    rng = np.random.default_rng(5)
    jobs = []
    for i, task in enumerate(PLANAR_TASKS):
        assert not task_error(task, SMALL), task
        jobs.append((task, random_operands(rng, task), _planar_datasets(task, 100 + 31 * i)))
    results = run_planar(jobs, backend="verilator", stall=0.25, seed=2)
    for (task, operands, _), got in zip(jobs, results):
        _check_planar(task, operands, got)


def test_rejected_task_streams_are_dropped():
    """A rejected task takes no operand: its readers stop at its done and drop what they read,
    and the next task gets its own operands only; a channel reduction writes one plane."""
    rng = np.random.default_rng(6)
    good = make_task(mode=Mode.REDUCE, op=RedOp.MAX, axis=Axis.CHANNEL, in_fmt=Fmt.INT8,
                     out_fmt=Fmt.INT8, channels=3, height=2, width=20, scale=_f32(1.0))
    bad = dict(good, kh=0, mode=Mode.POOL)          # a pooling window of height 0
    assert task_error(bad, SMALL) and not task_error(good, SMALL)
    ops = random_operands(rng, good)
    ds = _planar_datasets(good, 500)
    results = run_planar([(bad, ops, ds), (good, ops, ds)], backend="verilator", stall=0.1)
    assert results[0] is None
    _check_planar(good, ops, results[1])


@pytest.mark.slow
def test_random_planar_tasks_on_verilator():
    from npu_sim.planar import random_task
    rng = np.random.default_rng(7)
    jobs = []
    for i in range(12):
        task = random_task(rng, SMALL, max_dim=20)
        if task_error(task, SMALL):
            continue
        jobs.append((task, random_operands(rng, task), _planar_datasets(task, 57 * i)))
    results = run_planar(jobs, backend="verilator", stall=0.3, seed=4)
    for (task, operands, _), got in zip(jobs, results):
        _check_planar(task, operands, got)


# ---------------------------------------------------------------------------------------------
# registers


def test_register_map_of_several_cores():
    regs = register_map(3)
    assert regs["NE2_OUT_RSTRIDE"].offset == 0x20 + 8 + 4
    assert regs["PE_OUT_BASE"].offset == DATA_PROCESSOR["PE_OUT_BASE"].offset
    dp = DataProcessor(preset("ecp5"))
    assert dp.width == 64 and len(dp.ne) == 2 and dp.regmap.size == DATA_PROCESSOR.size
