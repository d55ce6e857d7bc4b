"""The int8 MAC array for the iCE40: two lanes per ``SB_MAC16``, in its dual 8x8 mode.

:class:`Ice40MacArray` has the contract of :class:`npu.neural.mac.MacArray` (the same ports,
commands, results, error behaviour and dual-kernel mode; ``docs/mac.md``), built for the
iCE40UP5K, where every logic cell counts:

* One ``SB_MAC16`` computes the products of two lanes (its 8x8 mode: ``A[15:8] * B[15:8]`` and
  ``A[7:0] * B[7:0]``, both signed), with its input, product and output registers in use, so
  the operands and products cost no logic cells. An 8-lane array takes 4 of the 8 DSPs.
* The accumulate step of a lane is one carry chain: ``acc + p`` for ``MAC``,
  ``acc + ~p = acc - p - 1`` for ``MAX``, ``MIN`` and ``CMP`` (whose sign and an equality test
  order ``p`` and ``acc``), and the selection by op in the same cycle. The bias and the
  command's control travel once for the whole array, not per lane.
* Only int8 is built: a configuration with a binary16 format is refused when the array is
  constructed. Commands in another format are consumed, write nothing and set ``error``, as in
  the generic int8 build.

Products of different lanes belong to different outputs (each lane is one output position, the
coefficient is broadcast), so the contract leaves nothing for an adder tree to sum across lanes:
every lane keeps its own int32 slots (block RAM: 2 EBR per lane for 32 bits).

For the Amaranth simulator, and for Verilog that is simulated without the vendor models,
:class:`DualMul8` and :class:`AccSlots` have behavioural twins of their primitives
(``SB_MAC16``, ``SB_RAM40_4K``) with the same registers and timing; the primitives are used
when ``primitives=True`` or when elaborated for an iCE40 platform.
"""

from amaranth.hdl import (
    Cat,
    ClockSignal,
    Const,
    Instance,
    Module,
    Mux,
    ResetInserter,
    Signal,
    signed,
)
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .layouts import MacFormat, MacOp, slot_shape
from .mac import check_array_config, mac_array_signature, slot_hazard, sticky_error

__all__ = ["AccSlots", "DualMul8", "Ice40MacArray", "check_config", "ice40_pipeline_stages",
           "is_ice40_platform"]


def is_ice40_platform(platform):
    """True if ``platform`` is an Amaranth platform for an iCE40 device (``device`` iCE40...)."""
    return str(getattr(platform, "device", "")).startswith("iCE40")


