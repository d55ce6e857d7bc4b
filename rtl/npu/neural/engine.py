"""The neural engine core: rasterizer, kernel DMA, input buffer and shifter, MAC array,
post-processor and output circuit (``docs/neural_engine.md``).

Four processes run side by side, each with its own copy of the loop position (no position
travels with the data):

* the **kernel DMA** walks (output-channel group, work unit) and streams each group's header
  once and its body once per work unit from the kernel memory into the kernel extractor;
* the **loader** walks the same loops and fills one of two input-buffer banks with the rows a
  work unit needs (its halo), while the other bank is being computed on;
* the **sequencer** starts the extractor on each header and body, turns coefficient beats into
  MAC commands (the shifter picks, for every lane, the input at the beat's kernel offset) and
  hands parameter beats to the post-processor;
* the **output circuit** turns post-processed result beats into row writes.

Loop nest: ``for group (up to acc_slots output channels): for tile_y: for tile_x:
for (ic, ky, kx, oc) in scan order, zero coefficients skipped``. A work unit is ``W x H`` output
positions with ``W * H = macs``; lane ``i`` is position ``(i // W, i % W)``.
"""

from amaranth.hdl import Cat, Const, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from npu_spec import neural as neural_spec
from npu_spec.config import NPUConfig
from npu_spec.neural import engine_geometry

from ..lib.enums import hw_enum
from .layouts import MacFormat, MacOp
from .mac import MacArray, format_supported
from .kernel_extract import KernelExtract
from .layouts import KERNEL_WORD, MAX_KERNEL
from .postproc import PostProcessor, postproc_config_layout

__all__ = ["EngineError", "NeuralEngine", "engine_geometry", "layer_layout"]


#: ``error_code`` of the neural engine (0: no error).
EngineError = hw_enum(neural_spec.NeuralError)


def layer_layout():
    """The layer registers the engine reads while it runs (see ``docs/neural_engine.md``)."""
    return data.StructLayout({
        "fmt":      MacFormat,
        "log2w":    4,
        "groups":   12,
        "icpg":     12,
        "ocpg":     12,
        "in_h":     12,
        "in_w":     12,
        "out_h":    12,
        "out_w":    12,
        "kh":       5,
        "kw":       5,
        "stride":   3,
        "dilation": 3,
        "pad":      4,
        "sparse":   1,
        "palette":  4,
        "ktable":   16,
        "post":     postproc_config_layout(),
    })


