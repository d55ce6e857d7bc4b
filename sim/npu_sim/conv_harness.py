"""A standalone neural-engine harness: the engine with behavioural memories inside the design.

Until the data processor and the DMA exist, :class:`ConvHarness` stands in for them: an input
memory that answers row requests (``row_values`` inputs per cycle, zeros outside the image), a
kernel memory read by the engine's kernel DMA, and an output memory taking the output
circuit's row writes. Everything is loaded and read back through one command stream and one
result stream, so the same design runs in ``amaranth.sim`` and under Verilator with no Python
per cycle.

Command beats (``cmd``): ``op`` / ``addr`` / ``data``

====  ====================================================================================
op    meaning
====  ====================================================================================
0     write register ``addr`` (word address in the ``NEURAL_ENGINE`` map) with ``data``;
      ``addr`` = :data:`STALL_ADDR` sets the harness's stall probability to ``data / 256``
      (256: the memories never answer, to test the engine's timeout):
      in each cycle the input memory refuses a row request and the output memory refuses a
      write with that probability (a 16-bit LFSR decides)
1     write input value ``data[0:16]`` at input-memory position ``addr`` (see
      :func:`input_address`)
2     write kernel-memory word ``addr``
3     run: start the layer, wait for the end, then send ``data`` output-memory words (each as
      ``macs / 2`` result beats, value ``2k`` in bits 0-15 of beat ``k``) and three status
      beats: ``STATUS``, ``CYCLES``, ``MAC_ACTIVE``
====  ====================================================================================
"""

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from npu.lib.csr import RegisterFile
from npu.neural.engine import NeuralEngine
from npu_spec.neural import LAYER_REGISTERS, NEURAL_ENGINE

__all__ = ["ConvHarness", "CMD_LAYOUT", "STALL_ADDR", "input_address", "output_words"]

#: Command address of the harness's own stall register.
STALL_ADDR = 0x3FFFFF

CMD_LAYOUT = data.StructLayout({"op": 2, "addr": 22, "data": 32})