class DualMul8(wiring.Component):
    """Two signed 8 x 8 products with three register stages: one ``SB_MAC16`` in 8x8 mode.

    ``p_lo = a_lo * b_lo`` and ``p_hi = a_hi * b_hi`` (int8 operands, int16 products) appear
    three advancing cycles (``en``) after their operands: the DSP's input registers
    (``A_REG``, ``B_REG``), its 8x8 product registers (``TOP_8x8_MULT_REG``,
    ``BOT_8x8_MULT_REG``) and its output registers (the accumulator registers loaded with
    ``0 + product``, ``*OUTPUT_SELECT = 1``). ``en`` is the DSP's clock enable. The registers
    have no reset (their contents are don't-care until valid data has passed).

    Parameters
    ----------
    primitive : bool or None
        ``True``: instantiate ``SB_MAC16``; ``False``: the behavioural twin; ``None``: the
        primitive when elaborated for an iCE40 platform, else the twin.
    """

    LATENCY = 3

    a_lo: In(8)
    a_hi: In(8)
    b_lo: In(8)
    b_hi: In(8)
    en: In(1)
    p_lo: Out(signed(16))
    p_hi: Out(signed(16))

    def __init__(self, *, primitive=None):
        self._primitive = primitive
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        primitive = self._primitive
        if primitive is None:
            primitive = is_ice40_platform(platform)
        if primitive:
            out = Signal(32)
            m.submodules.dsp = Instance(
                "SB_MAC16",
                p_NEG_TRIGGER=0, p_C_REG=0, p_A_REG=1, p_B_REG=1, p_D_REG=0,
                p_TOP_8x8_MULT_REG=1, p_BOT_8x8_MULT_REG=1,
                p_PIPELINE_16x16_MULT_REG1=0, p_PIPELINE_16x16_MULT_REG2=0,
                # Each half: its adder adds 0 (the C / D input) to its 8x8 product, and the
                # output is the register after the adder.
                p_TOPOUTPUT_SELECT=1, p_TOPADDSUB_LOWERINPUT=1, p_TOPADDSUB_UPPERINPUT=1,
                p_TOPADDSUB_CARRYSELECT=0,
                p_BOTOUTPUT_SELECT=1, p_BOTADDSUB_LOWERINPUT=1, p_BOTADDSUB_UPPERINPUT=1,
                p_BOTADDSUB_CARRYSELECT=0,
                p_MODE_8x8=1, p_A_SIGNED=1, p_B_SIGNED=1,
                i_CLK=ClockSignal("sync"), i_CE=self.en,
                i_A=Cat(self.a_lo, self.a_hi), i_B=Cat(self.b_lo, self.b_hi),
                i_C=Const(0, 16), i_D=Const(0, 16),
                i_AHOLD=0, i_BHOLD=0, i_CHOLD=0, i_DHOLD=0,
                i_IRSTTOP=0, i_IRSTBOT=0, i_ORSTTOP=0, i_ORSTBOT=0,
                i_OLOADTOP=0, i_OLOADBOT=0, i_ADDSUBTOP=0, i_ADDSUBBOT=0,
                i_OHOLDTOP=0, i_OHOLDBOT=0, i_CI=0, i_ACCUMCI=0, i_SIGNEXTIN=0,
                o_O=out,
            )
            m.d.comb += [self.p_lo.eq(out[:16]), self.p_hi.eq(out[16:])]
        else:
            # The twin: the same three registers, all advancing with `en`.
            alo, ahi, blo, bhi = (Signal(8, name=f"{n}0", reset_less=True)
                                  for n in ("alo", "ahi", "blo", "bhi"))
            prod = [Signal(signed(16), name=f"prod{i}", reset_less=True) for i in range(2)]
            outs = [Signal(signed(16), name=f"out{i}", reset_less=True) for i in range(2)]
            with m.If(self.en):
                m.d.sync += [alo.eq(self.a_lo), ahi.eq(self.a_hi),
                             blo.eq(self.b_lo), bhi.eq(self.b_hi),
                             prod[0].eq(alo.as_signed() * blo.as_signed()),
                             prod[1].eq(ahi.as_signed() * bhi.as_signed()),
                             outs[0].eq(prod[0]), outs[1].eq(prod[1])]
            m.d.comb += [self.p_lo.eq(outs[0]), self.p_hi.eq(outs[1])]
        return m


