"""CSR-bus helpers for async testbenches."""

from amaranth.sim import Simulator

__all__ = ["csr_read", "csr_write", "run"]


def run(dut, testbench, *processes):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    for process in processes:
        sim.add_process(process)
    sim.add_testbench(testbench)
    sim.run()


async def csr_write(ctx, bus, addr, data):
    """One bus write; returns the error strobe seen in the next cycle."""
    ctx.set(bus.addr, addr)
    ctx.set(bus.w_data, data)
    ctx.set(bus.w_en, 1)
    await ctx.tick()
    ctx.set(bus.w_en, 0)
    return ctx.get(bus.error)


async def csr_read(ctx, bus, addr):
    """One bus read; returns ``(data, error)`` seen in the next cycle."""
    ctx.set(bus.addr, addr)
    ctx.set(bus.r_en, 1)
    await ctx.tick()
    ctx.set(bus.r_en, 0)
    return ctx.get(bus.r_data), ctx.get(bus.error)
