# amaranth: UnusedElaboratable=no
"""The CSR bus and the register file generated from a register map (Amaranth simulation)."""

import enum
import random

import pytest
from amaranth.back import rtlil
from amaranth.hdl import ClockDomain, Module, Shape
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.lib.csr import (
    READ_PATHS,
    CSRSignature,
    RegisterFile,
    register_layout,
    register_signature,
)
from npu_spec.registers import NPU_INFO
from npu_spec.regmap import Field, Register, RegisterMap
from tests.support.csr import csr_read, csr_write, run


class Mode(enum.IntEnum):
    IDLE = 0
    CONV = 1
    POOL = 2


TEST_MAP = RegisterMap("TEST", base=0x20, registers=[
    Register("CTRL", offset=0, fields=[
        Field("mode", 2, enum=Mode, reset=Mode.CONV),
        Field("length", 10, offset=4, reset=0x155),
        Field("start", 1, offset=16, access="wo"),
        Field("arg", 7, access="wo"),
    ]),
    Register("STATUS", offset=1, fields=[
        Field("busy", 1, access="ro"),
        Field("level", 8, offset=8, access="ro", reset=0x5A),
        Field("done", 1, offset=16, access="w1c"),
        Field("errors", 3, access="w1c", reset=0b100),
    ]),
    Register("DATA", offset=3, fields=[Field("value", 32, reset=0xDEAD_BEEF)]),
])


def test_signature_and_ports():
    rf = RegisterFile(TEST_MAP)
    assert rf.addr_width == 2
    assert rf.signature.members["bus"] == In(CSRSignature(2))
    assert set(rf.signature.members) == {"bus", "ctrl", "status", "data"}
    ctrl = rf.signature.members["ctrl"].signature.members
    assert {name: (m.flow, Shape.cast(m.shape).width) for name, m in ctrl.items()} == {
        "mode": (Out, 2), "length": (Out, 10), "start": (Out, 1), "arg": (Out, 7),
        "written": (Out, 1)}
    status = rf.signature.members["status"].signature.members
    assert {name: m.flow for name, m in status.items()} == {
        "busy": In, "level": In, "done": Out, "done_set": In, "errors": Out, "errors_set": In,
        "written": Out}
    assert status["level"].init == 0x5A and status["errors"].init == 0b100
    assert rf.port("STATUS") is rf.status


def test_csr_signature():
    sig = CSRSignature(5)
    assert sig.addr_width == 5 and sig == CSRSignature(5) and sig != CSRSignature(6)
    assert sig.members["r_data"].flow == In and Shape.cast(sig.members["w_data"].shape).width == 32
    with pytest.raises(TypeError, match=r"not 0"):
        CSRSignature(0)


def test_register_layout():
    layout = register_layout(TEST_MAP["CTRL"])
    assert layout.size == 32
    assert layout["length"].offset == 4 and layout["length"].width == 10
    assert layout["start"].offset == 16 and layout["arg"].offset == 17


def test_addr_width():
    assert RegisterFile(TEST_MAP, addr_width=8).bus.addr.shape().width == 8
    with pytest.raises(ValueError, match=r"at least 2 .* not 1"):
        RegisterFile(TEST_MAP, addr_width=1)
    assert RegisterFile(NPU_INFO).addr_width == (NPU_INFO.size - 1).bit_length()


def test_port_name_clashes():
    with pytest.raises(ValueError, match=r"port name 'written'"):
        register_signature(Register("R", [Field("written"), Field("x")]))
    with pytest.raises(ValueError, match=r"port name 'done_set'"):
        register_signature(Register("R", [Field("done", access="w1c"), Field("done_set")]))
    for name in ("BUS", "REGMAP", "PORT", "SIGNATURE"):
        with pytest.raises(ValueError, match=rf"'{name.lower()}', which is reserved"):
            RegisterFile(RegisterMap("M", [Register(name, [Field("x")])]))
    with pytest.raises(TypeError, match=r"not 'TEST'"):
        RegisterFile("TEST")


def test_ro_register_has_no_written_strobe():
    rf = RegisterFile(NPU_INFO)
    assert "written" not in rf.signature.members["config0"].signature.members
    assert "written" in rf.signature.members["scratch"].signature.members


