"""The neural task manager: queues, arbiter, descriptor DMA, fetch and configuration queues,
task switching, task buffer dispatch, exceptions and counters."""

from amaranth.hdl import Array, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu_spec.config import NPUConfig
from ..lib.csr import CSRSignature, RegisterFile
from npu_spec.registers import ADDRESS_WINDOWS
from .arbiter import Arbiter
from ..lib.engine import ADDR_WIDTH, QUEUE_WIDTH, EngineSignature, WriteLayout
from .layouts import MemReadSignature
from npu_spec.taskman import BASE_TABLE_SIZE, PRIORITY_WIDTH, Cause, task_manager_map
from .slots import SlotRing
from .taskbuffer import ENGINES, TaskBuffer

__all__ = ["DESCRIPTOR_MAGIC", "HEADER_WORDS", "TaskManager"]

#: Descriptor format constants (see ``docs/descriptors.md``; the Python encoder is
#: ``npu_spec.descriptors``).
DESCRIPTOR_MAGIC = 0xD7
HEADER_WORDS = 4


class TaskManager(wiring.Component):
    """The neural task manager.

    Parameters
    ----------
    config : NPUConfig
        ``config.task_queues`` sets the number of task queues.
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
        Descriptor reads from system memory.
    writes : Out(stream.Signature(WriteLayout))
        Register writes to the blocks (descriptor entries), tagged with the task's sequence
        number.
    ne, pe : Out(EngineSignature())
        Dispatch to the neural engine and the planar engine.
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
        self._regmap = task_manager_map(self._queues)
        self._regfile = RegisterFile(self._regmap)
        super().__init__({
            "csr": In(CSRSignature(self._regfile.addr_width)),
            "irq": Out(1),
            "mem": Out(MemReadSignature()),
            "writes": Out(stream.Signature(WriteLayout)),
            "ne": Out(EngineSignature()),
            "pe": Out(EngineSignature()),
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
        depth = self._config_depth
        slots = depth + 1
        W = self._slot_words
        m.submodules.regfile = regs = self._regfile
        wiring.connect(m, wiring.flipped(self.csr), regs.bus)

        def reg(name):
            return regs.port(name)

        enable = reg("CTRL").enable

        # ---- Queue state -------------------------------------------------------------------
        head = Array(Signal(ADDR_WIDTH, name=f"head{i}") for i in range(nq))
        count = Array(Signal(16, name=f"count{i}") for i in range(nq))
        tqsp = Array(Signal(name=f"tqsp{i}") for i in range(nq))
        retired = Array(Signal(name=f"retired{i}") for i in range(nq))
        dropq = Array(Signal(name=f"drop{i}") for i in range(nq))
        prio = Array(reg(f"Q{i}_CTRL").priority for i in range(nq))
        network = Array(reg(f"Q{i}_CTRL").network for i in range(nq))
        base_index = Array(reg(f"Q{i}_CTRL").base_index for i in range(nq))
        tail = Array(reg(f"Q{i}_TAIL").address for i in range(nq))
        table_base = Array(reg(f"BASE{j}").address for j in range(BASE_TABLE_SIZE))
        table_limit = Array(reg(f"LIMIT{j}").words for j in range(BASE_TABLE_SIZE))
        for i in range(nq):
            st = reg(f"Q{i}_STATUS")
            m.d.comb += [st.count.eq(count[i]), st.tqsp.eq(tqsp[i]), st.retired.eq(retired[i]),
                         reg(f"Q{i}_PTR").address.eq(head[i])]

        # ---- Arbiter -----------------------------------------------------------------------
        # Secure mode (seed 004): work on a secure queue is a secure request. From then on only
        # secure queues are chosen; the mode switches once the NPU has drained, and switches
        # back once no secure work is left and the NPU has drained again.
        secure = Array(reg(f"Q{i}_CTRL").secure for i in range(nq))
        secure_mode = Signal()
        secure_request = Signal()
        has_work = [(count[i] != 0) & ~retired[i] for i in range(nq)]
        # Registered (one cycle behind, off the critical path).
        m.d.sync += secure_request.eq(Cat(has_work[i] & secure[i] for i in range(nq)).any())
        m.submodules.arbiter = arb = Arbiter(nq, PRIORITY_WIDTH)
        for i in range(nq):
            m.d.comb += [arb.request[i].eq(has_work[i] & enable &
                                           (secure[i] | ~(secure_mode | secure_request))),
                         arb.priority[i].eq(prio[i])]

        # The arbiter's choice is registered to keep it off the critical path; a choice whose
        # queue has meanwhile run out of descriptors or been retired is ignored.
        choice_valid = Signal()
        choice = Signal(QUEUE_WIDTH)
        choice_prio = Signal(PRIORITY_WIDTH)
        m.d.sync += [choice_valid.eq(arb.valid), choice.eq(arb.index),
                     choice_prio.eq(arb.chosen_priority)]
        choice_ok = Signal()
        m.d.comb += choice_ok.eq(choice_valid & (count[choice] != 0) & ~retired[choice])

        # The current queue is the one whose tasks are being committed. It keeps the pipeline
        # until its list ends, it is retired, or rule 3 releases it.
        cur = Signal(QUEUE_WIDTH)
        cur_valid = Signal()
        gtsp = Signal()
        tsr_pending = Signal()
        stay = Signal()
        target = Signal(QUEUE_WIDTH)
        target_valid = Signal()
        # While GTSP is set and the TSR task is committed, the switch is certain (rule 3): the
        # fetch queue already takes the arbiter's choice, so its descriptor is ready when the TSR
        # task completes.
        m.d.comb += stay.eq(cur_valid & (count[cur] != 0) & ~retired[cur] & enable &
                            ~(gtsp & tsr_pending))
        with m.If(stay):
            m.d.comb += [target.eq(cur), target_valid.eq(1)]
        with m.Else():
            m.d.comb += [target.eq(choice), target_valid.eq(choice_ok)]

        # ---- Exceptions (combinational events, applied below) -------------------------------
        fetch_err = Signal()
        fetch_cause = Signal(3)
        timeout = Signal(ENGINES)

        # ---- Descriptor DMA and fetch queue ------------------------------------------------
        m.submodules.slots = slot_mem = Memory(shape=32, depth=slots * W, init=[])
        slot_wr = slot_mem.write_port()
        slot_rd = slot_mem.read_port(transparent_for=())
        m.submodules.ring = ring = SlotRing(depth)
        cfg_rd = ring.rd                       # oldest committed slot
        cfg_wr = ring.wr                       # fetch slot
        cfg_level = ring.level
        slot_queue = Array(Signal(QUEUE_WIDTH, name=f"slot_queue{s}") for s in range(slots))
        slot_addr = Array(Signal(ADDR_WIDTH, name=f"slot_addr{s}") for s in range(slots))
        slot_base = Array(Signal(ADDR_WIDTH, name=f"slot_base{s}") for s in range(slots))
        slot_tsr = Array(Signal(name=f"slot_tsr{s}") for s in range(slots))

        f_busy = Signal()          # reading a descriptor
        f_valid = Signal()         # the fetch queue holds a complete descriptor
        f_queue = Signal(QUEUE_WIDTH)
        f_addr = Signal(ADDR_WIDTH)
        f_len = Signal(8)
        f_len_known = Signal()
        f_tsr = Signal()
        f_issue = Signal(8)
        f_recv = Signal(8)
        f_pending = Signal()       # a read was issued last cycle
        f_ent_rem = Signal(16)
        f_base = Signal(ADDR_WIDTH)
        f_limit = Signal(ADDR_WIDTH)

        # The fetch queue is replaced (no side effects) when it no longer matches the target.
        stale = Signal()
        m.d.comb += stale.eq(~target_valid | (f_queue != target) | (head[f_queue] != f_addr) |
                             retired[f_queue])

        # Issue reads: word 0 first, the rest once the length is known.
        issue = Signal()
        m.d.comb += issue.eq(f_busy & ~stale &
                             ((f_issue == 0) | (f_len_known & (f_issue < f_len))))
        m.d.comb += [self.mem.addr.eq(f_addr + f_issue), self.mem.en.eq(issue)]
        with m.If(issue):
            m.d.sync += f_issue.eq(f_issue + 1)
        m.d.sync += f_pending.eq(issue)

        word = self.mem.data
        k = f_recv
        recv = Signal()
        m.d.comb += recv.eq(f_busy & ~stale & f_pending)
        m.d.comb += [slot_wr.addr.eq(Cat(k[:W.bit_length() - 1], cfg_wr)),
                     slot_wr.data.eq(word), slot_wr.en.eq(recv)]

        w_len = word[8:16]
        w_count = word[16:32]
        w_reg = word[:16]
        desc_end = Signal(ADDR_WIDTH + 1)
        m.d.comb += desc_end.eq(f_addr + w_len)
        win_end = Signal(ADDR_WIDTH + 1)
        m.d.comb += win_end.eq(f_base + f_limit)
        ftail = Signal(ADDR_WIDTH)
        m.d.comb += ftail.eq(tail[f_queue])

        # Register-address check: the range lies in one window of ADDRESS_WINDOWS.
        reg_last = Signal(17)
        m.d.comb += reg_last.eq(w_reg + w_count)
        in_map = 0
        for start, size in ADDRESS_WINDOWS.values():
            in_map = in_map | ((w_reg >= start) & (reg_last <= start + size))

        with m.If(recv):
            m.d.sync += f_recv.eq(f_recv + 1)
            with m.If(k == 0):
                with m.If((word[:8] != DESCRIPTOR_MAGIC) | (word[25:] != 0) |
                          (w_len < HEADER_WORDS) | (w_len > W)):
                    m.d.comb += [fetch_err.eq(1), fetch_cause.eq(Cause.DECODE)]
                with m.Elif((f_addr < f_base) | (desc_end > win_end) |
                            ((ftail != 0) & (desc_end > ftail))):
                    m.d.comb += [fetch_err.eq(1), fetch_cause.eq(Cause.WINDOW)]
                m.d.sync += [f_len.eq(w_len), f_len_known.eq(1), f_tsr.eq(word[20])]
            with m.Elif(k == 1):
                # The network ID must be the queue's.
                m.d.comb += [fetch_err.eq(word[16:24] != network[f_queue]),
                             fetch_cause.eq(Cause.DECODE)]
            with m.Elif(k == 2):
                with m.If(word[24:] != 0):
                    m.d.comb += [fetch_err.eq(1), fetch_cause.eq(Cause.DECODE)]
                with m.Elif((word[:16] + word[16:24]) > f_limit):
                    m.d.comb += [fetch_err.eq(1), fetch_cause.eq(Cause.WINDOW)]
            with m.Elif(k == 3):
                with m.If(word[16:] != 0):
                    m.d.comb += [fetch_err.eq(1), fetch_cause.eq(Cause.DECODE)]
                with m.Elif((word[:16] + 1) > f_limit):
                    m.d.comb += [fetch_err.eq(1), fetch_cause.eq(Cause.WINDOW)]
            with m.Elif(f_ent_rem == 0):
                # An entry header.
                with m.If((w_count == 0) | ((k + 1 + w_count) > f_len)):
                    m.d.comb += [fetch_err.eq(1), fetch_cause.eq(Cause.DECODE)]
                with m.Elif(~in_map):
                    m.d.comb += [fetch_err.eq(1), fetch_cause.eq(Cause.ADDRESS)]
                m.d.sync += f_ent_rem.eq(w_count)
            with m.Else():
                m.d.sync += f_ent_rem.eq(f_ent_rem - 1)
            # The last word completes the descriptor (word 0, which carries the length, is never
            # the last: a descriptor has at least the 4 header words).
            last = Signal()
            m.d.comb += last.eq(f_len_known & (k + 1 == f_len))
            with m.If(last & ~fetch_err):
                m.d.sync += [f_busy.eq(0), f_valid.eq(1)]

        with m.If(fetch_err):
            m.d.sync += [f_busy.eq(0), f_valid.eq(0)]

        # Commit: fetch queue -> configuration queue.
        commit = Signal()
        m.d.comb += commit.eq(f_valid & ~stale & ~ring.full & ~tsr_pending & enable &
                              (secure[f_queue] == secure_mode))
        m.d.comb += ring.commit.eq(commit)

        with m.If((f_busy | f_valid) & stale):
            m.d.sync += [f_busy.eq(0), f_valid.eq(0)]
        with m.Elif(~f_busy & ~f_valid & target_valid):
            # Start a fetch from the target queue's head.
            m.d.sync += [f_busy.eq(1), f_queue.eq(target), f_addr.eq(head[target]),
                         f_issue.eq(0), f_recv.eq(0), f_len_known.eq(0), f_ent_rem.eq(0),
                         f_base.eq(table_base[base_index[target]]),
                         f_limit.eq(table_limit[base_index[target]])]
        with m.If(commit):
            m.d.sync += [f_valid.eq(0),
                         slot_queue[cfg_wr].eq(f_queue), slot_addr[cfg_wr].eq(f_addr),
                         slot_base[cfg_wr].eq(f_base), slot_tsr[cfg_wr].eq(f_tsr),
                         cur.eq(f_queue), cur_valid.eq(1)]
            with m.If(f_tsr):
                m.d.sync += tsr_pending.eq(1)

        # ---- Programming stage: configuration queue -> register writes -> task buffer ------
        m.submodules.taskbuf = tb = TaskBuffer(self._buffer_depth, nq)
        m.d.comb += tb.skew.eq(reg("SKEW").limit)
        p_k = Signal(8)
        p_len = Signal(8)
        p_h = [Signal(32, name=f"p_h{n}") for n in range(HEADER_WORDS)]
        p_reg = Signal(16)
        p_rem = Signal(16)
        pop = Signal()
        pop_tsr = Signal()
        head_queue = Signal(QUEUE_WIDTH)
        m.d.comb += head_queue.eq(slot_queue[cfg_rd])
        rword = slot_rd.data

        # The task entry built from the header words.
        load = tb.load.payload
        h0, h1, h2, h3 = p_h
        m.d.comb += [
            load.engine.eq(h0[16]), load.tse.eq(h0[17]), load.spc.eq(h0[18]),
            load.dpc.eq(h0[19]), load.tsr.eq(h0[20]), load.spl.eq(h0[21]),
            load.src_mem.eq(h0[22]), load.dst_mem.eq(h0[23]), load.irq.eq(h0[24]),
            load.barrier.eq(h0[17] | h0[20] | h0[21]),
            load.task_id.eq(h1[:16]), load.network.eq(h1[16:24]), load.dep.eq(h1[24:]),
            load.src.eq(h2[:16]), load.src_len.eq(h2[16:24]), load.dst.eq(h3[:16]),
            load.queue.eq(head_queue), load.base.eq(slot_base[cfg_rd]),
            load.addr.eq(slot_addr[cfg_rd]),
        ]
        m.d.comb += [self.writes.payload.addr.eq(p_reg), self.writes.payload.data.eq(rword),
                     self.writes.payload.seq.eq(tb.next_seq)]

        # The slot memory is read one word ahead: ``rd_k`` is the word presented next cycle.
        rd_k = Signal(8)
        m.d.comb += slot_rd.addr.eq(Cat(rd_k[:W.bit_length() - 1], cfg_rd))
        advance = Signal()
        m.d.comb += rd_k.eq(Mux(advance, p_k + 1, p_k))
        with m.FSM(name="program"):
            with m.State("IDLE"):
                m.d.comb += rd_k.eq(0)
                with m.If(cfg_level != 0):
                    with m.If(dropq[head_queue]):
                        m.d.comb += pop.eq(1)
                    with m.Else():
                        m.d.sync += [p_k.eq(0), p_rem.eq(0)]
                        m.next = "WORD"
            with m.State("WORD"):
                # Word p_k of the descriptor is on rword.
                with m.If(dropq[head_queue]):
                    m.d.comb += pop.eq(1)
                    m.next = "IDLE"
                with m.Elif(p_k < HEADER_WORDS):
                    for n in range(HEADER_WORDS):
                        with m.If(p_k == n):
                            m.d.sync += p_h[n].eq(rword)
                    with m.If(p_k == 0):
                        m.d.sync += p_len.eq(rword[8:16])
                    m.d.comb += advance.eq(1)
                with m.Elif(p_rem == 0):
                    m.d.sync += [p_reg.eq(rword[:16]), p_rem.eq(rword[16:])]
                    m.d.comb += advance.eq(1)
                with m.Else():
                    m.d.comb += self.writes.valid.eq(1)
                    with m.If(self.writes.ready):
                        m.d.sync += [p_reg.eq(p_reg + 1), p_rem.eq(p_rem - 1)]
                        m.d.comb += advance.eq(1)
                with m.If(advance):
                    m.d.sync += p_k.eq(p_k + 1)
                    with m.If((p_k != 0) & (p_k + 1 == p_len)):
                        m.next = "LOAD"
            with m.State("LOAD"):
                with m.If(dropq[head_queue]):
                    m.d.comb += pop.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += tb.load.valid.eq(1)
                    with m.If(tb.load.ready):
                        m.d.comb += pop.eq(1)
                        m.next = "IDLE"
        # A dropped TSR task no longer blocks commits.
        m.d.comb += pop_tsr.eq(pop & dropq[head_queue] & slot_tsr[cfg_rd])
        m.d.comb += ring.pop.eq(pop)

        # ---- Dispatch to the engines, rules 4 and 2 ----------------------------------------
        engines = [self.ne, self.pe]
        run_q = Signal(QUEUE_WIDTH)        # queue of the most recently started task
        run_q_valid = Signal()
        started_new_queue = Signal()
        for e, eng in enumerate(engines):
            src = tb.start[e]
            m.d.comb += [eng.start.valid.eq(src.valid), src.ready.eq(eng.start.ready),
                         eng.start.payload.eq(src.payload),
                         # Rule 4: SPC with TQSP set reads system memory.
                         eng.start.payload.src_mem.eq(src.payload.src_mem |
                                                      (src.payload.spc &
                                                       tqsp[src.payload.queue]))]
            with m.If(src.valid & src.ready):
                m.d.sync += [run_q.eq(src.payload.queue), run_q_valid.eq(1)]
                with m.If(~run_q_valid | (src.payload.queue != run_q)):
                    m.d.comb += started_new_queue.eq(1)

        # ---- Watchdog ----------------------------------------------------------------------
        limit = reg("WATCHDOG").cycles
        for e, eng in enumerate(engines):
            timer = Signal(32, name=f"timer{e}")
            busy = Signal(name=f"engine_busy{e}")
            with m.If(eng.start.valid & eng.start.ready):
                m.d.sync += [busy.eq(1), timer.eq(0)]
            with m.Elif(busy):
                m.d.sync += timer.eq(timer + 1)
            with m.If(tb.finished_valid[e]):
                m.d.sync += busy.eq(0)
            m.d.comb += timeout[e].eq(busy & ~eng.done & (limit != 0) & (timer + 1 >= limit))
            m.d.comb += [tb.done[e].eq(eng.done), tb.kill[e].eq(timeout[e]),
                         eng.abort.eq(timeout[e])]

        # ---- Completion: rules 1, 2, 3 and 5 ----------------------------------------------
        # Switch-point tasks run alone (task-buffer barrier), so at most one completing task
        # carries TSE, TSR or SPL.
        request = Signal()
        gtsp_set = Signal()
        gtsp_now = Signal()
        switch = Signal()
        tqsp_set = Signal()
        tqsp_clear = Signal()
        flag_queue = Signal(QUEUE_WIDTH)
        task_done_irq = Signal()
        completed = Signal(2)
        tsr_done = Signal()
        for e, eng in enumerate(engines):
            fin = tb.finished[e]
            ok = tb.finished_valid[e] & ~timeout[e]
            m.d.comb += completed[e].eq(tb.finished_valid[e])
            with m.If(ok & fin.tse & ((choice_ok & (choice_prio > prio[fin.queue])) |
                                       (secure_request & ~secure[fin.queue]))):
                m.d.comb += gtsp_set.eq(1)
            with m.If(tb.finished_valid[e] & fin.tsr):
                m.d.comb += tsr_done.eq(1)
            with m.If(ok & (fin.tse | fin.tsr | fin.spl)):
                m.d.comb += flag_queue.eq(fin.queue)
            with m.If(ok & fin.irq):
                m.d.comb += task_done_irq.eq(1)
        m.d.comb += gtsp_now.eq(gtsp | gtsp_set)
        for e, eng in enumerate(engines):
            fin = tb.finished[e]
            ok = tb.finished_valid[e] & ~timeout[e]
            # Rule 2: DPC while GTSP is set writes the output to system memory.
            m.d.comb += eng.done_mem.eq(fin.dst_mem | (fin.dpc & gtsp_now))
            with m.If(ok & fin.tsr & gtsp_now):
                m.d.comb += [switch.eq(1), tqsp_set.eq(1)]     # rule 3
            with m.If(ok & fin.spl):
                m.d.comb += tqsp_clear.eq(1)                   # rule 5
        m.d.comb += request.eq(cur_valid & ((choice_ok & (choice_prio > prio[cur])) |
                                            (secure_request & ~secure[cur])))

        with m.If(started_new_queue):
            m.d.sync += gtsp.eq(0)
        with m.If(gtsp_set):
            m.d.sync += gtsp.eq(1)
        with m.If(switch):
            m.d.sync += [gtsp.eq(0), cur_valid.eq(0)]
        with m.If(tsr_done | pop_tsr):
            m.d.sync += tsr_pending.eq(0)

        # ---- Exceptions --------------------------------------------------------------------
        exc = reg("EXC_STATUS")
        exc_cause = Signal(3)
        exc_queue = Signal(QUEUE_WIDTH)
        exc_addr = Signal(ADDR_WIDTH)
        exc_count = Signal(8)
        any_err = Signal()
        m.d.comb += [exc.cause.eq(exc_cause), exc.queue.eq(exc_queue), exc.count.eq(exc_count),
                     reg("EXC_ADDR").address.eq(exc_addr)]
        err_queue = Signal(QUEUE_WIDTH)
        err_drop = Signal()
        with m.If(fetch_err & ~stale):
            m.d.comb += any_err.eq(1)
            m.d.comb += err_queue.eq(f_queue)
            m.d.sync += [exc_cause.eq(fetch_cause), exc_queue.eq(f_queue), exc_addr.eq(f_addr)]
        for e in range(ENGINES):
            with m.If(timeout[e]):
                m.d.comb += [any_err.eq(1), err_queue.eq(tb.finished[e].queue), err_drop.eq(1)]
                m.d.sync += [exc_cause.eq(Cause.TIMEOUT), exc_queue.eq(tb.finished[e].queue),
                             exc_addr.eq(tb.finished[e].addr)]
        with m.If(any_err):
            with m.If(exc_count != 0xFF):
                m.d.sync += exc_count.eq(exc_count + 1)
            with m.If(cur_valid & (cur == err_queue)):
                m.d.sync += cur_valid.eq(0)

        # ---- Queue state updates -----------------------------------------------------------
        for i in range(nq):
            h = reg(f"Q{i}_HEAD")
            push = reg(f"Q{i}_PUSH")
            inc = Mux(push.written, push.count, 0)
            dec = Mux(commit & (f_queue == i), 1, 0)
            m.d.sync += count[i].eq(count[i] + inc - dec)
            with m.If(h.written):
                m.d.sync += [head[i].eq(h.address), retired[i].eq(0), dropq[i].eq(0),
                             tqsp[i].eq(0)]
            with m.Else():
                with m.If(commit & (f_queue == i)):
                    m.d.sync += head[i].eq(head[i] + f_len)
                with m.If(tqsp_set & (flag_queue == i)):
                    m.d.sync += tqsp[i].eq(1)
                with m.If(tqsp_clear & (flag_queue == i)):
                    m.d.sync += tqsp[i].eq(0)
                with m.If(any_err & (err_queue == i)):
                    m.d.sync += retired[i].eq(1)
                    with m.If(err_drop):
                        m.d.sync += dropq[i].eq(1)
        m.d.comb += tb.drop.eq(Cat(dropq[i] for i in range(nq)))

        # ---- Interrupts --------------------------------------------------------------------
        irq_status = reg("IRQ_STATUS")
        irq_enable = reg("IRQ_ENABLE")
        m.d.comb += [irq_status.error_set.eq(any_err), irq_status.task_done_set.eq(task_done_irq),
                     self.irq.eq((irq_status.error & irq_enable.error) |
                                 (irq_status.task_done & irq_enable.task_done))]

        # ---- Status and performance counters ----------------------------------------------
        busy = Signal()
        m.d.comb += busy.eq((cfg_level != 0) | ~tb.empty)
        status = reg("STATUS")
        m.d.comb += [status.gtsp.eq(gtsp), status.current_valid.eq(cur_valid),
                     status.current.eq(cur), status.busy.eq(busy),
                     status.secure.eq(secure_mode), status.secure_request.eq(secure_request)]
        # Mode switch when drained: nothing committed, loaded or running, and the current queue
        # does not hold the pipeline.
        drained = Signal()
        m.d.comb += drained.eq(~busy & ~stay)
        with m.If(drained & (secure_mode != secure_request)):
            m.d.sync += secure_mode.eq(secure_request)
        work = Signal()
        m.d.comb += work.eq(choice_ok)
        engine_running = Signal()
        m.d.comb += engine_running.eq(~tb.empty)
        counters = {}
        for name in ("TASKS_RUN", "BUSY_CYCLES", "IDLE_CYCLES", "STALL_FETCH", "STALL_DEP",
                     "STALL_WRITE", "SWITCHES", "SWITCH_LATENCY"):
            counters[name] = Signal(32, name=name.lower())
            m.d.comb += reg(name).value.eq(counters[name])
        m.d.sync += counters["TASKS_RUN"].eq(counters["TASKS_RUN"] + completed[0] + completed[1])
        with m.If(busy):
            m.d.sync += counters["BUSY_CYCLES"].eq(counters["BUSY_CYCLES"] + 1)
        with m.Else():
            m.d.sync += counters["IDLE_CYCLES"].eq(counters["IDLE_CYCLES"] + 1)
        with m.If(work & (cfg_level == 0) & tb.empty):
            m.d.sync += counters["STALL_FETCH"].eq(counters["STALL_FETCH"] + 1)
        with m.If(tb.waiting[0] | tb.waiting[1]):
            m.d.sync += counters["STALL_DEP"].eq(counters["STALL_DEP"] + 1)
        with m.If(self.writes.valid & ~self.writes.ready):
            m.d.sync += counters["STALL_WRITE"].eq(counters["STALL_WRITE"] + 1)
        with m.If(switch):
            m.d.sync += counters["SWITCHES"].eq(counters["SWITCHES"] + 1)
        # Switch latency: from the first cycle of a request to the start of a task of another
        # queue.
        lat = Signal(32)
        lat_on = Signal()
        with m.If(lat_on):
            m.d.sync += lat.eq(lat + 1)
            with m.If(started_new_queue):
                m.d.sync += [lat_on.eq(0), counters["SWITCH_LATENCY"].eq(lat + 1)]
        with m.Elif(request):
            m.d.sync += [lat_on.eq(1), lat.eq(0)]
        return m
