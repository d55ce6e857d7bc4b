"""A board without the board: :class:`npu_fpga.boards.BoardSystem` (the NPU, the UART bridge,
the arbiter and on-chip system memory) with a host on its serial pins, under Verilator.

The host is gateware so that a whole run needs no Python per cycle: its own UART (the same
:class:`npu.bridge.uart.UARTTx` / ``UARTRx``, on the other ends of the two serial lines) and a
small command interpreter fed from a file by :class:`npu_sim.verilator.StreamBench`. Commands
(:func:`host_layout`):

=====  ===========================================================================================
op     meaning
=====  ===========================================================================================
BYTE   send ``value[0:8]`` on the line (frames are made by :mod:`npu_sim.uart_host`)
POLL   send a read frame of one word at word address ``addr`` and take its answer, again and
       again until ``(word & mask) == value``; the answers stay inside the host
DRAIN  wait until ``value`` answer bytes have gone to the response stream: after a long read,
       so that the next frames do not pile up in the bridge's 16-byte receive queue while it
       is still answering (a host that sends faster than the bridge answers overruns it)
AT     as POLL, until ``(word & mask) >= value`` (a counter such as ``TASKS_RUN`` that may
       move on by more than one between two polls)
=====  ===========================================================================================

Every byte the board sends outside a POLL goes to the response stream. :func:`board_run` loads
a program over the bridge, starts it, polls the task manager until it is idle, reads the
result memory and ``EXC_STATUS`` back, and returns them for a comparison with the golden
model; with ``late`` (``{queue: n}``, several programs) it pushes a queue once ``TASKS_RUN``
has reached ``n``, as :func:`npu_sim.board_host.run_on_board` does.
"""

import enum

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu.bridge import UARTRx, UARTTx
from npu_fpga.boards import BoardSystem, micro_npu
from npu_spec.bridge import MAX_WORDS, NPU_REGS_BASE, Command

from .uart_host import bytes_of, decode_words, encode_read, encode_write, words_of

__all__ = ["BoardSimBench", "HostOp", "board_commands", "board_run", "host_layout"]


class HostOp(enum.IntEnum):
    BYTE = 0
    POLL = 1
    DRAIN = 2
    AT = 3


def host_layout():
    return data.StructLayout({"op": 2, "addr": 32, "mask": 32, "value": 32})


class BoardSimBench(wiring.Component):
    """:class:`BoardSystem` with a gateware host on its serial pins (module documentation).

    Parameters
    ----------
    config : NPUConfig
    clk_freq, baud : float
        The bridge's divisor comes from these (the simulation has no real time).
    mem_bytes : int or None
        System memory of the board.
    shared : SharedModules or None
        Library of shared blocks of the NPU (``npu.lib.shared``).

    Members
    -------
    cmd : In(stream.Signature(host_layout()))
    res : Out(stream.Signature(StructLayout({"byte": 8})))
    """

    def __init__(self, config, *, clk_freq=4e6, baud=1e6, mem_bytes=None, shared=None):
        self.config = config
        self.clk_freq = clk_freq
        self.baud = baud
        self.mem_bytes = mem_bytes
        self.shared = shared
        super().__init__({
            "cmd": In(stream.Signature(host_layout())),
            "res": Out(stream.Signature(data.StructLayout({"byte": 8}))),
        })

    def elaborate(self, platform):
        m = Module()
        from npu.top import NPUTop
        # The micro build (``npu_impl="micro"``, the icebreaker preset) has its own NPU.
        if self.config.npu_impl == "micro":
            npu = micro_npu(self.config)
        else:
            npu = NPUTop(self.config, shared=self.shared)
        m.submodules.system = system = BoardSystem(
            self.config, clk_freq=self.clk_freq, baud=self.baud, mem_bytes=self.mem_bytes,
            timeout_bits=1000, npu=npu)
        m.submodules.host_tx = tx = UARTTx(self.clk_freq, self.baud)
        m.submodules.host_rx = rx = UARTRx(self.clk_freq, self.baud)
        m.d.comb += [system.rx.eq(tx.tx), rx.rx.eq(system.tx)]
        cmd = self.cmd.payload

        # A poll's read frame (one word at ``addr``), sent from the top byte down.
        frame = Signal(48)
        poll_frame = Cat(cmd.addr, Const(1, 8), Const(Command.READ, 8))
        sent = Signal(range(7))
        word = Signal(32)
        got = Signal(range(5))
        drained = Signal(32)
        with m.FSM():
            with m.State("COMMAND"):
                # Answers go out; a BYTE goes on the line.
                m.d.comb += [self.res.valid.eq(rx.data.valid),
                             self.res.payload.byte.eq(rx.data.payload),
                             rx.data.ready.eq(self.res.ready)]
                with m.If(self.cmd.valid & (cmd.op == HostOp.BYTE)):
                    m.d.comb += [tx.data.valid.eq(1), tx.data.payload.eq(cmd.value[:8]),
                                 self.cmd.ready.eq(tx.data.ready)]
                with m.Elif(self.cmd.valid & (cmd.op == HostOp.DRAIN)):
                    m.d.sync += drained.eq(0)
                    m.next = "DRAIN"
                with m.Elif(self.cmd.valid):
                    m.d.sync += [frame.eq(poll_frame), sent.eq(0), got.eq(0)]
                    m.next = "POLL_SEND"
            with m.State("DRAIN"):
                # Answers go out until ``value`` of them have.
                m.d.comb += [self.res.valid.eq(rx.data.valid),
                             self.res.payload.byte.eq(rx.data.payload),
                             rx.data.ready.eq(self.res.ready)]
                with m.If(drained == cmd.value):
                    m.d.comb += self.cmd.ready.eq(1)
                    m.next = "COMMAND"
                with m.Elif(rx.data.valid & self.res.ready):
                    m.d.sync += drained.eq(drained + 1)
            with m.State("POLL_SEND"):
                m.d.comb += [tx.data.valid.eq(1), tx.data.payload.eq(frame[40:])]
                with m.If(tx.data.ready):
                    m.d.sync += [frame.eq(frame << 8), sent.eq(sent + 1)]
                    with m.If(sent == 5):
                        m.next = "POLL_ANSWER"
            with m.State("POLL_ANSWER"):
                m.d.comb += rx.data.ready.eq(1)
                with m.If(rx.data.valid):
                    m.d.sync += [word.eq(Cat(rx.data.payload, word[:24])), got.eq(got + 1)]
                    with m.If(got == 3):
                        m.next = "POLL_CHECK"
            with m.State("POLL_CHECK"):
                masked = word & cmd.mask
                with m.If(Mux(cmd.op == HostOp.AT, masked >= cmd.value, masked == cmd.value)):
                    m.d.comb += self.cmd.ready.eq(1)
                    m.next = "COMMAND"
                with m.Else():
                    m.d.sync += [frame.eq(poll_frame), sent.eq(0), got.eq(0)]
                    m.next = "POLL_SEND"
        return m


