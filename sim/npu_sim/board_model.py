"""A board without hardware, for host tests of the ``board`` backend (``docs/boards.md``).

:class:`GoldenBoard` is the bridge's reference model (:class:`npu_sim.uart_host.BridgeModel`)
in front of :class:`GoldenNPURegisters`, the NPU's host registers acted out by the golden
system model: the identification registers of a configuration, the task manager's setup
registers, and on ``CTRL.enable`` a run of :func:`npu_model.system.run_program` on what the
host loaded, after which ``STATUS.idle``, ``EXC_STATUS``, the queues' status, ``TASKS_RUN``
and the trace buffer read as the hardware's would. A queue pushed while the program runs (the
host's late push of ``npu_sim.board_host.run_on_board``) arrives after the tasks completed
so far (``TASKS_RUN``: the task ends that have reached the trace buffer): the run is done again
from the memory at ``CTRL.enable`` with that arrival (``run_program(arrivals=...)``, whose
tasks before it are the same), and the entries not yet delivered are replaced. The trace's
cycle numbers are task ordinals (the golden model has no time): start ``2 k``, end ``2 k + 1``
for the ``k``-th task.
Like the hardware's, the trace buffer holds ``trace_depth`` entries and the entries arrive
while the program runs, ``events_per_read`` of them for each register read of the host (the
model's time); ``STATUS.idle`` is set once all have arrived. An entry that finds the buffer
full is dropped and sets ``TRACE_STATUS.overflow``: a host that does not drain the buffer
while it polls loses entries. Of the performance counters, ``TASKS_RUN`` counts the task ends
delivered so far and ``SWITCHES`` the golden run's task switches; the others read 0.

:class:`FakeSerial` is a pyserial-compatible port (``write``, ``read`` returning fewer bytes
after ``timeout`` seconds, ``reset_input_buffer``, ``close``) connected to a
:class:`GoldenBoard`, with faults to inject: a silent line, corrupted bytes, a closed port.
"""

import time

from npu_model.system import run_program
from npu_spec.program import BaseEntry, Program, QueueSetup
from npu_spec.registers import NPU_INFO, npu_info_values
from npu_spec.taskman import task_manager_map

from .uart_host import BridgeModel

__all__ = ["FakeSerial", "GoldenBoard", "GoldenNPURegisters"]


