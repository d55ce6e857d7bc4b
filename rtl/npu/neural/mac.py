"""The MAC unit and the MAC array of the neural engine.

A MAC unit multiplies two operands (int8 or binary16, in the combinations of
:class:`~npu.neural.layouts.MacFormat`) and combines the exact product with one of its accumulator
slots (add, max, min or compare). A MAC array is N units sharing one command stream: the
coefficient is broadcast, each unit gets its own data operand, every unit uses the same slot.
``docs/mac.md`` documents the command format, the pipeline and its latency.
"""

from amaranth.hdl import Cat, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu_spec.config import NPUConfig

from ..lib.fp32 import FP32AddPipe, Operand, decode_operand, product_to_f32
from ..lib.shared import SharedModule
from .layouts import MacFormat, MacOp, mac_command_layout, mac_result_layout, slot_shape

__all__ = ["MacUnit", "MacArray", "mac_array_signature", "format_supported", "pipeline_stages",
           "check_array_config", "lane_operands", "sticky_error", "slot_window", "slot_hazard"]


def _control_layout(slots):
    return data.StructLayout({
        "valid": 1,
        "kill":  1,
        "op":    MacOp,
        "fmt":   MacFormat,
        "slot":  slot_shape(slots),
        "first": 1,
        "last":  1,
    })


def pipeline_stages(config):
    """Register stages of a MAC unit for ``config``: ``(read_stage, write_stage, hazard)``.

    Stage ``S0`` holds an accepted command. The accumulator slot is read as the command enters
    ``S<read_stage>`` and written as it enters ``S<write_stage>``, which is also the result
    register. A command that reads a slot must not be accepted while a command writing that
    slot sits in one of the first ``hazard`` stages. With ``acc_memory="logic"`` the read port
    is transparent to the write port (a read in the same cycle as the write sees the new
    value); block RAM reads are not, which costs one more stage of interlock but keeps the
    bypass multiplexer out of the accumulate loop.
    """
    if config.has_float:
        read_stage, write_stage = 3, 7
    else:
        read_stage, write_stage = 2, 6
    hazard = write_stage - read_stage - (1 if config.acc_memory == "logic" else 0)
    return read_stage, write_stage, hazard


