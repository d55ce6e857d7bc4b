"""One harness protocol for every engine (simulation only).

An engine with the shared interface (:mod:`npu.lib.engine`: ``writes``, ``csr``, ``task``) is
wrapped in an :class:`EngineBench` with a *data side* that stands in for the data processor
(memories answering the engine's requests, or FIFOs feeding its operand streams). Everything
goes through one command stream and one response stream, so the same bench runs in
``amaranth.sim`` and under Verilator (:class:`npu_sim.verilator.StreamBench`) with no Python per
cycle. :class:`BenchProgram` builds the command beats and reads the responses.

Command beats (``cmd``, :func:`command_layout`): ``op``, ``sel``, ``addr``, ``data``

======  ==========================================================================================
op      meaning
======  ==========================================================================================
WRITE   register write on the engine's register-write port: word ``addr`` (absolute) gets
        ``data[0:32]``
START   a start beat on the engine's task port (``seq`` = ``data[0:8]``); waits until taken
WAIT    wait for the task's ``done``, then respond with a WORD beat: the error code
READ    read register ``addr`` (absolute) on the engine's CSR bus; respond with a WORD beat
LOAD    data beat ``data`` for the data side's input ``sel`` at ``addr`` (a memory word, or a
        beat of operand stream ``sel``)
DUMP    the data side sends ``data`` words of its memory ``sel`` from ``addr`` as DATA beats
        (taken once the WORD answer of an earlier command has left)
STALL   the data side refuses a request, or holds back a stream beat, with probability
        ``data / 256`` in each cycle (256: never answers, to test timeouts)
======  ==========================================================================================

Response beats (``res``, :func:`response_layout`): ``tag`` DATA (an engine output beat, or a
dumped word) or WORD (a WAIT or READ answer), and ``data``. DATA beats leave as the data side
produces them; a WORD beat waits until the data side has nothing to send.
"""

import enum

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "BenchOp",
    "BenchProgram",
    "DataSideSignature",
    "EngineBench",
    "StreamDataSide",
    "Tag",
    "command_layout",
    "response_layout",
    "run_bench",
]

#: Widths of the command fields.
SEL_BITS = 2
ADDR_BITS = 24


class BenchOp(enum.IntEnum):
    """Command codes (see the module documentation)."""
    WRITE = 0
    START = 1
    WAIT = 2
    READ = 3
    LOAD = 4
    DUMP = 5
    STALL = 6


class Tag(enum.IntEnum):
    """Response tags."""
    DATA = 0
    WORD = 1


def command_layout(data_width):
    return data.StructLayout({"op": 3, "sel": SEL_BITS, "addr": ADDR_BITS,
                              "data": data_width})


def response_layout(data_width):
    return data.StructLayout({"tag": 1, "data": data_width})


class DataSideSignature(wiring.Signature):
    """What the bench drives on a data side, from the bench's side.

    Members
    -------
    load : Out(stream.Signature({sel, addr, data}))
        LOAD commands.
    dump : Out(stream.Signature({sel, addr, count}))
        DUMP commands.
    out : In(stream.Signature({data}))
        The data side's DATA beats: engine outputs and dumped words.
    stall : Out(9)
        Refusal probability in 1/256.
    """

    def __init__(self, data_width):
        self._data_width = data_width
        super().__init__({
            "load":  Out(stream.Signature(data.StructLayout({
                "sel": SEL_BITS, "addr": ADDR_BITS, "data": data_width}))),
            "dump":  Out(stream.Signature(data.StructLayout({
                "sel": SEL_BITS, "addr": ADDR_BITS, "count": ADDR_BITS}))),
            "out":   In(stream.Signature(data.StructLayout({"data": data_width}))),
            "stall": Out(9),
        })

    @property
    def data_width(self):
        return self._data_width

    def __eq__(self, other):
        return type(other) is type(self) and other.data_width == self.data_width

    def __hash__(self):
        return hash((type(self), self._data_width))


