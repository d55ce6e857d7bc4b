# amaranth: UnusedElaboratable=no
"""The sequencer (npu.neural.sequencer) against npu_model.neural.mac_commands: the kernel
extractor stood in for by its golden model (npu_model.kernel_codec), the input buffer by a
memory whose rows tell their address, a loader that refills banks late, a replayer that lags,
a MAC array that stalls; and every way a layer ends."""

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module, Signal

from npu.neural.layer import EngineError
from npu.neural.sequencer import Sequencer
from npu_model import kernel_codec as kc
from npu_model.neural import mac_commands
from npu_spec.config import preset
from npu_spec.neural import engine_geometry
from tests.support.csr import run
from tests.support.neural import geometry, random_groups, random_layer

CONFIG = preset("small")
MAX_ROWS, ROW_VALUES, BUFFER_ROWS = engine_geometry(CONFIG)


def lane_value(addr, kx, lane):
    """What the stand-in buffer gives lane ``lane`` for row ``addr`` at kernel column ``kx``."""
    return (((addr << 4) | kx) + lane) & 0xFFFF


class Bench(Elaboratable):
    """The sequencer with the stand-in input buffer (read in one cycle) and a stand-in
    shifter that takes the beat's ``kx`` with the read and has ``stages`` registers
    (``ne_shift_stages``), loaded on ``read_en`` as the real one's."""

    def __init__(self, stages=0):
        self.stages = stages
        self.seq = Sequencer(CONFIG.replace(ne_shift_stages=stages), ROW_VALUES, BUFFER_ROWS)

    def elaborate(self, platform):
        m = Module()
        m.submodules.seq = seq = self.seq
        held = Signal.like(seq.read_addr)
        kx = Signal.like(seq.kx)
        with m.If(seq.read_en):
            m.d.sync += [held.eq(seq.read_addr), kx.eq(seq.kx)]
        lanes = [(((held << 4) | kx) + i)[:16] for i in range(CONFIG.macs)]
        for k in range(self.stages):
            late = [Signal(16, name=f"lane{i}_stage{k}") for i in range(CONFIG.macs)]
            with m.If(seq.read_en):
                m.d.sync += [late[i].eq(lanes[i]) for i in range(CONFIG.macs)]
            lanes = late
        m.d.comb += [seq.lanes[i].eq(lanes[i]) for i in range(CONFIG.macs)]
        return m


def command(c):
    """A sampled MAC command as a dict of ints."""
    return {"op": c.op.value, "fmt": c.fmt.value, "slot": c.slot, "first": c.first,
            "last": c.last, "dual": c.dual, "bias": c.bias, "coef0": c.coef[0],
            "coef1": c.coef[1], "data": [c.data[i] for i in range(CONFIG.macs)]}


def expected(fields, groups):
    out = []
    for cmd in mac_commands(fields, CONFIG, groups, BUFFER_ROWS):
        cmd = dict(cmd)
        if "addr" in cmd:
            cmd["data"] = [lane_value(cmd["addr"], cmd["kx"], i) for i in range(CONFIG.macs)]
            del cmd["addr"], cmd["kx"]
        else:
            cmd["data"] = [cmd["data"]] * CONFIG.macs
        out.append({k: int(v) if k != "data" else v for k, v in cmd.items()})
    return out


