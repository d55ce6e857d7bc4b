"""``npu run --timeline FILE.png``: engine activity over time, drawn from the per-task trace.

:func:`intervals` turns the trace of a run (``RunResult.tasks`` / ``JobsResult.tasks``:
``(task, engine name, start cycle, end cycle, error, queue)``) into lanes of intervals: one
lane per engine (``NE``, ``PE``, ``DMA``) and one per queue (its tasks on any engine).
:func:`order_intervals` does the same for a run without cycles (the golden backend), each
task one slot of the order the tasks ran in. :func:`draw` writes the picture (matplotlib,
the optional ``plot`` set of ``pyproject.toml``).
"""

from dataclasses import dataclass

__all__ = ["ENGINE_LANES", "Interval", "draw", "intervals", "order_intervals"]

#: The engine lanes, top to bottom, by the trace's engine names.
ENGINE_LANES = {"NEURAL": "NE", "PLANAR": "PE", "DMA": "DMA"}


@dataclass(frozen=True)
class Interval:
    """One task on a lane: ``[start, end)`` (cycles, or slots of the task order), its queue,
    task ID and engine lane."""
    start: int
    end: int
    queue: int
    task: int
    engine: str


def _lanes(items):
    lanes = {lane: [] for lane in ENGINE_LANES.values()}
    for iv in sorted(items, key=lambda iv: (iv.start, iv.queue, iv.task)):
        lanes[iv.engine].append(iv)
        lanes.setdefault(f"queue {iv.queue}", []).append(iv)
    return lanes


def intervals(tasks):
    """``{lane: [Interval]}`` (by start) from trace entries ``(task, engine name, start, end,
    error, queue)``: the lanes ``NE``, ``PE``, ``DMA`` (always there, maybe empty), then
    ``queue k`` for every queue in the trace. Cycles count from the first start."""
    t0 = min((int(t[2]) for t in tasks), default=0)
    return _lanes(Interval(int(start) - t0, int(end) - t0, int(queue), int(task),
                           ENGINE_LANES[engine])
                  for task, engine, start, end, _error, queue in tasks)


def order_intervals(order):
    """The lanes of a run without timing (golden): task ``k`` of ``order`` (``(queue, task,
    engine name)`` in the order they ran) takes the slot ``[k, k + 1)``."""
    return _lanes(Interval(k, k + 1, int(queue), int(task), ENGINE_LANES[engine])
                  for k, (queue, task, engine) in enumerate(order))


def draw(lanes, path, *, title="", unit="cycles"):
    """Write ``lanes`` (:func:`intervals`) as a PNG picture to ``path``: one row per lane, a
    bar per task, coloured by queue on the engine rows and by engine on the queue rows."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    names = list(lanes)
    fig = Figure(figsize=(12, 1.2 + 0.55 * len(names)), dpi=100)
    ax = fig.add_subplot()
    queue_colours = ["tab:purple", "tab:red", "tab:brown", "tab:cyan", "tab:olive", "tab:pink",
                     "tab:gray", "black"]
    engine_colours = {"NE": "tab:blue", "PE": "tab:orange", "DMA": "tab:green"}
    queues = sorted({iv.queue for ivs in lanes.values() for iv in ivs})
    for row, name in enumerate(names):
        y = len(names) - 1 - row
        bars = [(iv.start, max(iv.end - iv.start, 1)) for iv in lanes[name]]
        if name in engine_colours and len(queues) > 1:
            colours = [queue_colours[iv.queue % len(queue_colours)] for iv in lanes[name]]
        else:
            colours = [engine_colours[iv.engine] for iv in lanes[name]]
        if bars:
            ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=colours, edgecolor="black",
                           linewidth=0.3)
    ax.set_yticks(range(len(names)), list(reversed(names)))
    ax.set_xlabel("cycle" if unit == "cycles" else "task (order of the run; no timing)")
    end = max((iv.end for ivs in lanes.values() for iv in ivs), default=1)
    ax.set_xlim(0, end)
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.grid(axis="x", linewidth=0.3)
    legend = [Patch(color=c, label=e) for e, c in engine_colours.items()]
    if len(queues) > 1:
        legend += [Patch(color=queue_colours[q % len(queue_colours)], label=f"queue {q}")
                   for q in queues]
    ax.legend(handles=legend, loc="upper right", fontsize=8, ncol=len(legend))
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, format="png")
