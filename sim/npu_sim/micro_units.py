"""Run one micro engine unit (``npu.micro.ne``, ``npu.micro.pe``) in the Amaranth simulator on
a buffer, a kernel memory and register values, as the micro NPU gives them to it
(``docs/micro.md``, "Shared interfaces").

:func:`run_unit` returns what the golden model's :func:`npu_model.system.run_neural_task` and
:func:`~npu_model.system.run_planar_task` return, plus the cycles from ``start`` to ``done``.
"""

from amaranth.hdl import Cat, Elaboratable, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator

__all__ = ["PoolingAsPlanar", "UnitHarness", "run_unit", "start_and_wait"]

#: Register words a block of the harness's register file holds.
BLOCK_WORDS = 32


class PoolingAsPlanar(wiring.Component):
    """A neural unit built with its pooling mode (``MicroNeural(pooling=True)``) behind the
    planar unit's ports: ``start`` is its ``pool_start`` (``docs/micro.md``, "Pooling in the
    neural unit")."""

    def __init__(self):
        from npu.micro.unit import unit_members
        super().__init__(unit_members())

    def elaborate(self, platform):
        from npu.micro.ne import MicroNeural
        m = Module()
        m.submodules.unit = unit = MicroNeural(pooling=True)
        m.d.comb += [unit.pool_start.eq(self.start), self.done.eq(unit.done),
                     self.error.eq(unit.error), self.reg_addr.eq(unit.reg_addr),
                     unit.reg_data.eq(self.reg_data), self.buf_addr.eq(unit.buf_addr),
                     self.buf_wdata.eq(unit.buf_wdata), self.buf_we.eq(unit.buf_we),
                     unit.buf_rdata.eq(self.buf_rdata)]
        return m


class UnitHarness(Elaboratable):
    """``unit`` with a buffer of ``len(buffer)`` elements, a kernel memory (if ``kmem`` is
    given and the unit has the port) and a register file holding the blocks of
    :data:`BLOCK_WORDS` words that ``regs`` (``{word address: value}``) touches; a read of any
    other register word returns 0. Each is a synchronous-read RAM."""

    def __init__(self, unit, buffer, regs, kmem=None):
        self.unit = unit
        self.buf = Memory(shape=16, depth=len(buffer), init=[int(v) for v in buffer])
        self.kmem = None if kmem is None else Memory(shape=32, depth=len(kmem),
                                                     init=[int(v) for v in kmem])
        self.blocks = sorted({addr // BLOCK_WORDS for addr in regs})
        rows = [0] * (BLOCK_WORDS * max(1, len(self.blocks)))
        for addr, value in regs.items():
            rows[BLOCK_WORDS * self.blocks.index(addr // BLOCK_WORDS)
                 + addr % BLOCK_WORDS] = int(value)
        self.regs = Memory(shape=32, depth=len(rows), init=rows)

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = self.unit
        m.submodules.buf = self.buf
        m.submodules.regs = self.regs
        # buffer: one port, read data the next cycle
        br = self.buf.read_port()
        bw = self.buf.write_port()
        m.d.comb += [br.addr.eq(unit.buf_addr), unit.buf_rdata.eq(br.data),
                     bw.addr.eq(unit.buf_addr), bw.data.eq(unit.buf_wdata),
                     bw.en.eq(unit.buf_we)]
        if self.kmem is not None:
            m.submodules.kmem = self.kmem
            kr = self.kmem.read_port()
            m.d.comb += [kr.addr.eq(unit.kmem_addr), unit.kmem_data.eq(kr.data)]
        # register file: the blocks kept, 0 elsewhere
        rr = self.regs.read_port()
        block = unit.reg_addr // BLOCK_WORDS
        row = Signal(range(max(1, len(self.blocks))))
        kept = Signal()
        for k, b in enumerate(self.blocks):
            with m.If(block == b):
                m.d.comb += row.eq(k)
        m.d.sync += kept.eq(Cat(block == b for b in self.blocks).any())
        m.d.comb += [rr.addr.eq(row * BLOCK_WORDS + unit.reg_addr % BLOCK_WORDS),
                     unit.reg_data.eq(kept.replicate(32) & rr.data)]
        return m


async def start_and_wait(ctx, start, done, limit):
    """Pulse ``start`` for one cycle and wait for ``done``; returns the cycles from ``start``
    to ``done``. Raises :class:`RuntimeError` if ``done`` has not come within ``limit``."""
    ctx.set(start, 1)
    await ctx.tick()
    ctx.set(start, 0)
    cycles = 1
    while not ctx.get(done):
        await ctx.tick()
        cycles += 1
        if cycles >= limit:
            raise RuntimeError(f"the unit was not done after {limit} cycles")
    return cycles


def run_unit(unit, buffer, regs, kmem=None, *, limit=5_000_000):
    """Start ``unit`` once and wait for ``done``: ``(error code, buffer, cycles)``, the buffer
    a list of its elements after the task and the cycles from ``start`` to ``done``. Raises
    :class:`RuntimeError` if the unit is not done within ``limit`` cycles."""
    h = UnitHarness(unit, buffer, regs, kmem)
    sim = Simulator(h)
    sim.add_clock(1e-6)
    out = {}

    async def tb(ctx):
        out["cycles"] = await start_and_wait(ctx, unit.start, unit.done, limit)
        out["error"] = ctx.get(unit.error)
        out["buf"] = [ctx.get(h.buf.data[i]) for i in range(len(buffer))]

    sim.add_testbench(tb)
    sim.run()
    return out["error"], out["buf"], out["cycles"]
