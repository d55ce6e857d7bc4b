"""Random MAC programs, and running them through the RTL MAC array (Amaranth simulator).

:func:`random_program` builds accumulate sequences that cover the format corner cases
(subnormals, signed zeros, infinities, NaNs, overflow, exact cancellation) with slots
interleaved so the read-after-write interlock is exercised. :func:`run_amaranth` drives a
program through :class:`npu.neural.mac.MacArray` with random stalls on both streams.
"""

import numpy as np

from npu_model.mac import FMT, OP, empty_program, program_beats

__all__ = ["FORMAT_CHOICES", "random_program", "command_words", "results_from_words",
           "run_amaranth", "run_timed", "compare_results"]

#: ``--format`` choices of ``npu sim mac`` and the command formats each one draws from.
FORMAT_CHOICES = {
    "int8":  (FMT["int8"],),
    "fp16":  (FMT["fp16"],),
    "mixed": (FMT["i8f16"], FMT["f16i8"]),
}


def _random_f16(rng, n):
    """binary16 bit patterns from a mixture of classes."""
    cls = rng.choice(8, size=n, p=[0.50, 0.10, 0.06, 0.02, 0.02, 0.10, 0.10, 0.10])
    sign = rng.integers(0, 2, n, dtype=np.uint16) << 15
    frac = rng.integers(0, 1 << 10, n, dtype=np.uint16)
    exp = np.select(
        [cls == 0, cls == 1, cls == 2, cls == 3, cls == 4, cls == 5, cls == 6],
        [rng.integers(11, 20, n), 0, 0, 31, 31, rng.integers(28, 31, n), 15],
        rng.integers(0, 32, n)).astype(np.uint16)
    frac = np.where(cls == 2, 0, frac)                   # signed zeros
    frac = np.where(cls == 3, 0, frac)                   # infinities
    frac = np.where(cls == 4, frac | 1, frac)            # NaNs (quiet and signalling)
    frac = np.where(cls == 6, 0, frac)                   # exact +-1.0
    return (sign | (exp << 10) | frac).astype(np.uint16)


def _random_f32(rng, n):
    """binary32 bias patterns: ordinary, zeros, subnormals, near-overflow, inf, NaN."""
    cls = rng.choice(7, size=n, p=[0.55, 0.15, 0.08, 0.08, 0.03, 0.03, 0.08])
    sign = rng.integers(0, 2, n, dtype=np.uint32) << 31
    frac = rng.integers(0, 1 << 23, n, dtype=np.uint32)
    exp = np.select(
        [cls == 0, cls == 1, cls == 2, cls == 3, cls == 4, cls == 5],
        [rng.integers(117, 140, n), 0, 0, 254, 255, 255],
        rng.integers(0, 256, n)).astype(np.uint32)
    frac = np.where(cls == 1, 0, frac)
    frac = np.where(cls == 4, 0, frac)
    frac = np.where(cls == 5, frac | 1, frac)
    return (sign | (exp << 23) | frac).astype(np.uint32)


def _random_int32(rng, n):
    cls = rng.choice(3, size=n, p=[0.7, 0.2, 0.1])
    small = rng.integers(-40000, 40000, n)
    edge = rng.choice([-(1 << 31), (1 << 31) - 1, (1 << 31) - 5000, -(1 << 31) + 5000], n)
    full = rng.integers(-(1 << 31), 1 << 31, n)
    return np.select([cls == 0, cls == 1], [small, edge], full).astype(np.int64) \
        .astype(np.uint32)


