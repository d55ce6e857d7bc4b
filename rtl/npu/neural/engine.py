"""The neural engine core: the composition of its sub-units (``docs/neural_engine.md``).

::

    kernel memory -> KernelDMA -> KernelExtract -> Sequencer -> MacArray -> result queue
                                                       |  ^                      |
                  row_req/row_data <-> Loader -> InputBuffer -> Shifter          v
                                                       |                   PostProcessor
                                                 ParamReplay -----------------^  |
                                                                         Writer -> out

Each process keeps its own copy of the loop position (output-channel group, tile row, tile
column; ``npu.lib.loop.LoopNest``); nothing but data travels between them. A layer is
programmed through the engine's registers (``npu_spec.neural.NEURAL_ENGINE``), which the core
samples when the layer starts (so the next layer may be programmed while one runs), and started,
ended and aborted through the shared engine interface (``npu.lib.engine.EngineControl``).
"""

from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.config import NPUConfig
from npu_spec.engine import TASK_OFFSET
from npu_spec.neural import (
    LAYER_REGISTERS,
    core_base,
    core_register_map,
    engine_geometry,
    out_channel_limit,
    out_size_limit,
    shift_beats,
)
from npu_spec.neural import post_lanes as spec_post_lanes

from ..lib.csr import CSRSignature
from ..lib.engine import EngineControl, EngineSignature, WriteLayout
from ..lib.pipe import Queue
from .input_buffer import InputBuffer
from .kernel_dma import KernelDMA
from .kernel_extract import kernel_extractor
from .layer import EngineError, LayerSetup
from .layouts import (
    KernelReadSignature,
    group_bits,
    layer_layout,
    mac_result_layout,
    row_data_layout,
    row_request_layout,
    row_tag_layout,
    row_write_layout,
)
from .loader import Loader
from .mac_select import mac_array, shared_mac_unit
from .postproc_seq import post_processor
from .replay import ParamReplay
from .sequencer import Sequencer
from .shifter import Shifter, StrideOrder, value_bits
from .watchdog import Watchdog
from .writer import Writer

__all__ = ["EngineError", "NeuralEngine", "engine_geometry"]


