"""The sequencer: the layer's control, the kernel extractor's starts and the MAC command issue.

For every output-channel group the sequencer works out each slot's input channels (the group
walker), starts the extractor on the group's header (its parameter beats fill the bias table
and the replayer's parameter tables), then for every work unit waits for the loader's bank and
starts the extractor on the body. Coefficient beats become MAC commands through the issue
pipeline (``docs/neural_engine.md``)::

    S0: the beat, and the input-buffer row it reads: bank, (slot base + ic) * kh + ky
    S1: the rows are read; the shifter picks each lane's input at kernel column kx
    S2: the MAC command register

With ``NPUConfig.ne_shift_stages`` 1 the shifter has a register of its own, loaded as the
pipeline advances (``read_en``), and the beat spends one more stage between S1 and S2.

A slot whose kernel is all zero gets one ``hold`` beat: a command that yields exactly its bias
(``MAX`` against a product of -infinity on binary32 accumulators, ``MAC`` with coefficient 0
on int32 ones).

The sequencer also ends the layer: ``finish`` once the writer has written the last result, or
with an error code (the halo and buffer checks, the extractor's and the post-processor's
errors, the watchdog), when it also clears the datapath (``fail``).
"""

from amaranth.hdl import Cat, Module, Mux, Shape, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.formats import F16_NEG_INF, F16_ONE
from npu_spec.neural import out_channel_limit, out_size_limit

from ..lib.arith import narrow_mul
from ..lib.loop import LoopNest
from .block_ram import block_memory, registered_read
from .group_walker import GroupWalker
from .layer import EngineError
from .layouts import (
    MacOp,
    coef_beat_layout,
    geometry_layout,
    group_bits,
    kernel_config_layout,
    layer_layout,
    mac_command_layout,
    param_beat_layout,
    param_store_layout,
)

__all__ = ["Sequencer"]


