# amaranth: UnusedElaboratable=no
"""The shared engine control: register writes, host access, start, done, error, abort."""

import enum

from npu.lib.engine import EngineControl, TaskEntry
from npu_spec.codes import coded
from npu_spec.engine import TASK_OFFSET, control_registers
from npu_spec.regmap import Field, Register, RegisterMap
from tests.support.csr import csr_read, csr_write, run


@coded(4)
class DemoError(enum.IntEnum):
    NONE = 0
    BAD = 5


MAP = RegisterMap("TEST_ENGINE", base=0x5000, registers=control_registers(DemoError) + [
    Register("SIZE", offset=TASK_OFFSET, fields=[Field("n", 16)]),
    Register("MODE", fields=[Field("op", 4)]),
])


async def write(ctx, dut, addr, data):
    """One register write on the task manager's port; returns the cycles it waited."""
    ctx.set(dut.writes.valid, 1)
    ctx.set(dut.writes.payload.addr, addr)
    ctx.set(dut.writes.payload.data, data)
    waited = 0
    while not ctx.get(dut.writes.ready):
        await ctx.tick()
        waited += 1
    await ctx.tick()
    ctx.set(dut.writes.valid, 0)
    return waited


async def status(ctx, dut):
    data, error = await csr_read(ctx, dut.csr, MAP["STATUS"].offset)
    assert error == 0
    return MAP.decode(MAP.address("STATUS"), data)


def test_register_writes_and_window():
    dut = EngineControl(MAP, base=0x5100)       # a second instance of the map

    async def tb(ctx):
        assert await write(ctx, dut, 0x5100 + TASK_OFFSET, 1234) == 0
        assert ctx.get(dut.regs.size.n) == 1234
        await write(ctx, dut, MAP.address("SIZE"), 99)     # the first instance's window
        await write(ctx, dut, 0x5100 + 0x40, 7)             # past the map
        assert ctx.get(dut.regs.size.n) == 1234
        # The host reads it back; an unmapped host access is an error, a write's is not.
        assert await csr_read(ctx, dut.csr, TASK_OFFSET) == (1234, 0)
        assert (await csr_read(ctx, dut.csr, 0x7))[1] == 1
        await write(ctx, dut, 0x5100 + 0x7, 1)
        assert ctx.get(dut.csr.error) == 0

    run(dut, tb)


def test_host_access_wins():
    dut = EngineControl(MAP)

    async def tb(ctx):
        ctx.set(dut.csr.addr, MAP["MODE"].offset)
        ctx.set(dut.csr.w_data, 3)
        ctx.set(dut.csr.w_en, 1)
        ctx.set(dut.writes.valid, 1)
        ctx.set(dut.writes.payload.addr, MAP.address("MODE"))
        ctx.set(dut.writes.payload.data, 9)
        assert not ctx.get(dut.writes.ready)
        await ctx.tick()
        ctx.set(dut.csr.w_en, 0)
        assert ctx.get(dut.regs.mode.op) == 3
        assert ctx.get(dut.writes.ready)
        await ctx.tick()
        ctx.set(dut.writes.valid, 0)
        assert ctx.get(dut.regs.mode.op) == 9

    run(dut, tb)


def test_start_done_error_and_cycles():
    dut = EngineControl(MAP)

    async def tb(ctx):
        # A start beat: go in this cycle, busy from the next; a second beat waits.
        ctx.set(dut.task.start.valid, 1)
        ctx.set(dut.task.start.payload.task_id, 0x77)
        assert ctx.get(dut.go) and ctx.get(dut.task.start.ready)
        await ctx.tick()
        assert ctx.get(dut.busy) and not ctx.get(dut.task.start.ready)
        assert ctx.get(dut.entry.task_id) == 0x77
        ctx.set(dut.task.start.valid, 0)
        await ctx.tick().repeat(4)
        assert (await status(ctx, dut))["busy"] == 1
        # Finish with an error code, 6 cycles after go (the read took one).
        ctx.set(dut.finish, 1)
        ctx.set(dut.code, DemoError.BAD)
        assert ctx.get(dut.task.done) and ctx.get(dut.task.error) == DemoError.BAD
        await ctx.tick()
        ctx.set(dut.finish, 0)
        assert not ctx.get(dut.busy)
        assert await status(ctx, dut) == {"busy": 0, "error": 1, "error_code": DemoError.BAD}
        cycles, _ = await csr_read(ctx, dut.csr, MAP["CYCLES"].offset)
        assert cycles == 6
        # CTRL.start from the host starts the next task and clears the error.
        assert await csr_write(ctx, dut.csr, *MAP.encode("CTRL", start=1)) == 0
        assert ctx.get(dut.go)
        await ctx.tick()
        assert ctx.get(dut.busy) and ctx.get(dut.entry.task_id) == 0
        ctx.set(dut.finish, 1)
        ctx.set(dut.code, 0)
        await ctx.tick()
        ctx.set(dut.finish, 0)
        assert await status(ctx, dut) == {"busy": 0, "error": 0, "error_code": DemoError.NONE}

    run(dut, tb)


def test_abort_flushes_without_done():
    dut = EngineControl(MAP)

    async def tb(ctx):
        ctx.set(dut.task.start.valid, 1)
        await ctx.tick()
        ctx.set(dut.task.start.valid, 0)
        await ctx.tick().repeat(3)
        ctx.set(dut.task.abort, 1)
        assert ctx.get(dut.flush) and not ctx.get(dut.task.done)
        await ctx.tick()
        ctx.set(dut.task.abort, 0)
        assert not ctx.get(dut.busy) and not ctx.get(dut.flush)
        # An abort while idle does nothing.
        ctx.set(dut.task.abort, 1)
        assert not ctx.get(dut.flush)

    run(dut, tb)


def test_task_entry_fields_come_from_the_descriptor_format():
    from npu_spec.descriptors import HEADER
    for word, names in ((1, ("task_id", "network", "dep")), (2, ("src", "src_len")),
                        (3, ("dst",))):
        for name in names:
            assert TaskEntry.members[name].width == HEADER[word][name].width
