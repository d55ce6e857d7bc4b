"""The MAC array for the ECP5: registered ``MULT18X18D`` products, a pipeline that never stalls.

:class:`MacArrayECP5` has the contract of :class:`npu.neural.mac.MacArray` (the same ports,
command and result formats, latency, read-after-write interlock, error and ``active`` outputs,
bit for bit the same results; ``docs/mac.md``), built differently:

* **Registered multiplier.** Each lane's significand product comes from a
  :class:`~npu.lib.ecp5_dsp.Mult18x18D` with its input and output registers enabled: the
  decoded significands go straight into the cell's input registers (stage S1) and the product
  leaves its output register (stage S2), so the stages and the latency are those of the generic
  lane, but nextpnr times the multiplier as registered.
* **No stall.** Every lane register advances in every cycle: there is no clock enable at all.
  Results enter an output queue of :attr:`MacArrayECP5.queue_depth` entries, and a command with
  ``last`` is accepted only against a free entry (a credit), counted from its acceptance until
  its result leaves the queue. The queue therefore never overflows, and a consumer that stops
  taking results stops only the commands that would produce more of them. A queue of
  ``latency + 1`` entries or more keeps the array at one command per cycle while the consumer
  keeps up.

``primitive=False`` builds the behavioural twin of the multiplier for the Amaranth simulator;
everything else is the same circuit.
"""

from amaranth.hdl import Cat, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, fifo, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu_spec.config import NPUConfig

from ..lib.ecp5_dsp import Mult18x18D
from ..lib.fp32 import Operand, count_leading_zeros, decode_operand, product_to_f32
from ..lib.fp32_deep import FP32AddDeep
from .layouts import MacFormat, MacOp, mac_result_layout, slot_shape
from .mac import (
    MacUnit,
    check_array_config,
    format_supported,
    lane_operands,
    mac_array_signature,
    slot_hazard,
    slot_window,
    sticky_error,
)

__all__ = ["MacLaneECP5", "MacArrayECP5", "ecp5_stages", "queue_depth_or_default",
           "credit_queue", "registered_product"]


def ecp5_stages():
    """``(read_stage, write_stage, hazard)`` of the ECP5 lane, as
    :func:`npu.neural.mac.pipeline_stages` gives them for the generic one: the accumulator
    input is registered in S4, the six-stage adder fills S5-S10, S11 is the result register,
    the slot is written as the command enters S12, and the read passes a same-cycle write on,
    so a command reading a slot waits while a writer of that slot is in one of the first 7
    stages (8 interleaved slots run at one command per cycle)."""
    read_stage, write_stage = 4, 6 + FP32AddDeep.LATENCY
    return read_stage, write_stage, write_stage - read_stage - 1


def queue_depth_or_default(queue_depth, latency):
    """The result queue depth of an ECP5 array: ``queue_depth``, or by default ``latency + 1``
    rounded up to a power of two; ``ValueError`` unless a positive integer."""
    if queue_depth is None:
        queue_depth = 1 << latency.bit_length()
    if not isinstance(queue_depth, int) or queue_depth < 1:
        raise ValueError(f"queue_depth must be a positive integer, not {queue_depth!r}")
    return queue_depth


def credit_queue(m, array, out_ctl, results, *, write, accept, credit):
    """The result queue of an ECP5 array and its credits.

    The queue (``array.queue_depth`` entries) takes ``results`` (one per lane) with the format
    and slot of ``out_ctl`` when ``write`` is high, and feeds ``array.res``. Entries are
    reserved by accepted (``accept``) commands with ``last`` until their result leaves the
    queue; the register ``credit`` (a free entry exists) is driven here, so ``ready`` stays
    short."""
    cfg = array.config
    res_layout = mac_result_layout(cfg.macs, cfg.acc_slots)
    m.submodules.queue = queue = fifo.SyncFIFO(width=res_layout.size,
                                               depth=array.queue_depth)
    entry = Signal(res_layout)
    m.d.comb += [
        entry.fmt.eq(out_ctl.fmt),
        entry.slot.eq(out_ctl.slot),
        queue.w_data.eq(entry),
        queue.w_en.eq(write),
        array.res.valid.eq(queue.r_rdy),
        array.res.payload.eq(queue.r_data),
        queue.r_en.eq(array.res.ready),
    ]
    for i, result in enumerate(results):
        m.d.comb += entry.acc[i].eq(result)

    reserved = Signal(range(array.queue_depth + 1))
    take = Signal()
    pop = Signal()
    m.d.comb += [take.eq(accept & array.cmd.payload.last),
                 pop.eq(array.res.valid & array.res.ready)]
    next_reserved = Signal.like(reserved)
    m.d.comb += next_reserved.eq(reserved + take - pop)
    m.d.sync += [reserved.eq(next_reserved),
                 credit.eq(next_reserved < array.queue_depth)]


