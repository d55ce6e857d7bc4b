"""The micro build (``npu.micro.top.MicroNPU``) in the Amaranth simulator: a program file
loaded into its system memory, the host's setup writes on its register bus, the run, and the
memory and status read back (``docs/micro.md``)."""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from npu.lib.csr import CSRSignature
from npu.micro.sysmem import MicroSystemMemory
from npu.micro.top import MicroNPU
from npu_spec.registers import NPU_INFO
from npu_spec.taskman import task_manager_map

from .system import setup_writes

__all__ = ["MicroSystem", "run_micro"]


class MicroSystem(wiring.Component):
    """A :class:`MicroNPU` (``npu``) with its system memory (``memory``, the board's
    :class:`npu.micro.sysmem.MicroSystemMemory`, initialised with ``image``; its bridge port
    idle); the host bus is forwarded."""

    def __init__(self, npu, image=b""):
        self.npu = npu
        words = npu.config.mem_kib * 256
        image = bytes(image) + bytes(-len(image) % 4)
        init = [int.from_bytes(image[k:k + 4], "little") for k in range(0, len(image), 4)]
        self.memory = MicroSystemMemory(words, init=init)
        super().__init__({"bus": In(CSRSignature(16)), "irq": Out(1)})

    def elaborate(self, platform):
        m = Module()
        npu = m.submodules.npu = self.npu
        m.submodules.memory = self.memory
        wiring.connect(m, wiring.flipped(self.bus), npu.bus)
        m.d.comb += self.irq.eq(npu.irq)
        memory = self.memory
        m.d.comb += [memory.addr.eq(npu.mem_addr), memory.re.eq(npu.mem_re),
                     npu.mem_rdata.eq(memory.rdata), memory.wdata.eq(npu.mem_wdata),
                     memory.we.eq(npu.mem_we)]
        return m


async def _write(ctx, bus, address, value):
    ctx.set(bus.addr, address)
    ctx.set(bus.w_data, value)
    ctx.set(bus.w_en, 1)
    await ctx.tick()
    ctx.set(bus.w_en, 0)


async def _read(ctx, bus, address):
    ctx.set(bus.addr, address)
    ctx.set(bus.r_en, 1)
    await ctx.tick()
    ctx.set(bus.r_en, 0)
    return ctx.get(bus.r_data)


def run_micro(program, *, neural=None, planar=None, max_cycles=2_000_000, writes=None,
              onchip=False, reads=()):
    """Run ``program`` (:class:`npu_spec.program.Program`) on the micro build in the Amaranth
    simulator; returns ``{"memory": bytes, "registers": {name: word}, "cycles": int}`` with
    the task manager's ``EXC_STATUS``, ``EXC_ADDR``, ``IRQ_STATUS``, ``STATUS`` and every
    queue's ``Qi_STATUS``, and ``NPU_INFO``'s identification words. ``writes`` replaces the
    host's setup writes (``npu_sim.system.setup_writes``). With ``onchip``, also ``"buffer"``
    and ``"kernel"``: the buffer's elements and the kernel memory's words (lists of ints).
    ``reads``: more task manager registers (names) to read at the end.
    :class:`TimeoutError` after ``max_cycles`` without ``STATUS.idle``."""
    config = program.config
    dut = MicroSystem(MicroNPU(config, neural=neural, planar=planar), program.memory)
    tm = task_manager_map(config.task_queues)
    idle = tm["STATUS"]["idle"]
    setup = setup_writes(program) if writes is None else writes
    out = {}

    async def host(ctx):
        bus = dut.bus
        for address, value in setup:
            await _write(ctx, bus, address, value)
        await _write(ctx, bus, tm.address("CTRL"), tm["CTRL"].pack(enable=1))
        cycles = 0
        while True:
            status = await _read(ctx, bus, tm.address("STATUS"))
            cycles += 1
            if status & idle.mask and cycles > 1:
                break
            if cycles > max_cycles:
                raise TimeoutError(f"the micro NPU did not finish in {max_cycles} cycles")
        names = ["EXC_STATUS", "EXC_ADDR", "IRQ_STATUS", "STATUS"]
        names += [f"Q{q}_STATUS" for q in range(config.task_queues)] + list(reads)
        regs = {name: await _read(ctx, bus, tm.address(name)) for name in names}
        for name in ("ID", "VERSION", "CONFIG0", "CONFIG1", "CONFIG2", "CONFIG3", "CONFIG4"):
            regs[name] = await _read(ctx, bus, NPU_INFO[name].offset)
        out["registers"] = regs
        out["cycles"] = cycles
        data = dut.memory.data
        out["memory"] = b"".join(ctx.get(data[k]).to_bytes(4, "little")
                                 for k in range(data.depth))
        if onchip:
            for name, data in (("buffer", dut.npu.buffer.data), ("kernel", dut.npu.kmem.data)):
                out[name] = [ctx.get(data[k]) for k in range(data.depth)]

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(host)
    sim.run()
    return out
