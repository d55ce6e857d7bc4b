"""The reference model against the seed's expectations (pure Python)."""

from npu_model.taskman import Raised, TaskManagerModel, engine_error, layout, program, task
from npu_spec.engine import Engine
from npu_spec.taskman import Cause
from tests.support.taskman import CONFIG, WINDOWS, chain, inputs_for, serial_values


def build(lists, prios, **kwargs):
    image = {}
    placed = {}
    for q, descs in lists.items():
        img, pl = layout({q: descs}, start=WINDOWS[q][0])
        image.update(img)
        placed.update(pl)
    inputs_for(image)
    m = TaskManagerModel(image, CONFIG.task_queues, **kwargs)
    for q in lists:
        m.set_queue(q, priority=prios[q], network=q + 1, base=WINDOWS[q][0],
                    limit=WINDOWS[q][1])
        m.set_head(q, placed[q].head)
    return m, image


def test_model_fig15():
    A = chain(1, [{}, {"tse": True, "dpc": True, "tsr": True}, {"spc": True, "spl": True}, {}])
    B = chain(2, [{}, {}])
    m, _image = build({0: A, 1: B}, {0: 1, 1: 4})
    m.push(0, 4)
    m.on("start", 0, 1, lambda m: m.push(1, 2))
    trace = m.run()
    starts = [(e.queue, e.task_id, e.src_mem) for e in trace if e.kind == "start"]
    assert starts == [(0, 0, True), (0, 1, False), (1, 0, True), (1, 1, False),
                      (0, 2, True), (0, 3, False)]
    ends = {(e.queue, e.task_id): e for e in trace if e.kind == "end"}
    assert ends[(0, 1)].dst_mem and not ends[(0, 0)].dst_mem
    assert not m.q[0].tqsp
    assert {e.task_id: e.value for e in trace if e.kind == "end" and e.queue == 0} == \
        serial_values(A, 0, inputs_for({}))


def test_model_priority_ties_and_fetch_replacement():
    A = chain(1, [{}, {}])
    B = chain(2, [{}])
    C = chain(3, [{}])
    m, _ = build({0: A, 1: B, 2: C}, {0: 2, 1: 2, 2: 1})
    m.push(2, 1)
    m.push(1, 1)
    m.push(0, 2)
    trace = m.run()
    # Equal priorities go to the lower index; C (lowest) last.
    assert [(e.queue, e.task_id) for e in trace if e.kind == "start"] == \
        [(0, 0), (0, 1), (1, 0), (2, 0)]


def test_model_errors():
    A = chain(1, [{}, {}])
    bad = task(0, network=9)     # network mismatch
    m, _ = build({0: A, 1: [bad]}, {0: 1, 1: 2})
    m.push(0, 2)
    m.push(1, 1)
    trace = m.run()
    assert m.errors == [Raised(Cause.DECODE, 1, WINDOWS[1][0])]
    assert m.q[1].retired
    assert [e.task_id for e in trace if e.kind == "end"] == [0, 1]


def test_behavioural_error_code():
    writes = [(b.address + i, w) for b in program(Engine.DMA, 5, error=9) for i, w in
              enumerate(b.words)]
    assert engine_error(Engine.DMA, writes) == 9
    assert engine_error(Engine.DMA, [(b.address, b.words[0]) for b in program(Engine.DMA, 5)]) \
        == 0


def test_model_engine_error_retires_its_queue():
    # Queue 1's DMA task fails: queue 1's later tasks never start; queue 0 runs to its end.
    A = chain(1, [{}, {"engine": Engine.PLANAR}, {"engine": Engine.DMA}, {}])
    B = chain(2, [{}, {"engine": Engine.DMA, "error": 5, "cycles": 10, "dep": 1},
                  {"dep": 1}, {}])
    m, _ = build({0: A, 1: B}, {0: 1, 1: 2})
    m.push(0, 4)
    m.push(1, 4)
    trace = m.run()
    assert m.errors == [Raised(Cause.ENGINE, 1, WINDOWS[1][0] + B[0].length, Engine.DMA, 5)]
    assert m.q[1].retired
    assert [(e.kind, e.task_id) for e in trace if e.queue == 1] == \
        [("start", 0), ("end", 0), ("start", 1), ("error", 1)]
    assert [e.task_id for e in trace if e.queue == 0 and e.kind == "end"] == [0, 1, 2, 3]


def test_model_bus_error():
    A = chain(1, [{}, {}])
    m, _ = build({0: A}, {0: 1}, bus_errors={WINDOWS[0][0] + 1})
    m.push(0, 2)
    trace = m.run()
    assert m.errors == [Raised(Cause.BUS, 0, WINDOWS[0][0])]
    assert trace == []
