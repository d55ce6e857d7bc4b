"""The ECP5 MAC array with float units shared between lanes (``mac_impl="ecp5_shared"``).

:class:`MacArrayECP5Shared` has the contract of :class:`npu.neural.mac.MacArray` (ports,
command and result formats, dual mode, errors, ``flush``, bit-exact results; ``docs/mac.md``)
and the habits of :mod:`npu.neural.mac_ecp5` (registered ``MULT18X18D``, no clock enable, a
credit-counted result queue), with the lane split in two:

* ``macs`` int8 lanes (:class:`IntLaneECP5`): a multiplier, the accumulator slots, an int32
  add / max / min / compare and the result register;
* ``macs / fp_share`` float units (:class:`FloatUnitECP5`): decode, significand product,
  conversion to binary32 and the six-stage binary32 adder, each serving ``fp_share`` lanes.

A float command is issued as ``fp_share`` sub-beats on consecutive cycles; sub-beat ``k`` runs
lane ``g * fp_share + k`` of every group ``g`` through the group's float unit. Every entry (an
int8 command or a float sub-beat) takes the same stages, so slots are written and results
leave in command order.
"""

from amaranth.hdl import Const, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..lib.ecp5_dsp import Mult18x18D
from ..lib.fp32 import count_leading_zeros, product_to_f32
from ..lib.fp32_deep import FP32AddDeep
from .layouts import MacFormat, MacOp, slot_shape
from .mac import (
    check_array_config,
    format_supported,
    lane_operands,
    mac_array_signature,
    slot_hazard,
    slot_window,
    sticky_error,
)
from .mac_ecp5 import credit_queue, queue_depth_or_default, registered_product

__all__ = ["FloatUnitECP5", "IntLaneECP5", "MacArrayECP5Shared", "shared_stages"]

#: Stage in which the accumulator input is registered (the slot is read as the entry leaves
#: S3, by an int8 entry and a float sub-beat alike), the stage the int8 operands enter the
#: multiplier's input registers (S3; the product leaves it into S4), the stage holding the
#: int8 value selected by op, and the result register (the slot is written with the value
#: going into it, as the entry leaves S10).
FLOAT_READ, INT_MUL, INT_SELECT, RESULT = 4, 3, 6, 11


def shared_stages():
    """``(read_stage, write_stage, hazard)`` as :func:`npu.neural.mac_ecp5.ecp5_stages` gives
    them: the read (every entry's, int8 or float, as it enters S4), the write (as an entry
    enters S11), and the interlock window: with no bypass, a reader must enter S4 no earlier
    than the cycle after the write, so it waits while a writer is in one of the first
    ``write - read`` = 7 stages (8 interleaved slots run at one command per cycle)."""
    return FLOAT_READ, RESULT, RESULT - FLOAT_READ


def _control_layout(slots, share):
    return data.StructLayout({
        "valid": 1,
        "kill":  1,
        "op":    MacOp,
        "fmt":   MacFormat,
        "slot":  slot_shape(slots),
        "first": 1,
        "last":  1,
        "float": 1,                         # a float sub-beat (else an int8 or killed entry)
        "sub":   range(max(2, share)),      # which lane of its group a float sub-beat serves
        "final": 1,                         # the command's last entry
    })