def test_connect_to_consumer():
    class Consumer(wiring.Component):
        ctrl: In(register_signature(TEST_MAP["CTRL"]))

        def elaborate(self, platform):
            return Module()

    class Top(wiring.Component):
        bus: In(CSRSignature(2))

        def elaborate(self, platform):
            m = Module()
            m.submodules.regfile = regfile = RegisterFile(TEST_MAP)
            m.submodules.consumer = consumer = Consumer()
            wiring.connect(m, wiring.flipped(self.bus), regfile.bus)
            wiring.connect(m, regfile.ctrl, consumer.ctrl)
            return m

    assert "regfile" in rtlil.convert(Top())


@pytest.mark.parametrize("regmap", [TEST_MAP, NPU_INFO], ids=lambda m: m.name)
def test_converts(regmap):
    rf = RegisterFile(regmap)
    text = rtlil.convert(rf)
    assert "bus__r_data" in text


# Behaviour -------------------------------------------------------------------------------------

@pytest.mark.parametrize("read_path", READ_PATHS)
def test_reset_values_and_reads(read_path):
    dut = RegisterFile(TEST_MAP, read_path=read_path)

    async def tb(ctx):
        assert ctx.get(dut.ctrl.mode) == Mode.CONV
        assert ctx.get(dut.ctrl.length) == 0x155
        assert ctx.get(dut.data.value) == 0xDEAD_BEEF
        assert ctx.get(dut.status.errors) == 0b100
        assert ctx.get(dut.bus.r_data) == 0 and ctx.get(dut.bus.error) == 0
        # rw: reads return the reset value; wo fields read as 0.
        assert await csr_read(ctx, dut.bus, 0) == (TEST_MAP["CTRL"].reset, 0)
        assert await csr_read(ctx, dut.bus, 3) == (0xDEAD_BEEF, 0)
        # ro: an undriven input idles at the field's reset value.
        assert await csr_read(ctx, dut.bus, 1) == (0x5A << 8 | 0b100 << 17, 0)
        # r_data is 0 in cycles that do not follow a read.
        await ctx.tick()
        assert ctx.get(dut.bus.r_data) == 0

    run(dut, tb)


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_reset_restores_reset_values(read_path):
    dut = RegisterFile(TEST_MAP, read_path=read_path)
    m = Module()
    m.domains.sync = cd = ClockDomain()
    m.submodules.dut = dut

    async def tb(ctx):
        for reg in TEST_MAP:
            await csr_write(ctx, dut.bus, reg.offset, 0xFFFF_FFFF)
        assert await csr_read(ctx, dut.bus, 3) == (0xFFFF_FFFF, 0)
        ctx.set(cd.rst, 1)
        await ctx.tick()
        ctx.set(cd.rst, 0)
        assert await csr_read(ctx, dut.bus, 0) == (TEST_MAP["CTRL"].reset, 0)
        assert await csr_read(ctx, dut.bus, 3) == (0xDEAD_BEEF, 0)
        # Written again after the reset, a register reads its new value.
        await csr_write(ctx, dut.bus, 3, 0x0BAD_F00D)
        assert await csr_read(ctx, dut.bus, 3) == (0x0BAD_F00D, 0)
        assert await csr_read(ctx, dut.bus, 0) == (TEST_MAP["CTRL"].reset, 0)

    run(m, tb)