class EngineBench(wiring.Component):
    """An engine and its data side behind one command and one response stream.

    Parameters
    ----------
    engine : wiring.Component
        Has ``writes``, ``csr`` and ``task`` (the shared engine interface) and a ``base``
        property: the word address of its register map.
    data_side : wiring.Component
        Has a ``bench`` port ``In(DataSideSignature(data_width))`` and a method
        ``connect_engine(m, engine)`` that wires the engine's data ports to it.
    data_width : int
        Width of the ``data`` fields (at least 32).

    Members
    -------
    cmd : In(stream.Signature(command_layout(data_width)))
    res : Out(stream.Signature(response_layout(data_width)))
    active : Out(1)
        The engine is busy (for the simulator's progress reports).
    """

    def __init__(self, engine, data_side, *, data_width=32):
        if data_width < 32:
            raise ValueError(f"data_width must be at least 32, not {data_width!r}")
        self.engine = engine
        self.data_side = data_side
        self._data_width = data_width
        super().__init__({
            "cmd":    In(stream.Signature(command_layout(data_width))),
            "res":    Out(stream.Signature(response_layout(data_width))),
            "active": Out(1),
        })

    @property
    def data_width(self):
        return self._data_width

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = eng = self.engine
        m.submodules.data_side = side = self.data_side
        self.data_side.connect_engine(m, eng)
        bench = side.bench
        cmd = self.cmd.payload
        base = eng.base

        # The task's end, latched until the next start.
        finished = Signal(init=1)
        code = Signal(len(eng.task.error))
        with m.If(eng.task.done):
            m.d.sync += [finished.eq(1), code.eq(eng.task.error)]
        m.d.comb += self.active.eq(eng.task.start.valid | ~finished)

        # One WORD response waits in `word`; DATA beats of the data side go first.
        word = Signal(32)
        word_valid = Signal()
        with m.If(bench.out.valid):
            m.d.comb += [self.res.valid.eq(1), self.res.payload.tag.eq(Tag.DATA),
                         self.res.payload.data.eq(bench.out.payload.data),
                         bench.out.ready.eq(self.res.ready)]
        with m.Else():
            m.d.comb += [self.res.valid.eq(word_valid), self.res.payload.tag.eq(Tag.WORD),
                         self.res.payload.data.eq(word)]
            with m.If(self.res.ready):
                m.d.sync += word_valid.eq(0)

        m.d.comb += [
            eng.writes.payload.addr.eq(cmd.addr),
            eng.writes.payload.data.eq(cmd.data[:32]),
            eng.task.start.payload.seq.eq(cmd.data[:8]),
            eng.csr.addr.eq(cmd.addr - base),
            bench.load.payload.sel.eq(cmd.sel),
            bench.load.payload.addr.eq(cmd.addr),
            bench.load.payload.data.eq(cmd.data),
            bench.dump.payload.sel.eq(cmd.sel),
            bench.dump.payload.addr.eq(cmd.addr),
            bench.dump.payload.count.eq(cmd.data),
        ]
        stall = Signal(9)
        m.d.comb += bench.stall.eq(stall)
        with m.FSM():
            with m.State("COMMAND"):
                with m.Switch(cmd.op):
                    with m.Case(BenchOp.WRITE):
                        m.d.comb += [eng.writes.valid.eq(self.cmd.valid),
                                     self.cmd.ready.eq(eng.writes.ready)]
                    with m.Case(BenchOp.START):
                        m.d.comb += [eng.task.start.valid.eq(self.cmd.valid),
                                     self.cmd.ready.eq(eng.task.start.ready)]
                        with m.If(self.cmd.valid & eng.task.start.ready):
                            m.d.sync += finished.eq(0)
                    with m.Case(BenchOp.WAIT):
                        with m.If(self.cmd.valid & finished & ~word_valid):
                            m.d.comb += self.cmd.ready.eq(1)
                            m.d.sync += [word.eq(code), word_valid.eq(1)]
                    with m.Case(BenchOp.READ):
                        with m.If(self.cmd.valid & ~word_valid):
                            m.d.comb += [self.cmd.ready.eq(1), eng.csr.r_en.eq(1)]
                            m.next = "READ"
                    with m.Case(BenchOp.LOAD):
                        m.d.comb += [bench.load.valid.eq(self.cmd.valid),
                                     self.cmd.ready.eq(bench.load.ready)]
                    with m.Case(BenchOp.DUMP):
                        # After the answer before it, so the dumped words cannot overtake it.
                        with m.If(~word_valid):
                            m.d.comb += [bench.dump.valid.eq(self.cmd.valid),
                                         self.cmd.ready.eq(bench.dump.ready)]
                    with m.Case(BenchOp.STALL):
                        m.d.comb += self.cmd.ready.eq(1)
                        with m.If(self.cmd.valid):
                            m.d.sync += stall.eq(cmd.data[:9])
                    with m.Default():
                        m.d.comb += self.cmd.ready.eq(1)
            with m.State("READ"):
                m.d.sync += [word.eq(eng.csr.r_data), word_valid.eq(1)]
                m.next = "COMMAND"
        return m


