"""Running a program on a board over its UART bridge (``docs/boards.md``).

:func:`run_on_board` is what ``npu run --backend board`` does through a
:class:`npu_sim.uart_host.BridgeClient`:

1. read ``NPU_INFO`` (``ID``, ``VERSION``, ``CONFIG0``..``CONFIG4``) and refuse a board whose
   build differs from the program's configuration (:class:`BoardConfigError`);
2. write the program's memory image, zeros up to the end of its last tensor included, so that
   what an earlier run left in the board's memory cannot leak into this one;
3. write the task manager's setup (:func:`npu_sim.system.setup_writes`), read back the
   ``Qi_TAIL`` of every queue but queue 0 when the program has several queues (a build that
   serves fewer queues than it has registers for, the micro build's one, drops the others'
   setup: refused with :class:`BoardQueuesError` before anything runs), clear the trace
   buffer and the bridge's status, and set ``CTRL.enable``;
4. with ``late`` (``{queue: n}``, several programs): poll ``TASKS_RUN`` until ``n`` tasks have
   completed, then push that queue's tasks (``Qi_PUSH``), one queue after the other in the
   order of ``n``;
5. poll ``STATUS.idle`` until it is set; steps 4 and 5 together for at most ``timeout``
   seconds (:class:`BoardRunError`), draining the trace buffer before each poll so that a
   program of more tasks than the buffer holds keeps every entry (unless the host falls
   behind: then ``TRACE_STATUS.overflow`` is set and the result says so);
6. read ``EXC_STATUS``, ``EXC_ADDR``, ``IRQ_STATUS``, the performance counters, every queue's
   status, the rest of the trace buffer, ``TRACE_STATUS`` and the memory, and check the
   bridge's error flags.

Every failure is a :class:`BoardRunError` (or :class:`npu_sim.uart_host.BridgeError` from the
transport) with a one-line message.
"""

import time

from npu_spec.registers import NPU_INFO, VERSION_MAJOR, npu_info_values
from npu_spec.taskman import COUNTERS, task_manager_map

from .system import WATCHDOG, setup_writes

__all__ = ["BoardConfigError", "BoardQueuesError", "BoardRunError", "board_config",
           "check_board_config", "run_on_board"]

#: Registers of ``NPU_INFO`` that describe the build; compared with the program's.
CONFIG_REGISTERS = ("CONFIG0", "CONFIG1", "CONFIG2", "CONFIG3", "CONFIG4")


class BoardRunError(RuntimeError):
    """A run on the board failed (timeout, an exception of the NPU, a bridge error)."""


class BoardConfigError(BoardRunError):
    """The board's NPU was built for another configuration than the program."""


class BoardQueuesError(BoardConfigError):
    """The board's NPU serves fewer task queues than the program uses (the micro build:
    queue 0 only, ``docs/micro.md``)."""


def board_config(client):
    """``{register: {field: value}}`` of the board's ``CONFIG0``..``CONFIG4``, after
    :meth:`BridgeClient.identify` has checked ``ID`` and ``VERSION``."""
    major, minor = client.identify()
    if major != VERSION_MAJOR:
        raise BoardConfigError(f"the board on {client.name} has register interface "
                               f"{major}.{minor}; this host speaks {VERSION_MAJOR}.x")
    return {name: NPU_INFO[name].unpack(client.read_reg(NPU_INFO[name].offset), strict=False)
            for name in CONFIG_REGISTERS}


def check_board_config(client, config):
    """:class:`BoardConfigError` naming the fields in which the board's build differs from
    ``config``."""
    want = npu_info_values(config)
    got = board_config(client)
    diffs = [f"{field} board {got[reg].get(field)} program {value}"
             for reg in CONFIG_REGISTERS for field, value in want[reg].items()
             if got[reg].get(field) != value]
    if diffs:
        raise BoardConfigError(f"the board on {client.name} was built for another "
                               f"configuration than the program ({'; '.join(diffs)}); "
                               f"program it with npu build --board BOARD --preset "
                               f"{config.name} --program")


def _image(program):
    """The memory to load: the image, zeros up to the end of the last tensor."""
    end = max([len(program.memory)] + [t.extent[1] for t in program.tensors])
    return program.memory + bytes(end - len(program.memory))