class Sequencer(wiring.Component):
    """Sequencer of one neural engine core.

    Parameters
    ----------
    config : NPUConfig
    row_values, buffer_rows : int
        Input-buffer geometry (the halo and buffer limits).

    Members
    -------
    go : In(1)
        A layer starts.
    check : In(EngineError)
        The start-time check (``LayerSetup``): a code other than ``NONE`` ends the layer at
        once.
    layer : In(layer_layout())
    geometry : In(geometry_layout(macs))
    ext_cfg : Out(kernel_config_layout(slots))
        The kernel extractor's configuration for the current group.
    start_header, start_body : Out(1)
        Start the extractor on a header or a body part.
    ext_done, ext_error : In(1)
        The extractor finished the part, or found it malformed.
    coefs : In(stream.Signature(coef_beat_layout(slots)))
        Coefficient beats, taken while a body is decoded.
    params : In(stream.Signature(param_beat_layout(slots)))
        Parameter beats, taken while a header is decoded.
    store : Out(param_store_layout(slots))
        Each parameter beat's scale and shift, for the replayer.
    headers : Out(group_bits)
        Headers decoded in this layer.
    group : Out(group_bits)
        The group the sequencer is on. Group counters are ``group_bits(config)`` bits wide
        (``npu.neural.layouts``): as many as the build's output-channel groups need.
    replay_group : In(group_bits)
        The group the replayer is on: a header is decoded only once the replayer has left the
        group whose parameter table it overwrites.
    full : In(2)
        The input buffer's full banks ...
    release : Out(2)
        ... and the banks whose last read has been made.
    read_addr : Out(range(2 * buffer_rows)), read_en : Out(1)
        The input-buffer row read for the beat in S0.
    kx : Out(4)
        Kernel column of the beat in S0, whose rows are read (for the shifter, which takes it
        with ``read_en`` and applies it to the rows in S1).
    lanes : In(data.ArrayLayout(16, macs))
        The shifter's output: each lane's input for the beat in S1, or with
        ``ne_shift_stages`` 1 for the beat in the stage after S1.
    cmd : Out(stream.Signature(mac_command_layout(macs, slots)))
        MAC commands.
    post_error : In(1)
        The post-processor could not process a result (sticky).
    written : In(1)
        The writer has written the layer's last result.
    timeout : In(1)
        The watchdog expired.
    finish : Out(1)
        The layer ends in this cycle ...
    code : Out(EngineError)
        ... with this code.
    fail : Out(1)
        The layer ended with an error: clear the datapath.
    """

    def __init__(self, config, row_values, buffer_rows):
        self._config = config
        self._row_values = row_values
        self._buffer_rows = buffer_rows
        n, slots = config.macs, config.acc_slots
        gb = group_bits(config)
        super().__init__({
            "go":           In(1),
            "check":        In(EngineError),
            "layer":        In(layer_layout()),
            "geometry":     In(geometry_layout(n)),
            "ext_cfg":      Out(kernel_config_layout(slots)),
            "start_header": Out(1),
            "start_body":   Out(1),
            "ext_done":     In(1),
            "ext_error":    In(1),
            "coefs":        In(stream.Signature(coef_beat_layout(slots))),
            "params":       In(stream.Signature(param_beat_layout(slots))),
            "store":        Out(param_store_layout(slots)),
            "headers":      Out(gb),
            "group":        Out(gb),
            "replay_group": In(gb),
            "full":         In(2),
            "release":      Out(2),
            "read_addr":    Out(range(2 * buffer_rows)),
            "read_en":      Out(1),
            "kx":           Out(4),
            "lanes":        In(data.ArrayLayout(16, n)),
            "cmd":          Out(stream.Signature(mac_command_layout(n, slots))),
            "post_error":   In(1),
            "written":      In(1),
            "timeout":      In(1),
            "finish":       Out(1),
            "code":         Out(EngineError),
            "fail":         Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        slots = self._config.acc_slots
        layer = self.layer
        geo = self.geometry

        m.submodules.walker = walker = GroupWalker(slots)
        channel_bits = out_channel_limit(self._config).bit_length()
        tile_bits = out_size_limit(self._config).bit_length()
        m.submodules.tiles = tiles = LoopNest([("base", channel_bits, slots),
                                               ("ty", tile_bits), ("tx", tile_bits)])
        m.d.comb += [
            walker.ocpg.eq(layer.ocpg), walker.icpg.eq(layer.icpg),
            walker.remaining.eq(geo.out_channels - tiles.index.base),
            tiles.limit.base.eq(geo.out_channels), tiles.limit.ty.eq(geo.tiles_y),
            tiles.limit.tx.eq(geo.tiles_x),
            self.ext_cfg.coef_fp16.eq(geo.fp_coef),
            self.ext_cfg.sparse.eq(layer.sparse),
            self.ext_cfg.palette.eq(layer.palette),
            self.ext_cfg.icg.eq(layer.icpg),
            self.ext_cfg.kh.eq(layer.kh),
            self.ext_cfg.kw.eq(layer.kw),
            self.ext_cfg.ocg.eq(walker.ocg),
        ]

        bank = Signal()                                     # the bank the bodies read
        # Input-channel offset per slot, kept only as wide as the buffer address it ends in.
        addr_bits = Shape.cast(range(2 * self._buffer_rows)).width
        slot_base = Signal(data.ArrayLayout(addr_bits, slots))
        # The bias table: a memory written by the parameter beats and read in S0 for the beat
        # entering S1 (`_issue`).
        m.submodules.bias = bias = block_memory(32, slots)
        issuing = Signal()          # a body is decoded: take coefficient beats
        in_flight, pipe_empty = self._issue(m, bank, slot_base, bias, issuing)

        # Bank release: the extractor finished the body and no beat of the bank is still
        # before the buffer read (the body's end sets `release_pending` in the FSM below,
        # which overrides this update in that cycle).
        release_pending = Signal(2)
        release = Signal(2)
        m.d.comb += [release.eq(release_pending & ~in_flight), self.release.eq(release)]
        m.d.sync += release_pending.eq(release_pending & ~release)

        # Parameter beats fill the bias table (read when commands issue, so only once the
        # previous group's commands have left the issue pipeline) and the replayer's tables.
        taking_params = Signal()
        p = self.params.payload
        m.d.comb += [
            self.params.ready.eq(taking_params),
            self.store.en.eq(self.params.valid & self.params.ready),
            self.store.bank.eq(self.group[0]),
            self.store.slot.eq(p.slot),
            self.store.scale.eq(p.scale),
            self.store.shift.eq(p.shift),
        ]
        bias_write = bias.write_port()
        m.d.comb += [bias_write.en.eq(self.store.en), bias_write.addr.eq(p.slot),
                     bias_write.data.eq(p.bias)]

        error = Signal(EngineError)
        m.d.comb += self.code.eq(error)

        def watch():
            with m.If(self.timeout):
                m.d.sync += error.eq(EngineError.TIMEOUT)
                m.next = "FAIL"

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.go):
                    with m.If(self.check != EngineError.NONE):
                        m.d.sync += error.eq(self.check)
                        m.next = "FAIL"
                    with m.Else():
                        m.d.comb += [walker.restart.eq(1), tiles.restart.eq(1)]
                        m.d.sync += [bank.eq(0), self.group.eq(0), self.headers.eq(0)]
                        m.next = "CHECK"
            with m.State("CHECK"):
                # The checks that need the registered shape.
                with m.If(geo.halo_w > self._row_values):
                    m.d.sync += error.eq(EngineError.HALO)
                    m.next = "FAIL"
                with m.Else():
                    m.next = "GROUP"
            with m.State("GROUP"):
                m.d.comb += walker.begin.eq(1)
                m.next = "WALK"
            with m.State("WALK"):
                with m.If(walker.walking):
                    m.d.comb += walker.step.eq(1)
                    m.d.sync += slot_base[walker.index].eq(walker.slot_base)
                with m.Elif(self._rows_exceed(walker.in_count, layer.kh)):
                    m.d.sync += error.eq(EngineError.BUFFER)
                    m.next = "FAIL"
                with m.Elif(pipe_empty & (self.replay_group + 1 >= self.group)):
                    # The bias table is free and the replayer is done with the parameter
                    # table this header overwrites.
                    m.d.comb += self.start_header.eq(1)
                    m.next = "HEADER"
            with m.State("HEADER"):
                m.d.comb += taking_params.eq(1)
                with m.If(self.ext_error):
                    m.d.sync += error.eq(EngineError.EXTRACT)
                    m.next = "FAIL"
                with m.Elif(self.ext_done):
                    m.d.sync += self.headers.eq(self.headers + 1)
                    m.next = "WAIT_BANK"
                watch()
            with m.State("WAIT_BANK"):
                with m.If(self.full.bit_select(bank, 1) & ~release_pending.bit_select(bank, 1)):
                    m.d.comb += self.start_body.eq(1)
                    m.next = "BODY"
                watch()
            with m.State("BODY"):
                m.d.comb += issuing.eq(1)
                with m.If(self.ext_error):
                    m.d.sync += error.eq(EngineError.EXTRACT)
                    m.next = "FAIL"
                with m.Elif(self.ext_done):
                    m.d.comb += tiles.advance.eq(1)
                    m.d.sync += [release_pending.eq(release_pending | Mux(bank, 0b10, 0b01)),
                                 bank.eq(~bank)]
                    with m.If(~tiles.last.ty | ~tiles.last.tx):
                        m.next = "WAIT_BANK"
                    with m.Else():
                        m.d.sync += self.group.eq(self.group + 1)
                        with m.If(~tiles.last.base):
                            m.next = "GROUP"
                        with m.Else():
                            m.next = "FINISH"
                watch()
            with m.State("FINISH"):
                with m.If(self.post_error):
                    m.d.sync += error.eq(EngineError.POSTPROC)
                    m.next = "FAIL"
                with m.Elif(self.written):
                    m.d.comb += self.finish.eq(1)
                    m.next = "IDLE"
                watch()
            with m.State("FAIL"):
                # Report; the engine clears the whole datapath (FSMs, queues, pipelines).
                m.d.comb += [self.fail.eq(1), self.finish.eq(1)]
        return m

    def _rows_exceed(self, count, kh):
        """``count * kh > buffer_rows`` with a product only as wide as ``buffer_rows``
        needs."""
        limit = self._buffer_rows
        width = limit.bit_length() + len(kh)
        return (count > limit) | (narrow_mul(count, kh, width) > limit)

    def _issue(self, m, bank, slot_base, bias, issuing):
        """The issue pipeline: coefficient beats (while ``issuing``) to MAC commands. Returns
        what the control needs of it: ``in_flight`` (the bank of the beat in S0 that has not
        been read yet, one bit per bank) and ``pipe_empty`` (no beat in S0, S1 or S2)."""
        layer = self.layer
        geo = self.geometry
        depth = self._buffer_rows
        beat = self.coefs.payload
        # The pipeline's data registers have no reset (the valid bits, which have one,
        # qualify them), so the core's clear reaches only the control flip-flops.
        cmd = Signal.like(self.cmd.payload, name="cmd_reg", reset_less=True)
        m.d.comb += self.cmd.payload.eq(cmd)

        advance = Signal()
        m.d.comb += [advance.eq(~self.cmd.valid | self.cmd.ready),
                     self.coefs.ready.eq(advance & issuing)]
        s0 = Signal.like(beat, name="s0", reset_less=True)
        s0_valid = Signal()
        s0_bank = Signal(reset_less=True)
        s0_addr = Signal(range(2 * depth), reset_less=True)
        s1 = Signal.like(beat, name="s1", reset_less=True)
        s1_valid = Signal()
        # The bias of the beat entering S1, read as it moves (the table is written only while
        # the pipeline is empty, before a group's first beat).
        bias_read = registered_read(m, bias, s0.slot, advance, name="bias_read")
        with m.If(advance):
            m.d.sync += [
                s0.eq(beat), s0_valid.eq(self.coefs.valid & issuing), s0_bank.eq(bank),
                s0_addr.eq(Mux(bank, depth, 0)
                           + narrow_mul(slot_base[beat.slot] + beat.ic, layer.kh, len(s0_addr))
                           + beat.ky),
                s1.eq(s0), s1_valid.eq(s0_valid),
            ]
        m.d.comb += [self.read_addr.eq(s0_addr), self.read_en.eq(advance), self.kx.eq(s0.kx)]

        # The shifter's own stages: the beat and its bias wait there for its lanes.
        late, late_valid, late_bias = s1, s1_valid, bias_read
        stages = [s1_valid]
        for k in range(self._config.ne_shift_stages):
            nxt = Signal.like(beat, name=f"shift{k}", reset_less=True)
            nxt_valid = Signal(name=f"shift{k}_valid")
            nxt_bias = Signal.like(bias_read, name=f"shift{k}_bias", reset_less=True)
            with m.If(advance):
                m.d.sync += [nxt.eq(late), nxt_valid.eq(late_valid), nxt_bias.eq(late_bias)]
            late, late_valid, late_bias = nxt, nxt_valid, nxt_bias
            stages.append(nxt_valid)

        # S2: the command. A hold beat of a float format multiplies -inf by 1.0 (or int8 1).
        fp_data, fp_coef, is_int = geo.fp_data, geo.fp_coef, geo.is_int
        hold_data = Mux(fp_data, F16_NEG_INF, 1)
        hold_coef = Mux(fp_data, Mux(fp_coef, F16_ONE, 1), F16_NEG_INF)
        with m.If(advance):
            m.d.sync += [
                self.cmd.valid.eq(late_valid),
                cmd.op.eq(Mux(late.hold & ~is_int, MacOp.MAX, MacOp.MAC)),
                cmd.fmt.eq(layer.fmt),
                cmd.slot.eq(late.slot),
                cmd.first.eq(late.first),
                cmd.last.eq(late.last),
                cmd.dual.eq(0),
                cmd.bias.eq(late_bias),
                cmd.coef[0].eq(Mux(late.hold, Mux(is_int, 0, hold_coef), late.coef)),
                cmd.coef[1].eq(0),
            ]
            m.d.sync += [cmd.data[i].eq(Mux(late.hold & ~is_int, hold_data, self.lanes[i]))
                         for i in range(self._config.macs)]

        in_flight = Signal(2)
        pipe_empty = Signal()
        m.d.comb += [
            in_flight.eq(Mux(s0_valid, Mux(s0_bank, 0b10, 0b01), 0)),
            pipe_empty.eq(~s0_valid & ~Cat(*stages).any() & ~self.cmd.valid),
        ]
        return in_flight, pipe_empty