class StreamDataSide(wiring.Component):
    """A data side for an engine with operand streams: LOAD with ``sel = k`` pushes a beat into
    a FIFO feeding the engine's ``inputs[k]`` stream; the engine's ``output`` stream becomes
    DATA responses. No memories: DUMP is taken and ignored.

    STALL holds the streams back at random: in each cycle, each input stream offers its next
    beat and the output stream accepts a beat only with probability ``1 - stall / 256``, each
    decided by its own 16-bit LFSR. A beat once offered stays offered until it is taken (the
    stream rules). With no STALL (0) the FIFOs and the output pass straight through.

    Parameters
    ----------
    inputs : sequence of str
        Names of the engine's input streams (at most 4).
    output : str
        Name of the engine's output stream.
    beat_width : int
        Width of the streams' payloads.
    data_width : int
        The bench's data width (at least ``beat_width``).
    depth : int
        Entries of each input FIFO.
    """

    #: Initial values of the LFSRs: the inputs' in order, then the output's.
    LFSR_SEEDS = (0xACE1, 0x1D87, 0x5A3C, 0xE2B9, 0x7F31)

    def __init__(self, inputs, output, beat_width, data_width, *, depth=4):
        if not 1 <= len(inputs) <= 1 << SEL_BITS:
            raise ValueError(f"a stream data side takes 1 to {1 << SEL_BITS} inputs, "
                             f"not {len(inputs)}")
        if beat_width > data_width:
            raise ValueError(f"beat width {beat_width} exceeds the data width {data_width}")
        self._inputs = tuple(inputs)
        self._output = output
        self._beat_width = beat_width
        self._depth = depth
        self._beat_ports = {}
        super().__init__({
            "bench": In(DataSideSignature(data_width)),
            **{f"in_{name}": Out(stream.Signature(unsigned(beat_width)))
               for name in self._inputs},
            "result": In(stream.Signature(unsigned(beat_width))),
        })

    def connect_engine(self, m, engine):
        for name in self._inputs:
            port = getattr(engine, name)
            mine = getattr(self, f"in_{name}")
            m.d.comb += [port.valid.eq(mine.valid), port.payload.eq(mine.payload),
                         mine.ready.eq(port.ready)]
        out = getattr(engine, self._output)
        m.d.comb += [self.result.valid.eq(out.valid), self.result.payload.eq(out.payload),
                     out.ready.eq(self.result.ready)]

    def _lfsr(self, m, k):
        """A pass in this cycle, with probability ``1 - stall / 256``, from LFSR ``k``."""
        lfsr = Signal(16, init=self.LFSR_SEEDS[k], name=f"lfsr{k}")
        m.d.sync += lfsr.eq(Mux(lfsr[0], (lfsr >> 1) ^ 0xB400, lfsr >> 1))
        return lfsr[:8] >= self.bench.stall

    def elaborate(self, platform):
        m = Module()
        load = self.bench.load
        ready = 0
        for k, name in enumerate(self._inputs):
            q = fifo.SyncFIFOBuffered(width=self._beat_width, depth=self._depth)
            m.submodules[f"fifo_{name}"] = q
            mine = getattr(self, f"in_{name}")
            # A beat offered and not taken stays offered.
            offered = Signal(name=f"offered_{name}")
            m.d.sync += offered.eq(mine.valid & ~mine.ready)
            m.d.comb += [
                q.w_data.eq(load.payload.data[:self._beat_width]),
                q.w_en.eq(load.valid & (load.payload.sel == k)),
                mine.valid.eq(q.r_rdy & (offered | self._lfsr(m, k))),
                mine.payload.eq(q.r_data),
                q.r_en.eq(mine.valid & mine.ready),
            ]
            ready = ready | ((load.payload.sel == k) & q.w_rdy)
        # The output: a result passes on (and is taken from the engine) only when let through.
        out = self.bench.out
        passing = Signal()
        m.d.sync += passing.eq(out.valid & ~out.ready)
        m.d.comb += [
            load.ready.eq(ready | (load.payload.sel >= len(self._inputs))),
            self.bench.dump.ready.eq(1),
            out.valid.eq(self.result.valid & (passing | self._lfsr(m, len(self._inputs)))),
            out.payload.data.eq(self.result.payload),
            self.result.ready.eq(out.valid & out.ready),
        ]
        return m


