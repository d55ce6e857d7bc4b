"""The pooling result queue: vertical filter results on their way to the lane pipeline.

Each entry is one V beat (``FL`` values and the window position of its lane 0). The head
entry leaves as up to ``K`` output beats of ``L`` lanes, one per lane pipeline step; beats
past the end of the output row are skipped. An output beat enters the lane pipeline as ``MUL``
by the average's divisor ``recip(n)`` (``n`` the valid elements of each lane's window) or by
1.0 (max, min). A group of the vertical filter reserves three entries when it starts, so the
queue never overflows; output back-pressure reaches the vertical filter only through it. An
output beat passes through a register (with its window's valid rows and columns, from which
the divisor follows) on its way to the lane pipeline: one lane pipeline step later.

The entries are a memory with a synchronous read port (block RAM or LUT RAM, not flip-flops):
it is addressed with the head pointer of the next cycle and is transparent for the write port,
so its data is the head entry in every cycle, as a combinational read would give it.
"""

from amaranth.hdl import Array, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from npu_spec.formats import F32_ONE
from npu_spec.planar import recip_bits

from .geometry import QUEUE_DEPTH
from .layouts import (
    MAX_WINDOW,
    EltOp,
    Mode,
    PoolOp,
    config_layout,
    lane_input_layout,
    queue_entry_layout,
    sizes_layout,
    vresult_layout,
)

__all__ = ["ResultQueue"]


class ResultQueue(wiring.Component):
    """The result queue and the average's divisors.

    Parameters
    ----------
    geometry : Geometry
        ``L``, ``K``, ``FL``.

    Members
    -------
    task, sizes : In(config_layout()), In(sizes_layout())
        The running task and its sizes.
    push : In(vresult_layout(FL))
        The vertical filter's group starts, results and invalid beat ends.
    room : Out(1)
        Room for a group's three results.
    busy : Out(1)
        Entries are held or reserved, or a beat is in the output register.
    en : In(1)
        The lane pipeline advances (takes ``beat``).
    beat : Out(lane_input_layout(L))
        The head's output beat (``valid`` when it holds at least one output).
    """

    def __init__(self, geometry):
        self._geometry = geometry
        super().__init__({
            "task":  In(config_layout()),
            "sizes": In(sizes_layout()),
            "push":  In(vresult_layout(geometry.filter_lanes, geometry.buffer_shape)),
            "room":  Out(1),
            "busy":  Out(1),
            "en":    In(1),
            "beat":  Out(lane_input_layout(geometry.lanes, geometry.word)),
        })

    def elaborate(self, platform):
        m = Module()
        g = self._geometry
        L, K = g.lanes, g.pool_beats
        task = self.task
        depth = QUEUE_DEPTH
        ptr_bits = (depth - 1).bit_length()

        m.submodules.entries = entries = Memory(shape=queue_entry_layout(g.filter_lanes,
                                                                         g.buffer_shape),
                                                depth=depth, init=[])
        write = entries.write_port()
        head = entries.read_port(transparent_for=(write,))
        wp = Signal(ptr_bits + 1)
        rp = Signal(ptr_bits + 1)
        rp_next = Signal(ptr_bits + 1)      # the head pointer of the next cycle
        held = Signal(range(depth + 1))     # entries held and reserved
        m.d.comb += self.room.eq(held <= depth - 3)
        m.d.comb += [write.addr.eq(wp[:ptr_bits]), write.en.eq(self.push.valid),
                     write.data.eq(self.push.entry), head.addr.eq(rp_next[:ptr_bits])]
        with m.If(self.push.valid):
            m.d.sync += wp.eq(wp + 1)

        # The head's output beat k; its lane 0's window starts at column gxb + k L sx.
        any_held = Signal()
        m.d.comb += any_held.eq(wp != rp)
        k = Signal(range(max(K, 2)))
        offset = Signal(16)
        gxb = Signal(signed(18))
        m.d.comb += gxb.eq(head.data.gxb + offset)

        def has_window(x):
            return x + task.kw <= task.width + task.px

        more = Signal()     # the head entry has another output beat
        m.d.comb += more.eq((k != K - 1) & has_window(gxb + self.sizes.beat_cols))
        take = Signal()
        m.d.comb += take.eq((task.mode == Mode.POOL) & any_held & self.en)
        pop = Signal()
        m.d.comb += [pop.eq(take & ~more), rp_next.eq(rp + pop)]
        m.d.sync += rp.eq(rp_next)
        with m.If(take):
            with m.If(more):
                m.d.sync += [k.eq(k + 1), offset.eq(offset + self.sizes.beat_cols)]
            with m.Else():
                m.d.sync += [k.eq(0), offset.eq(0)]
        release = Signal(2)
        m.d.comb += release.eq(self.push.empty + pop)
        m.d.sync += held.eq(held + Mux(self.push.start, 3, 0) - release)

        # The output register: the head's output beat enters it on `en` and the lane pipeline
        # takes it on the next `en`. It holds the valid rows and columns of each lane's window;
        # the average's divisor (their product's reciprocal) follows from it.
        staged_valid = Signal()
        staged = Signal(data.StructLayout({
            "mask": L, "a": data.ArrayLayout(g.word, L), "rows": 5,
            "cols": data.ArrayLayout(5, L)}), reset_less=True)
        m.d.comb += self.busy.eq((held != 0) | staged_valid)

        # Valid rows times valid columns of each lane's window.
        oyb = head.data.oyb
        rows_lo = Mux(oyb < 0, 0, oyb)
        rows_hi = Mux(oyb + task.kh > task.height, task.height, oyb + task.kh)
        outputs = Signal(L)
        with m.If(self.en):
            m.d.sync += [staged_valid.eq(outputs[0]), staged.mask.eq(outputs),
                         staged.rows.eq(rows_hi - rows_lo)]
        for i in range(L):
            x0 = Signal(signed(18), name=f"x0_{i}")
            m.d.comb += x0.eq(gxb + task.sx * i)
            m.d.comb += outputs[i].eq(any_held & has_window(x0))
            cols_lo = Mux(x0 < 0, 0, x0)
            cols_hi = Mux(x0 + task.kw > task.width, task.width, x0 + task.kw)
            value = (Array(head.data.value[j * L + i] for j in range(K))[k] if K > 1
                     else head.data.value[i])
            with m.If(self.en):
                m.d.sync += [staged.cols[i].eq(cols_hi - cols_lo), staged.a[i].eq(value)]

        recip = Array(Const(recip_bits(n), 32) for n in range(MAX_WINDOW * MAX_WINDOW + 1))
        beat = self.beat
        for i in range(L):
            m.d.comb += beat.a[i].eq(staged.a[i])
            if not g.integer:   # the integer build has no average (its lanes pass MUL's A)
                m.d.comb += beat.b[i].eq(
                    Mux(task.op == PoolOp.AVG, recip[(staged.rows * staged.cols[i])[:7]],
                        F32_ONE))
        m.d.comb += [beat.valid.eq(staged_valid), beat.op.eq(EltOp.MUL),
                     beat.mask.eq(staged.mask)]
        return m
