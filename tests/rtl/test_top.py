# amaranth: UnusedElaboratable=no
"""The NPU top level: its NPU_INFO register file as the top wires it."""

import pytest

from npu.lib.csr import RegisterFile
from npu.top import NPUInfo
from npu_spec.config import PRESETS
from npu_spec.registers import MAGIC, NPU_INFO, VERSION_MAJOR, VERSION_MINOR, npu_info_values
from tests.support.csr import csr_read, csr_write, run

# NPU_INFO as the NPU top wires it (npu.top.NPUInfo) ------------------------------------------

def test_npu_info_undriven_constants():
    dut = RegisterFile(NPU_INFO)

    async def tb(ctx):
        assert await csr_read(ctx, dut.bus, NPU_INFO.address("ID")) == (MAGIC, 0)
        assert await csr_read(ctx, dut.bus, NPU_INFO.address("VERSION")) == (
            VERSION_MAJOR << 16 | VERSION_MINOR, 0)

    run(dut, tb)


@pytest.mark.parametrize("preset", ["small", "ice40", "ecp5"])
def test_npu_info(preset):
    config = PRESETS[preset]
    dut = NPUInfo(config)

    async def tb(ctx):
        # Identification and configuration read back as the model says.
        for reg_name, fields in npu_info_values(config).items():
            address = NPU_INFO.address(reg_name)
            data, error = await csr_read(ctx, dut.bus, address)
            assert error == 0
            assert NPU_INFO.decode(address, data) == fields
        assert (await csr_read(ctx, dut.bus, NPU_INFO.address("ID")))[0] == 0x4E50_5530

        # SCRATCH holds what was written.
        for value in (0xA5A5_5A5A, 0, 0xFFFF_FFFF):
            assert await csr_write(ctx, dut.bus, *NPU_INFO.encode("SCRATCH", value=value)) == 0
            data, _ = await csr_read(ctx, dut.bus, NPU_INFO.address("SCRATCH"))
            assert NPU_INFO.decode(NPU_INFO.address("SCRATCH"), data) == {"value": value}

        status = NPU_INFO.address("IRQ_STATUS")
        assert await csr_read(ctx, dut.bus, status) == (0, 0)
        # An unmapped read sets bus_read_error, an unmapped write bus_write_error.
        assert await csr_read(ctx, dut.bus, 0x7) == (0, 1)
        await ctx.tick()
        data, _ = await csr_read(ctx, dut.bus, status)
        assert NPU_INFO.decode(status, data) == {"bus_read_error": 1, "bus_write_error": 0}
        assert await csr_write(ctx, dut.bus, 0xF, 0x1234) == 1
        await ctx.tick()
        data, _ = await csr_read(ctx, dut.bus, status)
        assert NPU_INFO.decode(status, data) == {"bus_read_error": 1, "bus_write_error": 1}
        # Write one to clear, one flag at a time.
        await csr_write(ctx, dut.bus, *NPU_INFO.encode("IRQ_STATUS", bus_read_error=1))
        data, _ = await csr_read(ctx, dut.bus, status)
        assert NPU_INFO.decode(status, data) == {"bus_read_error": 0, "bus_write_error": 1}
        await csr_write(ctx, dut.bus, *NPU_INFO.encode("IRQ_STATUS", bus_write_error=1))
        assert await csr_read(ctx, dut.bus, status) == (0, 0)
        # SCRATCH was not disturbed by the failed write.
        data, _ = await csr_read(ctx, dut.bus, NPU_INFO.address("SCRATCH"))
        assert data == 0xFFFF_FFFF

    run(dut, tb)


def test_npu_info_cycle_and_trace():
    dut = NPUInfo(PRESETS["small"])

    async def tb(ctx):
        c0, _ = await csr_read(ctx, dut.bus, NPU_INFO.address("CYCLE"))
        c1, _ = await csr_read(ctx, dut.bus, NPU_INFO.address("CYCLE"))
        assert c1 > c0
        ctx.set(dut.trace, {"task_id": 0x1234, "engine": 2, "end": 1, "error": 5, "queue": 3,
                            "cycle": 777})
        ctx.set(dut.trace_valid, 1)
        ctx.set(dut.trace_count, 9)
        data, _ = await csr_read(ctx, dut.bus, NPU_INFO.address("TRACE_DATA0"))
        assert NPU_INFO.decode(NPU_INFO.address("TRACE_DATA0"), data) == {
            "task_id": 0x1234, "engine": 2, "end": 1, "error": 5, "queue": 3, "valid": 1}
        data, _ = await csr_read(ctx, dut.bus, NPU_INFO.address("TRACE_DATA1"))
        assert data == 777
        data, _ = await csr_read(ctx, dut.bus, NPU_INFO.address("TRACE_STATUS"))
        assert NPU_INFO.decode(NPU_INFO.address("TRACE_STATUS"), data) == {
            "count": 9, "overflow": 0}
        # TRACE_CTRL.pop is a one-cycle pulse after the write.
        await csr_write(ctx, dut.bus, *NPU_INFO.encode("TRACE_CTRL", pop=1))
        assert ctx.get(dut.trace_pop) == 1
        await ctx.tick()
        assert ctx.get(dut.trace_pop) == 0

    run(dut, tb)


# The start register of a dispatch port (npu.top.StartRegister, NPUConfig.dispatch_regs) -------

def test_start_register():
    """A start beat taken on ``up`` reaches the engine in the next cycle, never in the same
    one; ``up`` is not ready while the register holds a beat; the engine's ``done`` and the
    dispatcher's ``abort`` pass in the same cycle; an abort drops a beat still held."""
    from amaranth.sim import Simulator

    from npu.top import StartRegister
    dut = StartRegister()
    seen = []

    async def tb(ctx):
        up, down = dut.up, dut.down
        ctx.set(down.start.ready, 1)
        ctx.set(up.start.payload.task_id, 5)
        ctx.set(up.start.valid, 1)
        assert ctx.get(up.start.ready) == 1 and ctx.get(down.start.valid) == 0
        await ctx.tick()
        ctx.set(up.start.valid, 0)
        # The beat is on the engine's side now, and the dispatcher waits.
        assert ctx.get(down.start.valid) == 1 and ctx.get(down.start.payload.task_id) == 5
        assert ctx.get(up.start.ready) == 0
        await ctx.tick()
        assert ctx.get(down.start.valid) == 0 and ctx.get(up.start.ready) == 1
        # done, error and abort are not delayed.
        ctx.set(down.done, 1)
        ctx.set(down.error, 3)
        ctx.set(up.abort, 1)
        assert (ctx.get(up.done), ctx.get(up.error), ctx.get(down.abort)) == (1, 3, 1)
        ctx.set(down.done, 0)
        ctx.set(up.abort, 0)
        # An engine that is not ready keeps the beat; an abort drops it.
        ctx.set(down.start.ready, 0)
        ctx.set(up.start.payload.task_id, 9)
        ctx.set(up.start.valid, 1)
        await ctx.tick()
        ctx.set(up.start.valid, 0)
        for _ in range(3):
            assert ctx.get(down.start.valid) == 1 and ctx.get(up.start.ready) == 0
            await ctx.tick()
        ctx.set(up.abort, 1)
        assert ctx.get(down.start.valid) == 0          # not offered in the abort's cycle
        await ctx.tick()
        ctx.set(up.abort, 0)
        ctx.set(down.start.ready, 1)
        assert ctx.get(down.start.valid) == 0 and ctx.get(up.start.ready) == 1
        seen.append(True)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert seen == [True]
