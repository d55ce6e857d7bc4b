"""The micro build's neural unit: one int8 convolution task, sequentially (``docs/micro.md``).

The unit reads the layer registers of neural engine core 0 and its ``NE0_IN`` / ``NE0_OUT``
datasets through the register-file port, then for each output-channel group (up to 8
channels, ``acc_slots`` of the ``icebreaker`` preset)::

    read the group's kernel-table entry; check its header and body lengths
    count pass: every body byte, channel oc += (byte != 0); compare with the header's nnz,
                check each shift word (reserved 0, shift <= 63)
    for oy, ox:                                   # every output position
        acc[oc] = bias[oc]                        # header word 3 oc
        for ic, ky, kx, oc in the body's scan order (oc fastest): one byte a cycle
            acc[oc] += in[ic, oy*s + ky*d - pad, ox*s + kx*d - pad] * w   # 0 outside H, W
        for oc: y = sat8(((acc * scale) >> shift) + round + zp), ReLU / clamp; write it

Every input element a position needs is read from the buffer once per output position and
group (``icpg * kh * kw`` reads, each feeding the group's channels); each kernel byte is read
once per position, the body streamed in order. One multiplier serves every channel; the
post-processor multiplies 32 x 32 bits one bit a cycle and shifts right 32 bits in one step,
then one bit a cycle.

Errors (``error`` with ``done``): the golden model's :class:`npu_spec.neural.NeuralError` in
its order, and :data:`UNSUPPORTED` for a layer with ``groups != 1``. A group whose kernel the
golden extractor rejects ends the task with ``EXTRACT`` after the groups before it wrote their
outputs, as :mod:`npu_model.system` does.
"""

from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from npu_spec import dataproc, neural
from npu_spec.config import preset
from npu_spec.kernel import CHANNEL_WORDS, GROUP_TABLE_WORDS, MAX_KERNEL, MAX_SHIFT, SHIFT_WORD
from npu_spec.mac import MacFormat
from npu_spec.micro import UNSUPPORTED
from npu_spec.neural import NeuralError
from npu_spec.postproc import Act

from ..lib.csr import register_layout
from . import pe as pool
from .unit import unit_members

__all__ = ["UNSUPPORTED", "MicroNeural"]

#: The build whose neural engine the unit stands for: its limits are the layer checks'.
CONFIG = preset("icebreaker")
#: Output channels accumulated together (``acc_slots``).
SLOTS = CONFIG.acc_slots
#: The widest halo row (``ne_row_values``) and the most input-channels x kernel-rows of a group
#: (``ne_buffer_rows``).
_, ROW_VALUES, BUFFER_ROWS = neural.engine_geometry(CONFIG)
#: Most output channels (``ne_out_channels``) and output rows or columns (``ne_out_size``).
OUT_CHANNELS = neural.out_channel_limit(CONFIG)
OUT_SIZE = neural.out_size_limit(CONFIG)
#: Work-unit shapes (``log2w``) the build's core offers, a run of consecutive values.
LOG2W = neural.work_unit_shapes(CONFIG)

if CONFIG.formats != ("int8",) or CONFIG.kernel_extract != "dense_int8" or SLOTS != 8:
    raise AssertionError("the micro neural unit is built for int8, dense int8 kernels and 8 "
                         "accumulator slots")
if LOG2W != tuple(range(LOG2W[0], LOG2W[-1] + 1)):
    raise AssertionError(f"work-unit shapes {LOG2W} are not consecutive")

_NE = neural.NEURAL_ENGINE
_DP = dataproc.DATA_PROCESSOR
_IN = dataproc.ne_port_base(0, "IN")
_OUT = dataproc.ne_port_base(0, "OUT")

#: The register words the unit reads at its start, in order: (word address, register).
_READS = (
    (_NE.address("FORMAT"), _NE["FORMAT"]),
    (_NE.address("GROUPS"), _NE["GROUPS"]),
    (_NE.address("OCPG"), _NE["OCPG"]),
    (_NE.address("IN_SIZE"), _NE["IN_SIZE"]),
    (_NE.address("OUT_SIZE"), _NE["OUT_SIZE"]),
    (_NE.address("KERNEL"), _NE["KERNEL"]),
    (_NE.address("KTABLE"), _NE["KTABLE"]),
    (_NE.address("POST_CTRL"), _NE["POST_CTRL"]),
    (_NE.address("POST_LO"), _NE["POST_LO"]),
    (_NE.address("POST_HI"), _NE["POST_HI"]),
    (_IN + 0, _DP["NE0_IN_BASE"]),
    (_IN + 1, _DP["NE0_IN_SHAPE0"]),
    (_OUT + 0, _DP["NE0_OUT_BASE"]),
    (_OUT + 2, _DP["NE0_OUT_SHAPE1"]),
)

#: The strides the run reads again from the register file when it steps an address (never
#: kept in flip-flops): word address of each, for a convolution and for the pooling mode.
_STRIDES = {
    "in_cs": (_IN + 3, dataproc.pe_port_base("A") + 3),
    "in_rs": (_IN + 4, dataproc.pe_port_base("A") + 4),
    "out_cs": (_OUT + 3, dataproc.pe_port_base("OUT") + 3),
    "out_rs": (_OUT + 4, dataproc.pe_port_base("OUT") + 4),
}

#: The layer as the unit keeps it: the fields the loops use (trimmed to the widths they need),
#: and flags of those only the checks use (decided as each register is read).
Layer = data.StructLayout({
    "bad_fmt": 1, "log2w": 4, "bad_kernel": 1, "groups_zero": 1, "grouped": 1,
    "icpg": 12, "ocpg": 12, "in_zero": 1,
    "out_h": 12, "out_w": 12, "kh": 5, "kw": 5, "stride": 4, "dilation": 3, "pad": 4,
    "stride_x": 4, "pad_x": 4,
    "bad_post": 1, "relu": 1, "clamp": 1,
    "in_base": 14, "in_w": 12, "in_h": 12,
    "out_base": 14, "ring_on": 1,
})