class AccSlots(wiring.Component):
    """The accumulator slots of one lane: ``depth`` x 32 bits, one write and one read port
    (read data one cycle after the address, while ``ren`` is high).

    With ``primitive`` two ``SB_RAM40_4K`` (256 x 16 each) hold the slots; otherwise an
    Amaranth :class:`Memory`. A read in the cycle that writes the same slot returns an
    unspecified value (the array never uses such a value). Instantiating the block RAM spares
    the logic cells Yosys adds to an inferred one to return the old value in that case, which
    the array does not need.

    Parameters
    ----------
    depth : int
        Number of slots (at most 256 with ``primitive``).
    primitive : bool or None
        ``SB_RAM40_4K`` (``True``), an Amaranth memory (``False``), or by the platform
        (``None``).
    transparent : bool
        Amaranth memory only: the read port returns the value written in the same cycle (no
        block RAM can; for ``acc_memory="logic"``).
    """

    def __init__(self, depth, *, primitive=None, transparent=False):
        if not 1 <= depth <= 256:
            raise ValueError(f"Depth must be in [1, 256], not {depth!r}")
        self._depth = depth
        self._primitive = primitive
        self._transparent = transparent
        super().__init__({
            "raddr": In(slot_shape(depth)), "ren": In(1), "rdata": Out(32),
            "waddr": In(slot_shape(depth)), "wen": In(1), "wdata": In(32),
        })

    def elaborate(self, platform):
        m = Module()
        primitive = self._primitive
        if primitive is None:
            primitive = is_ice40_platform(platform)
        if primitive and not self._transparent:
            for half in range(2):
                m.submodules[f"ram{half}"] = Instance(
                    "SB_RAM40_4K",
                    p_READ_MODE=0, p_WRITE_MODE=0,     # 256 x 16
                    i_RCLK=ClockSignal("sync"), i_RCLKE=1, i_RE=self.ren,
                    i_RADDR=Cat(self.raddr, Const(0, 11 - len(self.raddr))),
                    i_WCLK=ClockSignal("sync"), i_WCLKE=1, i_WE=self.wen,
                    i_WADDR=Cat(self.waddr, Const(0, 11 - len(self.waddr))),
                    i_MASK=Const(0, 16),
                    i_WDATA=self.wdata[16 * half:16 * half + 16],
                    o_RDATA=self.rdata[16 * half:16 * half + 16],
                )
        else:
            attrs = None if self._transparent else {"ram_style": "block"}
            mem = Memory(shape=32, depth=self._depth, init=[], attrs=attrs)
            m.submodules.mem = mem
            wr = mem.write_port()
            rd = mem.read_port(transparent_for=(wr,) if self._transparent else ())
            m.d.comb += [
                wr.addr.eq(self.waddr), wr.data.eq(self.wdata), wr.en.eq(self.wen),
                rd.addr.eq(self.raddr), rd.en.eq(self.ren), self.rdata.eq(rd.data),
            ]
        return m


def ice40_pipeline_stages(config):
    """``(read_stage, write_stage, hazard)`` of :class:`Ice40MacArray` for ``config``.

    A command is in ``S0`` (DSP input registers) after its handshake, ``S1`` (DSP product
    registers; the slot's read address), ``S2`` (DSP output registers; the slot value read),
    ``S3`` (accumulator input: bias or slot) and ``S4`` (the new slot value: result register,
    written to the slot as the command leaves ``S4``). A command that reads a slot waits while
    a command writing it is in one of the first ``hazard`` stages: 3 with block RAM (its read is
    not transparent), 2 with ``acc_memory="logic"``.
    """
    read_stage, write_stage = 2, 4
    hazard = write_stage - read_stage + (1 if config.acc_memory == "block" else 0)
    return read_stage, write_stage, hazard


def check_config(config):
    """Raise if :class:`Ice40MacArray` cannot be built for ``config`` (it must be an
    :class:`NPUConfig` with only the int8 format)."""
    check_array_config(config)
    if config.formats != ("int8",):
        raise ValueError(f"The iCE40 MAC array (mac_impl='ice40') computes int8 only; "
                         f"configuration {config.name!r} asks for formats "
                         f"{', '.join(config.formats)}: use formats=('int8',) or "
                         f"mac_impl='generic'")


_CONTROL = data.StructLayout({
    "valid": 1, "kill": 1, "op": MacOp, "fmt": MacFormat, "first": 1, "last": 1,
})