class MacUnit(wiring.Component):
    """One multiply-accumulate unit with ``config.acc_slots`` accumulator slots.

    The unit is a fixed-length pipeline advanced by ``en``; it keeps its control alongside
    its data, so N units in an array are identical (and one converted unit can stand for all
    of them, :class:`MacArray` ``unit``). Results appear in ``result`` after
    ``write_stage + 1`` advancing cycles (see :func:`pipeline_stages`).

    Members
    -------
    flush : In(1)
        Synchronous clear: every pipeline register returns to its reset value (commands in
        flight are dropped); the accumulator slots keep their contents.
    en : In(1)
        Advance every pipeline stage.
    valid : In(1)
        A command is accepted this cycle (only sampled when ``en`` is high).
    kill : In(1)
        The command must not write its slot (unsupported format); its result is zero.
    op, fmt, slot, first, last, bias : In
        The command (see :func:`npu.neural.layouts.mac_command_layout`).
    a, b : In(16)
        Data and coefficient operands.
    result : Out(32)
        Slot value after the command in the last stage (int32 or binary32 bits).
    out : Out(control layout)
        Control of the command in the last stage (``valid``, ``slot``, ``last``, ...).
    """

    def __init__(self, config):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self._config = config
        ctl = _control_layout(config.acc_slots)
        super().__init__({
            "flush":  In(1),
            "en":     In(1),
            "valid":  In(1),
            "kill":   In(1),
            "op":     In(MacOp),
            "fmt":    In(MacFormat),
            "slot":   In(slot_shape(config.acc_slots)),
            "first":  In(1),
            "last":   In(1),
            "bias":   In(32),
            "a":      In(16),
            "b":      In(16),
            "result": Out(32),
            "out":    Out(ctl),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        read_stage, write_stage, _ = pipeline_stages(cfg)
        ctl_layout = _control_layout(cfg.acc_slots)
        en = self.en

        # Control travels with the data through every stage.
        ctl = [Signal(ctl_layout, name=f"ctl{i}") for i in range(write_stage + 1)]
        with m.If(en):
            m.d.sync += ctl[0].eq(Cat(self.valid, self.kill, self.op, self.fmt, self.slot,
                                      self.first, self.last))
            for i in range(1, write_stage + 1):
                m.d.sync += ctl[i].eq(ctl[i - 1])

        # S0: operand registers.
        a0 = Signal(16)
        b0 = Signal(16)
        bias = [Signal(32, name=f"bias{i}") for i in range(read_stage + 1)]
        with m.If(en):
            m.d.sync += [a0.eq(self.a), b0.eq(self.b), bias[0].eq(self.bias)]
            m.d.sync += [bias[i].eq(bias[i - 1]) for i in range(1, read_stage + 1)]

        # Accumulator slots: read as a command enters S<read_stage>, written as it enters the
        # last stage.
        attrs = {"ram_style": "block"} if cfg.acc_memory == "block" else None
        acc = Memory(shape=32, depth=cfg.acc_slots, init=[], attrs=attrs)
        m.submodules.acc = acc
        acc_wr = acc.write_port()
        acc_rd = acc.read_port(
            transparent_for=(acc_wr,) if cfg.acc_memory == "logic" else ())
        m.d.comb += [acc_rd.en.eq(en), acc_rd.addr.eq(ctl[read_stage - 1].slot)]
        last_ctl = ctl[write_stage - 1]
        final = Signal(32)
        m.d.comb += [
            acc_wr.addr.eq(last_ctl.slot),
            acc_wr.data.eq(final),
            acc_wr.en.eq(en & last_ctl.valid & ~last_ctl.kill),
        ]
        result = Signal(32)
        with m.If(en):
            m.d.sync += result.eq(Mux(last_ctl.kill, 0, final))
        m.d.comb += [self.result.eq(result), self.out.eq(ctl[write_stage])]

        addend = Signal(32)
        m.d.comb += addend.eq(Mux(ctl[read_stage].first, bias[read_stage], acc_rd.data))

        if cfg.has_float:
            # S1: decode both operands into sign, 11-bit significand, exponent, class.
            fmt0 = ctl[0].fmt
            a_is_int = (fmt0 == MacFormat.INT8) | (fmt0 == MacFormat.I8F16)
            b_is_int = (fmt0 == MacFormat.INT8) | (fmt0 == MacFormat.F16I8)
            if not cfg.has_mixed:
                a_is_int = b_is_int = fmt0 == MacFormat.INT8
            if not cfg.has_int8:
                a_is_int = b_is_int = 0
            dec_a = decode_operand(m, a0, a_is_int, name="dec_a")
            dec_b = decode_operand(m, b0, b_is_int, name="dec_b")
            da = Signal(Operand)
            db = Signal(Operand)
            with m.If(en):
                m.d.sync += [da.eq(dec_a), db.eq(dec_b)]

            # S2: multiply the significands (11 x 11 bits, one DSP), classify the product.
            a_zero = ~da.inf & ~da.nan & (da.sig == 0)
            b_zero = ~db.inf & ~db.nan & (db.sig == 0)
            psig = Signal(22)
            pexp = Signal(signed(7))
            psign = Signal()
            pinf = Signal()
            pnan = Signal()
            with m.If(en):
                m.d.sync += [
                    psig.eq(da.sig * db.sig),
                    pexp.eq(da.exp + db.exp),
                    psign.eq(da.sign ^ db.sign),
                    pinf.eq(da.inf | db.inf),
                    pnan.eq(da.nan | db.nan | (da.inf & b_zero) | (db.inf & a_zero)),
                ]

            # S3: the exact product as binary32 bits, or as int32 for INT8 commands.
            pf32 = product_to_f32(m, psign, psig, pexp, pinf, pnan, name="pf32")
            pint = Mux(psign, -psig, psig).as_signed()
            p2 = Signal(32)
            with m.If(en):
                m.d.sync += p2.eq(Mux(ctl[2].fmt == MacFormat.INT8, pint, pf32))

            # S4-S6: the binary32 adder; int32 results wait alongside.
            m.submodules.fadd = fadd = FP32AddPipe()
            m.d.comb += [fadd.en.eq(en), fadd.a.eq(addend), fadd.b.eq(p2),
                         fadd.op.eq(ctl[read_stage].op)]
            ires = self._int_op(m, ctl[read_stage].op, addend, p2)
            idelay = ires
            for i in range(FP32AddPipe.LATENCY):
                stage = Signal(32, name=f"ires{read_stage + 1 + i}")
                with m.If(en):
                    m.d.sync += stage.eq(idelay)
                idelay = stage
            m.d.comb += final.eq(Mux(last_ctl.fmt == MacFormat.INT8, idelay, fadd.result))
        else:
            # Integer-only build, cut for the iCE40: S1 a signed 8 x 8 multiply (one DSP),
            # S2 its output register (and the slot read), S3 the selected accumulator input,
            # S4 sum, difference and equality (carry chains only), S5 the selection by op,
            # whose register feeds the slot write and the result.
            p1 = Signal(signed(16))
            p2 = Signal(32)
            p3 = Signal(32)
            acc3 = Signal(32)
            sum4 = Signal(32)
            diff4 = Signal(33)
            eq4 = Signal()
            p4 = Signal(32)
            acc4 = Signal(32)
            ires = Signal(32)
            with m.If(en):
                m.d.sync += [
                    p1.eq(a0[:8].as_signed() * b0[:8].as_signed()),
                    p2.eq(p1),
                    p3.eq(p2),
                    acc3.eq(addend),
                    sum4.eq(acc3 + p3),
                    diff4.eq(p3.as_signed() - acc3.as_signed()),
                    eq4.eq(p3 == acc3),
                    p4.eq(p3),
                    acc4.eq(acc3),
                ]
            selected = self._int_select(m, ctl[read_stage + 2].op, acc4, p4, sum4,
                                        lt=diff4[32], eq=eq4)
            with m.If(en):
                m.d.sync += ires.eq(selected)
            m.d.comb += final.eq(ires)
        return ResetInserter(self.flush)(m)

    @staticmethod
    def _int_select(m, op, acc, p, total, *, lt, eq):
        """Combinational int32 result by ``op`` from the sum and the order of ``p`` and
        ``acc`` (``lt``: ``p < acc`` as signed, ``eq``: ``p == acc``)."""
        res = Signal(32)
        gt = ~lt & ~eq
        with m.Switch(op):
            with m.Case(MacOp.MAC):
                m.d.comb += res.eq(total)
            with m.Case(MacOp.MAX):
                m.d.comb += res.eq(Mux(gt, p, acc))
            with m.Case(MacOp.MIN):
                m.d.comb += res.eq(Mux(lt, p, acc))
            with m.Case(MacOp.CMP):
                m.d.comb += res.eq(Mux(gt, 1, Mux(lt, -1, 0)))
        return res

    @classmethod
    def _int_op(cls, m, op, acc, p):
        """Combinational int32 add (wrapping) / max / min / compare of ``p`` against ``acc``."""
        return cls._int_select(m, op, acc, p, acc + p,
                               lt=p.as_signed() < acc.as_signed(), eq=p == acc)


def format_supported(m, config, fmt):
    """A signal that is high when the :class:`MacFormat` ``fmt`` is built into ``config``."""
    supported = Signal()
    with m.Switch(fmt):
        with m.Case(MacFormat.INT8):
            m.d.comb += supported.eq(config.has_int8)
        with m.Case(MacFormat.FP16):
            m.d.comb += supported.eq(config.has_fp16)
        with m.Case(MacFormat.I8F16, MacFormat.F16I8):
            m.d.comb += supported.eq(config.has_mixed)
    return supported


def mac_array_signature(config):
    """The ports every MAC array implementation has (``docs/mac.md``): the command and result
    streams, the sticky ``error`` with its clear, ``active``, and ``flush`` (a synchronous
    clear of everything but the accumulator slots)."""
    return wiring.Signature({
        "flush": In(1),
        "cmd": In(stream.Signature(mac_command_layout(config.macs, config.acc_slots))),
        "res": Out(stream.Signature(mac_result_layout(config.macs, config.acc_slots))),
        "error": Out(1),
        "error_clear": In(1),
        "active": Out(1),
    })


# Pieces every MAC array implementation builds the same way (``docs/mac.md``).

def check_array_config(config):
    """Raise ``TypeError`` unless ``config`` is an :class:`NPUConfig`."""
    if not isinstance(config, NPUConfig):
        raise TypeError(f"config must be an NPUConfig, not {config!r}")


def lane_operands(cmd, i):
    """Lane ``i``'s data and coefficient operands of the command payload ``cmd``: the
    broadcast coefficient, or in dual-kernel mode the even/odd pairing (lanes 2j and 2j+1 take
    ``data[j]`` with ``coef[0]`` and ``coef[1]``)."""
    return (Mux(cmd.dual, cmd.data[i // 2], cmd.data[i]),
            Mux(cmd.dual & (i % 2 == 1), cmd.coef[1], cmd.coef[0]))


def sticky_error(m, array, accept, supported):
    """Drive ``array.error``: set by an accepted command of a format the build leaves out,
    cleared by ``array.error_clear``."""
    with m.If(array.error_clear):
        m.d.sync += array.error.eq(0)
    with m.If(accept & ~supported):
        m.d.sync += array.error.eq(1)


def _sync_when(m, en, statements):
    """``statements`` into the sync domain, under ``en`` unless it is ``None``."""
    if en is None:
        m.d.sync += statements
    else:
        with m.If(en):
            m.d.sync += statements


def slot_window(m, valid, slot, count, slots, *, en=None):
    """``[(valid, slot)]`` followed by ``count`` ``(valid, slot)`` registers shadowing it
    stage by stage (advancing while ``en``, or in every cycle if ``en`` is ``None``)."""
    window = [(valid, slot)]
    for i in range(count):
        next_valid = Signal(name=f"hz_valid{i}")
        next_slot = Signal(slot_shape(slots), name=f"hz_slot{i}")
        _sync_when(m, en, [next_valid.eq(valid), next_slot.eq(slot)])
        window.append((next_valid, next_slot))
        valid, slot = next_valid, next_slot
    return window


def slot_hazard(m, cmd, window, slots, *, en=None):
    """The read-after-write interlock: a registered per-slot ``busy`` mask of the slots written
    by the ``(valid, slot)`` pairs of ``window`` (updated while ``en``, or in every cycle if
    ``en`` is ``None``); returns the condition under which the command ``cmd`` must wait
    (it reads a busy slot; a command seeding from the bias reads nothing)."""
    busy = Signal(slots)
    next_busy = 0
    for valid, slot in window:
        next_busy = next_busy | Mux(valid, 1 << slot, 0)
    _sync_when(m, en, busy.eq(next_busy))
    return busy.bit_select(cmd.slot, 1) & ~cmd.first


class MacArray(wiring.Component):
    """``config.macs`` MAC units on one command stream, with broadcast coefficients.

    Every accepted command advances all units together. A command that reads a slot still
    being computed by an earlier command waits (``cmd.ready`` low) until the value is written
    back: interleaving at least ``hazard_stages + 1`` slots (4 with binary16 support, 5 for the
    int8-only block-RAM build) keeps the array at one command per cycle. ``docs/mac.md`` gives the
    command format, the latency and the dual-kernel mode.

    Members
    -------
    cmd : In(stream.Signature(mac_command_layout(macs, acc_slots)))
        Commands.
    res : Out(stream.Signature(mac_result_layout(macs, acc_slots)))
        One beat per command with ``last`` set, in command order.
    error : Out(1)
        Sticky: a command used a format this build leaves out. Such a command is consumed,
        writes no slot, and (if ``last``) yields a result beat of zeros.
    error_clear : In(1)
        Clear ``error``.
    active : Out(1)
        A command was accepted this cycle (for MAC-active performance counters).
    flush : In(1)
        Synchronous clear of the pipeline, the interlock and ``error`` (the engine's abort and
        error recovery); the accumulator slots keep their contents.

    Parameters
    ----------
    config : NPUConfig
    unit : SharedModule or None
        A :class:`MacUnit` of ``config`` converted once (:class:`npu.lib.shared.SharedModule`):
        the units become instances of it by name, so a wide array costs one unit's conversion.
        For Verilog output only; the Amaranth simulator needs ``None`` (the units inline).
    """

    def __init__(self, config, *, unit=None):
        check_array_config(config)
        if unit is not None and not (isinstance(unit, SharedModule)
                                     and isinstance(unit.component, MacUnit)
                                     and unit.component.config == config):
            raise TypeError(f"unit must be a SharedModule of a MacUnit of the same "
                            f"configuration, not {unit!r}")
        self._config = config
        self._unit = unit
        super().__init__(mac_array_signature(config))

    @property
    def config(self):
        return self._config

    @property
    def latency(self):
        """Cycles from a command's handshake to its result being valid (no stalls)."""
        return pipeline_stages(self._config)[1] + 1

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        _, _, hazard_stages = pipeline_stages(cfg)
        cmd = self.cmd.payload

        if self._unit is None:
            units = [MacUnit(cfg) for _ in range(cfg.macs)]
            for i, unit in enumerate(units):
                m.submodules[f"mac{i}"] = unit
        else:
            units = [self._unit.instance(m, f"mac{i}") for i in range(cfg.macs)]

        # The pipeline stalls only while a result waits for the consumer.
        out_ctl = units[0].out
        en = Signal()
        m.d.comb += [
            self.res.valid.eq(out_ctl.valid & out_ctl.last),
            en.eq(~self.res.valid | self.res.ready),
        ]

        # Read-after-write interlock on the accumulator slot (commands seeding from the bias
        # read nothing and need no wait).
        # `busy` has a bit per slot written by a command still in the interlock window; it is
        # kept as a register (next value from the shadow stages), so `ready` is one lookup.
        hazard = Signal()
        if hazard_stages:
            # A command entering S0 and those in S0..S<hazard-2> are the window next cycle.
            # (A killed command marks its slot too: harmless, and it keeps the format decode
            # out of this loop.)
            window = slot_window(m, units[0].valid, units[0].slot, hazard_stages - 1,
                                 cfg.acc_slots, en=units[0].en)
            m.d.comb += hazard.eq(slot_hazard(m, cmd, window, cfg.acc_slots, en=en))

        supported = format_supported(m, cfg, cmd.fmt)

        accept = Signal()
        m.d.comb += [
            self.cmd.ready.eq(en & ~hazard),
            accept.eq(self.cmd.valid & self.cmd.ready),
            self.active.eq(accept),
        ]
        sticky_error(m, self, accept, supported)

        # Operand routing: broadcast coefficient, or the even/odd dual-kernel pairing.
        for i, unit in enumerate(units):
            a, b = lane_operands(cmd, i)
            m.d.comb += [
                unit.flush.eq(self.flush),
                unit.en.eq(en),
                unit.valid.eq(accept),
                unit.kill.eq(~supported),
                unit.op.eq(cmd.op),
                unit.fmt.eq(cmd.fmt),
                unit.slot.eq(cmd.slot),
                unit.first.eq(cmd.first),
                unit.last.eq(cmd.last),
                unit.bias.eq(cmd.bias),
                unit.a.eq(a),
                unit.b.eq(b),
                self.res.payload.acc[i].eq(unit.result),
            ]
        m.d.comb += [
            self.res.payload.slot.eq(out_ctl.slot),
            self.res.payload.fmt.eq(out_ctl.fmt),
        ]
        # Instances of a shared unit are outside the reach of a ResetInserter: the units get
        # the flush on their port, everything here through the inserter.
        return ResetInserter(self.flush)(m)
