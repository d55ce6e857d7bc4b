"""The neural task manager: register map, queue layout, exception causes, counters.

The map lies in the ``TASK_MANAGER`` window of ``ADDRESS_WINDOWS``. Its layout does not depend
on the number of task queues: queue ``i`` always has its six registers at offset
``0x40 + 8 * i``, so a build with fewer queues simply has fewer registers.
:func:`task_manager_map` builds the map for a given count; :data:`TASK_MANAGER` is the map of
the default configuration (8 queues), which ``docs/registers.md`` documents.
"""

import enum

from .codes import coded
from .engine import ERROR_BITS, Engine
from .registers import ADDRESS_WINDOWS
from .regmap import Field, Register, RegisterMap

__all__ = [
    "BASE",
    "BASE_TABLE_OFFSET",
    "BASE_TABLE_SIZE",
    "COUNTERS",
    "PRIORITY_WIDTH",
    "QUEUE_OFFSET",
    "QUEUE_STRIDE",
    "SLOT_WORDS",
    "TASK_MANAGER",
    "Cause",
    "LEAN_COUNTERS",
    "address_bits",
    "base_table_size",
    "lean_error",
    "task_manager_map",
]

#: Word address of the map (start of the TASK_MANAGER address window).
BASE = ADDRESS_WINDOWS["TASK_MANAGER"][0]
#: Offset of queue 0's registers, and the distance between two queues' registers.
QUEUE_OFFSET = 0x40
QUEUE_STRIDE = 8
#: Offset and number of entries of the base-address table (two registers per entry).
BASE_TABLE_OFFSET = 0x20
BASE_TABLE_SIZE = 8
#: Width of a queue's priority.
PRIORITY_WIDTH = 4
#: Descriptor slot of the integrated NPU's task manager (``npu.top.NPUTop``): the longest
#: descriptor it takes, in words (a layer on two cores with their datasets needs about 60).
SLOT_WORDS = 64
#: Largest number of queues the layout has room for.
MAX_QUEUES = 32


@coded(3)
class Cause(enum.IntEnum):
    """Exception causes reported in ``EXC_STATUS.cause``."""
    NONE = 0
    DECODE = 1      # undecodable descriptor (magic, reserved bits, lengths, network ID)
    ADDRESS = 2     # a register write outside every register-map window
    WINDOW = 3      # descriptor or data pointer outside the network's memory window
    TIMEOUT = 4     # an engine ran longer than WATCHDOG cycles
    BUS = 5         # a descriptor read answered with a bus error
    ENGINE = 6      # an engine ended a task with a nonzero error code


#: Performance counters: (register name, description), at offsets 0x10.. in this order.
COUNTERS = (
    ("TASKS_RUN", "Tasks completed (including tasks aborted by the watchdog)."),
    ("BUSY_CYCLES", "Cycles with at least one task committed, loaded or running."),
    ("IDLE_CYCLES", "Cycles with nothing committed, loaded or running."),
    ("STALL_FETCH", ("Cycles in which queues hold work but the configuration queue is empty "
                    "and no task is running (descriptor fetch is the bottleneck).")),
    ("STALL_DEP", ("Cycles in which an engine is idle while a loaded task of it waits for a "
                  "dependency, a switch-point barrier or the drain before a queue change.")),
    ("STALL_WRITE", ("Cycles in which a register write is held back by the register-write "
                    "port (the blocks are not ready).")),
    ("SWITCHES", "Task switches by rule 3 (a TSR task completing while GTSP is set)."),
    ("SWITCH_LATENCY", ("Cycles from the first cycle a higher-priority queue requested a switch "
                       "to the start of its first task, for the most recent switch.")),
)


#: The counters a lean task manager (``NPUConfig.taskman_impl == "lean"``) keeps; the others
#: read 0 there.
LEAN_COUNTERS = ("TASKS_RUN", "BUSY_CYCLES", "IDLE_CYCLES", "SWITCHES")


def base_table_size(config):
    """Entries of the base-address table of ``config``'s task manager: 8, or one a queue in the
    lean build."""
    if config.taskman_impl == "lean":
        return min(BASE_TABLE_SIZE, config.task_queues)
    return BASE_TABLE_SIZE


def address_bits(config):
    """Bits of the word addresses and sizes the task manager of ``config`` keeps (``Qi_HEAD``,
    ``Qi_TAIL``, ``Qi_PTR``, ``BASEj``, ``LIMITj``, ``EXC_ADDR``): 32, or in the lean build
    enough for every word address of the system memory and its size (``mem_kib``)."""
    if config.taskman_impl == "lean":
        return min(32, (config.mem_kib * 256).bit_length())
    return 32