class Peers:
    """The sequencer's neighbours, one cycle at a time: extractor, loader, replayer, MAC
    array, writer."""

    def __init__(self, ctx, seq, fields, groups, rng, stall):
        self.ctx, self.seq, self.rng, self.stall = ctx, seq, rng, stall
        self.groups = groups
        self.part = None            # ("params" | "coefs", beats left)
        self.done_next = False
        self.full = 0b11            # the loader filled both banks
        self.refill = {}            # bank -> cycle it is full again
        self.replay_group = 0
        self.headers = 0
        self.group = 0
        self.commands = []
        self.cycle = 0

    async def step(self, written=False):
        ctx, seq, rng = self.ctx, self.seq, self.rng
        self.cycle += 1
        ctx.set(seq.ext_done, self.done_next)
        self.done_next = False
        # The extractor's beats.
        kind = self.part[0] if self.part and self.part[1] else None
        ctx.set(seq.params.valid, kind == "params")
        ctx.set(seq.coefs.valid, kind == "coefs")
        if kind:
            ctx.set(getattr(seq, kind).payload, self.part[1][0]._asdict() if kind == "coefs"
                    else self.part[1][0])
        # Loader and replayer.
        for bank, at in list(self.refill.items()):
            if at <= self.cycle:
                self.full |= 1 << bank
                del self.refill[bank]
        ctx.set(seq.full, self.full)
        if self.replay_group < self.headers and rng.random() < 0.3:
            self.replay_group += 1
        ctx.set(seq.replay_group, self.replay_group)
        ready = bool(rng.random() >= self.stall)
        ctx.set(seq.cmd.ready, ready)
        ctx.set(seq.written, written)
        _, _, sh, sb, pr, cr, release, cv, cp, finish, code, fail, headers, group = \
            await ctx.tick().sample(seq.start_header, seq.start_body, seq.params.ready,
                                    seq.coefs.ready, seq.release, seq.cmd.valid,
                                    seq.cmd.payload, seq.finish, seq.code, seq.fail,
                                    seq.headers, seq.group)
        if kind and (pr if kind == "params" else cr):
            self.part[1].pop(0)
            if not self.part[1]:
                self.done_next = True
        assert not (sh and sb)
        if sh:
            assert self.replay_group + 1 >= group, "header before the replayer left its table"
            enc = self.groups[group]
            p = kc.parse_header(enc.header, enc.config)
            self.part = ("params", [{"slot": s, "bias": int(p.bias[s]), "scale": int(p.scale[s]),
                                     "shift": int(p.shift[s]),
                                     "group_last": int(s == len(p.bias) - 1)}
                                    for s in range(len(p.bias))])
        if sb:
            enc = self.groups[group]
            self.part = ("coefs", kc.beats(enc.header, enc.body, enc.config))
        if release:
            assert self.full & release == release, "a bank released that was not full"
            self.full &= ~release
            self.refill[release.bit_length() - 1] = self.cycle + int(rng.integers(1, 40))
        if cv and ready:
            self.commands.append(command(cp))
        self.headers = headers
        return finish, code.value, fail


async def start(ctx, seq, fields, check=EngineError.NONE, **geometry_changes):
    ctx.set(seq.layer, fields)
    ctx.set(seq.geometry, {**geometry(fields, CONFIG), **geometry_changes})
    ctx.set(seq.check, check)
    ctx.set(seq.go, 1)
    await ctx.tick()
    ctx.set(seq.go, 0)


@pytest.mark.parametrize("stages", [0, 1])
@pytest.mark.parametrize("stall", [0.0, 0.4])
def test_commands_against_model(stall, stages):
    """Every command, with a combinational shifter and with one of ``ne_shift_stages=1``."""
    bench = Bench(stages)
    seq = bench.seq
    rng = np.random.default_rng(int(stall * 10) + 1)
    layers = []
    for fmt in ("int8", "fp16", "i8f16", "f16i8"):
        fields = random_layer(rng, CONFIG, fmt=fmt, max_side=7)
        layers.append((fields, random_groups(rng, fields, CONFIG)))

    async def tb(ctx):
        for fields, groups in layers:
            await start(ctx, seq, fields)
            peers = Peers(ctx, seq, fields, groups, rng, stall)
            expect = expected(fields, groups)
            finish = False
            while not finish and peers.cycle < 40 * len(expect) + 500:
                finish, code, fail = await peers.step(written=len(peers.commands) == len(expect))
            assert finish and code == 0 and not fail
            assert peers.commands == expect, fields

    run(bench, tb)


@pytest.mark.parametrize("case", ["check", "halo", "buffer", "extract", "timeout",
                                  "postproc"])
def test_errors(case):
    """Each way a layer fails: the code, ``fail`` with ``finish``, and the datapath's next
    layer is not the sequencer's business (the engine clears it)."""
    bench = Bench()
    seq = bench.seq
    rng = np.random.default_rng(5)
    fields = random_layer(rng, CONFIG, fmt="int8", max_side=5)
    groups = random_groups(rng, fields, CONFIG)
    codes = {"check": EngineError.SHAPE, "halo": EngineError.HALO,
             "buffer": EngineError.BUFFER, "extract": EngineError.EXTRACT,
             "timeout": EngineError.TIMEOUT, "postproc": EngineError.POSTPROC}

    async def tb(ctx):
        changes = {}
        if case == "halo":
            changes["halo_w"] = ROW_VALUES + 1
        if case == "buffer":
            fields["kh"] = 16
            fields["icpg"] = BUFFER_ROWS // 16 + 1
        await start(ctx, seq, fields, check=codes[case] if case == "check" else 0, **changes)
        peers = Peers(ctx, seq, fields, groups, rng, 0.0)
        for _ in range(3000):
            if case == "extract" and peers.part:
                ctx.set(seq.ext_error, 1)
            if case == "timeout" and peers.commands:
                ctx.set(seq.timeout, 1)
            if case == "postproc":
                ctx.set(seq.post_error, 1)
            finish, code, fail = await peers.step()
            if finish:
                break
        assert finish and fail and code == codes[case].value

    run(bench, tb)