if CHANNEL_WORDS != 3:
    raise AssertionError("the header walk assumes 3 words a channel")
if GROUP_TABLE_WORDS != 4:
    raise AssertionError("the table walk assumes 4-word group-table entries")

#: Rows of the weight cache: the most input elements (``icpg * kh * kw``) a group's kernel may
#: have; a layer with more is :data:`UNSUPPORTED`.
CACHE_DEPTH = 512

#: Addresses are element addresses of the 16K-element buffer: all arithmetic modulo 2**14.
ABITS = 14


class MicroNeural(wiring.Component):
    """Neural unit of the micro build: one int8 convolution task at a time.

    Members
    -------
    start : In(1)
        Pulse: the task's registers are written; run it.
    done : Out(1)
        Pulse: the task ended.
    error : Out(4)
        Valid with ``done``: 0, a :class:`npu_spec.neural.NeuralError` code or
        :data:`UNSUPPORTED`.
    reg_addr, reg_data : Out(16), In(32)
        Register-file read port (``reg_data`` valid the cycle after ``reg_addr``).
    buf_addr, buf_wdata, buf_we, buf_rdata : Out(14), Out(16), Out(1), In(16)
        Buffer port (``buf_rdata`` valid the cycle after ``buf_addr``).
    kmem_addr, kmem_data : Out(10), In(32)
        Kernel-memory read port (``kmem_data`` valid the cycle after ``kmem_addr``).
    """

    def __init__(self, *, pooling=False):
        self._pooling = bool(pooling)
        members = unit_members(kmem_read=True)
        if pooling:
            members["pool_start"] = In(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        lay = Signal(Layer)
        code = Signal(4)
        load = self._load(m, lay)
        prod = self._products(m, lay)
        self._checks(m, lay, prod, code)
        if self._pooling:
            load = self._pool_load(m, lay, load)
        self._run(m, lay, prod, code, load)
        return m

    def _pool_load(self, m, lay, load):
        """The pooling mode's register reads (``docs/micro.md``, "Pooling in the neural
        unit"): the planar unit's start reads (:func:`npu.micro.pe.latch`) into the layer's
        fields, then the bases of ``PE_A`` and ``PE_OUT`` (their strides are read again when a
        step adds them, :meth:`_reread`). Returns the load with
        the mode flag, the pooling task's fields and its latch statements."""
        idx, latch = load
        self._pmode = pmode = Signal()
        pfl = Signal(pool.Flags)
        f = SimpleNamespace(w=lay.in_w, h=lay.in_h, c=lay.ocpg, kh=lay.kh, kw=lay.kw,
                            sy=lay.stride, sx=lay.stride_x, py=lay.pad, px=lay.pad_x,
                            o_w=lay.out_w, o_h=lay.out_h, fl=pfl)
        self._pool_fields = f
        a, o = dataproc.pe_port_base("A"), dataproc.pe_port_base("OUT")
        extra = [(a + 0, "PE_A_BASE", lay.in_base, "addr"),
                 (o + 0, "PE_OUT_BASE", lay.out_base, "addr")]
        reads = pool.start_reads() + [addr for addr, *_ in extra]
        platch = pool.latch(self.reg_data, f)
        # one input channel a "group", read with dilation 1; no output ring
        platch[4] += [lay.icpg.eq(1), lay.dilation.eq(1), lay.ring_on.eq(0)]
        for k, (_, reg, target, name) in enumerate(extra, start=len(platch) + 1):
            view = data.View(register_layout(_DP[reg]), self.reg_data)
            platch[k] = [target.eq(getattr(view, name))]
        # a neural layer: one stride and one pad for both axes
        kernel = data.View(register_layout(_NE["KERNEL"]), self.reg_data)
        latch[6] = latch[6] + [lay.stride_x.eq(kernel.stride), lay.pad_x.eq(kernel.pad)]
        self._n_reads = Mux(pmode, len(reads), len(_READS))
        # while idle (idx 0) the start decides which read 0 to address
        sel = Mux(idx == 0, self.pool_start, pmode)
        pick = Mux(idx < len(reads), idx, 0)
        m.d.comb += self.reg_addr.eq(Mux(
            sel, Array(Const(a, 16) for a in reads)[pick],
            Array(Const(a, 16) for a, _ in _READS)[Mux(idx < len(_READS), idx, 0)]))
        return idx, latch, platch

    # -- register reads -----------------------------------------------------------------------

    def _load(self, m, lay):
        """Register reads, one a cycle from ``start`` on (state ``LOAD``): latch the fields."""
        idx = Signal(range(len(_READS) + 1))
        m.d.comb += self.reg_addr.eq(Array(Const(a, 16) for a, _ in _READS)[
            Mux(idx < len(_READS), idx, 0)])
        views = {name: data.View(register_layout(reg), self.reg_data) for (_, reg), name in
                 zip(_READS, ("format", "groups", "ocpg", "in_size", "out_size", "kernel",
                              "ktable", "post", "lo", "hi", "ib", "is0", "ob", "os1"))}
        v = views
        latch = {
            1: [lay.bad_fmt.eq(v["format"].fmt != MacFormat.INT8),
                lay.log2w.eq(v["format"].log2w),
                lay.bad_kernel.eq(v["format"].sparse | (v["format"].palette != 0))],
            2: [lay.groups_zero.eq(v["groups"].groups == 0),
                lay.grouped.eq(v["groups"].groups > 1), lay.icpg.eq(v["groups"].icpg)],
            3: [lay.ocpg.eq(v["ocpg"].ocpg)],
            4: [lay.in_zero.eq((v["in_size"].in_h == 0) | (v["in_size"].in_w == 0))],
            5: [lay.out_h.eq(v["out_size"].out_h), lay.out_w.eq(v["out_size"].out_w)],
            6: [lay.kh.eq(v["kernel"].kh), lay.kw.eq(v["kernel"].kw),
                lay.stride.eq(v["kernel"].stride), lay.dilation.eq(v["kernel"].dilation),
                lay.pad.eq(v["kernel"].pad)],
            7: [],
            8: [lay.bad_post.eq(v["post"].out_fp16 | (v["post"].act > Act.CLAMP)),
                lay.relu.eq(v["post"].act == Act.RELU), lay.clamp.eq(v["post"].act == Act.CLAMP)],
            9: [],
            10: [],
            11: [lay.in_base.eq(v["ib"].addr)],
            12: [lay.in_w.eq(v["is0"].width), lay.in_h.eq(v["is0"].height)],
            13: [lay.out_base.eq(v["ob"].addr)],
            14: [lay.ring_on.eq(v["os1"].slots != 0)],
        }
        return idx, latch

    # -- small products by repeated addition (no multiplier) ----------------------------------

    def _products(self, m, lay):
        """Signals of the products the checks and address steps need; state ``PRODUCTS``
        adds them up, one addition each a cycle, while ``count`` runs from 0."""
        p = {
            "dr": Signal(ABITS), "sr": Signal(ABITS), "pr": Signal(ABITS),   # d, s, pad x rstride
            "halo": Signal(8), "rows": Signal(13), "ring": Signal(11),
            # (every bound of the terms below is at most 31: the count stops by 31)
            "count": Signal(5), "busy": Signal(),
            # busy a cycle late: PRODUCTS ends on it (the comparators are off the paths into
            # the state and the enables)
            "busy_r": Signal(),
        }
        j = p["count"]
        rs = self.reg_data[:ABITS]           # the input's row stride, read again (PRODUCTS)
        # two bounds registered (their fields are latched early in LOAD and held): the
        # subtractions are off the comparisons' paths
        w1, kw1 = Signal(3), Signal(signed(6))
        m.d.sync += [w1.eq(Mux(lay.log2w > 3, 7, (Const(1, 8) << lay.log2w[:2]) - 1)),
                     kw1.eq(lay.kw - 1)]
        terms = [
            (j < lay.dilation, p["dr"], rs),
            (j < lay.stride, p["sr"], rs),
            (j < lay.pad, p["pr"], rs),
            (j < w1, p["halo"], lay.stride),
            (j < kw1, p["halo"], lay.dilation),
            # saturating: only "above the limit" matters
            ((j < lay.kh) & (p["rows"] <= BUFFER_ROWS), p["rows"], lay.icpg),
        ]
        p["terms"] = terms
        p["kw1"] = kw1
        # the output ring's planes (slots x max(1, planes), saturating), in state OUT_RING with
        # NE0_OUT_SHAPE1 read again, slots counted in ``k`` (the walker's channel counter)
        os1 = data.View(register_layout(_DP["NE0_OUT_SHAPE1"]), self.reg_data)
        p["ring_term"] = lambda k: ((k < os1.slots) & (p["ring"] <= OUT_CHANNELS),
                                    Mux(os1.planes == 0, 1, os1.planes))
        m.d.comb += p["busy"].eq(Cat(t[0] for t in terms).any())
        return p

    def _step_products(self, m, p):
        halo_add = 0
        for cond, target, add in p["terms"]:
            if target is p["halo"]:
                halo_add = halo_add + Mux(cond, add, 0)
            else:
                with m.If(cond):
                    m.d.sync += target.eq(target + add)
        m.d.sync += p["halo"].eq(Mux(p["halo"] > ROW_VALUES, p["halo"], p["halo"] + halo_add))
        m.d.sync += p["count"].eq(p["count"] + 1)

    # -- the layer checks ---------------------------------------------------------------------

    def _checks(self, m, lay, p, code):
        """``code``: the layer's error, combinational from the fields and the products."""
        zero = Cat(lay.groups_zero, lay.icpg == 0, lay.ocpg == 0, lay.out_h == 0,
                   lay.out_w == 0, lay.in_zero, lay.kh == 0, lay.kw == 0, lay.stride == 0,
                   lay.dilation == 0).any()
        checks = [
            (lay.bad_fmt, NeuralError.FORMAT),
            (zero | (~lay.grouped & (lay.ocpg > OUT_CHANNELS)) | (lay.out_h > OUT_SIZE)
             | (lay.out_w > OUT_SIZE),
             NeuralError.SHAPE),
            ((lay.kh > MAX_KERNEL) | (lay.kw > MAX_KERNEL) | (lay.log2w < LOG2W[0])
             | (lay.log2w > LOG2W[-1]), NeuralError.KERNEL),
            (p["halo"] + 1 > ROW_VALUES, NeuralError.HALO),
            (lay.grouped, UNSUPPORTED),
            (p["rows"] > BUFFER_ROWS, NeuralError.BUFFER),
            (lay.bad_kernel, NeuralError.EXTRACT),
            (lay.bad_post, NeuralError.POSTPROC),
        ]
        with m.If(checks[0][0]):
            m.d.comb += code.eq(checks[0][1])
        for cond, value in checks[1:]:
            with m.Elif(cond):
                m.d.comb += code.eq(value)

    # -- the run ------------------------------------------------------------------------------

    def _state(self):
        """The unit's registers, as a namespace."""
        ocg = Signal(4)                      # channels of the running group
        gbase = Signal(12)                   # its first output channel
        err = Signal(4)
        # the group's table entry
        hdr = Signal(10)
        hdr_bad = Signal()                   # the header is not 3 ocg words
        nnz_bad = Signal()                   # a channel's shift word fails its checks
        body = Signal(10)
        body_words = Signal(16)
        tcount = Signal(3)
        # accumulators, one per channel of the group
        # output position and its input origin
        # (13 bits with pooling: a pooled plane's OH, OW reach 4,125)
        oy = Signal(13 if self._pooling else 12)
        ox = Signal(13 if self._pooling else 12)
        iy0 = Signal(signed(ABITS + 1))
        ix0 = Signal(signed(ABITS + 1))
        ya0 = Signal(ABITS)
        orow = Signal(ABITS)
        # walker over the body's scan order
        ic = Signal(12)
        ky = Signal(5)
        kx = Signal(5)
        oc = Signal(3)
        iy = Signal(signed(ABITS + 1))
        ix = Signal(signed(ABITS + 1))
        ya = Signal(ABITS)
        cb = Signal(ABITS)                   # input channel address
        b = Signal(16)
        counting = Signal()
        # the walker's issued access, one cycle on: the multiply-add
        st_valid = Signal()
        st_lane = Signal(3)
        st_byte = Signal(2)
        st_inside = Signal()
        # weight-cache row of the walker's element, and of the issued byte
        pos = Signal(range(CACHE_DEPTH + 1))
        st_pos = Signal(range(CACHE_DEPTH))
        elems = Signal(range(CACHE_DEPTH + 1))  # the group's input elements
        st_mac = Signal()                    # the accumulators add, a cycle on
        acc_clr = Signal()                   # the accumulators clear (combinational)
        bacc = Signal(signed(32))            # accumulator plus bias, for the rescale
        # output channel address (ring planes of a flow-controlled dataset)
        gaddr = Signal(ABITS)
        gplane = Signal(11)
        caddr = Signal(ABITS)
        cplane = Signal(11)
        # post-processor
        o = Signal(3)
        hi = Signal(signed(35))
        lo = Signal(32)
        step = Signal(6)
        shift = Signal(6)
        rbit = Signal()
        y = Signal(8)                        # the int8 result

        return SimpleNamespace(
            ocg=ocg, gbase=gbase, err=err, hdr=hdr, hdr_bad=hdr_bad, nnz_bad=nnz_bad, body=body,
            body_words=body_words, tcount=tcount, oy=oy, ox=ox, iy0=iy0, ix0=ix0,
            ya0=ya0, orow=orow, ic=ic, ky=ky, kx=kx, oc=oc, iy=iy, ix=ix, ya=ya, cb=cb,
            b=b, counting=counting, st_valid=st_valid, st_lane=st_lane, st_byte=st_byte,
            st_inside=st_inside, pos=pos, st_pos=st_pos, elems=elems, st_mac=st_mac,
            acc_clr=acc_clr, bacc=bacc, gaddr=gaddr, gplane=gplane,
            caddr=caddr, cplane=cplane,
            o=o, hi=hi, lo=lo, step=step, shift=shift, rbit=rbit, y=y)

    def _walker(self, m, lay, p, s):
        """The multiply-add of the issued element, and the walker over the body's scan order:
        ``(start, issue)``, the statements that restart it and a function that issues one
        step (a byte in the count pass, an input element in the multiply-add pass), steps the
        walker and returns whether it was the last."""
        # the weight cache: the group's body regrouped by input element, the channels' bytes
        # of one element side by side (written a byte a cycle by the count pass)
        # (read and written in one cycle only in the count pass, which uses no word it reads)
        m.submodules.wcache = wc = Memory(shape=8 * SLOTS, depth=CACHE_DEPTH, init=[],
                                          attrs={"no_rw_check": 1})
        wr = wc.write_port(granularity=8)
        # an asynchronous port and a register: a synchronous read with collisions undefined
        # (no_rw_check; as the top's kernel memory)
        rd = SimpleNamespace(addr=Signal(range(CACHE_DEPTH)),
                             data=Signal(8 * SLOTS, reset_less=True))
        rd_comb = wc.read_port(domain="comb")
        m.d.comb += rd_comb.addr.eq(rd.addr)
        m.d.sync += rd.data.eq(rd_comb.data)
        # the issued byte (count pass) and element (multiply-add pass)
        w = Signal(signed(8))
        x = Signal(signed(8))
        m.d.comb += [
            w.eq(self.kmem_data.word_select(s.st_byte, 8)),
            x.eq(Mux(s.st_inside, self.buf_rdata[:8], 0)),
            rd.addr.eq(s.pos),
            wr.addr.eq(s.st_pos),
            wr.data.eq(w.as_unsigned().replicate(SLOTS)),
        ]
        # the accumulators, one per lane (channel of the group): cleared, or each adds its
        # product (a multiply-accumulate an SB_MAC16 holds); the tally pass of a group's checks
        # adds 1 x (w != 0) to count its nonzero coefficients
        s.acc = [Signal(signed(32), name=f"acc{lane}") for lane in range(SLOTS)]
        # channel o's accumulator, registered: valid a cycle after o and the accumulator
        # settle (the 8-way multiplexer is off the paths that decide the next state)
        s.acc_o = Signal(signed(32))
        m.d.sync += s.acc_o.eq(Array(s.acc)[s.o])
        with m.If(s.st_valid & s.counting):
            m.d.comb += wr.en.eq(1 << s.st_lane)
        # (no enable: a cycle that adds nothing adds 0 x 0, so Yosys packs each accumulator
        # register into its SB_MAC16, which it does not for one with an enable)
        xm = Mux(s.counting, 1, x)
        for k, acc in enumerate(s.acc):
            wk = rd.data.word_select(k, 8).as_signed()
            wm = Mux(s.st_mac, Mux(s.counting, wk != 0, wk), 0)
            with m.If(s.acc_clr):
                m.d.sync += acc.eq(0)
            with m.Else():
                m.d.sync += acc.eq(acc + xm * wm)
        m.d.sync += [s.st_valid.eq(0), s.st_mac.eq(0)]
        m.d.comb += s.acc_clr.eq(0)

        # the count pass steps through the channels of an element, the multiply-add pass
        # takes them all at once
        last_oc = ~s.counting | (s.oc == s.ocg - 1)
        # the kernel's and channels' last indices registered (their fields are latched in
        # LOAD, long before a walk): the subtractions are off the paths into the state
        kh1, icpg1 = Signal(signed(6)), Signal(signed(13))
        m.d.sync += [kh1.eq(lay.kh - 1), icpg1.eq(lay.icpg - 1)]
        last_kx = s.kx == p["kw1"]
        last_ky = s.ky == kh1
        last_ic = s.ic == icpg1

        def walk_start():
            return [s.ic.eq(0), s.ky.eq(0), s.kx.eq(0), s.oc.eq(0), s.iy.eq(s.iy0), s.ix.eq(s.ix0),
                    s.ya.eq(s.ya0), s.cb.eq(lay.in_base), s.b.eq(0), s.pos.eq(0)]

        def walk_issue():
            """Issue the current byte and element, then step the walker (s.oc fastest)."""
            inside = ((s.iy >= 0) & (s.iy < lay.in_h) & (s.ix >= 0) & (s.ix < lay.in_w))
            m.d.comb += [
                self.kmem_addr.eq(s.body + s.b[2:]),
                self.buf_addr.eq(s.cb + s.ya + s.ix[:ABITS]),
            ]
            m.d.sync += [s.st_valid.eq(1), s.st_lane.eq(s.oc), s.st_byte.eq(s.b[:2]),
                         s.st_inside.eq(inside), s.st_pos.eq(s.pos), s.b.eq(s.b + 1),
                         s.st_mac.eq(~s.counting)]
            with m.If(~last_oc):
                m.d.sync += s.oc.eq(s.oc + 1)
            with m.Else():
                m.d.sync += [s.oc.eq(0), s.pos.eq(s.pos + 1)]
                with m.If(~last_kx):
                    m.d.sync += [s.kx.eq(s.kx + 1), s.ix.eq(s.ix + lay.dilation)]
                with m.Else():
                    m.d.sync += [s.kx.eq(0), s.ix.eq(s.ix0)]
                    with m.If(~last_ky):
                        m.d.sync += [s.ky.eq(s.ky + 1), s.iy.eq(s.iy + lay.dilation),
                                     s.ya.eq(s.ya + p["dr"])]
                    with m.Else():
                        m.d.sync += [s.ky.eq(0), s.iy.eq(s.iy0), s.ya.eq(s.ya0), s.ic.eq(s.ic + 1),
                                     s.cb.eq(s.cb + self.reg_data[:ABITS])]
            return last_oc & last_kx & last_ky & last_ic

        return walk_start, walk_issue

    def _finish(self, m, s, value):
        m.d.sync += s.err.eq(value)
        m.next = "DONE"

    def _run(self, m, lay, p, code, load):
        idx, load_latch, *rest = load
        pool_latch = rest[0] if rest else {}
        pooling = self._pooling
        start = (self.start | self.pool_start) if pooling else self.start
        n_reads = self._n_reads if pooling else len(_READS)
        s = self._state()
        # header word offsets, CHANNEL_WORDS (3) a channel, without a multiplier (Yosys would
        # give even a constant multiplication a DSP)
        s.o3 = (s.o << 1) + s.o
        s.ocg3 = (s.ocg << 1) + s.ocg
        walk_start, walk_issue = self._walker(m, lay, p, s)
        if pooling:
            pool_regs, pool_code = self._pool_prepare(m, s)
        code_r = Signal(4)
        m.d.sync += code_r.eq(code)

        def finish(value):
            self._finish(m, s, value)

        with m.FSM():
            with m.State("IDLE"):
                m.d.sync += idx.eq(0)
                with m.If(start):
                    m.d.sync += idx.eq(1)
                    if self._pooling:
                        m.d.sync += self._pmode.eq(self.pool_start)
                    m.next = "LOAD"

            with m.State("LOAD"):
                with m.Switch(idx):
                    for k in sorted(set(load_latch) | set(pool_latch)):
                        with m.Case(k):
                            if pool_latch:
                                with m.If(self._pmode):
                                    m.d.sync += pool_latch.get(k, [])
                                with m.Else():
                                    m.d.sync += load_latch.get(k, [])
                            else:
                                m.d.sync += load_latch[k]
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == n_reads):
                    self._reread(m, "in_rs")
                    m.d.sync += [p[n].eq(0) for n in ("dr", "sr", "pr", "halo", "rows", "ring",
                                                      "count")]
                    m.d.sync += p["busy_r"].eq(1)
                    m.next = "PRODUCTS"

            with m.State("PRODUCTS"):
                # a step while the last count had a term (a step past the last term adds
                # nothing); the first cycle without one ends the state
                self._reread(m, "in_rs")
                m.d.sync += p["busy_r"].eq(p["busy"])
                with m.If(p["busy_r"]):
                    self._step_products(m, p)
                with m.Else():
                    m.d.comb += self.reg_addr.eq(_OUT + 2)
                    m.d.sync += s.ic.eq(0)
                    m.next = "OUT_RING"
                    if pooling:
                        with m.If(self._pmode):
                            m.d.sync += [s.oy.eq(0), s.ox.eq(0), s.iy0.eq(0), s.ix0.eq(0)]
                            m.next = "SIZES"

            with m.State("OUT_RING"):
                m.d.comb += self.reg_addr.eq(_OUT + 2)
                more, planes = p["ring_term"](s.ic)
                with m.If(more):
                    m.d.sync += [p["ring"].eq(p["ring"] + planes), s.ic.eq(s.ic + 1)]
                with m.Else():
                    m.next = "CHECK"

            if pooling:
                self._pool_states(m, lay, p, s, pool_regs, pool_code)

            with m.State("CHECK"):
                # the checks' code as it was when the products settled (the last PRODUCTS
                # cycle), registered: the comparators are off the state's paths
                m.d.sync += [s.gbase.eq(0), s.gaddr.eq(lay.out_base), s.gplane.eq(0)]
                with m.If(code_r != 0):
                    finish(code_r)
                with m.Else():
                    m.next = "GROUP"

            # -- a group: its table entry, its length checks, its count pass ----------------
            with m.State("GROUP"):
                # TABLE reads KTABLE again (pooling: POOL_GROUP the input channel stride)
                m.d.comb += self.reg_addr.eq(_NE.address("KTABLE"))
                if pooling:
                    with m.If(self._pmode):
                        self._reread(m, "in_cs")
                left = lay.ocpg - s.gbase
                m.d.sync += [s.ocg.eq(Mux(left > SLOTS, SLOTS, left)), s.tcount.eq(0)]
                with m.If(s.gbase >= lay.ocpg):
                    finish(0)
                with m.Else():
                    m.next = "TABLE"
                    if pooling:
                        with m.If(self._pmode):
                            m.d.sync += s.ocg.eq(1)
                            m.next = "POOL_GROUP"

            with m.State("TABLE"):
                m.d.comb += [self.reg_addr.eq(_NE.address("KTABLE")),
                             self.kmem_addr.eq(self.reg_data[:10] + (s.gbase[3:] << 2) + s.tcount)]
                m.d.sync += s.tcount.eq(s.tcount + 1)
                word = self.kmem_data[:16]
                with m.Switch(s.tcount):
                    with m.Case(1):
                        m.d.sync += s.hdr.eq(word)
                    with m.Case(2):
                        m.d.sync += s.hdr_bad.eq(word != s.ocg3)
                    with m.Case(3):
                        m.d.sync += s.body.eq(word)
                    with m.Case(4):
                        m.d.sync += s.body_words.eq(word)
                        m.next = "HEADER_LEN"

            with m.State("HEADER_LEN"):
                m.d.sync += [s.counting.eq(1), s.iy0.eq(0), s.ix0.eq(0), s.ya0.eq(0),
                             s.o.eq(0)]
                with m.If(s.hdr_bad):
                    finish(NeuralError.EXTRACT)
                with m.Else():
                    m.next = "CLEAR"

            with m.State("CLEAR"):
                # the count pass counts from 0
                m.d.comb += s.acc_clr.eq(1)
                m.next = "COUNT_START"

            with m.State("COUNT_START"):
                m.d.sync += walk_start()
                m.next = "COUNT"

            with m.State("COUNT"):
                with m.If(s.pos == CACHE_DEPTH):
                    finish(UNSUPPORTED)
                with m.Else():
                    with m.If(walk_issue()):
                        m.d.sync += [s.o.eq(0), s.elems.eq(s.pos + 1), s.pos.eq(0)]
                        m.next = "TALLY_START"

            with m.State("TALLY_START"):
                # the count pass's last byte lands in the weight cache
                m.next = "TALLY"

            with m.State("TALLY"):
                # every weight-cache row once: each lane counts its nonzero coefficients
                m.d.sync += [s.st_mac.eq(1), s.pos.eq(s.pos + 1)]
                with m.If(s.pos + 1 == s.elems):
                    m.next = "BODY_LEN"

            with m.State("BODY_LEN"):
                with m.If(s.body_words != (s.b + 3)[2:]):
                    finish(NeuralError.EXTRACT)
                with m.Else():
                    m.next = "NNZ_ADDR"

            with m.State("NNZ_ADDR"):
                m.d.comb += self.kmem_addr.eq(s.hdr + s.o3 + 2)
                m.next = "NNZ_CHECK"

            with m.State("NNZ_CHECK"):
                # the checks of the channel's shift word, registered (the kernel memory's
                # word is then off the paths into the next state's enables)
                sw = data.View(register_layout(SHIFT_WORD), self.kmem_data)
                m.d.sync += s.nnz_bad.eq((sw.reserved != 0) | (sw.shift > MAX_SHIFT) |
                                         (sw.nnz != s.acc_o[:16]) | (s.acc_o[16:] != 0))
                m.next = "NNZ_DECIDE"

            with m.State("NNZ_DECIDE"):
                with m.If(s.nnz_bad):
                    finish(NeuralError.EXTRACT)
                with m.Elif(s.o == s.ocg - 1):
                    m.d.sync += [s.o.eq(0), s.counting.eq(0), s.oy.eq(0), s.ox.eq(0), s.orow.eq(0),
                                 s.iy0.eq(-lay.pad), s.ix0.eq(-self._px(lay)), s.ya0.eq(-p["pr"])]
                    m.next = "SEED_ADDR"
                with m.Else():
                    m.d.sync += s.o.eq(s.o + 1)
                    m.next = "NNZ_ADDR"

            # -- an output position: seed, multiply-add, post-process ------------------------
            self._position_states(m, lay, p, s, walk_start, walk_issue)

            with m.State("DONE"):
                m.d.comb += [self.done.eq(1), self.error.eq(s.err)]
                m.next = "IDLE"

    def _position_states(self, m, lay, p, s, walk_start, walk_issue):
        """The states of an output position: seed, multiply-add, post-process, step."""
        with m.State("SEED_ADDR"):
            # the accumulators from 0 (the biases are added at the rescale)
            self._reread(m, "in_cs")
            m.d.comb += s.acc_clr.eq(1)
            m.d.sync += walk_start()
            if self._pooling:
                m.d.sync += s.first.eq(1)
            m.next = "MAC"

        with m.State("MAC"):
            self._reread(m, "in_cs")
            with m.If(walk_issue()):
                m.d.sync += [s.o.eq(0), s.caddr.eq(s.gaddr), s.cplane.eq(s.gplane)]
                m.next = "MAC_END"

        with m.State("MAC_END"):
            # the last products land in the accumulators
            self._reread(m, "out_cs")
            m.next = "BIAS_ADDR"
            if self._pooling:
                # (pooling: the last element folded in, the window's value written)
                with m.If(self._pmode):
                    m.d.sync += s.y.eq(s.folded)
                    m.next = "WRITE"

        with m.State("BIAS_ADDR"):
            m.d.comb += self.kmem_addr.eq(s.hdr + s.o3)
            m.next = "SCALE_ADDR"

        with m.State("SCALE_ADDR"):
            m.d.comb += self.kmem_addr.eq(s.hdr + s.o3 + 1)
            m.d.sync += s.bacc.eq(s.acc_o + self.kmem_data.as_signed())
            m.next = "SHIFT_ADDR"

        with m.State("SHIFT_ADDR"):
            m.d.comb += self.kmem_addr.eq(s.hdr + s.o3 + 2)
            m.d.sync += [s.lo.eq(self.kmem_data), s.hi.eq(0),
                         s.step.eq(0)]
            m.next = "SHIFT_LATCH"

        with m.State("SHIFT_LATCH"):
            m.d.sync += [s.shift.eq(self.kmem_data[:6]), s.rbit.eq(0)]
            m.next = "MULTIPLY"

        with m.State("MULTIPLY"):
            # {hi, lo} = acc * scale, one bit of the scale (in lo) a cycle, radix-2 Booth:
            # the digit b[i-1] - b[i] (b[i-1] in rbit, 0 at first) adds 0 or +-a; 32 digits
            # give the signed product
            a = s.bacc
            neg = s.lo[0] & ~s.rbit
            mag = Signal(signed(33))                  # 0 or a, sign-extended
            m.d.comb += mag.eq(Mux(s.lo[0] ^ s.rbit, a, 0))
            add = Signal(signed(33))                  # 0, a or ~a (-a = ~a + 1)
            m.d.comb += add.eq(mag.as_unsigned() ^ neg.replicate(33))
            t = Signal(signed(35))
            m.d.comb += t.eq(s.hi + add + neg)
            m.d.sync += [s.lo.eq(Cat(s.lo[1:], t[0])), s.hi.eq(t >> 1), s.rbit.eq(s.lo[0]),
                         s.step.eq(s.step + 1)]
            with m.If(s.step == 31):
                m.d.sync += s.rbit.eq(0)
                m.next = "SHIFT"

        with m.State("SHIFT"):
            # arithmetic shift right by ``shift``, 32 bits in one step while at least 32 are
            # left, then one a cycle; rbit is the last bit shifted out (POST_CTRL read again
            # for ROUND)
            m.d.comb += self.reg_addr.eq(_NE.address("POST_CTRL"))
            with m.If(s.shift == 0):
                m.next = "ROUND"
            with m.Elif(s.shift >= 32):
                m.d.sync += [s.rbit.eq(s.lo[31]), s.lo.eq(s.hi[:32]), s.hi.eq(s.hi >> 32),
                             s.shift.eq(s.shift - 32)]
            with m.Else():
                m.d.sync += [s.rbit.eq(s.lo[0]), s.lo.eq(Cat(s.lo[1:], s.hi[0])),
                             s.hi.eq(s.hi >> 1), s.shift.eq(s.shift - 1)]

        with m.State("ROUND"):
            # the result, registered (the rounding, saturation and activation off the
            # buffer's write path); the zero point (ReLU) or the clamp's low bound next
            post = data.View(register_layout(_NE["POST_CTRL"]), self.reg_data)
            m.d.comb += self.reg_addr.eq(Mux(lay.clamp, _NE.address("POST_LO"),
                                             _NE.address("POST_CTRL")))
            m.d.sync += s.y.eq(self._saturate(m, s.hi, s.lo, s.rbit, post.zero_point))
            m.next = "ACTIVATE"

        with m.State("ACTIVATE"):
            # ReLU (from the zero point) or the clamp's low bound; its high bound next
            m.d.comb += self.reg_addr.eq(_NE.address("POST_HI"))
            y, bound = s.y.as_signed(), self.reg_data[:8].as_signed()
            with m.If(lay.relu):
                m.d.sync += s.y.eq(Mux(y < post.zero_point.as_signed(), post.zero_point, y))
            with m.Elif(lay.clamp):
                m.d.sync += s.y.eq(Mux(y < bound, bound, y))
            m.next = "CLAMP_HI"

        with m.State("CLAMP_HI"):
            self._reread(m, "out_cs")
            hi8 = self.reg_data[:8].as_signed()
            with m.If(lay.clamp & (s.y.as_signed() > hi8)):
                m.d.sync += s.y.eq(hi8)
            m.next = "WRITE"

        with m.State("WRITE"):
            self._reread(m, "out_rs")
            m.d.comb += [self.buf_addr.eq(s.caddr + s.orow + s.ox[:ABITS]),
                         self.buf_wdata.eq(s.y.as_signed()),
                         self.buf_we.eq(1)]
            ring_end = lay.ring_on & (s.cplane + 1 == p["ring"])
            m.d.sync += [s.caddr.eq(Mux(ring_end, lay.out_base, s.caddr + self.reg_data[:ABITS])),
                         s.cplane.eq(Mux(ring_end, 0, s.cplane + 1))]
            with m.If(s.o != s.ocg - 1):
                m.d.sync += s.o.eq(s.o + 1)
                m.next = "BIAS_ADDR"
            with m.Else():
                m.d.sync += s.o.eq(0)
                m.next = "NEXT_POSITION"

        # the last column and row, registered: ox and oy are set many cycles before
        # NEXT_POSITION, and the comparators are off the paths into the origins' registers
        last_x, last_y = Signal(), Signal()
        m.d.sync += [last_x.eq(s.ox == lay.out_w - 1), last_y.eq(s.oy == lay.out_h - 1)]

        with m.State("NEXT_POSITION"):
            m.next = "SEED_ADDR"
            with m.If(~last_x):
                m.d.sync += [s.ox.eq(s.ox + 1), s.ix0.eq(s.ix0 + self._sx(lay))]
            with m.Else():
                m.d.sync += [s.ox.eq(0), s.ix0.eq(-self._px(lay)), s.oy.eq(s.oy + 1),
                             s.iy0.eq(s.iy0 + lay.stride), s.ya0.eq(s.ya0 + p["sr"]),
                             s.orow.eq(s.orow + self.reg_data[:ABITS])]
                with m.If(last_y):
                    # the group is done: the next one starts at the channel after it
                    m.d.sync += [s.gbase.eq(s.gbase + SLOTS), s.gaddr.eq(s.caddr),
                                 s.gplane.eq(s.cplane)]
                    if self._pooling:
                        # pooling: a channel a group (POOL_GROUP moves the input base on)
                        with m.If(self._pmode):
                            m.d.sync += s.gbase.eq(s.gbase + 1)
                    m.next = "GROUP"

    def _reread(self, m, name):
        """Address the stride ``name`` of :data:`_STRIDES` (the pooling mode's register with
        pooling): it is ``reg_data[:ABITS]`` a cycle on."""
        ne, pe = _STRIDES[name]
        addr = Mux(self._pmode, pe, ne) if self._pooling else ne
        m.d.comb += self.reg_addr.eq(addr)

    def _sx(self, lay):
        """The column stride: the pooling window's own with pooling, else the layer's."""
        return lay.stride_x if self._pooling else lay.stride

    def _px(self, lay):
        """The column padding: the pooling window's own with pooling, else the layer's."""
        return lay.pad_x if self._pooling else lay.pad

    def _pool_prepare(self, m, s):
        """The pooling mode's registers for its sizing (this unit's, reused), its checks'
        code (:func:`npu.micro.pe.checks`) and the fold of a window's elements into
        ``s.folded`` (:func:`npu.micro.pe.fold`): ``(registers, code)``."""
        f = self._pool_fields
        r = SimpleNamespace(oy=s.oy, ox=s.ox, iy0=s.iy0, ix0=s.ix0,
                            ylast=Signal(signed(ABITS + 1)), xlast=Signal(signed(ABITS + 1)),
                            k=s.gbase, planes=s.caddr, j=s.ic, ring=s.ya)
        s.best = Signal(signed(8))
        s.first = Signal()
        s.folded = pool.fold(m, f.fl, self.buf_rdata, s.best, s.first,
                             s.st_valid & s.st_inside & self._pmode)
        # the checks' code registered (off the state's paths): in POOL_CHECK it is the code of
        # RING's last cycle, whose registers that cycle leaves as they are
        code = Signal(4)
        m.d.sync += code.eq(pool.checks(m, f, r))
        return r, code

    def _pool_states(self, m, lay, p, s, r, code):
        """The pooling mode's sizing and check states (the planar unit's,
        :func:`npu.micro.pe.size_states`, on this unit's registers), and a channel's start."""
        pool.size_states(m, self, self._pool_fields, r, "POOL_CHECK")

        with m.State("POOL_CHECK"):
            m.d.sync += [s.gbase.eq(0), s.gaddr.eq(lay.out_base), s.gplane.eq(0)]
            with m.If(code != 0):
                self._finish(m, s, code)
            with m.Else():
                m.next = "GROUP"

        with m.State("POOL_GROUP"):
            # a channel's output positions, as a neural group's (NNZ_CHECK) start; after the
            # first channel the input base moves on by the channel stride (addressed in GROUP)
            with m.If(s.gbase != 0):
                m.d.sync += lay.in_base.eq(lay.in_base + self.reg_data[:ABITS])
            m.d.sync += [s.o.eq(0), s.counting.eq(0), s.oy.eq(0), s.ox.eq(0), s.orow.eq(0),
                         s.iy0.eq(-lay.pad), s.ix0.eq(-lay.pad_x), s.ya0.eq(-p["pr"])]
            m.next = "SEED_ADDR"

    def _saturate(self, m, hi, lo, rbit, zp):
        """The rescaled value ``{hi, lo}`` with its rounding bit, plus the zero point ``zp``,
        saturated to int8 (combinational)."""
        upper = Cat(lo[9:], hi)
        small = (upper == 0) | (upper == (1 << len(upper)) - 1)
        v = Signal(signed(12))
        m.d.comb += v.eq(lo[:10].as_signed() + rbit + zp.as_signed())
        y = Signal(signed(9))
        with m.If(~small):
            m.d.comb += y.eq(Mux(hi[-1], -128, 127))
        with m.Elif(v > 127):
            m.d.comb += y.eq(127)
        with m.Elif(v < -128):
            m.d.comb += y.eq(-128)
        with m.Else():
            m.d.comb += y.eq(v)
        return y[:8]