def test_read_path_is_checked():
    with pytest.raises(ValueError, match="read path must be one of logic, memory, not 'ram'"):
        RegisterFile(TEST_MAP, read_path="ram")


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_rw_write_and_strobe(read_path):
    dut = RegisterFile(TEST_MAP, read_path=read_path)

    async def tb(ctx):
        address, word = TEST_MAP.encode("CTRL", mode="POOL", length=0x3FF)
        assert await csr_write(ctx, dut.bus, address - TEST_MAP.base, word) == 0
        assert ctx.get(dut.ctrl.mode) == Mode.POOL
        assert ctx.get(dut.ctrl.length) == 0x3FF
        assert ctx.get(dut.ctrl.written) == 1
        assert ctx.get(dut.data.written) == 0
        await ctx.tick()
        assert ctx.get(dut.ctrl.written) == 0
        assert ctx.get(dut.ctrl.mode) == Mode.POOL
        data, error = await csr_read(ctx, dut.bus, 0)
        assert error == 0
        assert TEST_MAP.decode(TEST_MAP.address("CTRL"), data) == {
            "mode": Mode.POOL, "length": 0x3FF, "start": 0, "arg": 0}
        # Reserved bits are dropped on write and read back as 0.
        await csr_write(ctx, dut.bus, 0, 0xFFFF_FFFF)
        data, _ = await csr_read(ctx, dut.bus, 0)
        assert data == 0b11 | 0x3FF << 4

    run(dut, tb)


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_read_and_write_same_cycle(read_path):
    dut = RegisterFile(TEST_MAP, read_path=read_path)

    async def tb(ctx):
        ctx.set(dut.bus.addr, 3)
        ctx.set(dut.bus.w_data, 0x1234_5678)
        ctx.set(dut.bus.w_en, 1)
        ctx.set(dut.bus.r_en, 1)
        await ctx.tick()
        ctx.set(dut.bus.w_en, 0)
        ctx.set(dut.bus.r_en, 0)
        assert ctx.get(dut.bus.r_data) == 0xDEAD_BEEF
        assert ctx.get(dut.data.value) == 0x1234_5678
        assert await csr_read(ctx, dut.bus, 3) == (0x1234_5678, 0)

    run(dut, tb)


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_ro_fields(read_path):
    dut = RegisterFile(TEST_MAP, read_path=read_path)

    async def tb(ctx):
        ctx.set(dut.status.busy, 1)
        ctx.set(dut.status.level, 0xC3)
        assert await csr_read(ctx, dut.bus, 1) == (1 | 0xC3 << 8 | 0b100 << 17, 0)
        # Writes to ro fields are ignored, without an error (the address is mapped).
        assert await csr_write(ctx, dut.bus, 1, 0x0000_FFFF) == 0
        ctx.set(dut.status.busy, 0)
        data, error = await csr_read(ctx, dut.bus, 1)
        assert (data, error) == (0xC3 << 8 | 0b100 << 17, 0)

    run(dut, tb)


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_w1c(read_path):
    dut = RegisterFile(TEST_MAP, read_path=read_path)
    done = 1 << 16

    def errors(x):
        return x << 17

    async def tb(ctx):
        # Clear the reset value.
        await csr_write(ctx, dut.bus, 1, errors(0b100))
        assert ctx.get(dut.status.errors) == 0
        # A set pulse makes bits sticky.
        ctx.set(dut.status.done_set, 1)
        ctx.set(dut.status.errors_set, 0b010)
        await ctx.tick()
        ctx.set(dut.status.done_set, 0)
        ctx.set(dut.status.errors_set, 0)
        await ctx.tick().repeat(3)
        assert ctx.get(dut.status.done) == 1 and ctx.get(dut.status.errors) == 0b010
        assert await csr_read(ctx, dut.bus, 1) == (done | errors(0b010) | 0x5A << 8, 0)
        # Writing 0 clears nothing.
        await csr_write(ctx, dut.bus, 1, 0)
        assert ctx.get(dut.status.done) == 1 and ctx.get(dut.status.errors) == 0b010
        # Writing 1 clears only the bits written.
        await csr_write(ctx, dut.bus, 1, done)
        assert ctx.get(dut.status.done) == 0 and ctx.get(dut.status.errors) == 0b010
        # Set and clear in the same cycle: set wins, other cleared bits still clear.
        ctx.set(dut.status.errors_set, 0b001)
        await csr_write(ctx, dut.bus, 1, errors(0b011))
        ctx.set(dut.status.errors_set, 0)
        assert ctx.get(dut.status.errors) == 0b001
        ctx.set(dut.status.done_set, 1)
        await csr_write(ctx, dut.bus, 1, done)
        ctx.set(dut.status.done_set, 0)
        assert ctx.get(dut.status.done) == 1

    run(dut, tb)


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_wo_pulses(read_path):
    dut = RegisterFile(TEST_MAP, read_path=read_path)

    async def tb(ctx):
        address, word = TEST_MAP.encode("CTRL", start=1, arg=0x55)
        await csr_write(ctx, dut.bus, address - TEST_MAP.base, word)
        assert ctx.get(dut.ctrl.start) == 1 and ctx.get(dut.ctrl.arg) == 0x55
        assert ctx.get(dut.ctrl.written) == 1
        # rw fields not given kept their reset values in the encoded word.
        assert ctx.get(dut.ctrl.length) == 0x155
        await ctx.tick()
        assert ctx.get(dut.ctrl.start) == 0 and ctx.get(dut.ctrl.arg) == 0
        # Back-to-back writes give back-to-back pulses.
        await csr_write(ctx, dut.bus, 0, TEST_MAP.encode("CTRL", start=1, arg=1)[1])
        assert ctx.get(dut.ctrl.start) == 1 and ctx.get(dut.ctrl.arg) == 1
        await csr_write(ctx, dut.bus, 0, TEST_MAP.encode("CTRL", start=1, arg=2)[1])
        assert ctx.get(dut.ctrl.start) == 1 and ctx.get(dut.ctrl.arg) == 2
        await ctx.tick()
        assert ctx.get(dut.ctrl.start) == 0
        # wo fields read as 0.
        data, _ = await csr_read(ctx, dut.bus, 0)
        assert data == TEST_MAP["CTRL"].reset

    run(dut, tb)


