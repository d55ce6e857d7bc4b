"""Shared builders for the task-manager tests."""

from npu_model.taskman import layout, serial_run, task
from npu_sim.taskman import TaskBench
from npu_spec.config import NPUConfig
from npu_spec.descriptors import NE

#: Memory windows of the test networks: (base, words); descriptors at the start of each window,
#: data from offset IN_OFF.
WINDOWS = [(0x1000, 0x1000), (0x2000, 0x1000), (0x3000, 0x1000), (0x4000, 0x1000)]
IN_OFF = 0x800

CONFIG = NPUConfig(task_queues=4)
#: The lean build of the same (``taskman_impl="lean"``), with memory enough for the windows.
LEAN = CONFIG.replace(taskman_impl="lean", mem_kib=128)


def chain(network, flags, cycles=30, engine=NE, first_from_mem=True, out=0x400,
          last_to_mem=False):
    """A list in which each task reads the previous task's output from the buffer.

    ``flags`` is a list (one dict per task) of descriptor flags. The first task reads the
    network's input from memory. Buffer addresses ``out``, ``out + 1``, ... are the outputs.
    """
    descs = []
    for i, f in enumerate(flags):
        f = dict(f)
        src = IN_OFF + i if i == 0 else out + i - 1
        if i == 0 and first_from_mem:
            f.setdefault("src_mem", True)
        if last_to_mem and i == len(flags) - 1:
            f.setdefault("dst_mem", True)
        descs.append(task(i, engine=f.pop("engine", engine), cycles=f.pop("cycles", cycles),
                          network=network, src=f.pop("src", src), src_len=f.pop("src_len", 1),
                          dst=f.pop("dst", out + i), **f))
    return descs


def inputs_for(image, windows=WINDOWS, n=16):
    """Distinct input words at IN_OFF.. of every window."""
    for j, (base, _) in enumerate(windows):
        for i in range(n):
            image[base + IN_OFF + i] = 0x1000_0000 * (j + 1) + i
    return image


def make_bench(lists, *, config=None, seed=0, write_stall=0.0, **kwargs):
    """A bench with each list ``lists[q]`` placed at the start of window ``q``, for ``config``
    (default :data:`CONFIG`, looked up at the call, so a test may substitute :data:`LEAN`).

    Returns ``(bench, placed)``; windows are programmed and queue heads set (nothing pushed).
    """
    image = {}
    placed = {}
    for q, descs in lists.items():
        img, pl = layout({q: descs}, start=WINDOWS[q][0])
        image.update(img)
        placed.update(pl)
    inputs_for(image)
    bench = TaskBench(config or CONFIG, image, seed=seed, write_stall=write_stall, **kwargs)
    for j, (base, words) in enumerate(WINDOWS):
        bench.setup_window(j, base, words)
    return bench, placed


def serial_values(descs, q, image):
    """{task_id: output value} of ``descs`` run alone in list order."""
    results, _ = serial_run(descs, WINDOWS[q][0], image)
    return {tid: r[2] for tid, r in results.items()}


def values(bench, q):
    return {e.task_id: e.value for e in bench.events("end", q)}


class Scenario:
    """Queues and host pushes, run on the RTL bench and on the reference model alike.

    ``queues`` maps a queue index to ``(priority, descriptors, pushed at start)``; the network ID
    of queue ``q`` is ``q + 1`` and its window is ``WINDOWS[q]``. ``pushes`` is a list of
    ``(kind, queue, task_id, push_queue, count)``: when task ``task_id`` of ``queue`` has event
    ``kind`` ("start" or "end"), push ``count`` descriptors on ``push_queue``.
    """

    def __init__(self, queues, pushes=(), **bench_kwargs):
        self.queues = queues
        self.pushes = list(pushes)
        self.bench_kwargs = bench_kwargs

    def lists(self):
        return {q: descs for q, (_, descs, _) in self.queues.items()}

    def rtl(self, reads=(), skew=None, watchdog=None, checks=(), **kwargs):
        bench, placed = make_bench(self.lists(), **{**self.bench_kwargs, **kwargs})
        bench.checks.extend(checks)
        if skew is not None:
            bench.write("SKEW", limit=skew)
        if watchdog is not None:
            bench.write("WATCHDOG", cycles=watchdog)
        for q, (prio, descs, push) in self.queues.items():
            bench.setup_queue(q, priority=prio, network=q + 1, base_index=q,
                              head=placed[q].head, push=push)
        for kind, q, tid, pq, count in self.pushes:
            (bench.wait_start if kind == "start" else bench.wait_end)(q, tid)
            bench.write(f"Q{pq}_PUSH", count=count)
        for step in reads:
            bench.host.append(step)
        bench.placed = placed
        return bench.run()

    def model(self, skew=None, watchdog=0, bus_errors=()):
        """The reference model's run; ``skew`` defaults to the build's (1 for the lean task
        manager, which runs one task at a time)."""
        from npu_model.taskman import TaskManagerModel
        if skew is None:
            config = self.bench_kwargs.get("config") or CONFIG
            skew = 1 if config.taskman_impl == "lean" else 0
        image = {}
        placed = {}
        for q, descs in self.lists().items():
            img, pl = layout({q: descs}, start=WINDOWS[q][0])
            image.update(img)
            placed.update(pl)
        inputs_for(image)
        model = TaskManagerModel(image, CONFIG.task_queues, skew=skew, watchdog=watchdog,
                                 bus_errors=bus_errors)
        for q, (prio, descs, push) in self.queues.items():
            base, words = WINDOWS[q]
            model.set_queue(q, priority=prio, network=q + 1, base=base, limit=words)
            model.set_head(q, placed[q].head)
            model.push(q, push)
        for kind, q, tid, pq, count in self.pushes:
            model.on(kind, q, tid, lambda m, pq=pq, count=count: m.push(pq, count))
        model.run()
        return model

    def serial(self, q):
        image = inputs_for({})
        return serial_values(self.queues[q][1], q, image)


def summary(trace, kind="start"):
    """(queue, task_id, src_mem) of starts, or (queue, task_id, dst_mem, value) of ends."""
    if kind == "start":
        return [(e.queue, e.task_id, e.src_mem, e.inputs) for e in trace if e.kind == "start"]
    return [(e.queue, e.task_id, e.dst_mem, e.value) for e in trace if e.kind == kind]
