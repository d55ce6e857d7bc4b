"""amaranth.sim helpers: stream put/get with random stalls, running with a VCD.

Producers and consumers are async testbenches; ``stall`` is the probability that a beat is
held back (producer) or not accepted (consumer) for a cycle, drawn from a seeded generator so
every run is reproducible.
"""

import contextlib
import random

from amaranth.sim import Simulator

__all__ = ["stream_put", "stream_get", "run_simulation", "seeded_rng"]


async def stream_put(ctx, stream, word, rng=None, stall=0.0):
    """Send one beat (``word`` packed as an int) on ``stream``, after random idle cycles."""
    while rng is not None and stall and rng.random() < stall:
        await ctx.tick()
    ctx.set(stream.valid, 1)
    ctx.set(stream.payload.as_value(), word)
    await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


async def stream_get(ctx, stream, rng=None, stall=0.0):
    """Receive one beat from ``stream`` as an int, refusing it for random cycles."""
    while rng is not None and stall and rng.random() < stall:
        await ctx.tick()
    ctx.set(stream.ready, 1)
    word, = await ctx.tick().sample(stream.payload.as_value()).until(stream.valid)
    ctx.set(stream.ready, 0)
    return word


def run_simulation(dut, testbenches, *, vcd=None, clock=1e-8, processes=(), background=()):
    """Simulate ``dut`` with a clock, the given async testbenches and processes.

    ``background`` testbenches do not keep the simulation running (a watchdog, a monitor).
    Writes a VCD (and GTKW) to ``vcd`` when it is given.
    """
    sim = Simulator(dut)
    sim.add_clock(clock)
    for tb in testbenches:
        sim.add_testbench(tb)
    for tb in background:
        sim.add_testbench(tb, background=True)
    for proc in processes:
        sim.add_process(proc)
    if vcd:
        ctx = sim.write_vcd(str(vcd))
    else:
        ctx = contextlib.nullcontext()
    with ctx:
        sim.run()
    return sim


def seeded_rng(seed, name):
    """An independent, reproducible random generator per (seed, stream name)."""
    return random.Random(f"{seed}:{name}")