class GoldenNPURegisters:
    """The NPU's host registers of a build with ``config`` over ``memory`` (a ``bytearray``
    shared with the bridge model), acted out by the golden model (module documentation).

    ``hang=True`` makes the NPU never finish (``STATUS.idle`` stays clear), for timeout
    tests. ``kept_queues``: the queues whose registers the build keeps; the others drop
    writes and read 0 (default: every queue, or only queue 0 for the micro build,
    ``docs/micro.md``). Used by :class:`npu_sim.uart_host.BridgeModel` through ``get`` and item
    assignment, like a dictionary.
    """

    def __init__(self, config, memory, *, hang=False, trace_depth=64, events_per_read=0.25,
                 kept_queues=None):
        self.config = config
        self.memory = memory
        self.hang = hang
        if kept_queues is None:
            # The micro build keeps queue 0 only (docs/micro.md).
            kept_queues = 1 if config.npu_impl == "micro" else config.task_queues
        self.kept_queues = kept_queues
        self.tm = task_manager_map(config.task_queues)
        self.written = {}
        self.trace = []
        self.trace_depth = trace_depth
        self.events_per_read = events_per_read
        self.pending = []           # trace entries still to come
        self.due = 0.0              # entries owed to the buffer by the reads so far
        self.overflow = False
        self.state = {"EXC_STATUS": 0, "EXC_ADDR": 0, "SWITCHES": 0}
        self.queue_status = {}
        self.pushed = {}
        self.arrivals = {}          # queue: tasks completed when it was pushed (late pushes)
        self.delivered = 0          # trace entries that reached the buffer (or were dropped)
        self.completed = 0          # task ends among them: TASKS_RUN
        self.start_memory = None    # the memory at CTRL.enable
        self.done = False
        self.cycle = 0
        self.ro = {NPU_INFO[name].offset: NPU_INFO[name].pack(**fields)
                   for name, fields in npu_info_values(config).items()}
        # Register names by host word address: NPU_INFO's that change, the task manager's.
        self.names = {NPU_INFO[n].offset: n for n in ("CYCLE", "TRACE_STATUS", "TRACE_DATA0",
                                                      "TRACE_DATA1", "SCRATCH")}
        self.names.update({self.tm.base + r.offset: r.name for r in self.tm.registers})

    # The interface BridgeModel uses.
    def get(self, reg, default=0):
        self.cycle += 1
        self._advance()
        if reg in self.ro:
            return self.ro[reg]
        name = self.names.get(reg)
        if name is None:
            return default
        return self._read(name)

    def __setitem__(self, reg, value):
        if reg == NPU_INFO["TRACE_CTRL"].offset:
            f = NPU_INFO["TRACE_CTRL"].unpack(value, strict=False)
            if f["clear"]:
                self.trace.clear()
                self.overflow = False
            elif f["pop"] and self.trace:
                self.trace.pop(0)
            return
        if reg == NPU_INFO["SCRATCH"].offset:
            self.written["SCRATCH"] = value
            return
        name = self.names.get(reg)
        if name is None or reg < self.tm.base or self._dropped(name):
            return
        self.written[name] = value
        if name.endswith("_PUSH"):
            queue = int(name[1:-len("_PUSH")])
            self.pushed[queue] = self.pushed.get(queue, 0) + \
                self.tm[name].unpack(value, strict=False)["count"]
            if self.done:
                # Pushed while the program runs: it arrives after the tasks completed so far.
                self.arrivals[queue] = self.completed
                self._start(again=True)
        elif name == "CTRL":
            if self.tm["CTRL"].unpack(value, strict=False)["enable"]:
                self._start()
            else:
                # Stopped: the host sets up a new run.
                self.pushed.clear()
                self.arrivals.clear()
                self.done = False

    def _dropped(self, name):
        """A register of a queue the build does not keep (``kept_queues``)."""
        if name[0] != "Q" or "_" not in name or not name[1:name.index("_")].isdigit():
            return False
        return int(name[1:name.index("_")]) >= self.kept_queues

    def _advance(self):
        """The entries due by now enter the trace buffer, or are dropped when it is full."""
        self.due += self.events_per_read
        while self.pending and self.due >= 1:
            self.due -= 1
            entry = self.pending.pop(0)
            self.delivered += 1
            self.completed += NPU_INFO["TRACE_DATA0"].unpack(entry[0], strict=False)["end"]
            if len(self.trace) < self.trace_depth:
                self.trace.append(entry)
            else:
                self.overflow = True
        if not self.pending:
            self.due = 0.0

    def _read(self, name):
        if name == "CYCLE":
            return self.cycle & 0xFFFF_FFFF
        if name == "SCRATCH":
            return self.written.get("SCRATCH", 0)
        if name == "TRACE_STATUS":
            return NPU_INFO["TRACE_STATUS"].pack(count=len(self.trace),
                                                 overflow=int(self.overflow))
        if name in ("TRACE_DATA0", "TRACE_DATA1"):
            if not self.trace:
                return 0
            return self.trace[0][0 if name == "TRACE_DATA0" else 1]
        if name == "STATUS":
            idle = not self.hang and (self.done and not self.pending or not self.pushed)
            return self.tm["STATUS"].pack(idle=int(idle))
        if self._dropped(name):
            return 0
        if name == "TASKS_RUN":
            return self.completed
        if name in self.state:
            return self.state[name]
        if name.endswith("_STATUS") and name.startswith("Q"):
            return self.queue_status.get(int(name[1:-len("_STATUS")]), 0)
        return self.written.get(name, 0)

    def _program(self):
        tm, w = self.tm, self.written
        entries = []
        for j in range(8):
            if f"BASE{j}" not in w:
                break
            entries.append(BaseEntry(tm[f"BASE{j}"].unpack(w[f"BASE{j}"])["address"],
                                     tm[f"LIMIT{j}"].unpack(w.get(f"LIMIT{j}", 0))["words"]))
        queues = []
        for i, count in sorted(self.pushed.items()):
            ctrl = tm[f"Q{i}_CTRL"].unpack(w.get(f"Q{i}_CTRL", 0), strict=False)
            queues.append(QueueSetup(
                i, priority=ctrl["priority"], network=ctrl["network"],
                base_index=ctrl["base_index"],
                head=w.get(f"Q{i}_HEAD", 0), tail=w.get(f"Q{i}_TAIL", 0), tasks=count))
        return Program(self.config, base_table=entries, queues=queues,
                       memory=self.start_memory)

    def _start(self, again=False):
        """Run what the host pushed; ``again``: a queue was pushed while it ran (module
        documentation)."""
        if self.hang or not self.pushed:
            return
        if not again:
            self.start_memory = bytes(self.memory)
            self.delivered = self.completed = 0
            self.pending = []
        result = run_program(self._program(), arrivals=self.arrivals)
        self.memory[:len(result.memory)] = result.memory
        d0 = NPU_INFO["TRACE_DATA0"]
        entries = []
        for k, t in enumerate(result.tasks):
            error = 15 if t.code is None else t.code
            for end in (0, 1):
                word = d0.pack(task_id=t.task_id, engine=t.engine, end=end,
                               error=error if end else 0, queue=t.queue, valid=1)
                entries.append((word, 2 * k + end))
        self.pending = entries[self.delivered:]
        self.state["SWITCHES"] = len(result.switches)
        retired = [q for q in result.queues if q.retired]
        exc = self.tm["EXC_STATUS"]
        for q in retired:
            self.state["EXC_STATUS"] = exc.pack(cause=q.cause, queue=q.index,
                                                count=len(retired), engine=q.engine or 0,
                                                error_code=q.code)
            self.state["EXC_ADDR"] = q.address or 0
        for q in result.queues:
            self.queue_status[q.index] = self.tm[f"Q{q.index}_STATUS"].pack(
                count=self.pushed[q.index] - q.completed if q.retired else 0,
                retired=int(q.retired))
        self.done = True


