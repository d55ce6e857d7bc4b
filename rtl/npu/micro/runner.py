"""The micro build's task runner: queue 0's descriptors, one task at a time
(``docs/micro.md``, "What the micro build implements")."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu_spec.config import NPUConfig
from npu_spec.descriptors import ENTRY, HEADER, HEADER_WORDS, MAGIC, reserved_mask
from npu_spec.engine import ERROR_BITS, Engine
from npu_spec.registers import ADDRESS_WINDOWS, NPU_INFO, npu_info_values
from npu_spec.taskman import SLOT_WORDS, Cause, address_bits, base_table_size, task_manager_map

from ..lib.csr import CSRSignature

__all__ = ["MicroRunner"]

H0, H1, H2, H3 = HEADER


def _at_least(value, bound):
    """``value >= bound`` for an unsigned ``value`` and a constant ``bound``; a bound that is a
    power of two needs no comparator."""
    if bound & (bound - 1) == 0:
        return value[bound.bit_length() - 1:] != 0
    return value >= bound


def _field(word, register, name):
    """Field ``name`` of ``register`` in ``word``."""
    f = register[name]
    return word[f.offset:f.offset + f.width]


def _inside_one_window(address, count_bits):
    """``(last, inside)``: drive ``last`` with the last register of a run of 1 to
    ``2**count_bits - 1`` registers from ``address``; ``inside`` says both lie in one window
    of ``ADDRESS_WINDOWS`` (combinational; every window is a power of two in size, aligned,
    and larger than a run). A run from inside a window of ``2**s`` words leaves it exactly
    when the addition carries into bit ``s``, which then differs between ``last`` and
    ``address``: one bit compared instead of the high bits of ``last``."""
    last = Signal(17)
    ok = []
    for start, size in ADDRESS_WINDOWS.values():
        if size & (size - 1) or start % size or size < 1 << count_bits:
            raise AssertionError(f"window 0x{start:X}+0x{size:X} is not aligned or too small")
        bits = (size - 1).bit_length()
        ok.append(((address >> bits) == start >> bits) & (last[bits] == address[bits]))
    return last, Cat(*ok).any()


class MicroRunner(wiring.Component):
    """Queue 0 of the task manager, run one descriptor at a time, and the host registers.

    The runner reads a descriptor word by word from system memory (two cycles a word),
    checks each as :func:`npu_spec.descriptors.decode` does (in its order: the first failing
    word decides the cause), writes each entry's data words to the register file as they
    arrive, then starts the unit of ``H0.engine`` and waits for its ``done``. A descriptor
    error or an engine's nonzero error code retires the queue (``Q0_STATUS.retired``,
    ``EXC_STATUS``, ``EXC_ADDR``, ``IRQ_STATUS.error``).

    Host registers (``bus``): ``NPU_INFO``'s identification and configuration words; of the
    task manager's map, ``CTRL``, ``IRQ_ENABLE``, ``BASE0``, ``LIMIT0``, ``Q0_CTRL``,
    ``Q0_HEAD``, ``Q0_PUSH``, ``Q0_TAIL`` (written) and ``IRQ_STATUS`` (read, write 1 to
    clear), ``EXC_STATUS``, ``EXC_ADDR``, ``STATUS``, ``Q0_STATUS``, ``Q0_PTR`` (read). Other
    words read 0 and drop writes.

    Members
    -------
    bus : In(CSRSignature(16))
        The host's register bus (``r_data`` the cycle after ``r_en``).
    irq : Out(1)
        ``IRQ_STATUS`` and ``IRQ_ENABLE`` have a common bit.
    mem_addr : Out(mem_addr_bits), mem_re : Out(1), mem_rdata : In(32)
        Descriptor reads from system memory (32-bit words; data the next cycle).
    reg_w_addr : Out(16), reg_w_data : Out(32), reg_w_en : Out(1)
        Register-file writes.
    ne_core0 : In(1)
        ``NE_CORES`` bit 0; a neural task without it runs nothing and ends with 0.
    engine : Out(2)
        The engine of the current task.
    running : Out(1)
        A unit's task is running: the unit owns the register-file read port, the buffer and
        (the DMA unit) system memory.
    start : Out(1)
        Start pulse for the unit of ``engine``.
    done : In(1), error : In(4)
        The running unit's end and error code.
    base, limit : Out(32)
        The window of queue 0 (``BASE0``, ``LIMIT0``; 32-bit words).
    """

    def __init__(self, config):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"Configuration must be an NPUConfig, not {config!r}")
        self._config = config
        self._mem_words = config.mem_kib * 256
        self.mem_addr_bits = max(1, (self._mem_words - 1).bit_length())
        self._abits = address_bits(config)
        self._tm = task_manager_map(config.task_queues, base_entries=base_table_size(config),
                                    address_width=self._abits)
        super().__init__({
            "bus": In(CSRSignature(16)), "irq": Out(1),
            "mem_addr": Out(self.mem_addr_bits), "mem_re": Out(1), "mem_rdata": In(32),
            "reg_w_addr": Out(16), "reg_w_data": Out(32), "reg_w_en": Out(1),
            "ne_core0": In(1), "engine": Out(2), "running": Out(1), "start": Out(1),
            "done": In(1), "error": In(ERROR_BITS),
            "base": Out(32), "limit": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        q = self._queue_state(m)
        self._host(m, q)
        self._fetch(m, q)
        return m

    # -- the queue and exception state ------------------------------------------------------

    def _queue_state(self, m):
        a = self._abits
        q = {
            "enable": Signal(init=self._tm["CTRL"]["enable"].reset),
            "base": Signal(a), "limit": Signal(a), "network": Signal(8),
            "base_index": Signal(3), "ptr": Signal(a), "tail": Signal(a),
            "count": Signal(16), "retired": Signal(),
            "cause": Signal(Cause.bits), "exc_engine": Signal(2), "exc_code": Signal(ERROR_BITS),
            "exc_count": Signal(8), "exc_addr": Signal(a),
            "irq_error": Signal(), "irq_done": Signal(),
            "en_error": Signal(init=1), "en_done": Signal(init=1),
            "busy": Signal(),
            # the host writes Q0_PUSH in this cycle (which adds to the count)
            "pushing": Signal(),
        }
        m.d.comb += [self.base.eq(q["base"]), self.limit.eq(q["limit"]),
                     self.irq.eq((q["irq_error"] & q["en_error"]) | (q["irq_done"] & q["en_done"]))]
        return q

    def _host(self, m, q):
        """The host's register reads and writes."""
        bus, tm = self.bus, self._tm
        info = npu_info_values(self._config)
        reads = {NPU_INFO[name].offset: NPU_INFO[name].pack(**values)
                 for name, values in info.items()}

        def at(name):
            return tm.address(name)

        idle = ~q["busy"] & (q["retired"] | (q["count"] == 0) | ~q["enable"])
        status = tm["STATUS"]
        # What the runtime reads (npu_sim.board_host); the other registers are write-only.
        live = {
            at("IRQ_STATUS"): Cat(q["irq_error"], q["irq_done"]),
            at("EXC_STATUS"): self._pack(tm["EXC_STATUS"], cause=q["cause"], count=q["exc_count"],
                                         engine=q["exc_engine"], error_code=q["exc_code"]),
            at("EXC_ADDR"): q["exc_addr"],
            at("STATUS"): self._pack(status, busy=q["busy"], idle=idle,
                                     current_valid=q["busy"]),
            at("Q0_STATUS"): self._pack(tm["Q0_STATUS"], count=q["count"], retired=q["retired"]),
            at("Q0_PTR"): q["ptr"],
        }
        # The read's word offset and window are registered; the word is chosen in the next
        # cycle (0 unless a read was made).
        offset_bits = 7
        if max(a - tm.base for a in live) >> offset_bits or max(reads) >> offset_bits:
            raise AssertionError("a host register lies beyond the decoded offset bits")
        in_info = (bus.addr >> offset_bits) == NPU_INFO.base >> offset_bits
        in_tm = (bus.addr >> offset_bits) == tm.base >> offset_bits
        r_offset, r_info, r_tm = Signal(offset_bits), Signal(), Signal()
        m.d.sync += [r_offset.eq(bus.addr), r_info.eq(bus.r_en & in_info),
                     r_tm.eq(bus.r_en & in_tm)]
        with m.If(r_info):
            with m.Switch(r_offset):
                for address, value in reads.items():
                    with m.Case(address):
                        m.d.comb += bus.r_data.eq(value)
        with m.If(r_tm):
            with m.Switch(r_offset):
                for address, value in live.items():
                    with m.Case(address - tm.base):
                        m.d.comb += bus.r_data.eq(value)

        # Writes: the window decoded once, the register by its offset in the window.
        written = ("CTRL", "IRQ_STATUS", "IRQ_ENABLE", "BASE0", "LIMIT0", "Q0_CTRL", "Q0_HEAD",
                   "Q0_PUSH", "Q0_TAIL")
        if max(tm.address(name) - tm.base for name in written) >> offset_bits:
            raise AssertionError("a written register lies beyond the decoded offset bits")

        def offset(name):
            return tm.address(name) - tm.base

        data = bus.w_data
        with m.If(bus.w_en & in_tm):
            with m.Switch(bus.addr[:offset_bits]):
                with m.Case(offset("CTRL")):
                    m.d.sync += q["enable"].eq(_field(data, tm["CTRL"], "enable"))
                with m.Case(offset("IRQ_STATUS")):
                    m.d.sync += [q["irq_error"].eq(q["irq_error"] & ~data[0]),
                                 q["irq_done"].eq(q["irq_done"] & ~data[1])]
                with m.Case(offset("IRQ_ENABLE")):
                    m.d.sync += [q["en_error"].eq(data[0]), q["en_done"].eq(data[1])]
                with m.Case(offset("BASE0")):
                    m.d.sync += q["base"].eq(data)
                with m.Case(offset("LIMIT0")):
                    m.d.sync += q["limit"].eq(data)
                with m.Case(offset("Q0_CTRL")):
                    m.d.sync += [q["network"].eq(_field(data, tm["Q0_CTRL"], "network")),
                                 q["base_index"].eq(_field(data, tm["Q0_CTRL"], "base_index"))]
                with m.Case(offset("Q0_HEAD")):
                    m.d.sync += [q["ptr"].eq(data), q["retired"].eq(0)]
                with m.Case(offset("Q0_PUSH")):
                    m.d.comb += q["pushing"].eq(1)
                    m.d.sync += q["count"].eq(q["count"] + _field(data, tm["Q0_PUSH"], "count"))
                with m.Case(offset("Q0_TAIL")):
                    m.d.sync += q["tail"].eq(data)

    @staticmethod
    def _pack(register, **fields):
        """The word of ``register`` with ``fields`` (values) in place, other bits 0."""
        word = Const(0, 32)
        for name, value in fields.items():
            f = register[name]
            word = word | (Value.cast(value)[:f.width] << f.offset)
        return word[:32]

    # -- fetch, check, program, run ---------------------------------------------------------

    def _fetch(self, m, q):
        k = Signal(range(HEADER_WORDS + 1))      # header word, HEADER_WORDS in the entries
        rem = Signal(8)                          # words left, the current one included
        address = Signal(self._abits + 1)        # the word read
        engine = Signal(2)
        irq_flag = Signal()
        # Data words left in the current entry: a count that is not below the words left
        # (at most SLOT_WORDS) ends the descriptor, so it never needs more bits.
        left = Signal(range(SLOT_WORDS))
        w_addr = Signal(16)                      # register the next data word goes to
        beyond = Signal()                        # the word read lies beyond system memory
        word = Signal(32)
        m.d.comb += word.eq(Mux(beyond, 0, self.mem_rdata))
        m.d.comb += [self.mem_addr.eq(address), self.engine.eq(engine)]
        decode_error, window_error, address_error = Signal(), Signal(), Signal()
        self._checks(m, q, word, k, left, rem, decode_error, window_error, address_error)
        # the last word's checks failed, with this cause
        failed = Signal()
        failed_cause = Signal(Cause.bits)

        def fail():
            m.d.sync += [q["cause"].eq(failed_cause), failed.eq(0)]
            m.next = "EXCEPTION"

        with m.FSM():
            with m.State("IDLE"):
                m.d.sync += [k.eq(0), left.eq(0), address.eq(q["ptr"])]
                with m.If(q["enable"] & (q["count"] != 0) & ~q["retired"]):
                    m.d.sync += q["busy"].eq(1)
                    m.next = "READ"
                with m.Else():
                    m.d.sync += q["busy"].eq(0)

            with m.State("READ"):
                # (the read is made even after a failed word: a read changes nothing, and
                # the flag stays off the path into system memory's port)
                m.d.comb += self.mem_re.eq(1)
                m.d.sync += beyond.eq(_at_least(address, self._mem_words))
                with m.If(failed):
                    fail()
                with m.Else():
                    m.next = "WORD"

            with m.State("WORD"):
                m.d.sync += [address.eq(address + 1), rem.eq(rem - 1)]
                with m.If(k != HEADER_WORDS):
                    m.d.sync += k.eq(k + 1)
                with m.If(k == 0):
                    m.d.sync += [rem.eq(_field(word, H0, "length") - 1),
                                 engine.eq(_field(word, H0, "engine")),
                                 irq_flag.eq(_field(word, H0, "irq"))]
                with m.Elif((k >= HEADER_WORDS) & (left == 0)):
                    m.d.sync += [left.eq(_field(word, ENTRY, "count")[:len(left)]),
                                 w_addr.eq(_field(word, ENTRY, "address"))]
                with m.Elif(k >= HEADER_WORDS):
                    m.d.comb += [self.reg_w_addr.eq(w_addr), self.reg_w_data.eq(word),
                                 self.reg_w_en.eq(1)]
                    m.d.sync += [w_addr.eq(w_addr + 1), left.eq(left - 1)]

                # The word's checks are registered (their cause, in their order) and acted on
                # in the next cycle, READ or START: the word is then off the paths into the
                # state and the enables. A failing word's side effects above are dropped there.
                m.d.sync += [failed.eq(decode_error | window_error | address_error),
                             failed_cause.eq(Mux(decode_error, Cause.DECODE,
                                                 Mux(window_error, Cause.WINDOW,
                                                     Cause.ADDRESS)))]
                with m.If((k != 0) & (rem == 1)):
                    m.next = "START"
                with m.Else():
                    m.next = "READ"

            with m.State("START"):
                # A neural task without core 0 runs nothing (NE_CORES).
                with m.If(failed):
                    fail()
                with m.Elif((engine == Engine.NEURAL) & ~self.ne_core0):
                    m.next = "COMPLETE"
                with m.Else():
                    m.d.comb += [self.start.eq(1), self.running.eq(1)]
                    m.next = "RUN"

            with m.State("RUN"):
                m.d.comb += self.running.eq(1)
                with m.If(self.done):
                    with m.If(self.error != 0):
                        m.d.sync += [q["cause"].eq(Cause.ENGINE), q["exc_engine"].eq(engine),
                                     q["exc_code"].eq(self.error)]
                        m.next = "EXCEPTION"
                    with m.Else():
                        m.next = "COMPLETE"

            with m.State("COMPLETE"):
                # (the count is taken down in a cycle without a host push, which sets it too)
                with m.If(~q["pushing"]):
                    m.d.sync += [q["ptr"].eq(address), q["count"].eq(q["count"] - 1)]
                    with m.If(irq_flag):
                        m.d.sync += q["irq_done"].eq(1)
                    m.next = "IDLE"

            with m.State("EXCEPTION"):
                # The queue is retired and drops the descriptors left in it (and a push in
                # this very cycle with them).
                m.d.sync += [q["retired"].eq(1), q["exc_addr"].eq(q["ptr"]),
                             q["irq_error"].eq(1), q["count"].eq(0)]
                with m.If(q["exc_count"] != 0xFF):
                    m.d.sync += q["exc_count"].eq(q["exc_count"] + 1)
                with m.If(q["cause"] != Cause.ENGINE):
                    m.d.sync += [q["exc_engine"].eq(0), q["exc_code"].eq(0)]
                m.next = "IDLE"

    def _checks(self, m, q, word, k, left, rem, decode_error, window_error, address_error):
        """The checks of :func:`npu_spec.descriptors.decode` on header word ``k`` or an entry
        word (``rem`` words left in the descriptor, this one included; combinational)."""
        # Only base-table entry 0 is kept: another entry is an empty window.
        window = Signal(self._abits)
        m.d.comb += window.eq(Mux(q["base_index"] == 0, q["limit"], 0))
        # The descriptor's end, checked with word 1 from the length word 0 left in ``rem``
        # (length - 1): registers only, so the adders are off the memory's read path. A
        # word 0 that fails it decides the cause before word 1's own check.
        desc_end = q["ptr"] + rem + 1
        window_0 = ((q["ptr"] < q["base"]) | (desc_end > q["base"] + window)
                    | ((q["tail"] != 0) & (desc_end > q["tail"])))
        count = _field(word, ENTRY, "count")
        reg = _field(word, ENTRY, "address")
        # The run's end matters only for a count of 1 up to the words left (else the decode
        # check, which comes first, fails): its low bits suffice.
        count_bits = SLOT_WORDS.bit_length()
        last, inside = _inside_one_window(reg, count_bits)
        m.d.comb += last.eq(reg + count[:count_bits] - 1)
        with m.If(k == 0):
            m.d.comb += decode_error.eq(
                (_field(word, H0, "magic") != MAGIC)
                | (_field(word, H0, "engine") > max(Engine))
                | ((word & reserved_mask(H0)) != 0)
                | (_field(word, H0, "length") < HEADER_WORDS)
                | (_field(word, H0, "length") > SLOT_WORDS))
        with m.Elif(k == 1):
            m.d.comb += [window_error.eq(window_0),
                         decode_error.eq(~window_0
                                         & (_field(word, H1, "network") != q["network"]))]
        with m.Elif(k == 2):
            m.d.comb += [decode_error.eq((word & reserved_mask(H2)) != 0),
                         window_error.eq(_field(word, H2, "src") + _field(word, H2, "src_len")
                                         > window)]
        with m.Elif(k == 3):
            m.d.comb += [decode_error.eq((word & reserved_mask(H3)) != 0),
                         window_error.eq(_field(word, H3, "dst") >= window)]
        with m.Elif(left == 0):
            m.d.comb += [decode_error.eq((count == 0) | (count >= rem)),
                         address_error.eq(~inside)]