class FloatUnitECP5(wiring.Component):
    """The float half of a MAC lane, without slots: product and binary32 accumulate.

    Stages: S0 operand registers, S1 decode (into the multiplier's input registers), S2 the
    ``MULT18X18D`` output register, S3 the product's leading-zero count, S4 the product as
    binary32 and the accumulator input, S5-S10 :class:`~npu.lib.fp32_deep.FP32AddDeep`.

    Members
    -------
    a, b : In(16)
        Operands of the entry entering S0.
    fmt : In(MacFormat)
        Its format (``INT8`` is not sent here).
    op : In(MacOp)
        Its operation.
    addend : In(32)
        Accumulator input of the entry in S3 (slot value or bias; registered into S4).
    result : Out(32)
        New slot value of the entry in S10 (combinational from the adder's last register).
    """

    a:      In(16)
    b:      In(16)
    fmt:    In(MacFormat)
    op:     In(MacOp)
    addend: In(32)
    result: Out(32)

    def __init__(self, config, *, primitive=None):
        self._mixed = config.has_mixed
        self._primitive = primitive
        super().__init__()

    def elaborate(self, platform):
        m = Module()

        # S0: operands; format and op travel beside them (the op is used in S4).
        # The datapath registers have no reset: the array's control says which values count.
        a0, b0 = Signal(16, reset_less=True), Signal(16, reset_less=True)
        fmt0 = Signal(MacFormat, reset_less=True)
        ops = [Signal(MacOp, name=f"op{i}", reset_less=True) for i in range(FLOAT_READ + 1)]
        m.d.sync += [a0.eq(self.a), b0.eq(self.b), fmt0.eq(self.fmt), ops[0].eq(self.op)]
        m.d.sync += [ops[i].eq(ops[i - 1]) for i in range(1, FLOAT_READ + 1)]

        # S1: decode both operands; the significands go into the multiplier's input registers.
        a_is_int = (fmt0 == MacFormat.I8F16) if self._mixed else Const(0)
        b_is_int = (fmt0 == MacFormat.F16I8) if self._mixed else Const(0)
        # S2: the product leaves the multiplier's output register; its class beside it.
        psig, pexp, psign, pinf, pnan = registered_product(m, a0, b0, a_is_int, b_is_int,
                                                           primitive=self._primitive,
                                                           reset_less=True)

        # S3: the product's leading-zero count.
        psig3, lz3 = Signal(22, reset_less=True), Signal(5, reset_less=True)
        pexp3 = Signal(signed(7), reset_less=True)
        psign3, pinf3, pnan3 = (Signal(reset_less=True) for _ in range(3))
        m.d.sync += [
            psig3.eq(psig), lz3.eq(count_leading_zeros(m, psig, name="psig_lz")),
            pexp3.eq(pexp), psign3.eq(psign), pinf3.eq(pinf), pnan3.eq(pnan),
        ]

        # S4: the exact product as binary32 bits (every product is normal or zero, nothing
        # rounds) and the accumulator input.
        pf32 = product_to_f32(m, psign3, psig3, pexp3, pinf3, pnan3, "pf32", lz=lz3)
        p4, addend4 = Signal(32, reset_less=True), Signal(32, reset_less=True)
        m.d.sync += [p4.eq(pf32), addend4.eq(self.addend)]

        # S5-S10: the binary32 adder.
        m.submodules.fadd = fadd = FP32AddDeep(reset_less=True)
        m.d.comb += [fadd.a.eq(addend4), fadd.b.eq(p4), fadd.op.eq(ops[FLOAT_READ]),
                     self.result.eq(fadd.result)]
        return m