def board_commands(program, *, dump_bytes=None, late=None):
    """Host commands of one run of ``program`` and the number of answer bytes: the memory
    image (its nonzero runs of words), the task manager's setup and start, the pushes of the
    queues in ``late`` (``{queue: n}``) each once ``TASKS_RUN`` reads ``n`` or more, a poll
    of ``STATUS.idle``, then reads of ``EXC_STATUS`` and of the memory."""
    from npu_spec.taskman import task_manager_map

    from .system import WATCHDOG, setup_writes
    layout = host_layout()
    beats = []

    def send(frame):
        beats.extend(layout.const({"op": HostOp.BYTE, "value": b}).as_bits() for b in frame)

    words = words_of(program.memory)
    k = 0
    while k < len(words):
        if not words[k]:
            k += 1
            continue
        run = k
        while run < len(words) and words[run] and run - k < MAX_WORDS:
            run += 1
        send(encode_write(k, words[k:run]))
        k = run
    cfg = program.config
    tm = task_manager_map(cfg.task_queues)
    late = dict(late or {})
    for addr, value in setup_writes(program, watchdog=WATCHDOG, late=late):
        send(encode_write(NPU_REGS_BASE + addr, [value]))
    ctrl = tm["CTRL"]
    send(encode_write(NPU_REGS_BASE + tm.base + ctrl.offset, [ctrl.pack(enable=1)]))
    for i, n in sorted(late.items(), key=lambda item: item[1]):
        beats.append(layout.const({"op": HostOp.AT,
                                   "addr": NPU_REGS_BASE + tm.base + tm["TASKS_RUN"].offset,
                                   "mask": 0xFFFF_FFFF, "value": n}).as_bits())
        push = tm[f"Q{i}_PUSH"]
        send(encode_write(NPU_REGS_BASE + tm.base + push.offset,
                          [push.pack(count=program.queue(i).tasks)]))
    status, idle = tm["STATUS"], tm["STATUS"]["idle"]
    # Twice: the second confirms the first did not see idle before the work began.
    for _ in range(2):
        beats.append(layout.const({"op": HostOp.POLL,
                                   "addr": NPU_REGS_BASE + tm.base + status.offset,
                                   "mask": idle.mask, "value": idle.mask}).as_bits())
    def drain(count):
        beats.append(layout.const({"op": HostOp.DRAIN, "value": count}).as_bits())

    send(encode_read(NPU_REGS_BASE + tm.base + tm["EXC_STATUS"].offset, 1))
    drain(4)
    dump = dump_bytes if dump_bytes is not None else len(program.memory)
    n = -(-dump // 4)
    for k in range(0, n, MAX_WORDS):
        count = min(MAX_WORDS, n - k)
        send(encode_read(k, count))
        # One read in flight: its answer is out before the next frame is sent.
        drain(4 * count)
    return beats, 4 * (1 + n)


def board_run(program, *, progress=None, max_cycles=20_000_000, late=None):
    """Run ``program`` on the simulated board (Verilator); returns ``{"memory", "EXC_STATUS",
    "cycles", "wall"}``. ``late``: :func:`board_commands`'."""
    import time

    from npu.lib.shared import SharedModules

    from .verilator import StreamBench
    cfg = program.config
    dump = max([len(program.memory)] + [t.extent[1] for t in program.tensors])
    beats, expected = board_commands(program, dump_bytes=dump, late=late)
    shared = SharedModules()
    mem_bytes = program.memory_bytes
    bench = BoardSimBench(cfg, mem_bytes=mem_bytes, shared=shared)
    # The cache key's source digest covers npu, npu_spec and npu_sim; add the board system.
    import hashlib
    from pathlib import Path

    import npu_fpga.boards
    boards = hashlib.sha256(Path(npu_fpga.boards.__file__).read_bytes()).hexdigest()[:16]
    sb = StreamBench(bench, in_name="cmd", out_name="res", progress=progress,
                     key=("board", cfg, mem_bytes, boards),
                     extra_verilog=shared.verilog)
    t0 = time.perf_counter()
    answer, stats = sb.run(beats, expected, max_cycles=max_cycles)
    words = decode_words(bytes(answer))
    return {"EXC_STATUS": words[0], "memory": bytes_of(words[1:])[:dump],
            "cycles": stats.get("cycles"), "wall": time.perf_counter() - t0}