@pytest.mark.parametrize("read_path", READ_PATHS)
@pytest.mark.parametrize("addr_width", [None, 6])
def test_unmapped_addresses(addr_width, read_path):
    dut = RegisterFile(TEST_MAP, addr_width=addr_width, read_path=read_path)
    mapped = {r.offset for r in TEST_MAP}

    async def tb(ctx):
        for addr in range(1 << dut.addr_width):
            if addr in mapped:
                continue
            # A read answers in one cycle with 0 and a one-cycle error strobe.
            assert await csr_read(ctx, dut.bus, addr) == (0, 1)
            await ctx.tick()
            assert ctx.get(dut.bus.error) == 0
            # A write answers with an error and changes nothing.
            assert await csr_write(ctx, dut.bus, addr, 0xFFFF_FFFF) == 1
            assert ctx.get(dut.data.written) == 0 and ctx.get(dut.ctrl.written) == 0
            assert ctx.get(dut.ctrl.start) == 0
            await ctx.tick()
            assert ctx.get(dut.bus.error) == 0
        # The bus still works afterwards.
        assert await csr_read(ctx, dut.bus, 3) == (0xDEAD_BEEF, 0)
        assert await csr_write(ctx, dut.bus, 3, 7) == 0
        assert await csr_read(ctx, dut.bus, 3) == (7, 0)

    run(dut, tb)


# Random accesses against a reference model ----------------------------------------------------

class RefRegisterFile:
    """Cycle model of :class:`RegisterFile`, written from the documented behaviour."""

    def __init__(self, regmap):
        self.regmap = regmap
        self.state = {r.name: {f.name: (f.reset or 0) for f in r if f.access != "ro"}
                      for r in regmap}
        self.written = {r.name: 0 for r in regmap}

    def step(self, *, addr, w_en, w_data, r_en, ro, sets):
        """One clock cycle; returns ``(r_data, error)`` seen after the edge."""
        reg = next((r for r in self.regmap if r.offset == addr), None)
        r_data = 0
        if r_en and reg is not None:
            values = {**self.state[reg.name], **ro[reg.name]}
            r_data = sum(values[f.name] << f.offset for f in reg if f.access != "wo")
        error = int((r_en or w_en) and reg is None)
        for r in self.regmap:
            hit = bool(w_en) and r is reg
            fields = r.unpack(w_data, strict=False) if hit else {}
            for f in r:
                state = self.state[r.name]
                if f.access == "rw" and hit:
                    state[f.name] = int(fields[f.name])
                elif f.access == "w1c":
                    clear = fields[f.name] if hit else 0
                    state[f.name] = (state[f.name] & ~clear) | sets[r.name][f.name]
                elif f.access == "wo":
                    state[f.name] = int(fields[f.name]) if hit else 0
            self.written[r.name] = int(hit)
        return r_data, error


