"""Wishbone helpers for async testbenches: a reference memory, a checking bus master and the
system memory's host port."""

from collections import deque

__all__ = ["RefMemory", "burst", "host_read", "host_write", "idle", "random_requests"]


class RefMemory:
    """What system memory should hold: ``words`` words of ``data_width`` bits."""

    def __init__(self, words, data_width, init=()):
        self.words = words
        self.data_width = data_width
        self.data = list(init) + [0] * (words - len(init))

    def write(self, adr, sel, value):
        mask = 0
        for lane in range(self.data_width // 8):
            if sel >> lane & 1:
                mask |= 0xFF << (8 * lane)
        self.data[adr] = (self.data[adr] & ~mask) | (value & mask)

    def answer(self, we, adr, sel, value):
        """The answer a request should get, ``("err", None)`` or ``("ack", read data or
        None)``; a write changes the reference."""
        if adr >= self.words:
            return "err", None
        if we:
            self.write(adr, sel, value)
            return "ack", None
        return "ack", self.data[adr]


def random_requests(rng, count, words, data_width, *, addr_width=30, err_rate=0.1):
    """``count`` random requests ``(we, adr, sel, dat_w)``, some beyond ``words``."""
    reqs = []
    for _ in range(count):
        if rng.random() < err_rate:
            adr = rng.choice([words, words + rng.randrange(64), 2 ** addr_width - 1])
        else:
            adr = rng.randrange(words)
        reqs.append((rng.random() < 0.5, adr, rng.randrange(1, 2 ** (data_width // 8)),
                     rng.getrandbits(data_width)))
    return reqs


async def idle(ctx, port, cycles):
    """Leave the bus alone for ``cycles`` cycles; no answer may arrive."""
    ctx.set(port.cyc, 0)
    ctx.set(port.stb, 0)
    for _ in range(cycles):
        _, _, ack, err = await ctx.tick().sample(port.ack, port.err)
        assert not ack and not err, "an answer while no request was in flight"


async def burst(ctx, port, ref, requests, rng, *, gap=0.0, timeout=2000):
    """One bus cycle: ``requests`` presented pipelined (a request may follow the one taken in
    the cycle before; with probability ``gap`` a cycle presents none), every answer checked
    against ``ref`` in order, then ``cyc`` dropped. Returns the number of cycles."""
    ctx.set(port.cyc, 1)
    expected = deque()
    i = 0
    cycles = 0
    while i < len(requests) or expected:
        present = i < len(requests) and not (gap and rng.random() < gap)
        ctx.set(port.stb, present)
        if present:
            we, adr, sel, value = requests[i]
            ctx.set(port.we, we)
            ctx.set(port.adr, adr)
            ctx.set(port.sel, sel)
            ctx.set(port.dat_w, value)
        _, _, stall, ack, err, dat_r = await ctx.tick().sample(port.stall, port.ack, port.err,
                                                              port.dat_r)
        cycles += 1
        assert cycles < timeout, f"{len(expected)} requests not answered"
        assert not (ack and err), "ack and err together"
        if ack or err:
            assert expected, "an answer to no request"
            kind, value = expected.popleft()
            assert (kind == "err") == bool(err), f"expected {kind}"
            if value is not None:
                assert dat_r == value, f"read {dat_r:#x}, expected {value:#x}"
        if present and not stall:
            expected.append(ref.answer(*requests[i]))
            i += 1
    ctx.set(port.stb, 0)
    ctx.set(port.cyc, 0)
    return cycles


async def host_write(ctx, host, addr, value):
    ctx.set(host.addr, addr)
    ctx.set(host.w_data, value)
    ctx.set(host.w_en, 1)
    await ctx.tick()
    ctx.set(host.w_en, 0)


async def host_read(ctx, host, addr):
    ctx.set(host.addr, addr)
    ctx.set(host.r_en, 1)
    await ctx.tick()
    ctx.set(host.r_en, 0)
    return ctx.get(host.r_data)