class IntLaneECP5(wiring.Component):
    """One int8 lane with the accumulator slots of its position, and its result register.

    The slots have one read port, read as an entry leaves S3 whatever its format (an int8
    entry for itself, a float sub-beat for the float unit serving the lane), so that int8 and
    float entries never compete for it. The int8 path: S0-S2 the operands carried on (8 bits),
    S3-S4 the ``MULT18X18D``, S4 the product and the accumulator input (slot or bias), S5 one
    33-bit carry chain (``acc + p`` for ``MAC``, ``acc - p`` for the others, whose sign orders
    the two) and the equality, S6 the value selected by op, S7-S10 that value carried on, S11
    the result register. The result register takes the float unit's result instead when the
    entry in S10 is a float sub-beat for this lane; the slot is written with the same value in
    the same cycle. The datapath registers have no reset (``flush`` and the domain reset reach
    only the control that says which of them count).

    Members
    -------
    a, b : In(8)
        Int8 operands of the entry entering S0.
    rd_slot, rd_first, bias : In
        Slot, ``first`` and bias of the entry in S3 (the read).
    rd_op : In(MacOp)
        Operation of the entry in S3.
    load, use_float, kill : In(1)
        The entry in S10 writes this lane; it is a float sub-beat (take ``f_result``); it is
        killed (result zero, no slot write).
    wr_slot, wr_en : In
        The entry in S10: its slot, and whether it writes this lane's slot.
    f_data : Out(32)
        The accumulator input of the entry in S3 (its slot as read now, or the bias if
        ``rd_first``), combinational: what ``f_acc`` takes next.
    f_acc : Out(32)
        The accumulator input register: ``f_data`` of the entry that was in S3 a cycle ago.
    f_result : In(32)
        The float unit's result for the entry in S10.
    result : Out(32)
        The result register.
    """

    def __init__(self, config, *, primitive=None):
        self._config = config
        self._primitive = primitive
        slot = slot_shape(config.acc_slots)
        super().__init__({
            "a": In(8), "b": In(8),
            "rd_slot": In(slot), "rd_first": In(1), "bias": In(32), "rd_op": In(MacOp),
            "load": In(1), "use_float": In(1), "kill": In(1),
            "wr_slot": In(slot), "wr_en": In(1),
            "f_data": Out(32), "f_acc": Out(32), "f_result": In(32),
            "result": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config

        # Accumulator slots: one read port (the entry leaving S3), written with the value
        # going into the result register, so that a read in the next cycle sees it (no bypass
        # multiplexer).
        m.submodules.acc = acc = Memory(shape=32, depth=cfg.acc_slots, init=[])
        rd = acc.read_port(domain="comb")
        m.d.comb += [rd.addr.eq(self.rd_slot),
                     self.f_data.eq(Mux(self.rd_first, self.bias, rd.data))]
        # S4: the accumulator input (slot or bias), for the int8 path and the float gather.
        acc4 = Signal(32, reset_less=True)
        m.d.sync += acc4.eq(self.f_data)
        m.d.comb += self.f_acc.eq(acc4)
        int_res = Const(0, 32)
        if cfg.has_int8:
            int_res = self._int_path(m, acc4)

        # S11: the result register (a killed entry clears it: a synchronous reset, no logic),
        # and the slot write (never for a killed entry).
        value = Signal(32)
        m.d.comb += value.eq(Mux(self.use_float, self.f_result, int_res))
        result = Signal(32, reset_less=True)
        with m.If(self.kill):
            m.d.sync += result.eq(0)
        with m.Elif(self.load):
            m.d.sync += result.eq(value)
        m.d.comb += self.result.eq(result)
        wr = acc.write_port()
        m.d.comb += [wr.addr.eq(self.wr_slot), wr.data.eq(value), wr.en.eq(self.wr_en)]
        return m

    def _int_path(self, m, acc4):
        """The int8 product and int32 accumulate from the accumulator input register ``acc4``;
        the value of the entry in S10."""
        def reg(shape, name, init=0):
            # ECP5 flip-flops start at their set / reset value, so a register set
            # synchronously by a condition (no logic) starts at that value too.
            return Signal(shape, name=name, init=init, reset_less=True)

        # S0-S2: the operands carried on; S3-S4 the multiplier (the low 16 bits of the product
        # of the sign-extended operands are the int16 product).
        a, b = self.a, self.b
        for i in range(INT_MUL):
            a_i, b_i = reg(8, f"a{i}"), reg(8, f"b{i}")
            m.d.sync += [a_i.eq(a), b_i.eq(b)]
            a, b = a_i, b_i
        m.submodules.mult = mult = Mult18x18D(primitive=self._primitive)
        m.d.comb += [mult.a.eq(a.as_signed()), mult.b.eq(b.as_signed())]
        p4 = mult.p[:16].as_signed()

        # S4: the op beside the accumulator input.
        op4 = reg(MacOp, "op4")
        m.d.sync += op4.eq(self.rd_op)

        # S5: one carry chain, acc + p for MAC, else acc - p (33 bits: its sign says p > acc,
        # and the low 32 bits are zero when p == acc). The candidates of MAX and MIN are kept;
        # for CMP they are replaced by +1 and -1 (a synchronous set or reset of those
        # registers, no logic), so that the selection below treats CMP as a MAX between them.
        mac4, cmp4 = op4 == MacOp.MAC, op4 == MacOp.CMP
        chain5 = reg(33, "chain5")
        acc5, p5 = reg(32, "acc5", init=-1), reg(signed(16), "p5", init=1)
        mac5, max5, cmp5 = (reg(1, f"{name}5") for name in ("mac", "max", "cmp"))
        m.d.sync += [
            chain5.eq(acc4.as_signed() + Mux(mac4, p4, ~p4) + ~mac4),
            acc5.eq(Mux(cmp4, -1, acc4)), p5.eq(Mux(cmp4, 1, p4)),
            mac5.eq(mac4), max5.eq(op4 == MacOp.MAX), cmp5.eq(cmp4),
        ]

        # S6: the value by op: the sum, or p or acc by their order (when they are equal
        # either will do; CMP: +1 or -1, or zero when equal, a synchronous reset); S7-S10
        # carried on to the result register.
        gt5, eq5 = chain5[32], chain5[:32] == 0
        take_p = Signal()
        m.d.comb += take_p.eq((max5 | cmp5) == gt5)
        value = reg(32, "value6")
        m.d.sync += value.eq(Mux(cmp5 & eq5, 0,
                                 Mux(mac5, chain5[:32], Mux(take_p, p5, acc5))))
        for i in range(INT_SELECT + 1, RESULT):
            value_i = reg(32, f"value{i}")
            m.d.sync += value_i.eq(value)
            value = value_i
        return value


def _gather(m, lanes, sub2, sub3, name):
    """The accumulator input of float sub-beat ``sub3`` (in S3) from its lane, ``lanes[sub3]``.

    Every lane reads the slot of the entry in S3 in every cycle, and all sub-beats of a float
    command read the same slot, so a lane's accumulator input register (``f_acc``) holds its
    value for the command from the cycle after the command's first read on. Sub-beat 0 takes
    lane 0's read as it happens (``f_data``), sub-beat 1 lane 1's register (read with sub-beat
    0), and sub-beat ``k >= 2`` lane ``k``'s register as read with sub-beat ``k - 2``, through
    two levels of multiplexers with a register between: level 1 (groups of 4 lanes, selected
    by ``sub2``, the sub-beat in S2) and level 2 (selected by ``sub3``). So no multiplexer
    takes a slot read, and no path runs from a lane's memory to the float unit.

    Reading lane ``k >= 2`` two cycles early sees the same value. The interlock lets a
    command's first read (sub-beat 0's) come no earlier than the cycle after the last write of
    its slot by an earlier command. An int8 writer writes every lane at once, before that
    read, and lane ``k`` is read ``k - 2 >= 0`` cycles after it. A float writer wrote lane
    ``k`` with its sub-beat ``k``, ``share - 1 - k`` cycles before its last write, so lane
    ``k``'s early read comes at least ``(share - 1 - k) + (k - 2) + 1 = share - 2`` cycles
    after it: at least one once ``share >= 3``, the only case with a sub-beat 2. The
    sub-beats of one command write other lanes than they read.
    """
    share = len(lanes)
    groups = []
    for base in range(0, share, 4):
        members = [k for k in range(base, min(base + 4, share)) if k >= 2]
        reg = Signal(32, name=f"{name}_l1_{base // 4}", reset_less=True)
        if members:
            with m.Switch(sub2[:2]):
                for k in members[:-1]:
                    with m.Case(k % 4):
                        m.d.sync += reg.eq(lanes[k].f_acc)
                with m.Default():
                    m.d.sync += reg.eq(lanes[members[-1]].f_acc)
        groups.append(reg)
    head = lanes[0].f_data
    if share > 1:
        head = Mux(sub3[0], lanes[1].f_acc, head)
    if share > 2:
        head = Mux(sub3[1], groups[0], head)
    addend = Signal(32, name=f"{name}_addend")
    if len(groups) > 1:
        with m.Switch(sub3[2:]):
            for i, reg in enumerate(groups[1:], 1):
                with m.Case(i):
                    m.d.comb += addend.eq(reg)
            with m.Default():
                m.d.comb += addend.eq(head)
    else:
        m.d.comb += addend.eq(head)
    return addend


class MacArrayECP5Shared(wiring.Component):
    """``config.macs`` int8 lanes and ``macs / fp_share`` float units on one command stream.

    Same members and contract as :class:`npu.neural.mac.MacArray` (``docs/mac.md``); a float
    command takes ``fp_share`` cycles.

    Parameters
    ----------
    config : NPUConfig
        ``fp_share`` lanes share a float unit.
    primitive : bool or None
        Instantiate ``MULT18X18D`` (``True``), use its behavioural twin (``False``), or decide
        by the platform the array is elaborated for (``None``: the cell on an ECP5 platform).
    queue_depth : int, optional
        Result queue entries; 16 by default.
    """

    def __init__(self, config, *, primitive=None, queue_depth=None):
        check_array_config(config)
        self._config = config
        self._primitive = primitive
        self._queue_depth = queue_depth_or_default(queue_depth, self.latency)
        super().__init__(mac_array_signature(config))

    @property
    def config(self):
        return self._config

    @property
    def latency(self):
        """Cycles from a command's handshake (a float command's: its last sub-beat's) to its
        result being valid (consumer ready)."""
        return RESULT + 2

    @property
    def fp_rate(self):
        """Cycles a float command takes (``fp_share``; 1 without float formats)."""
        return self._config.fp_share if self._config.has_float else 1

    @property
    def queue_depth(self):
        return self._queue_depth

    def elaborate(self, platform):
        m = Module()
        # The control (issue, the control pipeline, the queue, credits, interlock and error)
        # is cleared by `flush`; the lanes and float units are not: their registers carry
        # values that count only where the control says so.
        c = Module()
        cfg = self._config
        share = self.fp_rate
        cmd = self.cmd.payload
        layout = _control_layout(cfg.acc_slots, share)

        # Issue: an int8 (or unsupported, killed) command is one entry; a float command is
        # `share` entries on consecutive cycles, taken with its last one. The interlock and
        # the credit are checked before the first.
        supported = format_supported(c, cfg, cmd.fmt)
        multi = Signal()
        if share > 1:
            c.d.comb += multi.eq(supported & (cmd.fmt != MacFormat.INT8))
        sub = Signal(range(max(2, share)))
        final = Signal()
        c.d.comb += final.eq(~multi | (sub == share - 1))
        hazard = Signal()
        credit = Signal(init=1)
        go = Signal()
        issue = Signal()
        accept = Signal()
        c.d.comb += [
            go.eq((sub != 0) | (~hazard & (credit | ~cmd.last))),
            issue.eq(self.cmd.valid & go),
            self.cmd.ready.eq(go & final),
            accept.eq(self.cmd.valid & self.cmd.ready),
            self.active.eq(accept),
        ]
        with c.If(issue & multi):
            c.d.sync += sub.eq(Mux(final, 0, sub + 1))

        sticky_error(c, self, accept, supported)

        # Control travels down one shared pipeline; every register advances in every cycle.
        ctl = [Signal(layout, name=f"ctl{i}") for i in range(RESULT + 1)]
        c.d.sync += [
            ctl[0].valid.eq(issue), ctl[0].kill.eq(~supported), ctl[0].op.eq(cmd.op),
            ctl[0].fmt.eq(cmd.fmt), ctl[0].slot.eq(cmd.slot), ctl[0].first.eq(cmd.first),
            ctl[0].last.eq(cmd.last), ctl[0].float.eq(supported & (cmd.fmt != MacFormat.INT8)),
            ctl[0].sub.eq(sub), ctl[0].final.eq(final),
        ]
        c.d.sync += [ctl[i].eq(ctl[i - 1]) for i in range(1, RESULT + 1)]
        bias = [Signal(32, name=f"bias{i}", reset_less=True) for i in range(FLOAT_READ)]
        c.d.sync += [bias[0].eq(cmd.bias)]
        c.d.sync += [bias[i].eq(bias[i - 1]) for i in range(1, FLOAT_READ)]

        lanes = self._lanes(m, ctl, bias, sub, share)
        out_ctl = ctl[RESULT]
        credit_queue(c, self, out_ctl, [lane.result for lane in lanes],
                     write=out_ctl.valid & out_ctl.last & out_ctl.final, accept=accept,
                     credit=credit)
        # The interlock: a reader waits before its first entry while a writer of its slot is
        # in one of the first `hazard` stages.
        _, _, hazard_stages = shared_stages()
        window = slot_window(c, issue, cmd.slot, hazard_stages - 1, cfg.acc_slots)
        c.d.comb += hazard.eq(slot_hazard(c, cmd, window, cfg.acc_slots))
        m.submodules.control = ResetInserter(self.flush)(c)
        return m

    def _lanes(self, m, ctl, bias, sub, share):
        """The lanes, the float units and their wiring."""
        cfg = self._config
        cmd = self.cmd.payload
        lanes = [IntLaneECP5(cfg, primitive=self._primitive) for _ in range(cfg.macs)]
        for i, lane in enumerate(lanes):
            m.submodules[f"lane{i}"] = lane

        # Which lanes the entry in S10 writes: all for an int8 entry, one of each group for a
        # float sub-beat (one comparison per position in the group).
        c10, c3 = ctl[RESULT - 1], ctl[FLOAT_READ - 1]
        load = [Signal(name=f"load{k}") for k in range(share)]
        write = [Signal(name=f"write{k}") for k in range(share)]
        for k in range(share):
            m.d.comb += [
                load[k].eq(c10.valid & (~c10.float | (c10.sub == k))),
                write[k].eq(load[k] & ~c10.kill),
            ]
        for i, lane in enumerate(lanes):
            lo, co = lane_operands(cmd, i)
            m.d.comb += [
                lane.a.eq(lo[:8]), lane.b.eq(co[:8]),
                lane.rd_slot.eq(c3.slot), lane.rd_first.eq(c3.first), lane.bias.eq(bias[-1]),
                lane.rd_op.eq(c3.op), lane.load.eq(load[i % share]),
                lane.use_float.eq(c10.float), lane.kill.eq(c10.kill),
                lane.wr_slot.eq(c10.slot), lane.wr_en.eq(write[i % share]),
            ]
        if not cfg.has_float:
            return lanes

        # Float unit g serves lanes g * share + k; sub-beat k sends it lane k's operands.
        for g in range(cfg.macs // share):
            unit = FloatUnitECP5(cfg, primitive=self._primitive)
            m.submodules[f"float{g}"] = unit
            a_sel, b_sel = Signal(16), Signal(16)
            with m.Switch(sub):
                for k in range(share):
                    a_k, b_k = lane_operands(cmd, g * share + k)
                    with m.Case(k):
                        m.d.comb += [a_sel.eq(a_k), b_sel.eq(b_k)]
            addend = _gather(m, lanes[g * share:(g + 1) * share], ctl[FLOAT_READ - 2].sub,
                             c3.sub, f"gather{g}")
            m.d.comb += [
                unit.a.eq(a_sel), unit.b.eq(b_sel), unit.fmt.eq(cmd.fmt), unit.op.eq(cmd.op),
                unit.addend.eq(addend),
            ]
            for k in range(share):
                m.d.comb += lanes[g * share + k].f_result.eq(unit.result)
        return lanes
