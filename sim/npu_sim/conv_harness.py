"""The neural engine's data side for the engine bench (simulation only).

Until the data processor and the DMA exist, :class:`ConvDataSide` stands in for them inside an
:class:`npu_sim.engine_bench.EngineBench`: an input memory that answers row requests
(``row_values`` inputs per cycle, zeros outside the image), a kernel memory read by the
engine's kernel DMA, and an output memory taking the output circuit's row writes with one
write enable per value. :func:`conv_bench` builds the bench.

The bench's ``LOAD`` and ``DUMP`` commands address the memories by ``sel``:

====  ========  =============================================================================
sel   command   memory
====  ========  =============================================================================
0     LOAD      input memory: value ``data[0:16]`` at position ``addr`` (:func:`input_address`)
1     LOAD      kernel memory: word ``data`` at ``addr``
2     DUMP      output memory, as 32-bit beats: beat ``b`` holds values ``2k`` (bits 0-15)
                and ``2k + 1`` (bits 16-31) of word ``b // (macs / 2)``, ``k = b mod (macs /
                2)``; words hold ``macs`` values, row-major by channel and row
                (:func:`output_words`)
====  ========  =============================================================================

The bench's ``STALL`` sets the probability with which, in each cycle, the input memory refuses a
row request and the output memory refuses a write (a 16-bit LFSR decides; 256/256: they never
answer, to test the engine's timeout). The memories' layout depends on the layer's input and
output sizes: the data side keeps its own copy of ``IN_SIZE`` and ``OUT_SIZE`` from the register
writes it sees on the engine's ``writes`` port, and uses the values written before a task's start
for that task (the next layer may be programmed while one runs). A ``LOAD`` waits until a
``DUMP`` has sent its last beat.
"""

import enum

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from npu.lib.csr import register_layout
from npu.neural.engine import NeuralEngine
from npu.neural.layouts import (
    KernelReadSignature,
    row_data_layout,
    row_request_layout,
    row_write_layout,
)
from npu_sim.engine_bench import DataSideSignature, EngineBench
from npu_spec.neural import NEURAL_ENGINE

__all__ = ["DATA_WIDTH", "ConvDataSide", "MemorySel", "conv_bench", "input_address",
           "output_words"]

#: Width of the bench's data fields.
DATA_WIDTH = 32


class MemorySel(enum.IntEnum):
    """The ``sel`` codes of the data side's memories."""
    INPUT = 0
    KERNEL = 1
    OUTPUT = 2