def lean_error(config, base_table, queues):
    """Why the task manager of ``config`` cannot run a program with this setup (``base_table``:
    entries with ``base`` and ``limit``; ``queues``: setups with ``base_index``, ``head`` and
    ``tail``), or ``None``. The full build takes every setup; the lean build refuses base-table
    entries beyond :func:`base_table_size` and addresses or sizes that do not fit in
    :func:`address_bits` bits. The program file (``npu_spec.program.Program.check``) applies
    this rule, so the compiler, the golden model and every backend refuse such a program."""
    if config.taskman_impl != "lean":
        return None
    entries, bits = base_table_size(config), address_bits(config)
    if len(base_table) > entries:
        return (f"the lean task manager has {entries} base-table entries, the program uses "
                f"{len(base_table)}")
    values = [(f"base-table entry {j} {name}", getattr(e, name))
              for j, e in enumerate(base_table) for name in ("base", "limit")]
    values += [(f"queue {q.index} {name}", getattr(q, name))
               for q in queues for name in ("head", "tail")]
    for what, value in values:
        if value >> bits:
            return (f"the lean task manager keeps addresses in {bits} bits (mem_kib "
                    f"{config.mem_kib}); {what} is 0x{value:X}")
    return None


def _queue_registers(i, address_width=32):
    base = QUEUE_OFFSET + QUEUE_STRIDE * i
    return [
        Register(f"Q{i}_CTRL", offset=base + 0, doc=f"Static parameters of task queue {i}.",
                 fields=[
            Field("priority", PRIORITY_WIDTH, doc="Priority; higher wins, ties go to the lower "
                  "queue index."),
            Field("network", 8, offset=8, doc="Network ID; every descriptor fetched through this "
                  "queue must carry it."),
            Field("base_index", 3, offset=16, doc="Index into the base-address table: the memory "
                  "window of the queue's network."),
            Field("secure", 1, offset=20, doc="Secure queue: its tasks run only in secure mode, "
                  "and its work is a secure request (drain, then switch mode)."),
        ]),
        Register(f"Q{i}_HEAD", offset=base + 1, doc=f"Set the head pointer of queue {i}.",
                 fields=[
            Field("address", address_width, access="wo", doc="Word address of the next "
                  "descriptor. Writing "
                  "it also clears the queue's `retired` and `tqsp` flags."),
        ]),
        Register(f"Q{i}_PUSH", offset=base + 2, doc=f"Enqueue descriptors on queue {i}.",
                 fields=[
            Field("count", 16, access="wo", doc="Number of descriptors appended (stored one "
                  "after the other from the tail)."),
        ]),
        Register(f"Q{i}_TAIL", offset=base + 3, doc=f"Tail (end) of queue {i}'s descriptor "
                 "list.", fields=[
            Field("address", address_width, doc="Word address one past the last descriptor; a "
                  "fetch at or "
                  "beyond it is a memory-window violation. 0 disables the check."),
        ]),
        Register(f"Q{i}_STATUS", offset=base + 4, doc=f"State of queue {i}.", fields=[
            Field("count", 16, access="ro", doc="Descriptors not yet committed."),
            Field("tqsp", 1, access="ro", doc="Task-queue switch parameter: the queue was "
                  "interrupted by a task switch and its SPC tasks read system memory."),
            Field("retired", 1, access="ro", doc="The queue was retired by an exception; it is "
                  "never chosen until its head is written again."),
        ]),
        Register(f"Q{i}_PTR", offset=base + 5, doc=f"Current head pointer of queue {i}.",
                 fields=[
            Field("address", address_width, access="ro", doc="Word address of the next "
                  "descriptor to "
                  "commit."),
        ]),
    ]