def random_program(lanes, slots, fmt_name, count, seed, ops=("mac", "max", "min", "cmp"),
                   dual_prob=0.15):
    """A random program of at least ``count`` lane operations (``ceil(count / lanes)`` beats).

    Accumulate sequences of 1 to 12 commands run on random slots; up to four sequences are
    interleaved. A sequence starts with ``first`` (bias seeding) and ends with ``last``.
    """
    if fmt_name not in FORMAT_CHOICES:
        raise ValueError(f"unknown format {fmt_name!r}; choose from "
                         f"{', '.join(FORMAT_CHOICES)}")
    rng = np.random.default_rng(seed)
    beats = max(1, -(-count // lanes))
    prog = empty_program(beats, lanes)
    fmts = FORMAT_CHOICES[fmt_name]
    op_codes = [OP[o] for o in ops]

    # Build sequences, then interleave them by drawing which open sequence goes next.
    open_seqs = []
    free_slots = list(range(slots))
    i = 0
    while i < beats:
        while free_slots and len(open_seqs) < min(4, slots) and rng.random() < 0.7:
            slot = free_slots.pop(rng.integers(len(free_slots)))
            length = int(rng.integers(1, 13))
            op = int(rng.choice(op_codes, p=None if len(op_codes) == 1 else
                                [0.7] + [0.3 / (len(op_codes) - 1)] * (len(op_codes) - 1)))
            fmt = int(rng.choice(fmts))
            open_seqs.append({"slot": slot, "left": length, "op": op, "fmt": fmt,
                              "started": False, "cancel": rng.random() < 0.15, "prev": None})
        if not open_seqs:
            slot = free_slots.pop(rng.integers(len(free_slots)))
            open_seqs.append({"slot": slot, "left": 1, "op": OP["mac"], "fmt": int(fmts[0]),
                              "started": False, "cancel": False, "prev": None})
        seq = open_seqs[int(rng.integers(len(open_seqs)))]
        prog["op"][i] = seq["op"]
        prog["fmt"][i] = seq["fmt"]
        prog["slot"][i] = seq["slot"]
        prog["first"][i] = not seq["started"]
        seq["started"] = True
        seq["left"] -= 1
        if seq["left"] == 0 or i == beats - 1:
            prog["last"][i] = True
        prog["dual"][i] = rng.random() < dual_prob
        is_float = seq["fmt"] != FMT["int8"]
        prog["bias"][i] = _random_f32(rng, 1)[0] if is_float else _random_int32(rng, 1)[0]
        if rng.random() < 0.2:
            prog["bias"][i] = 0x8000_0000 if (is_float and rng.random() < 0.5) else 0
        prog["data"][i] = _random_f16(rng, lanes) if is_float else \
            rng.integers(0, 1 << 16, lanes, dtype=np.uint16)
        prog["coef"][i] = _random_f16(rng, 2) if is_float else \
            rng.integers(0, 1 << 16, 2, dtype=np.uint16)
        if seq["fmt"] in (FMT["i8f16"], FMT["int8"]):
            prog["data"][i] = rng.integers(0, 256, lanes, dtype=np.uint16) | \
                (rng.integers(0, 256, lanes, dtype=np.uint16) << 8)  # high byte ignored
        if seq["fmt"] in (FMT["f16i8"], FMT["int8"]):
            prog["coef"][i] = rng.integers(0, 1 << 16, 2, dtype=np.uint16)
        # Exact cancellation: repeat the previous operands with the coefficient negated.
        if seq["cancel"] and seq["prev"] is not None and seq["op"] == OP["mac"]:
            data, coef, dual = seq["prev"]
            prog["data"][i], prog["dual"][i] = data, dual
            prog["coef"][i] = coef ^ 0x8000 if seq["fmt"] in (FMT["fp16"], FMT["i8f16"]) \
                else coef
            if seq["fmt"] == FMT["f16i8"]:
                prog["data"][i] = data ^ 0x8000
        seq["prev"] = (prog["data"][i].copy(), prog["coef"][i].copy(), prog["dual"][i])
        if prog["last"][i]:
            open_seqs.remove(seq)
            free_slots.append(seq["slot"])
        i += 1
    return prog


def command_words(layout, program):
    """The program's commands packed as integers for the MAC command ``layout``."""
    offs = {name: field.offset for name, field in layout}
    lanes = program["data"].shape[1]
    words = []
    for i in range(program_beats(program)):
        w = (int(program["op"][i]) << offs["op"]) | (int(program["fmt"][i]) << offs["fmt"])
        w |= (int(program["slot"][i]) << offs["slot"]) | (int(program["first"][i]) << offs["first"])
        w |= (int(program["last"][i]) << offs["last"]) | (int(program["dual"][i]) << offs["dual"])
        w |= int(program["bias"][i]) << offs["bias"]
        w |= (int(program["coef"][i, 0]) | (int(program["coef"][i, 1]) << 16)) << offs["coef"]
        d = int.from_bytes(program["data"][i].astype("<u2").tobytes(), "little")
        w |= d << offs["data"]
        assert lanes * 16 + offs["data"] <= layout.size
        words.append(w)
    return words


def results_from_words(layout, words):
    """Decode result beats (packed ints) into ``(slot, fmt, uint32 values)`` tuples."""
    offs = {name: field for name, field in layout}
    lanes = offs["acc"].shape.length
    out = []
    for w in words:
        slot = (w >> offs["slot"].offset) & ((1 << offs["slot"].width) - 1)
        fmt = (w >> offs["fmt"].offset) & 3
        acc = (w >> offs["acc"].offset) & ((1 << (32 * lanes)) - 1)
        vals = np.frombuffer(acc.to_bytes(4 * lanes, "little"), dtype="<u4").astype(np.uint32)
        out.append((slot, fmt, vals))
    return out


def run_amaranth(config, program, *, seed=0, stall=0.3, vcd=None):
    """Run ``program`` through :class:`npu.neural.mac.MacArray` in the Amaranth simulator.

    Returns ``(results, cycles)``: decoded result beats and the cycles until the last one.
    """
    from npu.neural.mac_select import mac_array

    from .streams import run_simulation, seeded_rng, stream_get, stream_put

    dut = mac_array(config, primitives=False)   # behavioural twins of primitives
    cmd_layout = dut.cmd.payload.shape()
    res_layout = dut.res.payload.shape()
    words = command_words(cmd_layout, program)
    expected = int(np.count_nonzero(program["last"]))
    got = []
    sim_cycles = [0]

    async def producer(ctx):
        rng = seeded_rng(seed, "cmd")
        for w in words:
            await stream_put(ctx, dut.cmd, w, rng, stall)

    async def consumer(ctx):
        rng = seeded_rng(seed, "res")
        while len(got) < expected:
            got.append(await stream_get(ctx, dut.res, rng, stall))

    async def clock_count(ctx):
        while len(got) < expected:
            await ctx.tick()
            sim_cycles[0] += 1

    run_simulation(dut, [producer, consumer, clock_count], vcd=vcd)
    return results_from_words(res_layout, got), sim_cycles[0]


def run_timed(dut, program, results_wanted):
    """Offer ``program``'s commands to the MAC array ``dut`` back to back (no gaps) with the
    consumer always ready, until ``results_wanted`` results have arrived.

    Returns ``(accepted, results, got)``: the cycle of every command handshake, the cycle of
    every result beat, and the decoded results (:func:`results_from_words`).
    """
    from .streams import run_simulation

    words = command_words(dut.cmd.payload.shape(), program)
    accepted, results, beats = [], [], []

    async def producer(ctx):
        cycle = 0
        for w in words:
            ctx.set(dut.cmd.valid, 1)
            ctx.set(dut.cmd.payload.as_value(), w)
            while True:
                _, _, ready = await ctx.tick().sample(dut.cmd.ready)
                if ready:
                    accepted.append(cycle)
                cycle += 1
                if ready:
                    break
        ctx.set(dut.cmd.valid, 0)

    async def consumer(ctx):
        ctx.set(dut.res.ready, 1)
        cycle = 0
        while len(results) < results_wanted:
            _, _, valid, word = await ctx.tick().sample(dut.res.valid,
                                                        dut.res.payload.as_value())
            if valid:
                results.append(cycle)
                beats.append(word)
            cycle += 1

    run_simulation(dut, [producer, consumer])
    return accepted, results, results_from_words(dut.res.payload.shape(), beats)


def compare_results(expected, actual, limit=10):
    """Mismatches between golden and RTL result lists, as printable lines (empty if equal)."""
    lines = []
    if len(expected) != len(actual):
        lines.append(f"result count differs: golden {len(expected)}, RTL {len(actual)}")
    for k, ((es, ef, ev), (as_, af, av)) in enumerate(zip(expected, actual)):
        if es != as_ or ef != af:
            lines.append(f"result {k}: golden slot/fmt {es}/{ef}, RTL {as_}/{af}")
        bad = np.nonzero(ev != av)[0]
        for lane in bad:
            lines.append(f"result {k} slot {es} lane {lane}: golden {int(ev[lane]):#010x}, "
                         f"RTL {int(av[lane]):#010x}")
        if len(lines) >= limit:
            break
    return lines[:limit]


def run_verilator(config, program, *, seed=0, stall=0.3, progress=None):
    """Run ``program`` through the MAC array of ``config`` compiled with Verilator (the ECP5
    array with its ``MULT18X18D`` instances and :mod:`npu_sim.ecp5_cells`' model of them).

    Returns ``(results, stats)`` with ``stats`` = dict(cycles, sent, active).
    """
    from npu.neural.mac_select import mac_array

    from .verilator import StreamBench

    # The ECP5 array runs its netlist with MULT18X18D and the project's cell model;
    # other implementations use the behavioural twins of their vendor primitives.
    ecp5 = config.mac_impl in ("ecp5", "ecp5_shared")
    dut = mac_array(config, primitives=ecp5)
    extra = None
    if ecp5:
        from .ecp5_cells import MULT18X18D_MODEL
        extra = lambda: MULT18X18D_MODEL  # noqa: E731
    bench = StreamBench(dut, in_name="cmd", out_name="res", active_name="active",
                        progress=progress, key=("mac_array", config), extra_verilog=extra)
    words = command_words(dut.cmd.payload.shape(), program)
    expected = int(np.count_nonzero(program["last"]))
    outs, stats = bench.run(words, expected, stall=stall, seed=seed)
    return results_from_words(dut.res.payload.shape(), outs), stats