def run_on_board(client, program, *, timeout=60.0, poll_interval=0.01, trace_depth=64,
                 watchdog=WATCHDOG, progress=None, late=None):
    """Run ``program`` on the board behind ``client``; returns a dict like
    :func:`npu_sim.system.rtl_run`'s: ``memory`` (the loaded extent), ``trace``
    (``[(task_id, engine, end, error, queue, cycle)]``), ``registers`` (``EXC_STATUS``,
    ``EXC_ADDR``, ``IRQ_STATUS`` and the counters by name), ``queues``
    (``{index: Qi_STATUS}``), ``cycles`` (first task start to last task end in the trace),
    ``trace_overflow`` (the trace buffer dropped entries) and ``wall`` (seconds).

    ``late`` (``{queue: n}``) pushes a queue's tasks only once ``TASKS_RUN`` has reached
    ``n``, as :func:`npu_sim.system.host_commands` does on the RTL: a program arriving while
    another runs (``npu_runtime.runtime.run_jobs``)."""
    say = progress or (lambda msg: None)
    cfg = program.config
    tm = task_manager_map(cfg.task_queues)
    late = dict(late or {})
    t0 = time.perf_counter()
    check_board_config(client, cfg)
    image = _image(program)
    say(f"board: loading {len(image)} bytes over {client.name}")
    client.clear_status()
    client.write_mem(0, image)
    for addr, value in setup_writes(program, watchdog=watchdog, late=late):
        client.write_reg(addr, value)
    _check_queues_kept(client, program, tm)
    client.write_reg(NPU_INFO["TRACE_CTRL"].offset, NPU_INFO["TRACE_CTRL"].pack(clear=1))
    client.check_status()
    say("board: starting")
    ctrl = tm["CTRL"]
    client.write_reg(tm.base + ctrl.offset, ctrl.pack(enable=1))
    wait = _Waiter(client, tm, timeout, poll_interval, trace_depth)
    for i, n in sorted(late.items(), key=lambda item: item[1]):
        wait.tasks_run(n, f"queue {i} is pushed")
        push = tm[f"Q{i}_PUSH"]
        say(f"board: pushing queue {i} after {n} tasks")
        client.write_reg(tm.base + push.offset, push.pack(count=program.queue(i).tasks))
    wait.idle()
    trace = wait.trace
    regs = {name: client.read_reg(tm.base + tm[name].offset)
            for name in ("EXC_STATUS", "EXC_ADDR", "IRQ_STATUS") + tuple(n for n, _ in COUNTERS)}
    queues = {q.index: client.read_reg(tm.base + tm[f"Q{q.index}_STATUS"].offset)
              for q in program.queues}
    trace += _read_trace(client, trace_depth)
    status = NPU_INFO["TRACE_STATUS"]
    overflow = bool(status.unpack(client.read_reg(status.offset), strict=False)["overflow"])
    say(f"board: reading {len(image)} bytes back")
    memory = client.read_mem(0, len(image))
    client.check_status()
    starts = [t[5] for t in trace if not t[2]]
    ends = [t[5] for t in trace if t[2]]
    cycles = (max(ends) - min(starts)) & 0xFFFF_FFFF if starts and ends else None
    return {"memory": memory, "trace": trace, "registers": regs, "queues": queues,
            "cycles": cycles, "trace_overflow": overflow, "wall": time.perf_counter() - t0}


def _check_queues_kept(client, program, tm):
    """With several queues: :class:`BoardQueuesError` unless the ``Qi_TAIL`` of every queue
    but queue 0 reads back what the setup wrote. The micro build keeps queue 0's registers
    only and reads the others as 0 (``docs/micro.md``; its ``Q0_TAIL`` is write-only, so
    queue 0 is not read back); ``NPU_INFO`` does not tell the builds apart."""
    if len(program.queues) < 2:
        return
    for q in program.queues:
        if q.index == 0:
            continue
        reg = tm[f"Q{q.index}_TAIL"]
        got = reg.unpack(client.read_reg(tm.base + reg.offset), strict=False)["address"]
        if got != q.tail:
            raise BoardQueuesError(
                f"the board on {client.name} does not keep task queue {q.index} (Q{q.index}_TAIL "
                f"reads {got:#x} after a write of {q.tail:#x}): its NPU serves fewer queues "
                f"than the {len(program.queues)} these programs need (the micro build of the "
                f"icebreaker preset runs queue 0 only, docs/micro.md); run the programs one at "
                f"a time")


class _Waiter:
    """Polls of one run, under one deadline, draining the trace buffer before each poll
    (its entries in ``trace``)."""

    def __init__(self, client, tm, timeout, poll_interval, trace_depth):
        self.client, self.tm = client, tm
        self.timeout, self.poll_interval, self.trace_depth = timeout, poll_interval, trace_depth
        self.deadline = time.monotonic() + timeout
        self.trace = []

    def _read(self, name):
        self.trace += _read_trace(self.client, self.trace_depth)
        return self.client.read_reg(self.tm.base + self.tm[name].offset)

    def _sleep_or_fail(self, what):
        if time.monotonic() >= self.deadline:
            raise BoardRunError(f"timeout: the NPU on {self.client.name} did not finish in "
                                f"{self.timeout:g} s ({what})")
        time.sleep(self.poll_interval)

    def tasks_run(self, n, why):
        """Until ``TASKS_RUN`` reads ``n`` or more."""
        while True:
            got = self._read("TASKS_RUN")
            if got >= n:
                return
            self._sleep_or_fail(f"{got} of the {n} tasks after which {why} completed")

    def idle(self):
        """Until ``STATUS.idle`` reads set twice in a row (the first read cannot have come
        before the work began)."""
        idle = self.tm["STATUS"]["idle"]
        seen = 0
        while seen < 2:
            if self._read("STATUS") & idle.mask:
                seen += 1
                continue
            seen = 0
            self._sleep_or_fail("STATUS.idle never set")


def _read_trace(client, depth):
    info = NPU_INFO
    d0 = info["TRACE_DATA0"]
    pop = info["TRACE_CTRL"].pack(pop=1)
    trace = []
    for _ in range(depth):
        f = d0.unpack(client.read_reg(d0.offset))
        if not f["valid"]:
            break
        cycle = client.read_reg(info["TRACE_DATA1"].offset)
        client.write_reg(info["TRACE_CTRL"].offset, pop)
        trace.append((f["task_id"], f["engine"], f["end"], f["error"], f["queue"], cycle))
    return trace