class GoldenBoard(BridgeModel):
    """The bridge's reference model with :class:`GoldenNPURegisters` behind it and the
    configuration's system memory (``config.mem_kib`` KiB); ``hang``, ``trace_depth``,
    ``events_per_read`` and ``kept_queues`` are :class:`GoldenNPURegisters`'."""

    def __init__(self, config, *, hang=False, trace_depth=64, events_per_read=0.25,
                 kept_queues=None):
        super().__init__(config.mem_kib * 1024)
        self.regs = GoldenNPURegisters(config, self.memory, hang=hang, trace_depth=trace_depth,
                                       events_per_read=events_per_read,
                                       kept_queues=kept_queues)


class FakeSerial:
    """A pyserial-compatible port to a :class:`GoldenBoard` (or any bridge model).

    Parameters
    ----------
    board : BridgeModel
    timeout : float
        Seconds a ``read`` waits when nothing has arrived (pyserial's ``timeout``).
    silent : bool
        Nothing answers (a board without the bridge, or a wrong baud rate).
    corrupt : dict of int to int
        ``{byte index: xor mask}``: bytes of the host's stream flipped on the line.
    framing : bool
        The bridge reports a framing error (``STATUS.framing``) after the first frame.
    """

    def __init__(self, board, *, timeout=0.01, silent=False, corrupt=None, framing=False):
        self.board = board
        self.timeout = timeout
        self.silent = silent
        self.corrupt = dict(corrupt or {})
        self.framing = framing
        self.sent = 0
        self.is_open = True
        self._rx = bytearray()

    def write(self, data):
        if not self.is_open:
            raise OSError("the port is closed")
        data = bytearray(data)
        for k in range(len(data)):
            data[k] ^= self.corrupt.get(self.sent + k, 0)
        self.sent += len(data)
        if not self.silent:
            self._rx += self.board.feed(bytes(data))
            if self.framing:
                self.board.status["framing"] = 1
        return len(data)

    def read(self, size=1):
        if not self.is_open:
            raise OSError("the port is closed")
        if not self._rx:
            time.sleep(self.timeout)
            return b""
        out = bytes(self._rx[:size])
        del self._rx[:size]
        return out

    @property
    def in_waiting(self):
        return len(self._rx)

    def reset_input_buffer(self):
        self._rx.clear()
        self.board.idle()

    def close(self):
        self.is_open = False