def input_address(row_values, in_w, c, y, x, in_h):
    """Input-memory position of input ``(c, y, x)``: bank ``x mod row_values``, word
    ``(c * in_h + y) * ceil(in_w / row_values) + x // row_values``."""
    wpr = -(-in_w // row_values)
    return ((c * in_h + y) * wpr + x // row_values) * row_values + x % row_values


def output_words(macs, out_channels, out_h, out_w):
    """Output-memory words of a layer (``macs`` values each, row-major by channel and row)."""
    return out_channels * out_h * -(-out_w // macs)


class ConvHarness(wiring.Component):
    """The neural engine with its memories (see the module documentation)."""

    def __init__(self, config, *, input_values=None, kernel_words=1 << 14,
                 output_values=None, **engine_args):
        self._config = config
        scale = max(1, config.macs // 16)
        input_values = input_values or (1 << 15) * scale
        output_values = output_values or (1 << 15) * scale
        self.engine = NeuralEngine(config, **engine_args)
        self.row_values = self.engine.row_values
        self.input_depth = max(1, input_values // self.row_values)
        self.kernel_words = kernel_words
        self.output_depth = max(1, output_values // config.macs)
        super().__init__({
            "cmd":    In(stream.Signature(CMD_LAYOUT)),
            "res":    Out(stream.Signature(data.StructLayout({"data": 32}))),
            "active": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        n = cfg.macs
        RV = self.row_values
        log2rv = exact_log2(RV)
        m.submodules.engine = eng = self.engine
        m.submodules.regs = regs = RegisterFile(NEURAL_ENGINE)
        L = eng.layer
        for reg in LAYER_REGISTERS:
            for f in reg.fields:
                if reg.name.startswith("POST_"):
                    target = getattr(L.post, f.name)
                elif reg.name == "KTABLE":
                    target = L.ktable
                else:
                    target = getattr(L, f.name)
                m.d.comb += target.eq(getattr(regs.port(reg.name), f.name))
        start_cmd = Signal()
        m.d.comb += [
            eng.start.eq(regs.ctrl.start | start_cmd),
            regs.status.busy.eq(eng.busy),
            regs.status.error.eq(eng.error),
            regs.status.error_code.eq(eng.error_code),
            regs.cycles.count.eq(eng.cycles),
            regs.mac_active.count.eq(eng.mac_active),
        ]

        # ---- Random stalls of the input and output memories ----------------------------------
        cmd = self.cmd.payload
        stall = Signal(9)
        lfsr = Signal(16, init=0xACE1)
        m.d.sync += lfsr.eq(Mux(lfsr[0], (lfsr >> 1) ^ 0xB400, lfsr >> 1))
        with m.If(self.cmd.valid & self.cmd.ready & (cmd.op == 0) & (cmd.addr == STALL_ADDR)):
            m.d.sync += stall.eq(cmd.data[:9])
        take_row = Signal()
        take_out = Signal()
        m.d.comb += [take_row.eq(lfsr[:8] >= stall), take_out.eq(lfsr[8:] >= stall)]

        # ---- Input memory: one bank per column modulo row_values --------------------------
        wpr = Signal(12)
        m.d.comb += wpr.eq((L.in_w + RV - 1) >> log2rv)
        req = eng.row_req
        m.d.comb += req.ready.eq(take_row)
        r1_valid = Signal()
        r1_tag = Signal.like(req.payload.tag)
        r1_x = Signal(signed(14))
        r1_ok = Signal(RV)           # bank holds an input inside the image
        m.d.sync += [r1_valid.eq(req.valid & req.ready), r1_tag.eq(req.payload.tag),
                     r1_x.eq(req.payload.x)]
        row_ok = (req.payload.y >= 0) & (req.payload.y < L.in_h)
        row_base = Signal(32)
        m.d.comb += row_base.eq((req.payload.c * L.in_h + req.payload.y.as_unsigned()[:12]) * wpr)
        banks_out = []
        load_input = self.cmd.valid & (cmd.op == 1)
        for b in range(RV):
            mem = Memory(shape=16, depth=self.input_depth, init=[])
            m.submodules[f"in_bank{b}"] = mem
            wp = mem.write_port()
            rp = mem.read_port()
            m.d.comb += [
                wp.addr.eq(cmd.addr >> log2rv),
                wp.data.eq(cmd.data[:16]),
                wp.en.eq(load_input & (cmd.addr[:log2rv] == b)),
            ]
            # The column of this bank inside [x, x + RV): x + ((b - x) mod RV).
            col = Signal(signed(16), name=f"col{b}")
            m.d.comb += col.eq(req.payload.x + ((b - req.payload.x)[:log2rv]))
            m.d.comb += [rp.addr.eq(row_base + (col >> log2rv)), rp.en.eq(1)]
            with m.If(req.valid):
                m.d.sync += r1_ok[b].eq(row_ok & (col >= 0) & (col < L.in_w))
            banks_out.append(Mux(r1_ok[b], rp.data, 0))
        rd = eng.row_data
        m.d.comb += [rd.valid.eq(r1_valid), rd.payload.tag.eq(r1_tag)]
        # Element k is column x + k, in bank (x + k) mod RV: rotate the banks by x.
        values = banks_out
        for b in range(log2rv):
            nxt = [Signal(16, name=f"rot{b}_{k}") for k in range(RV)]
            m.d.comb += [nxt[k].eq(Mux(r1_x[b], values[(k + (1 << b)) % RV], values[k]))
                         for k in range(RV)]
            values = nxt
        for k in range(RV):
            m.d.comb += rd.payload.values[k].eq(values[k])

        # ---- Kernel memory -------------------------------------------------------------------
        kmem = Memory(shape=32, depth=self.kernel_words, init=[])
        m.submodules.kmem = kmem
        kwp = kmem.write_port()
        krp = kmem.read_port()
        m.d.comb += [
            kwp.addr.eq(cmd.addr), kwp.data.eq(cmd.data),
            kwp.en.eq(self.cmd.valid & (cmd.op == 2)),
            krp.addr.eq(eng.kmem_addr), krp.en.eq(eng.kmem_en), eng.kmem_data.eq(krp.data),
        ]

        # ---- Output memory: words of `macs` values, row-major by (channel, row) -------------
        omem = Memory(shape=data.ArrayLayout(16, n), depth=self.output_depth, init=[])
        m.submodules.omem = omem
        owp = omem.write_port(granularity=1)     # one enable per value
        orp = omem.read_port()
        o = eng.out.payload
        opr = Signal(12)
        m.d.comb += [opr.eq((L.out_w + n - 1) >> exact_log2(n)), eng.out.ready.eq(take_out)]
        shift = Signal(range(n))
        m.d.comb += shift.eq(o.x[:exact_log2(n)] if n > 1 else 0)
        m.d.comb += [
            owp.addr.eq((o.oc * L.out_h + o.y) * opr + (o.x >> exact_log2(n))),
            owp.data.eq(o.values.as_value() << (shift * 16)),
            owp.en.eq(Mux(eng.out.valid & eng.out.ready, o.mask << shift, 0)),
        ]

        # ---- Command processing and read-back ---------------------------------------------
        csr = regs.bus
        m.d.comb += [csr.addr.eq(cmd.addr - NEURAL_ENGINE.base), csr.w_data.eq(cmd.data)]
        words = Signal(22)
        word = Signal(22)
        part = Signal(range(max(2, n // 2)))
        status = Signal(3)
        m.d.comb += [self.active.eq(eng.busy), orp.en.eq(0)]
        with m.FSM():
            with m.State("CMD"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    with m.Switch(cmd.op):
                        with m.Case(0):
                            m.d.comb += csr.w_en.eq(cmd.addr != STALL_ADDR)
                        with m.Case(3):
                            m.d.comb += start_cmd.eq(1)
                            m.d.sync += [words.eq(cmd.data), word.eq(0), part.eq(0)]
                            m.next = "RUN"
            with m.State("RUN"):
                with m.If(eng.done):
                    m.next = "READ"
            with m.State("READ"):
                with m.If(word == words):
                    m.d.sync += status.eq(0)
                    m.next = "STATUS"
                with m.Else():
                    m.d.comb += [orp.addr.eq(word), orp.en.eq(1)]
                    m.next = "SEND"
            with m.State("SEND"):
                m.d.comb += [
                    self.res.valid.eq(1),
                    self.res.payload.data.eq(orp.data.as_value().word_select(part, 32)),
                ]
                with m.If(self.res.ready):
                    with m.If(part == n // 2 - 1):
                        m.d.sync += [part.eq(0), word.eq(word + 1)]
                        m.next = "READ"
                    with m.Else():
                        m.d.sync += part.eq(part + 1)
            with m.State("STATUS"):
                m.d.comb += self.res.valid.eq(1)
                with m.Switch(status):
                    with m.Case(0):
                        m.d.comb += self.res.payload.data.eq(
                            Cat(eng.busy, eng.error, 0, 0, eng.error_code))
                    with m.Case(1):
                        m.d.comb += self.res.payload.data.eq(eng.cycles)
                    with m.Case(2):
                        m.d.comb += self.res.payload.data.eq(eng.mac_active)
                with m.If(self.res.ready):
                    m.d.sync += status.eq(status + 1)
                    with m.If(status == 2):
                        m.next = "CMD"
        return m