def task_manager_map(queues=8, *, base_entries=BASE_TABLE_SIZE, address_width=32):
    """The TASK_MANAGER register map for a build with ``queues`` task queues.

    ``base_entries`` and ``address_width`` describe a lean build's registers
    (:func:`base_table_size`, :func:`address_bits`): the base-address table has that many
    entries and the address fields that many bits (their upper bits are not stored and read
    0); offsets and the other fields are those of every build."""
    if not isinstance(queues, int) or isinstance(queues, bool):
        raise TypeError(f"Number of queues must be an integer, not {queues!r}")
    if not 1 <= queues <= MAX_QUEUES:
        raise ValueError(f"Number of queues must be in [1, {MAX_QUEUES}], not {queues!r}")
    if not 1 <= base_entries <= BASE_TABLE_SIZE or not 1 <= address_width <= 32:
        raise ValueError(f"Base-table entries must be in [1, {BASE_TABLE_SIZE}] and the address "
                         f"width in [1, 32], not {base_entries!r}, {address_width!r}")
    registers = [
        Register("CTRL", offset=0x00, doc="Global control.", fields=[
            Field("enable", 1, reset=1, doc="Fetch and commit descriptors. Clearing it lets "
                  "committed tasks finish and starts nothing new from the queues."),
        ]),
        Register("SKEW", offset=0x01, doc="Task-skew limit of the task buffer.", fields=[
            Field("limit", 8, doc="Largest distance, in tasks, from the oldest task in flight "
                  "to a newly loaded one, plus one; 0 means the task buffer depth."),
        ]),
        Register("WATCHDOG", offset=0x02, doc="Watchdog on engine tasks.", fields=[
            Field("cycles", 32, doc="A task running this many cycles is aborted with cause "
                  "TIMEOUT; 0 disables the watchdog."),
        ]),
        Register("IRQ_STATUS", offset=0x03, doc="Sticky interrupt causes; write 1 to clear.",
                 fields=[
            Field("error", 1, access="w1c", doc="An exception was raised (see EXC_STATUS)."),
            Field("task_done", 1, access="w1c", doc="A task whose descriptor has the IRQ flag "
                  "completed."),
        ]),
        Register("IRQ_ENABLE", offset=0x04, doc="Interrupt enables.", fields=[
            Field("error", 1, reset=1, doc="Raise the interrupt on an exception."),
            Field("task_done", 1, reset=1, doc="Raise the interrupt on an IRQ-flagged task."),
        ]),
        Register("EXC_STATUS", offset=0x05, doc="The most recent exception.", fields=[
            Field("cause", Cause.bits, access="ro", enum=Cause, reset=Cause.NONE,
                  doc="What went wrong."),
            Field("queue", 5, offset=8, access="ro", reset=0, doc="Queue that was retired."),
            Field("count", 8, offset=16, access="ro", reset=0, doc="Exceptions so far "
                  "(saturates at 255)."),
            Field("engine", Engine.bits, offset=24, access="ro", enum=Engine, reset=0,
                  doc="Engine of the task, for causes ENGINE and TIMEOUT (0 otherwise)."),
            Field("error_code", ERROR_BITS, offset=28, access="ro", reset=0,
                  doc="For cause ENGINE: the error code the engine ended the task with (the "
                  "engine's own error enum; 0 otherwise)."),
        ]),
        Register("EXC_ADDR", offset=0x06, doc="Address of the descriptor of the most recent "
                 "exception.", fields=[
            Field("address", address_width, access="ro", reset=0,
                  doc="Descriptor word address."),
        ]),
        Register("STATUS", offset=0x07, doc="Task-switch state.", fields=[
            Field("gtsp", 1, access="ro", reset=0, doc="Global task-switch parameter: a switch "
                  "is in progress."),
            Field("current_valid", 1, access="ro", reset=0, doc="A queue is current."),
            Field("current", 5, access="ro", reset=0, doc="The current queue."),
            Field("busy", 1, offset=8, access="ro", reset=0, doc="Tasks committed, loaded or "
                  "running."),
            Field("secure", 1, offset=9, access="ro", reset=0, doc="Secure mode: only secure "
                  "queues run."),
            Field("secure_request", 1, access="ro", reset=0, doc="A secure queue has work."),
            Field("idle", 1, access="ro", reset=0, doc="Nothing to do: no queue has "
                  "uncommitted descriptors (retired queues aside) and no task is committed, "
                  "loaded or running. A host waits for it after enabling the queues."),
        ]),
    ]
    for n, (name, doc) in enumerate(COUNTERS):
        registers.append(Register(name, offset=0x10 + n, doc=doc, fields=[
            Field("value", 32, access="ro", reset=0, doc="Counter value (wraps)."),
        ]))
    for j in range(base_entries):
        registers += [
            Register(f"BASE{j}", offset=BASE_TABLE_OFFSET + 2 * j,
                     doc=f"Base-address table entry {j}: start of a network's memory window.",
                     fields=[Field("address", address_width, doc="Word address added to the "
                                   "descriptor's "
                                   "source and destination offsets.")]),
            Register(f"LIMIT{j}", offset=BASE_TABLE_OFFSET + 2 * j + 1,
                     doc=f"Base-address table entry {j}: size of the memory window.",
                     fields=[Field("words", address_width, doc="Window size in words; "
                                   "descriptors and "
                                   "data must lie in [base, base + words).")]),
        ]
    for i in range(queues):
        registers += _queue_registers(i, address_width)
    return RegisterMap("TASK_MANAGER", base=BASE, registers=registers, doc=(
        "The neural task manager: task queues (priority, network ID, base-address index, head, "
        "tail, count, TQSP), the base-address table of the networks' memory windows, global "
        "task-switch state, exceptions, interrupts and performance counters. Shown for the "
        "default 8 queues; queue i's registers are at offset 0x40 + 8 i. See "
        "docs/task_manager.md."))


#: The map of the default configuration.
TASK_MANAGER = task_manager_map(8)
