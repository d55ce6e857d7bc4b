"""Payload layouts and interface signatures of the task manager."""

from amaranth.hdl import unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "ADDR_WIDTH",
    "QUEUE_WIDTH",
    "SEQ_WIDTH",
    "EngineSignature",
    "MemReadSignature",
    "TaskEntry",
    "WriteLayout",
]

#: Width of task sequence numbers (task buffer tags).
SEQ_WIDTH = 8
#: Width of a queue index.
QUEUE_WIDTH = 5
#: Width of system-memory word addresses.
ADDR_WIDTH = 32


#: A task as the task buffer holds it and the engines receive it. ``src_mem`` and ``dst_mem``
#: on the engine start stream are the resolved locations (rules 2 and 4 applied); ``dst_mem`` is
#: only the static flag: whether the output also goes to system memory is given by ``done_mem``
#: in the cycle the engine signals ``done``.
TaskEntry = data.StructLayout({
    "seq":      unsigned(SEQ_WIDTH),
    "engine":   unsigned(1),
    "dep":      unsigned(8),
    "barrier":  unsigned(1),
    "queue":    unsigned(QUEUE_WIDTH),
    "task_id":  unsigned(16),
    "network":  unsigned(8),
    "tse":      unsigned(1),
    "spc":      unsigned(1),
    "dpc":      unsigned(1),
    "tsr":      unsigned(1),
    "spl":      unsigned(1),
    "src_mem":  unsigned(1),
    "dst_mem":  unsigned(1),
    "irq":      unsigned(1),
    "src":      unsigned(16),
    "src_len":  unsigned(8),
    "dst":      unsigned(16),
    "base":     unsigned(ADDR_WIDTH),
    "addr":     unsigned(ADDR_WIDTH),
})

#: One register write to the blocks: word ``addr`` gets ``data``; ``seq`` tags the task whose
#: program it belongs to.
WriteLayout = data.StructLayout({
    "addr": unsigned(16),
    "data": unsigned(32),
    "seq":  unsigned(SEQ_WIDTH),
})


class EngineSignature(wiring.Signature):
    """Dispatch interface to one engine (neural or planar), from the task manager's side.

    Members
    -------
    start : Out(stream.Signature(TaskEntry))
        Start a task (the engine's program was sent on the register-write port, tagged ``seq``).
    done : In(1)
        One-cycle strobe: the running task completed; its output is in the data buffer.
    done_mem : Out(1)
        Combinational, valid in the cycle of ``done``: the output must also be written to system
        memory (static DST_MEM, or rule 2: DPC while GTSP is set).
    abort : Out(1)
        One-cycle strobe: the watchdog aborted the running task; the engine drops it.
    """

    def __init__(self):
        super().__init__({
            "start":    Out(stream.Signature(TaskEntry)),
            "done":     In(1),
            "done_mem": Out(1),
            "abort":    Out(1),
        })


class MemReadSignature(wiring.Signature):
    """Read port to system memory (the task-manager DMA), from the initiator's side.

    ``data`` holds the word at ``addr`` in the cycle after ``en``.
    """

    def __init__(self):
        super().__init__({
            "addr": Out(ADDR_WIDTH),
            "en":   Out(1),
            "data": In(32),
        })