def registered_product(m, a0, b0, a_is_int, b_is_int, *, primitive, reset_less=False):
    """Stages S1 and S2 of an ECP5 float lane: decode the registered operands ``a0`` and
    ``b0`` (int8 where ``a_is_int`` / ``b_is_int``), their significands into the input
    registers of a ``MULT18X18D`` (submodule ``mult``), and the product's class registered
    beside its output register (without a reset if ``reset_less``). Returns the product in S2
    as ``(sig, exp, sign, inf, nan)``."""
    dec_a = decode_operand(m, a0, a_is_int, name="dec_a")
    dec_b = decode_operand(m, b0, b_is_int, name="dec_b")
    m.submodules.mult = mult = Mult18x18D(primitive=primitive)
    m.d.comb += [mult.a.eq(dec_a.sig), mult.b.eq(dec_b.sig)]
    da = Signal(Operand, reset_less=reset_less)
    db = Signal(Operand, reset_less=reset_less)
    a_zero1 = Signal(reset_less=reset_less)
    b_zero1 = Signal(reset_less=reset_less)
    m.d.sync += [
        da.eq(dec_a), db.eq(dec_b),
        a_zero1.eq(~dec_a.inf & ~dec_a.nan & (dec_a.sig == 0)),
        b_zero1.eq(~dec_b.inf & ~dec_b.nan & (dec_b.sig == 0)),
    ]

    # S2: the product leaves the multiplier's output register; its class beside it.
    pexp = Signal(signed(7), reset_less=reset_less)
    psign = Signal(reset_less=reset_less)
    pinf = Signal(reset_less=reset_less)
    pnan = Signal(reset_less=reset_less)
    m.d.sync += [
        pexp.eq(da.exp + db.exp),
        psign.eq(da.sign ^ db.sign),
        pinf.eq(da.inf | db.inf),
        pnan.eq(da.nan | db.nan | (da.inf & b_zero1) | (db.inf & a_zero1)),
    ]
    return mult.p[:22], pexp, psign, pinf, pnan


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