class Ice40MacArray(wiring.Component):
    """``config.macs`` int8 MAC lanes on ``config.macs // 2`` ``SB_MAC16`` (see the module
    documentation); the contract of :class:`npu.neural.mac.MacArray`.

    Parameters
    ----------
    config : NPUConfig
        Must have only the ``int8`` format.
    primitives : bool or None
        Passed to :class:`DualMul8`: instantiate ``SB_MAC16`` (``True``), the behavioural twin
        (``False``), or decide by the platform (``None``, the default).

    Members
    -------
    cmd, res, error, error_clear, active, flush
        As :class:`npu.neural.mac.MacArray`.
    """

    def __init__(self, config, *, primitives=None):
        check_config(config)
        self._config = config
        self._primitives = primitives
        super().__init__(mac_array_signature(config))

    @property
    def config(self):
        return self._config

    @property
    def latency(self):
        """Cycles from a command's handshake to its result being valid (no stalls)."""
        return ice40_pipeline_stages(self._config)[1] + 1

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        read_stage, write_stage, hazard_stages = ice40_pipeline_stages(cfg)
        cmd = self.cmd.payload
        slot_bits = slot_shape(cfg.acc_slots)

        # Control and slot index, once for the whole array, through S0..S4.
        ctl = [Signal(_CONTROL, name=f"ctl{i}") for i in range(write_stage + 1)]
        slot = [Signal(slot_bits, name=f"slot{i}") for i in range(write_stage + 1)]
        bias = [Signal(32, name=f"bias{i}", reset_less=True) for i in range(read_stage + 1)]

        en = Signal()
        out = ctl[write_stage]
        m.d.comb += [
            self.res.valid.eq(out.valid & out.last),
            en.eq(~self.res.valid | self.res.ready),
        ]

        # Read-after-write interlock: `busy` has a bit per slot written by a command in
        # S0..S<hazard-1> (a register: next value from the accepted command and S0..S<h-2>).
        accept = Signal()
        hazard = Signal()
        if hazard_stages:
            window = [(accept, cmd.slot)]
            window += [(ctl[i].valid, slot[i]) for i in range(hazard_stages - 1)]
            m.d.comb += hazard.eq(slot_hazard(m, cmd, window, cfg.acc_slots, en=en))

        supported = Signal()
        m.d.comb += [
            supported.eq(cmd.fmt == MacFormat.INT8),
            self.cmd.ready.eq(en & ~hazard),
            accept.eq(self.cmd.valid & self.cmd.ready),
            self.active.eq(accept),
        ]
        sticky_error(m, self, accept, supported)

        with m.If(en):
            m.d.sync += [
                ctl[0].valid.eq(accept), ctl[0].kill.eq(~supported), ctl[0].op.eq(cmd.op),
                ctl[0].fmt.eq(cmd.fmt), ctl[0].first.eq(cmd.first), ctl[0].last.eq(cmd.last),
                slot[0].eq(cmd.slot), bias[0].eq(cmd.bias),
            ]
            m.d.sync += [ctl[i].eq(ctl[i - 1]) for i in range(1, write_stage + 1)]
            m.d.sync += [slot[i].eq(slot[i - 1]) for i in range(1, write_stage + 1)]
            m.d.sync += [bias[i].eq(bias[i - 1]) for i in range(1, read_stage + 1)]

        # The op of the command in S3, decoded once for every lane.
        op3 = Signal(data.StructLayout({"mac": 1, "max": 1, "min": 1, "cmp": 1}))
        with m.If(en):
            m.d.sync += op3.eq(Cat(*(ctl[read_stage].op == op for op in
                                     (MacOp.MAC, MacOp.MAX, MacOp.MIN, MacOp.CMP))))

        products = self._products(m, cmd, en)
        for lane, product in enumerate(products):
            result = self._lane(m, lane, product, en=en, ctl=ctl, slot=slot, bias=bias, op3=op3,
                                read_stage=read_stage, write_stage=write_stage)
            m.d.comb += self.res.payload.acc[lane].eq(result)
        m.d.comb += [
            self.res.payload.slot.eq(slot[write_stage]),
            self.res.payload.fmt.eq(out.fmt),
        ]
        return ResetInserter(self.flush)(m)

    def _products(self, m, cmd, en):
        """The signed int16 product of every lane, valid while its command is in S2."""
        # Dual-kernel mode: lanes 2j and 2j+1 take data[j] with coef[0] and coef[1];
        # otherwise data[2j] and data[2j+1] with coef[0].
        coef_odd = Signal(8)
        m.d.comb += coef_odd.eq(Mux(cmd.dual, cmd.coef[1][:8], cmd.coef[0][:8]))
        products = []
        for j in range(self._config.macs // 2):
            mul = DualMul8(primitive=self._primitives)
            m.submodules[f"dsp{j}"] = mul
            m.d.comb += [
                mul.en.eq(en),
                mul.a_lo.eq(Mux(cmd.dual, cmd.data[j][:8], cmd.data[2 * j][:8])),
                mul.a_hi.eq(Mux(cmd.dual, cmd.data[j][:8], cmd.data[2 * j + 1][:8])),
                mul.b_lo.eq(cmd.coef[0][:8]),
                mul.b_hi.eq(coef_odd),
            ]
            products += [mul.p_lo, mul.p_hi]
        return products

    def _lane(self, m, lane, product, *, en, ctl, slot, bias, op3, read_stage, write_stage):
        """One lane's slots and accumulate step; returns its result register (S4)."""
        cfg = self._config
        acc = AccSlots(cfg.acc_slots, primitive=self._primitives,
                       transparent=cfg.acc_memory == "logic")
        m.submodules[f"acc{lane}"] = acc

        # S1 -> S2: slot read.
        m.d.comb += [acc.ren.eq(en), acc.raddr.eq(slot[read_stage - 1])]

        # S2 -> S3: accumulator input (bias or slot); the product, inverted for acc - p; whether
        # the two are equal (here rather than after S3, where it would lengthen the carry path).
        acc_in = Signal(32, name=f"acc_in{lane}")
        p2 = Signal(32, name=f"p2_{lane}")      # the product, sign-extended
        acc3 = Signal(32, name=f"acc3_{lane}", reset_less=True)
        q3 = Signal(signed(17), name=f"q3_{lane}", reset_less=True)
        eq3 = Signal(4, name=f"eq3_{lane}", reset_less=True)     # per byte
        sub = ctl[read_stage].op != MacOp.MAC
        m.d.comb += [acc_in.eq(Mux(ctl[read_stage].first, bias[read_stage], acc.rdata)),
                     p2.eq(product)]
        with m.If(en):
            m.d.sync += [
                acc3.eq(acc_in),
                q3.eq(product ^ Mux(sub, -1, 0)),
                # Four byte compares (two LUT levels each) rather than one 32-bit compare,
                # which the tools build as a chain of LUTs.
                eq3.eq(Cat(acc_in[8 * k:8 * k + 8] == p2[8 * k:8 * k + 8] for k in range(4))),
            ]

        # S3 -> S4: one carry chain without carry-in: acc + p, or acc + ~p = acc - p - 1, whose
        # sign says p >= acc; with the equality it orders p and acc.
        total = Signal(33, name=f"sum{lane}")
        m.d.comb += total.eq(acc3.as_signed() + q3)
        # The product itself, sign-extended, whenever it is selected (MAX, MIN: q3 = ~p).
        p3 = Signal(32, name=f"p3_{lane}")
        m.d.comb += p3.eq(~q3)
        t32 = total[32]                 # acc - p - 1 < 0: p >= acc
        eq = eq3.all()
        # The selection, arranged for LUT4s: a MAC takes the sum, MAX and MIN take p or acc,
        # CMP takes all ones and is cleared to -1, 0 or +1 by the flip-flops' synchronous reset.
        c3 = ctl[write_stage - 1]
        take_p = Signal(name=f"take_p{lane}")
        m.d.comb += take_p.eq(Mux(op3.max, t32 & ~eq, op3.min & ~t32))
        kept = Mux(op3.mac, total[:32], acc3)
        value = Signal(32, name=f"value{lane}")
        m.d.comb += value.eq(Mux(op3.cmp, -1, Mux(take_p, p3, kept)))
        result = Signal(32, name=f"result{lane}", reset_less=True)
        with m.If(en):
            # CMP: bits 1-31 are set only for p < acc, bit 0 only for p != acc.
            m.d.sync += [
                result[1:].eq(Mux(c3.kill | (op3.cmp & t32), 0, value[1:])),
                result[0].eq(Mux(c3.kill | (op3.cmp & eq), 0, value[0])),
            ]

        # S4: the new value is written as the command leaves S4.
        last = ctl[write_stage]
        m.d.comb += [
            acc.waddr.eq(slot[write_stage]),
            acc.wdata.eq(result),
            acc.wen.eq(en & last.valid & ~last.kill),
        ]
        return result
