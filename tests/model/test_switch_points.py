"""Task-switch points placed by the program builder (``ProgramBuilder.safe_points``,
``place_switch_points``), and preemption in the golden system model (``run_program``'s
``arrivals``): a switch at a safe point leaves both networks' results as in solo runs; a switch
where on-chip state is live does not."""

import numpy as np
import pytest

from npu_model.builder import BuildError, ProgramBuilder, combine, relocate
from npu_model.system import read_tensor, run_program
from npu_spec.config import preset

CFG = preset("small")


def _int8(rng, shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


def _params(rng, k, taps):
    return dict(bias=rng.integers(-512, 512, k), scale=rng.integers(1 << 28, 1 << 30, k),
                shift=np.full(k, min(63, round(36.5 + 0.5 * np.log2(taps)))))


def _two_layers(rng, *, reuse_kernels=False, **kw):
    """conv -> memory -> conv: tasks 0 load x, 1 kernels, 2 conv, 3 store h, 4 load h,
    5 kernels (unless ``reuse_kernels``: the second layer reads the first's, still in kernel
    memory), then conv and store."""
    b = ProgramBuilder(CFG, **kw)
    x = b.load(b.input("x", _int8(rng, (8, 6, 6))))
    k = b.dma_kernels(0, b.kernels(_int8(rng, (8, 8, 3, 3)), **_params(rng, 8, 72)))
    h = b.conv(x, k, pad=1)
    t = b.tensor("h", h.shape)
    b.store(h, t)
    b.release(x)
    b.release(h)
    h2 = b.load(t)
    k2 = k if reuse_kernels else b.dma_kernels(
        0, b.kernels(_int8(rng, (8, 8, 3, 3)), **_params(rng, 8, 72)))
    y = b.conv(h2, k2, pad=1)
    b.store(y, b.output("y", y.shape))
    return b


def test_safe_point_is_the_layer_boundary():
    b = _two_layers(np.random.default_rng(1))
    # After the store of h nothing on chip is read again; before it the input, the kernels
    # or h are.
    assert b.safe_points() == [3]


def test_resident_kernels_are_live_state():
    b = _two_layers(np.random.default_rng(1), reuse_kernels=True)
    assert len(b.tasks) == 7
    assert b.safe_points() == []


def test_flow_controlled_ring_is_never_a_switch_point():
    rng = np.random.default_rng(2)
    b = ProgramBuilder(CFG)
    x = b.load(b.input("x", _int8(rng, (8, 6, 6))))
    k = b.dma_kernels(0, b.kernels(_int8(rng, (16, 8, 3, 3)), **_params(rng, 16, 72)))
    ring = b.conv(x, k, pad=1, slots=1)                      # 8 of 16 planes: a small ring
    p = b.relu(ring)
    t = b.tensor("p", p.shape)
    b.store(p, t)                                            # task 4
    q = b.load(t)
    b.store(q, b.output("y", q.shape))
    assert b.safe_points() == [4]
    b.place_switch_points()
    flags = [sorted(k for k, v in t.flags.items() if v) for t in b.tasks]
    assert flags == [[], [], [], [], ["tse", "tsr"], ["spl"], []]
    b.build()


def _network(rng, queue, priority, points):
    """The two-layer network with TSE/TSR after each task of ``points`` (SPL on the next)."""
    b = _two_layers(rng, queue=queue, priority=priority, network=queue)
    for i in points:
        b.tasks[i].flags.update(tse=True, tsr=True)
        b.tasks[i + 1].flags["spl"] = True
    return b.build()


def _urgent(rng):
    """A more urgent network using the same buffer and kernel memory from 0."""
    return _two_layers(rng, queue=1, priority=5, network=1).build()


def _solo(program, name):
    return read_tensor(run_program(program).memory, program.tensor(name))


@pytest.mark.parametrize("point, equal", [(3, True), (1, False)])
def test_switch_only_at_a_safe_point_keeps_the_results(point, equal):
    a = _network(np.random.default_rng(3), 0, 1, [point])
    b = _urgent(np.random.default_rng(4))
    program = combine([a, relocate(b, -(-len(a.memory) // 256) * 256)])
    res = run_program(program, arrivals={1: 1})
    # The urgent network ran right after A's switch-point task, all of it, then A resumed.
    assert res.switches == [(0, point, 1)]
    assert [(t.queue, t.task_id) for t in res.tasks] == \
        [(0, i) for i in range(point + 1)] + [(1, i) for i in range(8)] + \
        [(0, i) for i in range(point + 1, 8)]
    ya, yb = (read_tensor(res.memory, program.tensor(f"q{q}/y")) for q in (0, 1))
    np.testing.assert_array_equal(yb, _solo(_urgent(np.random.default_rng(4)), "y"))
    # At task 1 A's kernels are in kernel memory and its input in the buffer: the urgent
    # network overwrites both.
    assert np.array_equal(ya, _solo(a, "y")) == equal


def test_no_switch_without_a_more_urgent_queue():
    a = _network(np.random.default_rng(3), 0, 5, [3])
    b = relocate(_urgent(np.random.default_rng(4)), 65536, priority=5)
    res = run_program(combine([a, b]), arrivals={1: 1})
    assert res.switches == []
    assert [t.queue for t in res.tasks] == [0] * 8 + [1] * 8


def test_arrival_before_a_switch_point_waits_for_it():
    a = _network(np.random.default_rng(3), 0, 1, [3])
    b = relocate(_urgent(np.random.default_rng(4)), 65536)
    res = run_program(combine([a, b]), arrivals={1: 4})      # after A's switch point: no switch
    assert res.switches == []
    assert [t.queue for t in res.tasks] == [0] * 8 + [1] * 8


def test_relocate_moves_everything_and_checks_the_size():
    a = _two_layers(np.random.default_rng(5)).build()
    moved = relocate(a, 4096, queue=3, priority=7)
    q, q0 = moved.queues[0], a.queues[0]
    assert (q.index, q.priority, q.head, q.tail) == (3, 7, q0.head + 1024, q0.tail + 1024)
    assert moved.base_table[0].base == 1024
    assert moved.base_table[0].limit == -(-len(a.memory) // 4)
    assert moved.tensor("y").addr == a.tensor("y").addr + 4096
    np.testing.assert_array_equal(_solo(moved, "y"), _solo(a, "y"))
    with pytest.raises(BuildError, match=f"need {CFG.mem_kib * 1024 + 4} bytes"):
        relocate(a, CFG.mem_kib * 1024 + 4 - len(a.memory))