class BenchProgram:
    """Command beats for an :class:`EngineBench`, and the responses they will bring.

    Build a program with the methods below (each returns ``self``); :attr:`beats` are the
    packed command words, :attr:`expected` the number of response beats. :meth:`parse` splits
    the responses of a run into one record per WAIT, READ and DUMP, in order, plus the DATA
    beats that came before each WAIT.
    """

    def __init__(self, data_width):
        self._layout = command_layout(data_width)
        self._data_width = data_width
        self.beats = []
        self._answers = []     # ("wait" | "read" | "dump", count)

    def _cmd(self, op, *, sel=0, addr=0, value=0):
        if not 0 <= value < (1 << self._data_width):
            raise ValueError(f"value {value:#x} does not fit {self._data_width} bits")
        self.beats.append(self._layout.const(
            {"op": op, "sel": sel, "addr": addr, "data": value}).as_bits())
        return self

    def write(self, address, value):
        return self._cmd(BenchOp.WRITE, addr=address, value=value & 0xFFFF_FFFF)

    def writes(self, pairs):
        for address, value in pairs:
            self.write(address, value)
        return self

    def start(self, seq=0):
        return self._cmd(BenchOp.START, value=seq)

    def wait(self, outputs=0):
        """Wait for the task's end; ``outputs`` DATA beats are expected before it."""
        self._answers.append(("wait", outputs))
        return self._cmd(BenchOp.WAIT)

    def read(self, address):
        self._answers.append(("read", 0))
        return self._cmd(BenchOp.READ, addr=address)

    def load(self, sel, value, address=0):
        return self._cmd(BenchOp.LOAD, sel=sel, addr=address, value=value)

    def dump(self, sel, address, count):
        self._answers.append(("dump", count))
        return self._cmd(BenchOp.DUMP, sel=sel, addr=address, value=count)

    def stall(self, probability):
        return self._cmd(BenchOp.STALL, value=min(256, int(round(probability * 256))))

    @property
    def expected(self):
        return sum(n + (kind != "dump") for kind, n in self._answers)

    def parse(self, responses):
        """``responses`` (packed ``res`` words, in order) as a list of records:
        ``("wait", code, data beats)``, ``("read", word)``, ``("dump", words)``."""
        layout = response_layout(self._data_width)
        beats = [layout.from_bits(r) for r in responses]
        records = []
        k = 0
        for kind, n in self._answers:
            if kind == "dump":
                records.append(("dump", [int(b.data) for b in beats[k:k + n]]))
                k += n
                continue
            data_beats = []
            while k < len(beats) and beats[k].tag == Tag.DATA:
                data_beats.append(int(beats[k].data))
                k += 1
            if k >= len(beats):
                raise RuntimeError(f"the bench sent no answer to {kind} (the engine stalled?)")
            word = int(beats[k].data)
            k += 1
            if kind == "wait":
                records.append(("wait", word, data_beats))
            else:
                if data_beats:
                    raise RuntimeError(f"{len(data_beats)} unexpected DATA beats before a READ")
                records.append(("read", word))
        return records


def run_bench(bench, program, *, backend="amaranth", stall=0.0, seed=0, max_cycles=None,
              verilator=None, vcd=None):
    """Run ``program`` on ``bench`` and return the parsed records (:meth:`BenchProgram.parse`).

    ``stall`` is the probability of a stall cycle on the command and response streams;
    ``verilator`` a :class:`npu_sim.verilator.StreamBench` of ``bench`` (built once by the
    caller and reused) for the Verilator backend. A run that takes more than ``max_cycles``
    (default: 100,000 plus 400 per command and response) fails with an error in either
    backend.
    """
    if backend == "verilator":
        if verilator is None:
            raise ValueError("the verilator backend needs a StreamBench of the bench")
        if max_cycles is None:
            max_cycles = 100_000 + 400 * (len(program.beats) + program.expected)
        responses, _ = verilator.run(program.beats, program.expected, stall=stall, seed=seed,
                                     max_cycles=max_cycles)
    elif backend == "amaranth":
        from .streams import run_simulation, seeded_rng, stream_get, stream_put
        responses = []
        if max_cycles is None:
            max_cycles = 100_000 + 400 * (len(program.beats) + program.expected)

        async def producer(ctx):
            rng = seeded_rng(seed, "cmd")
            for beat in program.beats:
                await stream_put(ctx, bench.cmd, beat, rng, stall)

        async def consumer(ctx):
            rng = seeded_rng(seed, "res")
            for _ in range(program.expected):
                responses.append(await stream_get(ctx, bench.res, rng, stall))

        async def watchdog(ctx):
            for _ in range(max_cycles):
                await ctx.tick()
            raise RuntimeError(f"the bench did not finish in {max_cycles} cycles "
                               f"({len(responses)} of {program.expected} responses)")

        run_simulation(bench, [producer, consumer], vcd=vcd, background=[watchdog])
    else:
        raise ValueError(f"backend must be 'amaranth' or 'verilator', not {backend!r}")
    return program.parse([int(r) for r in responses])
