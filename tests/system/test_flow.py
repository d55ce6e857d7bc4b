"""Flow control between the neural engine and the planar engine (``docs/system.md``, "Flow
control"): a conv writes a ring of M slots that the next planar task reads while the conv
runs. The whole NPU on the Verilator system simulation against the golden system model, with
random memory stalls."""

import numpy as np
import pytest

from npu_model.builder import BuildError, ProgramBuilder
from npu_model.system import run_program
from npu_sim.programs import int_params
from npu_spec.config import PRESETS
from npu_spec.engine import Engine
from npu_spec.taskman import Cause

from .test_system import _int8, _planar_task, _two_queues, check

CFG = PRESETS["small"]


def _conv_relu_pool(slots, seed, *, k=16, c=4, h=10, w=12):
    rng = np.random.default_rng(seed)
    b = ProgramBuilder(CFG)
    xd = b.load(b.input("x", _int8(rng, (c, h, w))))
    p = b.conv_relu_pool(xd, _int8(rng, (k, c, 3, 3)), pad=1, slots=slots,
                         **int_params(rng, k, 9 * c))
    b.store(p, b.output("y", p.shape))
    return b


def _conv_pool(slots, seed, *, k=24, c=3, h=9, w=8):
    """conv (ReLU in the post-processor) -> 2x2 max pool, the conv's output a ring."""
    rng = np.random.default_rng(seed)
    b = ProgramBuilder(CFG)
    xd = b.load(b.input("x", _int8(rng, (c, h, w))))
    kp = b.dma_kernels(0, b.kernels(_int8(rng, (k, c, 3, 3)), **int_params(rng, k, 9 * c)))
    y = b.conv(xd, kp, pad=1, act="relu", slots=slots)
    p = b.max_pool(y, 2)
    b.store(p, b.output("y", p.shape))
    return b, y


def test_flow_programs_equal_unchained_ones_on_the_golden_model():
    """The golden model gives a chained program the output of the same layers without flow
    control, for rings smaller than the tensor too."""
    for slots in (1, 2, 3):
        plain = run_program(_conv_pool(0, 5)[0].build())
        b, y = _conv_pool(slots, 5)
        chained = run_program(b.build())
        program = b.build()
        out = program.tensor("y")
        assert (chained.memory[out.addr:out.extent[1]]
                == plain.memory[out.addr:out.extent[1]])
        assert y.stored_planes == min(24, slots * CFG.acc_slots)
    # The consumer no longer waits for its producer's completion.
    b, _ = _conv_pool(1, 5)
    conv = next(i for i, t in enumerate(b.tasks) if t.engine == Engine.NEURAL)
    pool = b.tasks[conv + 1]
    assert pool.engine == Engine.PLANAR and pool.flow_from == conv
    assert pool.dep == 0 or conv + 1 - pool.dep != conv


def test_flow_needs_a_neural_producer_and_the_next_planar_task():
    b, y = _conv_pool(1, 6)
    with pytest.raises(BuildError, match="one planar task"):
        b.relu(y)
    b = ProgramBuilder(CFG)
    ring = b.ring((8, 4, 4), 1)
    with pytest.raises(BuildError, match="needs the neural task"):
        b.relu(ring)


def test_conv_relu_pool_flow_controlled():
    """conv -> ReLU -> max pool, the conv's 16 output channels (two units of 8 planes) in a
    ring of two slots that the planar ReLU reads while the conv runs; random memory
    stalls."""
    summary, golden, rtl = check(_conv_relu_pool(2, 11).build(), stall=0.2, seed=3)
    assert golden.queues[0].completed == 6
    spans = {}
    for task_id, engine, end, _, _, cycle in rtl["trace"]:
        spans.setdefault(task_id, {})[end] = cycle
    conv, relu = 2, 3
    # The ReLU starts before the conv ends: it overlaps its producer.
    assert spans[relu][0] < spans[conv][1]


def test_flow_ring_smaller_than_the_tensor_wraps():
    """24 output channels (three units) through a ring of one slot of 8 planes: every unit
    reuses the slot, the conv waits for the pool to read the previous one."""
    b, y = _conv_pool(1, 12)
    assert y.stored_planes == 8 < y.shape[0]
    check(b.build(), stall=0.1, seed=4)


@pytest.mark.slow
@pytest.mark.parametrize("slots", [1, 2, 3])
def test_flow_rings_slow(slots):
    b, _ = _conv_pool(slots, 20 + slots, k=40, c=5, h=7, w=11)
    check(b.build(), stall=slots / 8, seed=slots)


def _orphan_consumer(builder):
    """The first planar task's operand A becomes flow-controlled with no producer."""
    from npu_spec.dataproc import DATA_PROCESSOR, pe_port_base
    task = _planar_task(builder)
    shape1 = pe_port_base("A") + 2
    reg = DATA_PROCESSOR["NE0_IN_SHAPE1"]
    task.writes = [(a, w | reg.pack(slots=1, planes=CFG.acc_slots) if a == shape1 else w)
                   for a, w in task.writes]


def test_consumer_without_producer_times_out():
    """A flow-controlled operand whose producer never comes: the planar task waits until the
    watchdog aborts it (``TIMEOUT``); the other queue runs to its end."""
    program = _two_queues(_orphan_consumer, np.random.default_rng(8))
    summary, golden, rtl = check(program, watchdog=20_000, expect_retired=True)
    q0, q1 = golden.queue(0), golden.queue(1)
    assert q0.retired and (q0.cause, q0.engine) == (Cause.TIMEOUT, Engine.PLANAR)
    assert not q1.retired and q1.completed == 6
    y0 = program.tensor("q0/y")
    assert not any(rtl["memory"][y0.addr:y0.extent[1]])


def test_a_small_ring_cannot_be_a_switch_point():
    with pytest.raises(BuildError, match="switch point"):
        b2 = ProgramBuilder(CFG)
        xd = b2.load(b2.input("x", np.zeros((3, 9, 8), np.int8)))
        kp = b2.dma_kernels(0, b2.kernels(np.ones((24, 3, 3, 3), np.int8)))
        ring = b2.conv(xd, kp, pad=1, slots=1)
        b2.max_pool(ring, 2, tsr=True)
    # A ring holding the whole tensor may be one: the barrier only costs the overlap.
    b3 = ProgramBuilder(CFG)
    xd = b3.load(b3.input("x", np.zeros((3, 9, 8), np.int8)))
    kp = b3.dma_kernels(0, b3.kernels(np.ones((16, 3, 3, 3), np.int8)))
    ring = b3.conv(xd, kp, pad=1, slots=2, tse=True)
    b3.max_pool(ring, 2, tsr=True)