class MacLaneECP5(wiring.Component):
    """One float-capable MAC lane without a clock enable, its product from a ``MULT18X18D``.

    Stages (:func:`ecp5_stages`): S0 operand registers, S1 decode (into the multiplier's input
    registers), S2 the multiplier's output register, S3 the product's leading-zero count, S4
    the product as binary32 (or int32) and the selected accumulator input (slot or bias),
    S5-S10 the six-stage binary32 adder (:class:`~npu.lib.fp32_deep.FP32AddDeep`) beside the
    int32 path, S11 the result register, from which the slot is written. ``result`` and
    ``out`` are the value and the control of the command in S11.

    Members
    -------
    valid, kill, op, fmt, slot, first, last, bias : In
        The command entering S0 (``valid`` high if there is one).
    a, b : In(16)
        Data and coefficient operands.
    result : Out(32)
        Slot value after the command in S11 (zero for a killed command).
    out : Out(control layout)
        Control of that command.
    """

    def __init__(self, config, *, primitive=True):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        if not config.has_float:
            raise ValueError(f"the ECP5 MAC lane needs a float format; the int8-only build "
                             f"{config.formats!r} uses the generic MAC array")
        self._config = config
        self._primitive = primitive
        super().__init__({
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
            "out":    Out(_control_layout(config.acc_slots)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        read_stage, write_stage, _ = ecp5_stages()

        # Control travels with the data; every register advances in every cycle.
        ctl = [Signal(_control_layout(cfg.acc_slots), name=f"ctl{i}")
               for i in range(write_stage + 1)]
        m.d.sync += ctl[0].eq(Cat(self.valid, self.kill, self.op, self.fmt, self.slot,
                                  self.first, self.last))
        m.d.sync += [ctl[i].eq(ctl[i - 1]) for i in range(1, write_stage + 1)]

        # S0: operand registers.
        a0 = Signal(16)
        b0 = Signal(16)
        bias = [Signal(32, name=f"bias{i}") for i in range(read_stage)]
        m.d.sync += [a0.eq(self.a), b0.eq(self.b), bias[0].eq(self.bias)]
        m.d.sync += [bias[i].eq(bias[i - 1]) for i in range(1, read_stage)]

        # Accumulator slots: read (asynchronously) as a command enters S4, where the selected
        # accumulator input is registered; written from the result register S11 as the command
        # enters S12. A write in the same cycle as the read is passed on (a bypass from
        # registers, so the accumulate loop has no combinational path from the adder's
        # rounding into it).
        m.submodules.acc = acc = Memory(shape=32, depth=cfg.acc_slots, init=[])
        acc_wr = acc.write_port()
        acc_rd = acc.read_port(domain="comb")
        res_ctl = ctl[write_stage - 1]
        final = Signal(32)
        final_r = Signal(32)
        m.d.sync += final_r.eq(final)
        m.d.comb += [
            acc_rd.addr.eq(ctl[read_stage - 1].slot),
            acc_wr.addr.eq(res_ctl.slot),
            acc_wr.data.eq(final_r),
            acc_wr.en.eq(res_ctl.valid & ~res_ctl.kill),
            self.result.eq(Mux(res_ctl.kill, 0, final_r)),
            self.out.eq(res_ctl),
        ]
        slot_value = Mux(acc_wr.en & (acc_wr.addr == acc_rd.addr), acc_wr.data, acc_rd.data)
        addend = Signal(32)
        m.d.sync += addend.eq(Mux(ctl[read_stage - 1].first, bias[read_stage - 1],
                                  slot_value))

        # S1: decode both operands; the significands go into the multiplier's input registers.
        fmt0 = ctl[0].fmt
        a_is_int = (fmt0 == MacFormat.INT8) | (fmt0 == MacFormat.I8F16)
        b_is_int = (fmt0 == MacFormat.INT8) | (fmt0 == MacFormat.F16I8)
        if not cfg.has_mixed:
            a_is_int = b_is_int = fmt0 == MacFormat.INT8
        if not cfg.has_int8:
            a_is_int = b_is_int = 0
        psig, pexp, psign, pinf, pnan = registered_product(m, a0, b0, a_is_int, b_is_int,
                                                           primitive=self._primitive)

        # S3: the product's leading-zero count and its int32 value.
        psig3 = Signal(22)
        lz3 = Signal(5)
        pexp3 = Signal(signed(7))
        psign3 = Signal()
        pinf3 = Signal()
        pnan3 = Signal()
        pint3 = Signal(32)
        m.d.sync += [
            psig3.eq(psig), lz3.eq(count_leading_zeros(m, psig, name="psig_lz")),
            pexp3.eq(pexp), psign3.eq(psign), pinf3.eq(pinf), pnan3.eq(pnan),
            pint3.eq(Mux(psign, -psig, psig)),
        ]

        # S4: the exact product as binary32 bits (normalising shift and exponent; every
        # product is a normal number or zero, so nothing rounds), or the int32 value.
        pf32 = product_to_f32(m, psign3, psig3, pexp3, pinf3, pnan3, "pf32", lz=lz3)
        p3 = Signal(32)
        m.d.sync += p3.eq(Mux(ctl[read_stage - 1].fmt == MacFormat.INT8, pint3, pf32))

        # S5-S10: the six-stage binary32 adder. The int32 path: sum and order in S5, the
        # selection by op in S6, then registers alongside.
        op3 = ctl[read_stage].op
        m.submodules.fadd = fadd = FP32AddDeep()
        m.d.comb += [fadd.a.eq(addend), fadd.b.eq(p3), fadd.op.eq(op3)]
        sum4 = Signal(32)
        lt4 = Signal()
        eq4 = Signal()
        acc4 = Signal(32)
        p4 = Signal(32)
        m.d.sync += [
            sum4.eq(addend + p3),
            lt4.eq(p3.as_signed() < addend.as_signed()),
            eq4.eq(p3 == addend),
            acc4.eq(addend), p4.eq(p3),
        ]
        idelay = MacUnit._int_select(m, ctl[read_stage + 1].op, acc4, p4, sum4, lt=lt4, eq=eq4)
        for i in range(read_stage + 2, write_stage - 1):
            stage = Signal(32, name=f"ires{i}")
            m.d.sync += stage.eq(idelay)
            idelay = stage
        m.d.comb += final.eq(Mux(ctl[write_stage - 2].fmt == MacFormat.INT8, idelay,
                                 fadd.result))
        return m


class MacArrayECP5(wiring.Component):
    """``config.macs`` ECP5 MAC lanes on one command stream, with a credit-counted result queue.

    Same members and contract as :class:`npu.neural.mac.MacArray` (``docs/mac.md``); see the
    module documentation for what differs inside.

    Parameters
    ----------
    config : NPUConfig
        Needs a float format (``fp16`` or ``mixed``).
    primitive : bool
        Instantiate ``MULT18X18D`` (``True``) or use its behavioural twin (``False``, for the
        Amaranth simulator).
    queue_depth : int, optional
        Result queue entries; ``latency + 1`` rounded up to a power of two by default (16).
    """

    def __init__(self, config, *, primitive=True, queue_depth=None):
        check_array_config(config)
        if not config.has_float:
            raise ValueError(f"the ECP5 MAC array needs a float format; the int8-only build "
                             f"{config.formats!r} uses the generic MAC array")
        self._config = config
        self._primitive = primitive
        self._queue_depth = queue_depth_or_default(queue_depth, self.latency)
        super().__init__(mac_array_signature(config))

    @property
    def config(self):
        return self._config

    @property
    def latency(self):
        """Cycles from a command's handshake to its result being valid (consumer ready)."""
        return ecp5_stages()[1] + 1

    @property
    def queue_depth(self):
        return self._queue_depth

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        _, _, hazard_stages = ecp5_stages()
        cmd = self.cmd.payload

        lanes = [MacLaneECP5(cfg, primitive=self._primitive) for _ in range(cfg.macs)]
        for i, lane in enumerate(lanes):
            m.submodules[f"mac{i}"] = lane

        # Result queue: written as a command with `last` leaves the lanes; its credits.
        out_ctl = lanes[0].out
        credit = Signal(init=1)
        accept = Signal()
        credit_queue(m, self, out_ctl, [lane.result for lane in lanes],
                     write=out_ctl.valid & out_ctl.last, accept=accept, credit=credit)

        # Read-after-write interlock, as in the generic array: a registered per-slot `busy`
        # mask of the slots written by commands in the first `hazard` stages.
        hazard = Signal()
        if hazard_stages:
            window = slot_window(m, accept, cmd.slot, hazard_stages - 1, cfg.acc_slots)
            m.d.comb += hazard.eq(slot_hazard(m, cmd, window, cfg.acc_slots))

        supported = format_supported(m, cfg, cmd.fmt)
        m.d.comb += [
            self.cmd.ready.eq(~hazard & (credit | ~cmd.last)),
            accept.eq(self.cmd.valid & self.cmd.ready),
            self.active.eq(accept),
        ]
        sticky_error(m, self, accept, supported)

        # Operand routing: broadcast coefficient, or the even/odd dual-kernel pairing.
        for i, lane in enumerate(lanes):
            a, b = lane_operands(cmd, i)
            m.d.comb += [
                lane.valid.eq(accept),
                lane.kill.eq(~supported),
                lane.op.eq(cmd.op),
                lane.fmt.eq(cmd.fmt),
                lane.slot.eq(cmd.slot),
                lane.first.eq(cmd.first),
                lane.last.eq(cmd.last),
                lane.bias.eq(cmd.bias),
                lane.a.eq(a),
                lane.b.eq(b),
            ]
        return ResetInserter(self.flush)(m)
