"""The neural task manager: its sub-units composed, with the register file, the exception
status and the interrupt."""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.config import NPUConfig
from npu_spec.taskman import (
    BASE_TABLE_SIZE,
    COUNTERS,
    LEAN_COUNTERS,
    address_bits,
    base_table_size,
    task_manager_map,
)

from ..lib.csr import CSRSignature, RegisterFile
from ..lib.engine import EngineSignature, WriteLayout
from .config_queue import ConfigQueue
from .counters import Counters
from .dispatch import Dispatch
from .fetch import Fetch
from .layouts import CauseCode, ExceptionEvent, MemoryWindow, MemReadSignature, QueueControl
from .program import Programmer
from .queues import Queues
from .schedule import Scheduler
from .serial import SerialTaskBuffer
from .taskbuffer import TaskBuffer

__all__ = ["TaskManager"]


class TaskManager(wiring.Component):
    """The neural task manager.

    Sub-units (``docs/task_manager.md``): :class:`~.queues.Queues` (queue state),
    :class:`~.schedule.Scheduler` (arbiter, current queue, fetch target, GTSP, secure mode),
    :class:`~.fetch.Fetch` (descriptor DMA, fetch queue and its checks),
    :class:`~.config_queue.ConfigQueue` (committed descriptors), :class:`~.program.Programmer`
    (register writes, task loads), :class:`~.taskbuffer.TaskBuffer` (dispatch order),
    :class:`~.dispatch.Dispatch` (rule 4, watchdog, completion rules) and
    :class:`~.counters.Counters`.

    Parameters
    ----------
    config : NPUConfig
        ``config.task_queues`` sets the number of task queues; ``config.taskman_impl ==
        "lean"`` builds the lean task manager: a :class:`~.serial.SerialTaskBuffer` (one task at
        a time; ``buffer_depth`` and ``SKEW`` are ignored) with one watchdog timer, a base-address
        table of ``npu_spec.taskman.base_table_size(config)`` entries, head, tail, base, limit
        and exception addresses in ``npu_spec.taskman.address_bits(config)`` bits, and only the
        counters of ``npu_spec.taskman.LEAN_COUNTERS`` (``docs/task_manager.md``).
    config_depth : int
        Depth of the configuration queue (committed descriptors), at least 1.
    slot_words : int
        Largest descriptor, in words (a power of two, 8 to 256); a longer one is undecodable.
    buffer_depth : int
        Entries of the task buffer.

    Members
    -------
    csr : In(CSRSignature)
        Host register bus; offsets within the TASK_MANAGER map.
    irq : Out(1)
        Interrupt: an enabled ``IRQ_STATUS`` bit is set.
    mem : Out(MemReadSignature())
        Descriptor reads from system memory: requests (word addresses) and in-order responses
        (word and bus error) after any latency.
    writes : Out(stream.Signature(WriteLayout))
        Register writes to the blocks (descriptor entries), tagged with the task's sequence
        number.
    ne, pe, dma : Out(EngineSignature())
        Dispatch to the neural engine, the planar engine and the DMA engine. A ``done`` with a
        nonzero ``error`` code raises the exception ``ENGINE`` and retires the task's queue.
    """

    def __init__(self, config, *, config_depth=2, slot_words=32, buffer_depth=4):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"Configuration must be an NPUConfig, not {config!r}")
        if not isinstance(config_depth, int) or not 1 <= config_depth <= 15:
            raise ValueError(f"Configuration queue depth must be in [1, 15], "
                             f"not {config_depth!r}")
        if (not isinstance(slot_words, int) or slot_words < 8 or slot_words > 256
                or slot_words & (slot_words - 1)):
            raise ValueError(f"Slot size must be a power of two in [8, 256], not {slot_words!r}")
        self._config = config
        self._queues = config.task_queues
        self._config_depth = config_depth
        self._slot_words = slot_words
        self._buffer_depth = buffer_depth
        self._lean = config.taskman_impl == "lean"
        self._addr_width = address_bits(config)
        self._base_entries = base_table_size(config)
        self._regmap = task_manager_map(self._queues, base_entries=self._base_entries,
                                        address_width=self._addr_width)
        self._regfile = RegisterFile(self._regmap, read_path=config.csr_read)
        super().__init__({
            "csr": In(CSRSignature(self._regfile.addr_width)),
            "irq": Out(1),
            "mem": Out(MemReadSignature()),
            "writes": Out(stream.Signature(WriteLayout)),
            "ne": Out(EngineSignature()),
            "pe": Out(EngineSignature()),
            "dma": Out(EngineSignature()),
        })

    @property
    def config(self):
        return self._config

    @property
    def queues(self):
        return self._queues

    @property
    def regmap(self):
        return self._regmap

    @property
    def config_depth(self):
        return self._config_depth

    @property
    def slot_words(self):
        return self._slot_words

    def elaborate(self, platform):
        m = Module()
        nq = self._queues
        m.submodules.regfile = regs = self._regfile
        wiring.connect(m, wiring.flipped(self.csr), regs.bus)
        reg = regs.port

        m.submodules.queues = queues = Queues(nq, addr_width=self._addr_width)
        m.submodules.schedule = schedule = Scheduler(nq)
        aw = self._addr_width
        m.submodules.fetch = fetch = Fetch(nq, self._slot_words, addr_width=aw,
                                           base_entries=self._base_entries)
        m.submodules.config_queue = config_queue = ConfigQueue(self._config_depth,
                                                               self._slot_words, addr_width=aw)
        m.submodules.program = program = Programmer(nq, self._slot_words, addr_width=aw)
        if self._lean:
            taskbuf = SerialTaskBuffer(nq, addr_width=self._addr_width)
        else:
            taskbuf = TaskBuffer(self._buffer_depth, nq)
        m.submodules.taskbuf = taskbuf
        m.submodules.dispatch = dispatch = Dispatch(
            nq, shared_watchdog=self._lean, done_register=bool(self._config.dispatch_regs))
        m.submodules.counters = counters = Counters(LEAN_COUNTERS if self._lean else None)

        # Host registers of the queues and the base-address table.
        control = Signal(data.ArrayLayout(QueueControl, nq))
        windows = Signal(data.ArrayLayout(MemoryWindow, BASE_TABLE_SIZE))
        for i in range(nq):
            ctrl = reg(f"Q{i}_CTRL")
            state = queues.state[i]
            m.d.comb += [
                control[i].priority.eq(ctrl.priority), control[i].network.eq(ctrl.network),
                control[i].base_index.eq(ctrl.base_index), control[i].secure.eq(ctrl.secure),
                control[i].tail.eq(reg(f"Q{i}_TAIL").address),
                queues.set_head[i].eq(reg(f"Q{i}_HEAD").written),
                queues.head[i].eq(reg(f"Q{i}_HEAD").address),
                queues.push[i].eq(reg(f"Q{i}_PUSH").count),     # 0 unless just written
                reg(f"Q{i}_STATUS").count.eq(state.count), reg(f"Q{i}_STATUS").tqsp.eq(state.tqsp),
                reg(f"Q{i}_STATUS").retired.eq(state.retired),
                reg(f"Q{i}_PTR").address.eq(state.head),
            ]
        for j in range(self._base_entries):      # entries not built stay 0 (empty windows)
            m.d.comb += [windows[j].base.eq(reg(f"BASE{j}").address),
                         windows[j].limit.eq(reg(f"LIMIT{j}").words)]
        enable = reg("CTRL").enable

        # Fetch target -> fetch -> commit into the configuration queue.
        m.d.comb += [
            schedule.queue.eq(queues.state), schedule.control.eq(control),
            schedule.enable.eq(enable),
            fetch.queue.eq(queues.state), fetch.control.eq(control), fetch.window.eq(windows),
            fetch.target.eq(schedule.target), fetch.target_valid.eq(schedule.target_valid),
        ]
        wiring.connect(m, fetch.mem, wiring.flipped(self.mem))
        wiring.connect(m, fetch.fill, config_queue.fill)
        fetched = fetch.descriptor.payload
        commit = Signal()
        m.d.comb += [
            schedule.fetched_queue.eq(fetched.slot.queue),
            fetch.descriptor.ready.eq(~config_queue.full & schedule.may_commit),
            commit.eq(fetch.descriptor.valid & fetch.descriptor.ready),
            config_queue.commit.eq(commit), config_queue.info.eq(fetched.slot),
            queues.commit.eq(commit), queues.commit_queue.eq(fetched.slot.queue),
            queues.commit_length.eq(fetched.length),
            schedule.commit.eq(commit), schedule.commit_tsr.eq(fetched.slot.tsr),
        ]

        # Programming: configuration queue -> register writes -> task buffer.
        wiring.connect(m, program.slot, config_queue.read)
        wiring.connect(m, program.writes, wiring.flipped(self.writes))
        wiring.connect(m, program.load, taskbuf.load)
        m.d.comb += [program.drop.eq(queues.dropped), program.next_seq.eq(taskbuf.next_seq),
                     program.engine_busy.eq(taskbuf.loaded),
                     taskbuf.skew.eq(reg("SKEW").limit),
                     schedule.tsr_dropped.eq(program.dropped_tsr)]

        # Dispatch to the engines and the switch rules.
        for e, engine in enumerate((self.ne, self.pe, self.dma)):
            wiring.connect(m, taskbuf.start[e], dispatch.start[e])
            wiring.connect(m, dispatch.engines[e], wiring.flipped(engine))
            m.d.comb += [dispatch.finished[e].eq(taskbuf.finished[e]),
                         dispatch.finished_valid[e].eq(taskbuf.finished_valid[e]),
                         taskbuf.done[e].eq(dispatch.done[e]),
                         taskbuf.kill[e].eq(dispatch.kill[e]),
                         schedule.completing[e].eq(taskbuf.finished[e].queue),
                         dispatch.request_above[e].eq(schedule.request_above[e])]
        m.d.comb += [
            dispatch.tqsp.eq(queues.tqsp), dispatch.watchdog.eq(reg("WATCHDOG").cycles),
            dispatch.gtsp.eq(schedule.gtsp),
            schedule.gtsp_set.eq(dispatch.gtsp_set), schedule.switch.eq(dispatch.switch),
            schedule.started_new_queue.eq(dispatch.started_new_queue),
            schedule.tsr_done.eq(dispatch.tsr_done),
            queues.tqsp_set.eq(dispatch.tqsp_set), queues.tqsp_clear.eq(dispatch.tqsp_clear),
            queues.flag_queue.eq(dispatch.flag_queue),
        ]

        # Exceptions: a fetch error, or an engine error or a watchdog timeout (which win),
        # retires its queue; an engine error or a timeout also drops its remaining tasks, none of
        # which starts from this cycle on.
        raised = Signal(ExceptionEvent)
        m.d.comb += raised.eq(fetch.exception)
        with m.If(dispatch.exception.cause != CauseCode.NONE):
            m.d.comb += raised.eq(dispatch.exception)
        any_raised = Signal()
        m.d.comb += any_raised.eq(raised.cause != CauseCode.NONE)
        engine_raised = Signal()
        m.d.comb += engine_raised.eq(dispatch.exception.cause != CauseCode.NONE)
        m.d.comb += [queues.retire.eq(any_raised), queues.retire_queue.eq(raised.queue),
                     queues.retire_drop.eq(engine_raised),
                     schedule.retire.eq(any_raised), schedule.retire_queue.eq(raised.queue)]
        dropping = Signal(nq)
        with m.If(engine_raised):
            m.d.comb += dropping.eq(1 << dispatch.exception.queue)
        if self._lean:
            # One task in the buffer: an engine error or a timeout comes from the running task,
            # so no task waiting to start is there to drop in that cycle, and the next one is
            # dropped by the queue's (registered) drop flag; this keeps the watchdog's
            # comparison off the start path.
            m.d.comb += taskbuf.drop.eq(queues.dropped)
        else:
            # The exception of this cycle withdraws its queue's task waiting in a start
            # register; the grants see the queue's drop flag from the next cycle on (a task
            # granted in this cycle is withdrawn then), which keeps the exception off them.
            m.d.comb += [taskbuf.drop.eq(queues.dropped), taskbuf.withdraw.eq(dropping)]
        latest = Signal(ExceptionEvent)
        exceptions = Signal(8)          # saturating count
        with m.If(any_raised):
            m.d.sync += latest.eq(raised)
            with m.If(exceptions != 0xFF):
                m.d.sync += exceptions.eq(exceptions + 1)
        m.d.comb += [reg("EXC_STATUS").cause.eq(latest.cause),
                     reg("EXC_STATUS").queue.eq(latest.queue),
                     reg("EXC_STATUS").count.eq(exceptions),
                     reg("EXC_STATUS").engine.eq(latest.engine),
                     reg("EXC_STATUS").error_code.eq(latest.code),
                     reg("EXC_ADDR").address.eq(latest.addr)]

        # Interrupt.
        irq_status, irq_enable = reg("IRQ_STATUS"), reg("IRQ_ENABLE")
        m.d.comb += [irq_status.error_set.eq(any_raised),
                     irq_status.task_done_set.eq(dispatch.task_done_irq),
                     self.irq.eq((irq_status.error & irq_enable.error) |
                                 (irq_status.task_done & irq_enable.task_done))]

        # Status and counters.
        busy = Signal()
        m.d.comb += busy.eq(config_queue.read.valid | ~taskbuf.empty)
        status = reg("STATUS")
        m.d.comb += [
            schedule.busy.eq(busy),
            status.gtsp.eq(schedule.gtsp), status.current_valid.eq(schedule.current_valid),
            status.current.eq(schedule.current), status.busy.eq(busy),
            status.secure.eq(schedule.secure_mode),
            status.secure_request.eq(schedule.secure_request),
            status.idle.eq(~busy & ~Cat(*((queues.state[i].count != 0) & ~queues.state[i].retired
                                          for i in range(nq))).any()),
            counters.busy.eq(busy), counters.work.eq(schedule.work),
            counters.completed.eq(dispatch.completed),
            counters.waiting.eq(Cat(*taskbuf.waiting)),
            counters.write_stall.eq(self.writes.valid & ~self.writes.ready),
            counters.switch.eq(dispatch.switch), counters.request.eq(schedule.request),
            counters.started_new_queue.eq(dispatch.started_new_queue),
        ]
        for n, (name, _) in enumerate(COUNTERS):
            m.d.comb += reg(name).value.eq(counters.value[n])
        return m