class NeuralEngine(wiring.Component):
    """One neural engine core.

    Parameters
    ----------
    config : NPUConfig
    core : int
        Which core: its registers are at ``npu_spec.neural.core_base(core)``.
    row_values, buffer_rows : int or None
        Input-buffer geometry (defaults: ``npu_spec.neural.engine_geometry``).
    timeout : int
        Cycles without any stream moving after which a layer ends with ``TIMEOUT``.
    post_lanes : int or None
        Lanes the post-processor handles per cycle (default ``npu_spec.neural.post_lanes``:
        ``config.ne_post_lanes``, or a quarter of the MACs).
    shared : SharedModules or None
        Library of shared blocks (``npu.lib.shared``; Verilog output only): the MAC array is
        built from instances of one converted MAC unit.

    Members
    -------
    writes : In(stream.Signature(WriteLayout))
        Register writes from the task manager (absolute word addresses).
    csr : In(CSRSignature(...))
        The host's access to the core's registers (offsets).
    task : In(EngineSignature())
        Start, done with the error code (``EngineError``), abort.
    kmem : Out(KernelReadSignature())
        Read port of the kernel memory.
    row_req : Out(stream.Signature(row_request_layout(tag)))
        Input rows wanted: channel ``c``, row ``y``, first column ``x`` (signed: padding), and
        a ``tag`` to return with the data.
    row_data : In(stream.Signature(row_data_layout(row_values, tag)))
        ``row_values`` inputs ``x .. x + row_values - 1`` of the row (zeros outside the
        image), in request order, with the request's ``tag``; always accepted.
    out : Out(stream.Signature(row_write_layout(macs)))
        Output row writes: channel ``oc``, row ``y``, first column ``x``, ``values`` (column
        ``x + j`` at index ``j``) and ``mask`` (which values to write).
    """

    def __init__(self, config, *, core=0, row_values=None, buffer_rows=None, timeout=1 << 14,
                 post_lanes=None, shared=None):
        if not isinstance(config, NPUConfig):
            raise TypeError(f"config must be an NPUConfig, not {config!r}")
        n = config.macs
        if n & (n - 1):
            raise ValueError(f"the neural engine needs a power-of-two MAC count, not {n}")
        if not isinstance(core, int) or isinstance(core, bool) or not 0 <= core < config.cores:
            raise ValueError(f"core must be a core index below {config.cores}, not {core!r}")
        self._config = config
        self._core = core
        self.max_rows, self.row_values, self.buffer_rows = engine_geometry(
            config, row_values, buffer_rows)
        if self.row_values & (self.row_values - 1):
            raise ValueError(f"row_values must be a power of two, not {self.row_values}")
        self.timeout = timeout
        self._shared = shared
        # A result beat leaves at most once per input channel x kernel taps of its slot;
        # post-processing a quarter of the lanes per cycle (the default) keeps up with 4 or
        # more taps and needs a quarter of the multipliers.
        self.post_lanes = post_lanes or spec_post_lanes(config)
        self._control = EngineControl(core_register_map(config), base=core_base(core),
                                      read_path=config.csr_read)
        self.tag_layout = row_tag_layout(self.max_rows, self.buffer_rows)
        super().__init__({
            "writes":   In(stream.Signature(WriteLayout)),
            "csr":      In(CSRSignature(self._control.regs.addr_width)),
            "task":     In(EngineSignature()),
            "kmem":     Out(KernelReadSignature()),
            "row_req":  Out(stream.Signature(row_request_layout(self.tag_layout))),
            "row_data": In(stream.Signature(row_data_layout(self.row_values, self.tag_layout))),
            "out":      Out(stream.Signature(row_write_layout(n))),
        })

    @property
    def config(self):
        return self._config

    @property
    def core(self):
        return self._core

    @property
    def base(self):
        """Word address of the core's registers on the register-write port."""
        return self._control.base

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        n, slots = cfg.macs, cfg.acc_slots
        m.submodules.control = control = self._control
        lean = cfg.ne_control == "lean"
        for name in ("writes", "task") if lean else ("writes", "csr", "task"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(control, name))
        live, layer = self._layer_registers(m, control, lean)

        # The datapath: everything but the register file and the counters, cleared after an
        # error (the sequencer's `fail`) and by an abort.
        dp = Module()
        fail = Signal()
        m.submodules.datapath = ResetInserter(fail | control.flush)(dp)

        dp.submodules.setup = setup = LayerSetup(cfg, self.max_rows)
        ch = out_channel_limit(cfg).bit_length()
        # Work units down and across the output are at most its rows and columns.
        tb = out_size_limit(cfg).bit_length()
        dp.submodules.dma = dma = KernelDMA(slots, channel_bits=ch, tile_bits=tb,
                                            queue_depth=cfg.ne_kernel_queue or 8)
        dp.submodules.extract = ext = kernel_extractor(cfg)
        bits = value_bits(cfg)
        dp.submodules.loader = loader = Loader(n, slots, self.max_rows, self.row_values,
                                               self.buffer_rows, bits, channel_bits=ch,
                                               tile_bits=tb)
        dp.submodules.buffer = buffer = InputBuffer(self.max_rows, self.row_values,
                                                    self.buffer_rows, bits)
        strides = {s for _, s in shift_beats(cfg, self.row_values)}
        dp.submodules.order = order = StrideOrder(self.row_values, bits, strides)
        dp.submodules.shifter = shifter = Shifter(cfg, self.max_rows, self.row_values, bits,
                                                  stages=cfg.ne_shift_stages)
        dp.submodules.sequencer = seq = Sequencer(cfg, self.row_values, self.buffer_rows)
        dp.submodules.mac = mac = mac_array(cfg, unit=shared_mac_unit(cfg, self._shared))
        # The slots of a work unit finish on consecutive commands and the post-processor takes
        # macs / post_lanes cycles per result: a queue of one result per slot (the default of
        # `result_queue`) absorbs the burst, so the MAC array never waits for the
        # post-processor; a lean build keeps fewer and lets the MAC array wait. The MAC array
        # holds its last result until it is taken, so `result_queue` results wait with
        # `result_queue - 1` queue entries, and with 1 the array feeds the post-processor
        # directly.
        entries = cfg.result_queue - 1 if cfg.result_queue else slots
        if entries:
            dp.submodules.results = results = Queue(mac_result_layout(n, slots), entries)
        dp.submodules.replay = replay = ParamReplay(n, slots, channel_bits=ch, tile_bits=tb,
                                                    group_bits=group_bits(cfg))
        dp.submodules.post = post = post_processor(cfg, lanes_per_cycle=self.post_lanes)
        dp.submodules.writer = writer = Writer(n, slots, self.max_rows, channel_bits=ch,
                                               tile_bits=tb)
        dp.submodules.watchdog = watchdog = Watchdog(self.timeout)

        # Start: every process begins its loops once the layer's geometry is known (`ready`,
        # registered: at least a cycle after `go`, so the task manager's start and the
        # processes' starts are not one path), if the start check passed.
        geo = setup.geometry
        begin = Signal()
        dp.d.comb += [
            setup.layer.eq(live), setup.go.eq(control.go),
            begin.eq(setup.ready & (setup.check == EngineError.NONE)),
            seq.go.eq(setup.ready), seq.check.eq(setup.check),
            dma.start.eq(begin), loader.start.eq(begin), replay.start.eq(begin),
            writer.start.eq(begin),
            post.error_clear.eq(setup.ready), post.lfsr_load.eq(setup.ready),
            mac.error_clear.eq(setup.ready),
        ]
        for unit in (loader, seq, writer):
            dp.d.comb += [unit.layer.eq(layer), unit.geometry.eq(geo)]
        dp.d.comb += replay.geometry.eq(geo)
        dp.d.comb += [getattr(post.cfg, name).eq(getattr(layer, name))
                      for name, _ in post.cfg.shape()]

        # Kernels: DMA, extractor, sequencer.
        dp.d.comb += [dma.table.eq(layer.addr), dma.out_channels.eq(geo.out_channels),
                      dma.tiles_y.eq(geo.tiles_y), dma.tiles_x.eq(geo.tiles_x)]
        wiring.connect(dp, dma.kmem, wiring.flipped(self.kmem))
        wiring.connect(dp, dma.header, ext.header)
        wiring.connect(dp, dma.body, ext.body)
        wiring.connect(dp, ext.coefs, seq.coefs)
        wiring.connect(dp, ext.params, seq.params)
        dp.d.comb += [
            ext.cfg.eq(seq.ext_cfg), ext.start_header.eq(seq.start_header),
            ext.start_body.eq(seq.start_body),
            seq.ext_done.eq(ext.done), seq.ext_error.eq(ext.error),
        ]

        # Inputs: loader, input buffer, shifter.
        wiring.connect(dp, wiring.flipped(self.row_req), loader.row_req)
        wiring.connect(dp, wiring.flipped(self.row_data), loader.row_data)
        # The rows go into the buffer in stride order (the shifter reads them so).
        dp.d.comb += [
            buffer.write.en.eq(loader.buffer.en), buffer.write.row.eq(loader.buffer.row),
            buffer.write.addr.eq(loader.buffer.addr), order.stride.eq(layer.stride),
            order.values.eq(loader.buffer.values), buffer.write.values.eq(order.ordered),
        ]
        dp.d.comb += [
            buffer.fill.eq(loader.fill), loader.full.eq(buffer.full),
            buffer.release.eq(seq.release), seq.full.eq(buffer.full),
            buffer.read_addr.eq(seq.read_addr), buffer.read_en.eq(seq.read_en),
            shifter.rows.eq(buffer.rows), shifter.kx.eq(seq.kx), shifter.en.eq(seq.read_en),
            shifter.dilation.eq(layer.dilation), shifter.stride.eq(layer.stride),
            shifter.log2w.eq(layer.log2w),
        ]
        dp.d.comb += [seq.lanes[i].eq(shifter.lanes[i]) for i in range(n)]

        # Results: MAC array, result queue, post-processor (with the replayed parameters),
        # writer.
        wiring.connect(dp, seq.cmd, mac.cmd)
        if entries:
            wiring.connect(dp, mac.res, results.w)
            wiring.connect(dp, results.r, post.res)
        else:
            wiring.connect(dp, mac.res, post.res)
        wiring.connect(dp, replay.params, post.params)
        wiring.connect(dp, post.out, writer.res)
        wiring.connect(dp, writer.out, wiring.flipped(self.out))
        dp.d.comb += [
            replay.store.eq(seq.store), replay.headers.eq(seq.headers),
            seq.replay_group.eq(replay.group),
        ]

        # The layer's end.
        def fire(port):
            return port.valid & port.ready
        dp.d.comb += [
            watchdog.run.eq(control.busy),
            watchdog.moved.eq(fire(mac.cmd) | fire(self.row_req) | fire(self.row_data)
                              | fire(self.out) | dma.moved | fire(ext.params)
                              | fire(post.out) | fire(mac.res) | fire(post.params)),
            seq.timeout.eq(watchdog.expired),
            seq.post_error.eq(post.error),
            seq.written.eq(writer.done),
            writer.ack.eq(seq.finish),
            fail.eq(seq.fail),
            # The MAC array takes the clear on a port (its units may be shared instances).
            mac.flush.eq(fail | control.flush),
            control.finish.eq(seq.finish),
            control.code.eq(seq.code),
        ]

        # MAC_ACTIVE: cycles of the layer in which the MAC array took a command.
        mac_active = Signal(32)
        with m.If(control.go):
            m.d.sync += mac_active.eq(0)
        with m.Elif(control.busy):
            m.d.sync += mac_active.eq(mac_active + mac.active)
        m.d.comb += control.regs.mac_active.count.eq(mac_active)
        return m

    def _layer_registers(self, m, control, lean):
        """The layer registers (``layer_layout()``): as the layer setup reads them at `go`
        (the register file itself), and as the sub-units read them from its `ready` on.

        Full build: the setup registers all it derives at `go`, so it reads the register file
        only then; the sub-units read a copy taken at `go` until the next start, so that
        writes landing while a layer runs (the host's; the task manager's wait in
        ``EngineControl``) only change the next layer. Lean build
        (``ne_control="lean"``): the register file itself; the host's writes to the layer
        registers are refused while the core is busy (and in the cycle it starts), with the
        CSR error strobe in the next cycle, like an access to an unmapped address."""
        live = Signal(layer_layout())
        for reg in LAYER_REGISTERS:
            port = control.regs.port(reg.name)
            m.d.comb += [getattr(live, f.name).eq(getattr(port, f.name)) for f in reg.fields]
        if lean:
            host, inner = self.csr, control.csr
            refused = Signal()
            refused_last = Signal()
            m.d.comb += [
                refused.eq(host.w_en & (host.addr >= TASK_OFFSET) & (control.busy | control.go)),
                inner.addr.eq(host.addr), inner.w_data.eq(host.w_data),
                inner.r_en.eq(host.r_en), inner.w_en.eq(host.w_en & ~refused),
                host.r_data.eq(inner.r_data), host.error.eq(inner.error | refused_last),
            ]
            m.d.sync += refused_last.eq(refused)
            return live, live
        held = Signal(layer_layout(), reset_less=True)
        with m.If(control.go):
            m.d.sync += held.eq(live)
        return live, held