class NeuralEngine(wiring.Component):
    """One neural engine core.

    Members
    -------
    layer : In(layer_layout())
        Layer registers; held while ``busy``.
    start : In(1)
        Start the layer (ignored while ``busy``).
    busy, done : Out(1)
        ``done`` is a one-cycle pulse at the end of a layer, with or without error.
    error : Out(1), error_code : Out(EngineError)
        Set with ``done`` when the layer failed; cleared by the next ``start``.
    kmem_addr, kmem_en : Out, kmem_data : In(32)
        Read port of the kernel memory (data one cycle after ``kmem_en``).
    row_req : Out(stream)
        Input rows wanted: channel ``c``, row ``y``, first column ``x`` (signed: padding), and a
        ``tag`` to return with the data.
    row_data : In(stream)
        ``row_values`` inputs ``x .. x + row_values - 1`` of the row (zeros outside the image),
        in request order, with the request's ``tag``.
    out : Out(stream)
        Output row writes: channel ``oc``, row ``y``, first column ``x``, ``values`` (lane ``x``
        at index ``x``) and ``mask`` (which values to write).
    cycles, mac_active : Out(32)
        Cycles of the last (or current) layer, and cycles in which the MAC array took a command.
    """

    def __init__(self, config, *, row_values=None, buffer_rows=None, timeout=1 << 14,
                 post_lanes=None):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        self._config = config
        n = config.macs
        if n & (n - 1):
            raise ValueError(f"the neural engine needs a power-of-two MAC count, not {n}")
        self.max_rows, self.row_values, self.buffer_rows = engine_geometry(
            config, row_values, buffer_rows)
        if self.row_values & (self.row_values - 1):
            raise ValueError(f"row_values must be a power of two, not {self.row_values}")
        self.timeout = timeout
        # A result beat leaves at most once per input channel x kernel taps of its slot;
        # post-processing a quarter of the lanes per cycle keeps up with 4 or more taps and
        # needs a quarter of the multipliers.
        self.post_lanes = post_lanes or max(1, n // 4)
        slots = config.acc_slots
        self.tag_layout = data.StructLayout({
            "row": range(self.max_rows), "addr": range(2 * self.buffer_rows)})
        super().__init__({
            "layer":      In(layer_layout()),
            "start":      In(1),
            "busy":       Out(1),
            "done":       Out(1),
            "error":      Out(1),
            "error_code": Out(EngineError),
            "kmem_addr":  Out(16),
            "kmem_en":    Out(1),
            "kmem_data":  In(32),
            "row_req":    Out(stream.Signature(data.StructLayout({
                "c": 12, "y": signed(14), "x": signed(14), "tag": self.tag_layout}))),
            "row_data":   In(stream.Signature(data.StructLayout({
                "values": data.ArrayLayout(16, self.row_values), "tag": self.tag_layout}))),
            "out":        Out(stream.Signature(data.StructLayout({
                "oc": 12, "y": 12, "x": 12,
                "values": data.ArrayLayout(16, n), "mask": n}))),
            "cycles":     Out(32),
            "mac_active": Out(32),
        })
        self._slots = slots

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        n = cfg.macs
        log2n = exact_log2(n)
        slots = self._slots
        L = self.layer
        RV = self.row_values
        depth = self.buffer_rows
        max_rows = self.max_rows

        # Everything but the status registers is in `m`, which the soft reset `flush` clears
        # after an error; `top` keeps the error code and the counters.
        top = Module()
        run = Signal()
        flush = Signal()
        fail = Signal()
        err = Signal(EngineError)
        top.submodules.core = ResetInserter(flush)(m)
        m.d.comb += self.busy.eq(run)
        starting = Signal()
        m.d.comb += starting.eq(self.start & ~run)

        m.submodules.mac = mac = MacArray(cfg)
        m.submodules.extract = ext = KernelExtract(cfg)
        m.submodules.post = post = PostProcessor(cfg, lanes_per_cycle=self.post_lanes)
        m.d.comb += [post.cfg.eq(L.post), post.error_clear.eq(starting),
                     post.lfsr_load.eq(starting),
                     mac.error_clear.eq(starting)]
        # The 8 slots of a work unit finish on consecutive commands, and the post-processor
        # takes macs / post_lanes cycles per result: a FIFO of one result per slot absorbs the
        # burst, so the MAC array never waits for the post-processor.
        res_width = mac.res.payload.shape().size
        m.submodules.resfifo = resfifo = SyncFIFOBuffered(width=res_width, depth=slots)
        m.d.comb += [
            resfifo.w_data.eq(mac.res.payload),
            resfifo.w_en.eq(mac.res.valid),
            mac.res.ready.eq(resfifo.w_rdy),
            post.res.payload.eq(resfifo.r_data),
            post.res.valid.eq(resfifo.r_rdy),
            resfifo.r_en.eq(post.res.ready),
        ]
        pad = Signal(signed(6))
        m.d.comb += pad.eq(L.pad)

        # ---- Derived layer values, latched at start ------------------------------------------
        H = Signal(range(n + 1))
        W = Signal(range(n + 1))
        log2h = Signal(range(log2n + 1))
        K = Signal(24)
        C = Signal(24)
        fp_data = Signal()      # data operand is binary16
        fp_coef = Signal()
        is_int = Signal()
        with m.If(starting):
            m.d.sync += [
                W.eq(Const(1, 1) << L.log2w),
                H.eq(Const(n, n.bit_length() + 1) >> L.log2w),
                log2h.eq(log2n - L.log2w),
                K.eq(L.groups * L.ocpg),
                C.eq(L.groups * L.icpg),
                fp_data.eq((L.fmt == MacFormat.FP16) | (L.fmt == MacFormat.F16I8)),
                fp_coef.eq((L.fmt == MacFormat.FP16) | (L.fmt == MacFormat.I8F16)),
                is_int.eq(L.fmt == MacFormat.INT8),
            ]
        halo_w = Signal(16)
        m.d.comb += halo_w.eq((W - 1) * L.stride + (L.kw - 1) * L.dilation + 1)

        # Work-unit tiles: ceil(out / H) rows, ceil(out / W) columns.
        tiles_y = Signal(12)
        tiles_x = Signal(12)
        m.d.comb += [
            tiles_y.eq((L.out_h + H - 1) >> log2h),
            tiles_x.eq((L.out_w + W - 1) >> L.log2w),
        ]

        # ---- Configuration check -----------------------------------------------------------
        supported = format_supported(m, cfg, L.fmt)
        check = Signal(EngineError)
        zero_loop = ((L.groups == 0) | (L.icpg == 0) | (L.ocpg == 0) | (L.out_h == 0) |
                     (L.out_w == 0) | (L.in_h == 0) | (L.in_w == 0) | (L.kh == 0) |
                     (L.kw == 0) | (L.stride == 0) | (L.dilation == 0))
        valid_shape = Signal()
        m.d.comb += valid_shape.eq((L.log2w <= log2n) & (log2n - L.log2w <= exact_log2(max_rows)))
        with m.If(~supported):
            m.d.comb += check.eq(EngineError.FORMAT)
        with m.Elif(zero_loop):
            m.d.comb += check.eq(EngineError.SHAPE)
        with m.Elif((L.kh > MAX_KERNEL) | (L.kw > MAX_KERNEL) | ~valid_shape):
            m.d.comb += check.eq(EngineError.KERNEL)

        # ---- Group walker: the conv group of each slot of an output-channel group ----------
        # Walks the `ocg` channels of a group one per cycle, keeping (conv group, index in it)
        # so no division is needed. Two instances: the loader's and the sequencer's.
        def walker(name):
            w = {
                "g": Signal(12, name=f"{name}_g"), "r": Signal(12, name=f"{name}_r"),
                "g0": Signal(12, name=f"{name}_g0"), "glast": Signal(12, name=f"{name}_glast"),
                "oc_base": Signal(24, name=f"{name}_oc_base"),
                "ocg": Signal(range(slots + 1), name=f"{name}_ocg"),
                "i": Signal(range(slots + 1), name=f"{name}_i"),
            }
            return w

        def walker_reset(mod, w):
            mod.d.sync += [w["g"].eq(0), w["r"].eq(0), w["oc_base"].eq(0)]

        def walker_begin(mod, w):
            """Start a group at oc_base: compute ocg, remember g0."""
            rem = K - w["oc_base"]
            mod.d.sync += [
                w["ocg"].eq(Mux(rem >= slots, slots, rem)),
                w["g0"].eq(w["g"]),
                w["i"].eq(0),
            ]

        def walker_step(mod, w):
            """One channel: returns (conv group offset from g0) of slot i before the step."""
            last_in_group = w["r"] + 1 == L.ocpg
            mod.d.sync += [
                w["glast"].eq(w["g"]),
                w["g"].eq(Mux(last_in_group, w["g"] + 1, w["g"])),
                w["r"].eq(Mux(last_in_group, 0, w["r"] + 1)),
                w["i"].eq(w["i"] + 1),
            ]
            return w["g"] - w["g0"]

        # ---- Bank handshake between the loader and the sequencer ---------------------------
        full = Signal(2)
        set_full = Signal(2)
        clr_full = Signal(2)
        m.d.sync += full.eq((full | set_full) & ~clr_full)

        # ---- Kernel DMA ----------------------------------------------------------------------
        kfifo_depth = 8
        m.submodules.kfifo = kfifo = SyncFIFOBuffered(
            width=KERNEL_WORD.size + 1, depth=kfifo_depth)
        k_inflight = Signal(range(kfifo_depth + 2))
        k_issue = Signal()
        k_issue_part = Signal()   # ... of a header or body word
        k_ret = Signal()          # a read issued last cycle returns now
        k_ret_part = Signal(2)    # 0: table word, 1: header, 2: body
        k_ret_last = Signal()
        k_room = Signal()
        m.d.comb += k_room.eq(kfifo.level + k_inflight + 1 < kfifo_depth)
        m.d.sync += [k_ret.eq(k_issue)]
        m.d.sync += k_inflight.eq(k_inflight + k_issue_part - (k_ret & (k_ret_part != 0)))

        k_addr = Signal(16)
        k_left = Signal(16)
        k_part = Signal(2)
        tbl = Signal(data.ArrayLayout(16, 4))   # header addr, header words, body addr, words
        tbl_i = Signal(3)
        k_group = walker("kdma")
        k_ty = Signal(12)
        k_tx = Signal(12)
        k_gidx = Signal(16)
        m.d.comb += [self.kmem_addr.eq(k_addr), self.kmem_en.eq(k_issue)]

        # Table words land in `tbl`; part words go to the FIFO with (last, is_header).
        with m.If(k_ret & (k_ret_part == 0)):
            m.d.sync += tbl.as_value().word_select(tbl_i[:2], 16).eq(self.kmem_data[:16])
            m.d.sync += tbl_i.eq(tbl_i + 1)
        m.d.comb += [
            kfifo.w_en.eq(k_ret & (k_ret_part != 0)),
            kfifo.w_data.eq(Cat(self.kmem_data, k_ret_last, k_ret_part == 1)),
        ]
        k_head_word = kfifo.r_data
        k_is_header = k_head_word[33]
        m.d.comb += [
            ext.header.payload.eq(k_head_word[:33]),
            ext.body.payload.eq(k_head_word[:33]),
            ext.header.valid.eq(kfifo.r_rdy & k_is_header),
            ext.body.valid.eq(kfifo.r_rdy & ~k_is_header),
            kfifo.r_en.eq(Mux(k_is_header, ext.header.ready, ext.body.ready)),
        ]

        with m.FSM(name="kdma"):
            with m.State("IDLE"):
                with m.If(starting & (check == EngineError.NONE)):
                    walker_reset(m, k_group)
                    m.d.sync += k_gidx.eq(0)
                    m.next = "TABLE"
                    m.d.sync += [tbl_i.eq(0), k_addr.eq(L.ktable), k_left.eq(4)]
            with m.State("TABLE"):
                # Read the group's 4-word table entry.
                with m.If(k_left != 0):
                    m.d.comb += k_issue.eq(1)
                    m.d.sync += [k_addr.eq(k_addr + 1), k_left.eq(k_left - 1),
                                 k_ret_part.eq(0)]
                with m.Elif(~k_ret & (tbl_i == 4)):
                    m.d.sync += [k_addr.eq(tbl[0]), k_left.eq(tbl[1]), k_part.eq(1),
                                 k_ty.eq(0), k_tx.eq(0)]
                    m.next = "PART"
            with m.State("PART"):
                with m.If((k_left != 0) & k_room):
                    m.d.comb += [k_issue.eq(1), k_issue_part.eq(1)]
                    m.d.sync += [k_addr.eq(k_addr + 1), k_left.eq(k_left - 1),
                                 k_ret_part.eq(k_part), k_ret_last.eq(k_left == 1)]
                with m.Elif(k_left == 0):
                    # Next part: a body per work unit after the header, then the next group.
                    with m.If(k_part == 1):
                        m.d.sync += [k_addr.eq(tbl[2]), k_left.eq(tbl[3]), k_part.eq(2)]
                    with m.Else():
                        with m.If(k_tx + 1 < tiles_x):
                            m.d.sync += [k_tx.eq(k_tx + 1), k_addr.eq(tbl[2]),
                                         k_left.eq(tbl[3])]
                        with m.Elif(k_ty + 1 < tiles_y):
                            m.d.sync += [k_tx.eq(0), k_ty.eq(k_ty + 1), k_addr.eq(tbl[2]),
                                         k_left.eq(tbl[3])]
                        with m.Else():
                            m.d.sync += k_group["oc_base"].eq(k_group["oc_base"] + slots)
                            with m.If(k_group["oc_base"] + slots < K):
                                m.d.sync += [tbl_i.eq(0), k_left.eq(4), k_gidx.eq(k_gidx + 1),
                                             k_addr.eq(L.ktable + ((k_gidx + 1) << 2))]
                                m.next = "WAIT_TABLE"
                            with m.Else():
                                m.next = "IDLE"
            with m.State("WAIT_TABLE"):
                # Let the last part's reads land before the table read reuses k_ret_part.
                with m.If(~k_ret):
                    m.next = "TABLE"

        # ---- Input buffer: one memory per lane row, two banks ------------------------------
        bufs = []
        for r in range(max_rows):
            mem = Memory(shape=data.ArrayLayout(16, RV), depth=2 * depth, init=[])
            m.submodules[f"inbuf{r}"] = mem
            bufs.append((mem.write_port(), mem.read_port()))

        # ---- Loader --------------------------------------------------------------------------
        ld_group = walker("ld")
        ld_bank = Signal()
        ld_c = Signal(24)        # channel within the group's input range
        ld_nch = Signal(24)
        ld_ky = Signal(5)
        ld_y = Signal(range(max_rows + 1))
        ld_ty = Signal(12)
        ld_tx = Signal(12)
        ld_out = Signal(24)      # row requests not yet answered
        c_lo = Signal(24)
        ld_req = self.row_req.payload
        row_fire = self.row_req.valid & self.row_req.ready
        data_fire = self.row_data.valid & self.row_data.ready
        m.d.comb += self.row_data.ready.eq(1)
        m.d.sync += ld_out.eq(ld_out + row_fire - data_fire)
        for r, (wp, _) in enumerate(bufs):
            m.d.comb += [
                wp.addr.eq(self.row_data.payload.tag.addr),
                wp.data.eq(self.row_data.payload.values),
                wp.en.eq(data_fire & (self.row_data.payload.tag.row == r)),
            ]
        oy_row = Signal(signed(26))
        m.d.comb += [
            oy_row.eq(((ld_ty << log2h) + ld_y) * L.stride + ld_ky * L.dilation - pad),
            ld_req.c.eq(c_lo + ld_c),
            ld_req.y.eq(oy_row),
            ld_req.x.eq(((ld_tx << L.log2w) * L.stride) - pad),
            ld_req.tag.row.eq(ld_y),
            ld_req.tag.addr.eq(Mux(ld_bank, depth, 0) + ld_c * L.kh + ld_ky),
        ]
        with m.FSM(name="loader"):
            with m.State("IDLE"):
                with m.If(starting & (check == EngineError.NONE)):
                    walker_reset(m, ld_group)
                    m.d.sync += [ld_bank.eq(0), ld_ty.eq(0), ld_tx.eq(0)]
                    m.next = "GROUP"
            with m.State("GROUP"):
                walker_begin(m, ld_group)
                m.next = "WALK"
            with m.State("WALK"):
                with m.If(ld_group["i"] < ld_group["ocg"]):
                    walker_step(m, ld_group)
                with m.Else():
                    m.d.sync += [
                        c_lo.eq(ld_group["g0"] * L.icpg),
                        ld_nch.eq((ld_group["glast"] - ld_group["g0"] + 1) * L.icpg),
                    ]
                    m.next = "WAIT_BANK"
            with m.State("WAIT_BANK"):
                with m.If(~full.bit_select(ld_bank, 1)):
                    m.d.sync += [ld_c.eq(0), ld_ky.eq(0), ld_y.eq(0)]
                    m.next = "ROWS"
            with m.State("ROWS"):
                m.d.comb += self.row_req.valid.eq(1)
                with m.If(self.row_req.ready):
                    with m.If(ld_y + 1 < H):
                        m.d.sync += ld_y.eq(ld_y + 1)
                    with m.Elif(ld_ky + 1 < L.kh):
                        m.d.sync += [ld_y.eq(0), ld_ky.eq(ld_ky + 1)]
                    with m.Elif(ld_c + 1 < ld_nch):
                        m.d.sync += [ld_y.eq(0), ld_ky.eq(0), ld_c.eq(ld_c + 1)]
                    with m.Else():
                        m.next = "DRAIN"
            with m.State("DRAIN"):
                with m.If(ld_out == 0):
                    m.d.comb += set_full.eq(Mux(ld_bank, 0b10, 0b01))
                    m.d.sync += ld_bank.eq(~ld_bank)
                    with m.If(ld_tx + 1 < tiles_x):
                        m.d.sync += ld_tx.eq(ld_tx + 1)
                        m.next = "WAIT_BANK"
                    with m.Elif(ld_ty + 1 < tiles_y):
                        m.d.sync += [ld_tx.eq(0), ld_ty.eq(ld_ty + 1)]
                        m.next = "WAIT_BANK"
                    with m.Else():
                        m.d.sync += [ld_tx.eq(0), ld_ty.eq(0),
                                     ld_group["oc_base"].eq(ld_group["oc_base"] + slots)]
                        with m.If(ld_group["oc_base"] + slots < K):
                            m.next = "GROUP"
                        with m.Else():
                            m.next = "IDLE"

        # ---- Sequencer: extractor control and MAC command issue --------------------------
        sq_group = walker("sq")
        sq_bank = Signal()
        sq_ty = Signal(12)
        sq_tx = Signal(12)
        off = Signal(data.ArrayLayout(24, slots))      # input-channel offset of each slot
        bias = Signal(data.ArrayLayout(32, slots))
        m.d.comb += [
            ext.cfg.coef_fp16.eq(fp_coef),
            ext.cfg.sparse.eq(L.sparse),
            ext.cfg.palette.eq(L.palette),
            ext.cfg.icg.eq(L.icpg),
            ext.cfg.kh.eq(L.kh),
            ext.cfg.kw.eq(L.kw),
            ext.cfg.ocg.eq(sq_group["ocg"]),
        ]

        # Issue pipeline: S0 beat + buffer address, S1 buffer rows read, S2 the MAC command.
        adv = Signal()
        s0 = Signal(ext.coefs.payload.shape())
        s0_valid = Signal()
        s0_bank = Signal()
        s0_addr = Signal(range(2 * depth))
        s1 = Signal(ext.coefs.payload.shape())
        s1_valid = Signal()
        s1_bank = Signal()
        cmd = mac.cmd.payload
        m.d.comb += adv.eq(~mac.cmd.valid | mac.cmd.ready)
        issuing = Signal()
        m.d.comb += ext.coefs.ready.eq(adv & issuing)
        beat = ext.coefs.payload
        with m.If(adv):
            m.d.sync += [
                s0.eq(beat), s0_valid.eq(ext.coefs.valid & issuing), s0_bank.eq(sq_bank),
                s0_addr.eq(Mux(sq_bank, depth, 0) +
                           (off[beat.slot] + beat.ic) * L.kh + beat.ky),
                s1.eq(s0), s1_valid.eq(s0_valid), s1_bank.eq(s0_bank),
            ]
        for _, rp in bufs:
            m.d.comb += [rp.addr.eq(s0_addr), rp.en.eq(adv)]
        # Shifter: lane (y, x) takes element x * stride + kx * dilation of lane row y's row.
        kxd = Signal(16)
        m.d.comb += kxd.eq(s1.kx * L.dilation)
        hold_data = Mux(fp_data, 0xFC00, 1)          # -inf, or int8 1
        hold_coef = Mux(fp_data, Mux(fp_coef, 0x3C00, 1), 0xFC00)   # 1.0 / int8 1 / -inf
        with m.If(adv):
            m.d.sync += [
                mac.cmd.valid.eq(s1_valid),
                cmd.op.eq(Mux(s1.hold & ~is_int, MacOp.MAX, MacOp.MAC)),
                cmd.fmt.eq(L.fmt),
                cmd.slot.eq(s1.slot),
                cmd.first.eq(s1.first),
                cmd.last.eq(s1.last),
                cmd.dual.eq(0),
                cmd.bias.eq(bias[s1.slot]),
                cmd.coef[0].eq(Mux(s1.hold, Mux(is_int, 0, hold_coef), s1.coef)),
                cmd.coef[1].eq(0),
            ]
        # Shared per lane row r, so the cost grows with rows x row_values, not lanes x rows:
        #   rotator:   T_r[j] = row_r[(j + kxd) mod RV]       (log2 RV levels of 2:1 muxes)
        #   stride:    U_r[x] = T_r[(x * stride) mod RV]       (one mux over the strides)
        # and lane i of a W x H unit (row i >> log2w, column i & (W - 1)) picks U_r[x] from
        # the few shapes that put it somewhere. The halo check keeps every index below RV.
        log2rv = exact_log2(RV)
        strides = 1 << len(L.stride)
        cols = min(n, RV)
        shifted = []
        for r in range(max_rows):
            t = [bufs[r][1].data[j] for j in range(RV)]
            for b in range(log2rv):
                # Each level in named signals: an expression used twice would be copied.
                nxt = [Signal(16, name=f"rot_r{r}_l{b}_{j}") for j in range(RV)]
                m.d.comb += [nxt[j].eq(Mux(kxd[b], t[(j + (1 << b)) % RV], t[j]))
                             for j in range(RV)]
                t = nxt
            u = []
            for x in range(cols):
                ux = Signal(16, name=f"shift_r{r}_x{x}")
                with m.Switch(L.stride):
                    for s in range(1, strides):
                        with m.Case(s):
                            m.d.comb += ux.eq(t[(x * s) % RV])
                u.append(ux)
            shifted.append(u)
        shapes = [lw for lw in range(log2n + 1)
                  if (n >> lw) <= max_rows and (1 << lw) <= cols]
        for i in range(n):
            value = Signal(16, name=f"shift_out{i}")
            with m.Switch(L.log2w):
                for lw in shapes:
                    with m.Case(lw):
                        m.d.comb += value.eq(shifted[i >> lw][i & ((1 << lw) - 1)])
            with m.If(adv):
                m.d.sync += cmd.data[i].eq(Mux(s1.hold & ~is_int, hold_data, value))

        # Bank release: the extractor finished the body and no beat of the bank is still
        # before the buffer read.
        release_pending = Signal(2)
        in_flight = Signal(2)
        m.d.comb += in_flight.eq(Mux(s0_valid, Mux(s0_bank, 2, 1), 0))
        rel = Signal(2)
        m.d.comb += [rel.eq(release_pending & ~in_flight), clr_full.eq(rel)]
        m.d.sync += release_pending.eq(release_pending & ~rel)

        pipe_empty = Signal()
        m.d.comb += pipe_empty.eq(~s0_valid & ~s1_valid & ~mac.cmd.valid)

        # Parameter beats fill the bias table (read when commands issue, so only once the
        # previous group's commands have left the issue pipeline) and one of two parameter
        # tables (scale, shift) that the replayer below sends to the post-processor.
        taking_params = Signal()
        sq_gi = Signal(16)        # group the sequencer is on
        hdr_count = Signal(16)    # headers decoded
        rep_gi = Signal(16)       # group the replayer is on
        pentry = data.StructLayout({"scale": 32, "shift": 6})
        ptab = Signal(data.ArrayLayout(pentry, 2 * slots))
        m.d.comb += ext.params.ready.eq(taking_params)
        pb = ext.params.payload
        with m.If(ext.params.valid & ext.params.ready):
            m.d.sync += [
                bias[pb.slot].eq(pb.bias),
                ptab[Cat(pb.slot, sq_gi[0]) if (slots & (slots - 1)) == 0 else
                     sq_gi[0] * slots + pb.slot].eq(Cat(pb.scale, pb.shift)),
            ]

        # Replayer: the post-processor takes one set of parameters per work unit, so each
        # group's parameters are sent once for every work unit, running ahead of the results
        # as far as the post-processor's two parameter banks allow.
        rep_base = Signal(24)
        rep_ocg = Signal(range(slots + 1))
        rep_slot = Signal(range(slots + 1))
        rep_ty = Signal(12)
        rep_tx = Signal(12)
        rep_rem = Signal(24)
        m.d.comb += rep_rem.eq(K - rep_base)
        rep_entry = Signal(pentry)
        m.d.comb += rep_entry.eq(ptab[Cat(rep_slot[:max(1, ceil_log2(slots))], rep_gi[0])
                                      if (slots & (slots - 1)) == 0 else
                                      rep_gi[0] * slots + rep_slot])
        pp = post.params.payload
        m.d.comb += [
            pp.slot.eq(rep_slot), pp.bias.eq(0), pp.scale.eq(rep_entry.scale),
            pp.shift.eq(rep_entry.shift), pp.group_last.eq(rep_slot + 1 == rep_ocg),
        ]
        with m.FSM(name="replay"):
            with m.State("IDLE"):
                with m.If(starting & (check == EngineError.NONE)):
                    m.d.sync += [rep_gi.eq(0), rep_base.eq(0), rep_ty.eq(0), rep_tx.eq(0),
                                 rep_slot.eq(0)]
                    m.next = "WAIT"
            with m.State("WAIT"):
                with m.If(hdr_count > rep_gi):
                    m.d.sync += rep_ocg.eq(Mux(rep_rem >= slots, slots, rep_rem))
                    m.next = "PUSH"
            with m.State("PUSH"):
                m.d.comb += post.params.valid.eq(1)
                with m.If(post.params.ready):
                    m.d.sync += rep_slot.eq(rep_slot + 1)
                    with m.If(rep_slot + 1 == rep_ocg):
                        m.d.sync += rep_slot.eq(0)
                        with m.If(rep_tx + 1 < tiles_x):
                            m.d.sync += rep_tx.eq(rep_tx + 1)
                        with m.Elif(rep_ty + 1 < tiles_y):
                            m.d.sync += [rep_tx.eq(0), rep_ty.eq(rep_ty + 1)]
                        with m.Else():
                            m.d.sync += [rep_tx.eq(0), rep_ty.eq(0), rep_gi.eq(rep_gi + 1),
                                         rep_base.eq(rep_base + slots)]
                            with m.If(rep_base + slots < K):
                                m.next = "WAIT"
                            with m.Else():
                                m.next = "IDLE"

        timed_out = Signal()
        wr_done = Signal()

        def watch():
            with m.If(timed_out):
                m.d.sync += err.eq(EngineError.TIMEOUT)
                m.next = "FAIL"

        with m.FSM(name="seq"):
            with m.State("IDLE"):
                with m.If(starting):
                    with m.If(check != EngineError.NONE):
                        m.d.sync += err.eq(check)
                        m.next = "FAIL"
                    with m.Else():
                        walker_reset(m, sq_group)
                        m.d.sync += [run.eq(1), sq_bank.eq(0), sq_ty.eq(0), sq_tx.eq(0),
                                     sq_gi.eq(0), hdr_count.eq(0)]
                        m.next = "CHECK"
            with m.State("CHECK"):
                # Checks that need the latched shape (halo width, buffer depth).
                with m.If(halo_w > RV):
                    m.d.sync += err.eq(EngineError.HALO)
                    m.next = "FAIL"
                with m.Else():
                    m.next = "GROUP"
            with m.State("GROUP"):
                walker_begin(m, sq_group)
                m.next = "WALK"
            with m.State("WALK"):
                with m.If(sq_group["i"] < sq_group["ocg"]):
                    goff = walker_step(m, sq_group)
                    m.d.sync += off[sq_group["i"][:max(1, ceil_log2(slots))]].eq(goff * L.icpg)
                with m.Else():
                    nch = (sq_group["glast"] - sq_group["g0"] + 1) * L.icpg
                    with m.If(nch * L.kh > depth):
                        m.d.sync += err.eq(EngineError.BUFFER)
                        m.next = "FAIL"
                    with m.Elif(pipe_empty & (rep_gi + 1 >= sq_gi)):
                        # The bias table is free and the replayer is done with the
                        # parameter table this header overwrites.
                        m.d.comb += ext.start_header.eq(1)
                        m.next = "HEADER"
            with m.State("HEADER"):
                m.d.comb += taking_params.eq(1)
                with m.If(ext.error):
                    m.d.sync += err.eq(EngineError.EXTRACT)
                    m.next = "FAIL"
                with m.Elif(ext.done):
                    m.d.sync += hdr_count.eq(hdr_count + 1)
                    m.next = "WAIT_BANK"
                watch()
            with m.State("WAIT_BANK"):
                with m.If(full.bit_select(sq_bank, 1) & ~release_pending.bit_select(sq_bank, 1)):
                    m.d.comb += ext.start_body.eq(1)
                    m.next = "BODY"
                watch()
            with m.State("BODY"):
                m.d.comb += issuing.eq(1)
                with m.If(ext.error):
                    m.d.sync += err.eq(EngineError.EXTRACT)
                    m.next = "FAIL"
                with m.Elif(ext.done):
                    m.d.sync += [release_pending.eq(release_pending |
                                                    Mux(sq_bank, 0b10, 0b01)),
                                 sq_bank.eq(~sq_bank)]
                    with m.If(sq_tx + 1 < tiles_x):
                        m.d.sync += sq_tx.eq(sq_tx + 1)
                        m.next = "WAIT_BANK"
                    with m.Elif(sq_ty + 1 < tiles_y):
                        m.d.sync += [sq_tx.eq(0), sq_ty.eq(sq_ty + 1)]
                        m.next = "WAIT_BANK"
                    with m.Else():
                        m.d.sync += [sq_tx.eq(0), sq_ty.eq(0), sq_gi.eq(sq_gi + 1),
                                     sq_group["oc_base"].eq(sq_group["oc_base"] + slots)]
                        with m.If(sq_group["oc_base"] + slots < K):
                            m.next = "GROUP"
                        with m.Else():
                            m.next = "FINISH"
                watch()
            with m.State("FINISH"):
                with m.If(post.error):
                    m.d.sync += err.eq(EngineError.POSTPROC)
                    m.next = "FAIL"
                with m.Elif(wr_done):
                    m.d.comb += self.done.eq(1)
                    m.d.sync += run.eq(0)
                    m.next = "IDLE"
                watch()
            with m.State("FAIL"):
                # Report, then clear the whole datapath (FSMs, FIFOs, pipelines).
                m.d.comb += [fail.eq(1), self.done.eq(1), flush.eq(1)]

        # ---- Output circuit ------------------------------------------------------------------
        wr_group = Signal(24)     # oc_base
        wr_ocg = Signal(range(slots + 1))
        wr_count = Signal(range(slots + 1))
        wr_ty = Signal(12)
        wr_tx = Signal(12)
        wr_y = Signal(range(max_rows + 1))
        res = post.out
        o = self.out.payload
        m.d.comb += [
            o.oc.eq(wr_group + res.payload.slot),
            o.y.eq((wr_ty << log2h) + wr_y),
            o.x.eq(wr_tx << L.log2w),
        ]
        for x in range(n):
            # values[x] = result lane wr_y * W + x for x < W.
            lane = Signal(range(n), name=f"wr_lane{x}")
            m.d.comb += lane.eq((wr_y << L.log2w) + x)
            m.d.comb += [
                o.values[x].eq(res.payload.values[lane]),
                o.mask[x].eq((x < W) & ((wr_tx << L.log2w) + x < L.out_w)),
            ]
        row_ok = Signal()
        m.d.comb += row_ok.eq((wr_ty << log2h) + wr_y < L.out_h)
        wr_rem = Signal(24)
        m.d.comb += wr_rem.eq(K - wr_group)
        with m.FSM(name="writer"):
            with m.State("IDLE"):
                with m.If(starting & (check == EngineError.NONE)):
                    m.d.sync += [wr_group.eq(0), wr_ty.eq(0), wr_tx.eq(0), wr_y.eq(0),
                                 wr_count.eq(0)]
                    m.next = "GROUP"
            with m.State("GROUP"):
                m.d.sync += wr_ocg.eq(Mux(wr_rem >= slots, slots, wr_rem))
                m.next = "ROWS"
            with m.State("ROWS"):
                m.d.comb += self.out.valid.eq(res.valid & row_ok)
                step = Signal()
                m.d.comb += step.eq(res.valid & (~row_ok | self.out.ready))
                with m.If(step):
                    with m.If(wr_y + 1 < H):
                        m.d.sync += wr_y.eq(wr_y + 1)
                    with m.Else():
                        m.d.comb += res.ready.eq(1)
                        m.d.sync += [wr_y.eq(0), wr_count.eq(wr_count + 1)]
                        with m.If(wr_count + 1 == wr_ocg):
                            m.d.sync += wr_count.eq(0)
                            with m.If(wr_tx + 1 < tiles_x):
                                m.d.sync += wr_tx.eq(wr_tx + 1)
                            with m.Elif(wr_ty + 1 < tiles_y):
                                m.d.sync += [wr_tx.eq(0), wr_ty.eq(wr_ty + 1)]
                            with m.Else():
                                m.d.sync += [wr_tx.eq(0), wr_ty.eq(0),
                                             wr_group.eq(wr_group + slots)]
                                with m.If(wr_group + slots < K):
                                    m.next = "GROUP"
                                with m.Else():
                                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += wr_done.eq(1)
                with m.If(self.done):
                    m.next = "IDLE"

        # ---- Watchdog and counters ---------------------------------------------------------
        moved = (mac.cmd.valid & mac.cmd.ready) | row_fire | data_fire | \
            (self.out.valid & self.out.ready) | kfifo.w_en | k_issue | \
            (ext.params.valid & ext.params.ready) | (res.valid & res.ready) | \
            (mac.res.valid & mac.res.ready) | \
            (post.params.valid & post.params.ready)
        idle = Signal(range(self.timeout + 1))
        with m.If(~run | moved):
            m.d.sync += idle.eq(0)
        with m.Elif(idle != self.timeout):
            m.d.sync += idle.eq(idle + 1)
        m.d.comb += timed_out.eq(idle == self.timeout)

        # ---- Status kept across the soft reset ---------------------------------------------
        with top.If(starting):
            top.d.sync += [self.error.eq(0), self.error_code.eq(0),
                           self.cycles.eq(0), self.mac_active.eq(0)]
        with top.Elif(run):
            top.d.sync += [self.cycles.eq(self.cycles + 1),
                           self.mac_active.eq(self.mac_active + mac.active)]
        with top.If(fail):
            top.d.sync += [self.error.eq(1), self.error_code.eq(err)]
        return top