@pytest.mark.parametrize("read_path", READ_PATHS)
@pytest.mark.parametrize("seed", range(3))
def test_random_against_model(seed, read_path):
    regmap = RegisterMap("RANDOM", registers=[
        *TEST_MAP.registers,
        Register("FLAGS", offset=5, fields=[Field("f", 5, access="w1c"),
                                            Field("g", 2, offset=30, access="w1c")]),
        Register("CMD", fields=[Field("go", 1, access="wo"), Field("op", 4, access="wo")]),
    ])
    dut = RegisterFile(regmap, addr_width=3, read_path=read_path)
    ref = RefRegisterFile(regmap)
    rng = random.Random(seed)

    async def tb(ctx):
        for _ in range(400):
            addr = rng.randrange(8)
            w_en, r_en = rng.random() < 0.5, rng.random() < 0.5
            w_data = rng.choice([0, 0xFFFF_FFFF, rng.getrandbits(32)])
            ro = {r.name: {f.name: rng.randrange(f.max + 1) for f in r if f.access == "ro"}
                  for r in regmap}
            sets = {r.name: {f.name: (rng.getrandbits(f.width) if rng.random() < 0.2 else 0)
                             for f in r if f.access == "w1c"} for r in regmap}
            ctx.set(dut.bus.addr, addr)
            ctx.set(dut.bus.w_en, w_en)
            ctx.set(dut.bus.r_en, r_en)
            ctx.set(dut.bus.w_data, w_data)
            for r in regmap:
                port = dut.port(r.name)
                for name, value in ro[r.name].items():
                    ctx.set(getattr(port, name), value)
                for name, value in sets[r.name].items():
                    ctx.set(getattr(port, f"{name}_set"), value)
            await ctx.tick()
            expected = ref.step(addr=addr, w_en=w_en, w_data=w_data, r_en=r_en, ro=ro,
                                sets=sets)
            assert (ctx.get(dut.bus.r_data), ctx.get(dut.bus.error)) == expected
            for r in regmap:
                port = dut.port(r.name)
                for name, value in ref.state[r.name].items():
                    assert ctx.get(getattr(port, name)) == value, (r.name, name)
                if r.write_mask:
                    assert ctx.get(port.written) == ref.written[r.name], r.name

    run(dut, tb)


# The decoder in front of several register files ------------------------------------------------

def test_decoder_routes_windows():
    from npu.lib.csr import CSRDecoder
    from npu_spec.registers import ADDRESS_WINDOWS

    windows = {name: ADDRESS_WINDOWS[name] for name in ("NPU_INFO", "PLANAR_ENGINE")}
    other = RegisterMap("OTHER", base=ADDRESS_WINDOWS["PLANAR_ENGINE"][0], registers=[
        Register("A", offset=0x3, fields=[Field("v", 32)])])
    m = Module()
    m.submodules.dec = dec = CSRDecoder(windows, 16)
    m.submodules.info = info = RegisterFile(NPU_INFO, addr_width=8)   # the window's width
    m.submodules.other = rf = RegisterFile(other)
    wiring.connect(m, dec.target("NPU_INFO"), info.bus)
    m.d.comb += [rf.bus.addr.eq(dec.planar_engine.addr), rf.bus.w_en.eq(dec.planar_engine.w_en),
                 rf.bus.r_en.eq(dec.planar_engine.r_en),
                 rf.bus.w_data.eq(dec.planar_engine.w_data),
                 dec.planar_engine.r_data.eq(rf.bus.r_data),
                 dec.planar_engine.error.eq(rf.bus.error)]

    async def tb(ctx):
        scratch = NPU_INFO.address("SCRATCH")
        assert await csr_write(ctx, dec.bus, scratch, 0x1234) == 0
        assert await csr_write(ctx, dec.bus, other.address("A"), 0x5678) == 0
        assert await csr_read(ctx, dec.bus, scratch) == (0x1234, 0)
        assert await csr_read(ctx, dec.bus, other.address("A")) == (0x5678, 0)
        # Unmapped inside a window (the target's error) and outside every window (the
        # decoder's own).
        assert await csr_read(ctx, dec.bus, other.base + 1) == (0, 1)
        assert await csr_read(ctx, dec.bus, 0x2000) == (0, 1)
        assert await csr_write(ctx, dec.bus, 0x2000, 1) == 1
        assert ctx.get(info.scratch.value) == 0x1234

    run(m, tb)


def test_decoder_rejects_overlapping_windows():
    from npu.lib.csr import CSRDecoder
    with pytest.raises(ValueError, match="overlap"):
        CSRDecoder({"A": (0, 0x100), "B": (0x80, 0x100)}, 16)