def input_address(row_values, in_w, c, y, x, in_h):
    """Input-memory position of input ``(c, y, x)``: bank ``x mod row_values``, word
    ``(c * in_h + y) * ceil(in_w / row_values) + x // row_values``."""
    wpr = -(-in_w // row_values)
    return ((c * in_h + y) * wpr + x // row_values) * row_values + x % row_values


def output_words(macs, out_channels, out_h, out_w):
    """Output-memory words of a layer (``macs`` values each, row-major by channel and row)."""
    return out_channels * out_h * -(-out_w // macs)


class ConvDataSide(wiring.Component):
    """Input, kernel and output memories of one neural engine core (see the module
    documentation).

    Parameters
    ----------
    engine : NeuralEngine
        The engine served: its geometry, tag layout and register base.
    input_values, kernel_words, output_values : int or None
        Sizes of the memories (defaults scale with the MAC count).

    Members
    -------
    bench : In(DataSideSignature(DATA_WIDTH))
        LOAD, DUMP, STALL and the DATA beats of a DUMP.
    row_req : In(stream.Signature(row_request_layout(tag)))
    row_data : Out(stream.Signature(row_data_layout(row_values, tag)))
    kmem : In(KernelReadSignature())
    out : In(stream.Signature(row_write_layout(macs)))
        The engine's data ports.
    reg_write : In(StructLayout({en, addr, data}))
        The register writes taken by the engine (``IN_SIZE`` and ``OUT_SIZE`` are kept).
    start : In(1)
        The engine takes a task's start beat: the kept sizes become the task's.
    """

    def __init__(self, engine, *, input_values=None, kernel_words=1 << 14,
                 output_values=None):
        if not isinstance(engine, NeuralEngine):
            raise TypeError(f"engine must be a NeuralEngine, not {engine!r}")
        config = engine.config
        scale = max(1, config.macs // 16)
        self._macs = config.macs
        self._base = engine.base
        self.row_values = engine.row_values
        self.input_depth = max(1, (input_values or (1 << 15) * scale) // self.row_values)
        self.kernel_words = kernel_words
        self.output_depth = max(1, (output_values or (1 << 15) * scale) // config.macs)
        tag = engine.tag_layout
        super().__init__({
            "bench":     In(DataSideSignature(DATA_WIDTH)),
            "row_req":   In(stream.Signature(row_request_layout(tag))),
            "row_data":  Out(stream.Signature(row_data_layout(self.row_values, tag))),
            "kmem":      In(KernelReadSignature()),
            "out":       In(stream.Signature(row_write_layout(config.macs))),
            "reg_write": In(data.StructLayout({"en": 1, "addr": 16, "data": 32})),
            "start":     In(1),
        })

    def connect_engine(self, m, engine):
        wiring.connect(m, engine.row_req, self.row_req)
        wiring.connect(m, self.row_data, engine.row_data)
        wiring.connect(m, engine.kmem, self.kmem)
        wiring.connect(m, engine.out, self.out)
        writes = engine.writes
        m.d.comb += [
            self.reg_write.en.eq(writes.valid & writes.ready),
            self.reg_write.addr.eq(writes.payload.addr),
            self.reg_write.data.eq(writes.payload.data),
            self.start.eq(engine.task.start.valid & engine.task.start.ready),
        ]

    def elaborate(self, platform):
        m = Module()
        load = self.bench.load

        # The layer's sizes: the engine's register writes, taken at the task's start.
        sizes = {}
        for name in ("IN_SIZE", "OUT_SIZE"):
            reg = NEURAL_ENGINE[name]
            written = Signal(register_layout(reg), name=f"{name.lower()}_written")
            sizes[name] = Signal(register_layout(reg), name=name.lower())
            with m.If(self.reg_write.en & (self.reg_write.addr == self._base + reg.offset)):
                m.d.sync += written.eq(self.reg_write.data)
            with m.If(self.start):
                m.d.sync += sizes[name].eq(written)
        in_size, out_size = sizes["IN_SIZE"], sizes["OUT_SIZE"]

        # Random stalls of the input and output memories.
        lfsr = Signal(16, init=0xACE1)
        m.d.sync += lfsr.eq(Mux(lfsr[0], (lfsr >> 1) ^ 0xB400, lfsr >> 1))
        take_row = Signal()
        take_out = Signal()
        m.d.comb += [take_row.eq(lfsr[:8] >= self.bench.stall),
                     take_out.eq(lfsr[8:] >= self.bench.stall)]

        dumping = Signal()
        m.d.comb += load.ready.eq(~dumping)
        loading = load.valid & load.ready
        self._input_memory(m, in_size, take_row, loading)

        # Kernel memory.
        m.submodules.kmem = kmem = Memory(shape=32, depth=self.kernel_words, init=[])
        kwp = kmem.write_port()
        krp = kmem.read_port()
        m.d.comb += [
            kwp.addr.eq(load.payload.addr), kwp.data.eq(load.payload.data),
            kwp.en.eq(loading & (load.payload.sel == MemorySel.KERNEL)),
            krp.addr.eq(self.kmem.addr), krp.en.eq(self.kmem.en), self.kmem.data.eq(krp.data),
        ]

        self._output_memory(m, out_size, take_out, dumping)
        return m

    def _input_memory(self, m, in_size, take_row, loading):
        """One memory per column modulo ``row_values``; a row segment is one read of each,
        rotated by its first column."""
        rv = self.row_values
        log2rv = exact_log2(rv)
        load = self.bench.load
        req = self.row_req
        wpr = Signal(12)        # words per input row
        m.d.comb += [wpr.eq((in_size.in_w + rv - 1) >> log2rv), req.ready.eq(take_row)]
        r1_valid = Signal()
        r1_tag = Signal.like(req.payload.tag)
        r1_x = Signal(signed(14))
        r1_inside = Signal(rv)        # bank holds an input inside the image
        m.d.sync += [r1_valid.eq(req.valid & req.ready), r1_tag.eq(req.payload.tag),
                     r1_x.eq(req.payload.x)]
        row_inside = (req.payload.y >= 0) & (req.payload.y < in_size.in_h)
        row_base = Signal(32)
        m.d.comb += row_base.eq((req.payload.c * in_size.in_h
                                 + req.payload.y.as_unsigned()[:12]) * wpr)
        banks = []
        for b in range(rv):
            mem = Memory(shape=16, depth=self.input_depth, init=[])
            m.submodules[f"in_bank{b}"] = mem
            wp = mem.write_port()
            rp = mem.read_port()
            m.d.comb += [
                wp.addr.eq(load.payload.addr >> log2rv),
                wp.data.eq(load.payload.data[:16]),
                wp.en.eq(loading & (load.payload.sel == MemorySel.INPUT)
                         & (load.payload.addr[:log2rv] == b)),
            ]
            # The column of this bank inside [x, x + rv): x + ((b - x) mod rv).
            col = Signal(signed(16), name=f"col{b}")
            m.d.comb += col.eq(req.payload.x + ((b - req.payload.x)[:log2rv]))
            m.d.comb += [rp.addr.eq(row_base + (col >> log2rv)), rp.en.eq(1)]
            with m.If(req.valid):
                m.d.sync += r1_inside[b].eq(row_inside & (col >= 0) & (col < in_size.in_w))
            banks.append(Mux(r1_inside[b], rp.data, 0))
        rd = self.row_data
        m.d.comb += [rd.valid.eq(r1_valid), rd.payload.tag.eq(r1_tag)]
        # Element k is column x + k, in bank (x + k) mod rv: rotate the banks by x.
        values = banks
        for b in range(log2rv):
            nxt = [Signal(16, name=f"rot{b}_{k}") for k in range(rv)]
            m.d.comb += [nxt[k].eq(Mux(r1_x[b], values[(k + (1 << b)) % rv], values[k]))
                         for k in range(rv)]
            values = nxt
        m.d.comb += [rd.payload.values[k].eq(values[k]) for k in range(rv)]

    def _output_memory(self, m, out_size, take_out, dumping):
        """Words of ``macs`` values, row-major by (channel, row), one write enable per value;
        DUMP reads them back as 32-bit beats."""
        n = self._macs
        log2n = exact_log2(n)
        per = n // 2            # beats per word
        omem = Memory(shape=data.ArrayLayout(16, n), depth=self.output_depth, init=[])
        m.submodules.omem = omem
        owp = omem.write_port(granularity=1)
        orp = omem.read_port()
        o = self.out.payload
        opr = Signal(12)        # words per output row
        shift = Signal(range(n))
        m.d.comb += [
            opr.eq((out_size.out_w + n - 1) >> log2n),
            self.out.ready.eq(take_out),
            shift.eq(o.x[:log2n] if n > 1 else 0),
            owp.addr.eq((o.oc * out_size.out_h + o.y) * opr + (o.x >> log2n)),
            owp.data.eq(o.values.as_value() << (shift * 16)),
            owp.en.eq(Mux(self.out.valid & self.out.ready, o.mask << shift, 0)),
        ]

        # DUMP of the output memory: read a word, send its beats.
        dump = self.bench.dump
        beat = Signal(24)       # next beat
        left = Signal(24)       # beats still to send
        log2per = exact_log2(per)
        part = Signal(range(max(2, per)))
        m.d.comb += part.eq(beat & (per - 1))
        res = self.bench.out
        m.d.comb += orp.en.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += dump.ready.eq(1)
                with m.If(dump.valid & (dump.payload.sel == MemorySel.OUTPUT)):
                    m.d.sync += [beat.eq(dump.payload.addr), left.eq(dump.payload.count)]
                    m.next = "READ"
            with m.State("READ"):
                m.d.comb += dumping.eq(1)
                with m.If(left == 0):
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += [orp.addr.eq(beat >> log2per), orp.en.eq(1)]
                    m.next = "SEND"
            with m.State("SEND"):
                m.d.comb += [
                    dumping.eq(1),
                    res.valid.eq(1),
                    res.payload.data.eq(orp.data.as_value().word_select(part, 32)),
                ]
                with m.If(res.ready):
                    m.d.sync += [beat.eq(beat + 1), left.eq(left - 1)]
                    with m.If((part == per - 1) | (left == 1)):
                        m.next = "READ"


def conv_bench(config, *, core=0, **harness_args):
    """An :class:`EngineBench` of a :class:`NeuralEngine` of ``config`` and its
    :class:`ConvDataSide`; ``harness_args`` are the data side's sizes and the engine's build
    parameters (``row_values``, ``buffer_rows``, ``timeout``, ``post_lanes``)."""
    side_args = {k: harness_args.pop(k) for k in ("input_values", "kernel_words",
                                                  "output_values") if k in harness_args}
    engine = NeuralEngine(config, core=core, **harness_args)
    return EngineBench(engine, ConvDataSide(engine, **side_args), data_width=DATA_WIDTH)
