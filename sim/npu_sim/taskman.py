"""Simulation bench of the task manager with behavioural engines, memory and host.

:class:`TaskBench` runs :class:`npu.taskman.TaskManager` in ``amaranth.sim`` with

* system memory (a dict) answering the descriptor reads in order, each after a latency drawn
  from ``mem_latency``, with random stalls of requests and responses (``mem_stall``), and with
  a bus error for the addresses in ``bus_errors``,
* behavioural neural, planar and DMA engines (:mod:`npu_model.taskman`): a task's program
  arrives on the register-write port tagged with its sequence number; at start the engine reads
  its input from the buffer or system memory (as told by the start payload), after its run
  length it signals ``done`` with its error code and, if that is 0, writes its tagged output to
  the buffer, and to memory when ``done_mem`` is high,
* a host that performs register writes and reads in order, each step optionally waiting for a
  task to start or end, or for a cycle.

Everything is recorded: a trace of :class:`npu_model.taskman.Event`, the register writes per
task, the data log, the interrupt line, and read values.
"""


from npu.taskman import TaskManager
from npu_model.taskman import DataSpace, Event, engine_cycles, engine_error, task_value
from npu_spec.engine import Engine
from npu_spec.taskman import BASE

from .streams import run_simulation, seeded_rng

__all__ = ["HangError", "TaskBench", "switch_latency"]


class HangError(RuntimeError):
    """The bench ran out of cycles before the work was done."""


class TaskBench:
    """One simulation of the task manager.

    Parameters
    ----------
    config : NPUConfig
    image : dict
        System memory: word address to word (descriptors and data).
    seed : int
        Seed of the write-port and memory stalls and latencies.
    write_stall : float
        Probability that the register-write port refuses a beat in a cycle.
    mem_latency : int or (int, int)
        Cycles from a read request taken to its response (at least 1): fixed, or drawn
        uniformly from ``[lo, hi]`` for each read (responses stay in order).
    mem_stall : float
        Probability that the memory refuses a request, or holds back a ready response, in a
        cycle.
    bus_errors : iterable of int
        Word addresses whose reads are answered with ``err``.
    **kwargs
        Passed to :class:`TaskManager` (``config_depth``, ``slot_words``, ``buffer_depth``).
    """

    def __init__(self, config, image, *, seed=0, write_stall=0.0, mem_latency=1, mem_stall=0.0,
                 bus_errors=(), **kwargs):
        self.dut = TaskManager(config, **kwargs)
        self.regmap = self.dut.regmap
        self.space = DataSpace(image)
        self.rng = seeded_rng(seed, "writes")
        self.mem_rng = seeded_rng(seed, "memory")
        self.write_stall = write_stall
        if isinstance(mem_latency, int):
            mem_latency = (mem_latency, mem_latency)
        if not 1 <= mem_latency[0] <= mem_latency[1]:
            raise ValueError(f"Memory latency must be at least 1, not {mem_latency!r}")
        self.mem_latency = mem_latency
        self.mem_stall = mem_stall
        self.bus_errors = set(bus_errors)
        self.host = []           # steps: ("write", reg, fields) / ("read", reg) / waits
        self.trace = []
        self.programs = {}       # seq -> [(address, word)]
        self.reads = {}          # label -> {field: value}
        self.irq = []            # cycles with irq high
        self.mem_reads = []      # (cycle, address) of every descriptor read taken
        self.mem_answers = []    # (cycle, address, err) of every response taken
        self.max_in_flight = 0   # most reads taken and not yet answered
        self.windows = {}        # (queue, task_id) -> (base, limit) of the start beat
        self.host_log = []       # (cycle, register, fields) of every host write
        self.cycles = 0
        self.checks = []         # callables(bench, cycle) run every cycle

    # Host script.

    def write(self, register, **fields):
        self.host.append(("write", register, fields))

    def read(self, register, label=None):
        self.host.append(("read", register, label or register))

    def wait_start(self, queue, task_id):
        self.host.append(("wait", "start", queue, task_id))

    def wait_end(self, queue, task_id):
        self.host.append(("wait", "end", queue, task_id))

    def wait_cycles(self, n):
        self.host.append(("cycles", n))

    def setup_queue(self, i, *, priority=0, network=0, base_index=0, head=None, push=0,
                    tail=0, secure=False):
        self.write(f"Q{i}_CTRL", priority=priority, network=network, base_index=base_index,
                   secure=int(secure))
        if tail:
            self.write(f"Q{i}_TAIL", address=tail)
        if head is not None:
            self.write(f"Q{i}_HEAD", address=head)
        if push:
            self.write(f"Q{i}_PUSH", count=push)

    def setup_window(self, j, base, words):
        self.write(f"BASE{j}", address=base)
        self.write(f"LIMIT{j}", words=words)

    # Queries.

    def events(self, kind=None, queue=None):
        return [e for e in self.trace if (kind is None or e.kind == kind)
                and (queue is None or e.queue == queue)]

    def order(self, kind="start"):
        return [(e.queue, e.task_id) for e in self.events(kind)]

    # Simulation.

    def run(self, max_cycles=20000, idle_cycles=40, vcd=None):
        dut = self.dut
        engines = [getattr(dut, name) for name in ("ne", "pe", "dma")]
        assert len(engines) == len(Engine)
        bench = self

        def seen(kind, queue, task_id):
            return any(e.kind == kind and e.queue == queue and e.task_id == task_id
                       for e in bench.trace)

        async def world(ctx):
            running = [None] * len(engines)  # [seq, payload, remaining, start, inputs, error]
            inflight = []                 # [cycle the response may come, address] in order
            answering = False             # a response offered and not yet taken
            step = 0
            wait_until = None
            read_label = None
            quiet = 0
            cycle = 0
            while True:
                # Memory: the oldest read is answered once its latency has passed (and kept
                # offered until taken); a request is taken unless the memory stalls.
                if not answering and inflight and inflight[0][0] <= cycle:
                    answering = not bench._mem_stalls()
                address = inflight[0][1] if answering else None
                ctx.set(dut.mem.resp.valid, answering)
                ctx.set(dut.mem.resp.payload.data, bench.space.mem.get(address, 0))
                ctx.set(dut.mem.resp.payload.err, address in bench.bus_errors)
                ctx.set(dut.mem.req.ready, not bench._mem_stalls())
                ready = not (bench.write_stall and bench.rng.random() < bench.write_stall)
                ctx.set(dut.writes.ready, ready)
                for e, eng in enumerate(engines):
                    run = running[e]
                    done = run is not None and run[2] == 0
                    ctx.set(eng.done, done)
                    ctx.set(eng.error, run[5] if done else 0)
                    ctx.set(eng.start.ready, run is None)
                # Host step.
                ctx.set(dut.csr.w_en, 0)
                ctx.set(dut.csr.r_en, 0)
                if read_label is not None:
                    reg = bench.regmap[read_label[1]]
                    bench.reads[read_label[0]] = reg.unpack(ctx.get(dut.csr.r_data))
                    read_label = None
                while step < len(bench.host):
                    item = bench.host[step]
                    if item[0] == "wait":
                        if not seen(*item[1:]):
                            break
                        step += 1
                    elif item[0] == "cycles":
                        if wait_until is None:
                            wait_until = cycle + item[1]
                        if cycle < wait_until:
                            break
                        wait_until = None
                        step += 1
                    elif item[0] == "write":
                        address, word = bench.regmap.encode(item[1], **item[2])
                        ctx.set(dut.csr.addr, address - BASE)
                        ctx.set(dut.csr.w_data, word)
                        ctx.set(dut.csr.w_en, 1)
                        bench.host_log.append((cycle, item[1], item[2]))
                        step += 1
                        break
                    else:
                        ctx.set(dut.csr.addr, bench.regmap.address(item[1]) - BASE)
                        ctx.set(dut.csr.r_en, 1)
                        read_label = (item[2], item[1])
                        step += 1
                        break
                activity = False
                # Observe the DUT (combinational outputs after the inputs above).
                if ctx.get(dut.irq):
                    bench.irq.append(cycle)
                if ready and ctx.get(dut.writes.valid):
                    p = ctx.get(dut.writes.payload)
                    bench.programs.setdefault(p.seq, []).append((p.addr, p.data))
                    activity = True
                for e, eng in enumerate(engines):
                    run = running[e]
                    if run is not None and run[2] == 0 and run[5]:
                        p = run[1]
                        bench.trace.append(Event("error", cycle, p.queue, p.task_id, e,
                                                 bool(p.src_mem), bool(p.dst_mem), run[4],
                                                 error=run[5]))
                        running[e] = None
                        activity = True
                    elif run is not None and run[2] == 0:
                        p = run[1]
                        mem_flag = bool(ctx.get(eng.done_mem))
                        value = task_value(p.network, p.task_id, run[4])
                        bench.space.write((p.queue, p.task_id), value, mem_flag, p.base, p.dst)
                        bench.trace.append(Event("end", cycle, p.queue, p.task_id, e,
                                                 bool(p.src_mem), mem_flag, run[4], value))
                        running[e] = None
                        activity = True
                    elif run is not None and ctx.get(eng.abort):
                        p = run[1]
                        bench.trace.append(Event("abort", cycle, p.queue, p.task_id, e))
                        running[e] = None
                        activity = True
                    elif run is None and ctx.get(eng.start.valid):
                        p = ctx.get(eng.start.payload)
                        if p.engine != e:
                            raise AssertionError(f"task {p.task_id} of engine {p.engine} "
                                                 f"started on engine {e}")
                        prog = bench.programs.get(p.seq, [])
                        cycles = engine_cycles(e, prog)
                        _, inputs = bench.space.read((p.queue, p.task_id), bool(p.src_mem),
                                                     p.base, p.src, p.src_len)
                        bench.trace.append(Event("start", cycle, p.queue, p.task_id, e,
                                                 bool(p.src_mem), False, inputs))
                        bench.windows[(p.queue, p.task_id)] = (p.base, p.limit)
                        running[e] = [p.seq, p, cycles, cycle, inputs, engine_error(e, prog)]
                        activity = True
                # Memory: the response taken, the request taken.
                if answering and ctx.get(dut.mem.resp.ready):
                    bench.mem_answers.append((cycle, address, address in bench.bus_errors))
                    inflight.pop(0)
                    answering = False
                    activity = True
                if ctx.get(dut.mem.req.valid) and ctx.get(dut.mem.req.ready):
                    address = ctx.get(dut.mem.req.payload)
                    bench.mem_reads.append((cycle, address))
                    inflight.append([cycle + bench.mem_rng.randint(*bench.mem_latency),
                                     address])
                    bench.max_in_flight = max(bench.max_in_flight, len(inflight))
                    activity = True
                activity |= bool(inflight)
                for check in bench.checks:
                    check(bench, cycle)
                await ctx.tick()
                cycle += 1
                for run in running:
                    if run is not None and run[2] > 0:
                        run[2] -= 1
                busy = any(r is not None for r in running)
                quiet = 0 if (activity or busy) else quiet + 1
                if step >= len(bench.host) and quiet >= idle_cycles and read_label is None:
                    break
                if cycle >= max_cycles:
                    bench.cycles = cycle
                    raise HangError(f"task manager bench did not finish in {max_cycles} cycles "
                                    f"(host step {step} of {len(bench.host)})")
            bench.cycles = cycle

        run_simulation(dut, [world], vcd=vcd)
        return self

    def _mem_stalls(self):
        return bool(self.mem_stall) and self.mem_rng.random() < self.mem_stall


def switch_latency(config, *, task_cycles=64, positions=None, seed=0):
    """Measure the switch latency by the position of the request in the running task.

    Queue 0 (priority 1) runs T0, T1 {TSE, DPC, TSR} (``task_cycles`` long), T2 {SPC, SPL},
    T3; queue 1 (priority 5, one task) is pushed ``p`` cycles after T1 starts, for each ``p``
    in ``positions``. Returns one dict per position: ``position``, ``latency`` (cycles from the
    push to the start of queue 1's task), ``after_end`` (cycles from T1's end to that start),
    ``counter`` (the SWITCH_LATENCY register) and ``switched`` (queue 1 ran between T1 and T2).
    """
    from npu_model.taskman import layout, task
    from npu_spec.descriptors import NE

    if positions is None:
        positions = [0, task_cycles // 4, task_cycles // 2, 3 * task_cycles // 4,
                     task_cycles - 4]
    windows = [(0x8000, 0xC00), (0x9000, 0xC00)]    # system-memory windows of the networks
    a = [task(0, NE, 16, network=1, src=0x800, src_mem=True, dst=0x400),
         task(1, NE, task_cycles, network=1, src=0x400, dst=0x401, tse=True, dpc=True,
              tsr=True),
         task(2, NE, 16, network=1, src=0x401, dst=0x402, spc=True, spl=True),
         task(3, NE, 16, network=1, src=0x402, dst=0x403, dst_mem=True)]
    b = [task(0, NE, 16, network=2, src=0x800, src_mem=True, dst=0x400, dst_mem=True)]
    results = []
    for position in positions:
        if not 0 <= position < task_cycles:
            raise ValueError(f"Position must be in [0, {task_cycles}), not {position!r}")
        image, placed = layout({0: a}, start=windows[0][0])
        img_b, placed_b = layout({1: b}, start=windows[1][0])
        image.update(img_b)
        bench = TaskBench(config, image, seed=seed)
        for j, (base, words) in enumerate(windows):
            bench.setup_window(j, base, words)
        bench.setup_queue(0, priority=1, network=1, base_index=0, head=placed[0].head, push=4)
        bench.setup_queue(1, priority=5, network=2, base_index=1, head=placed_b[1].head)
        bench.wait_start(0, 1)
        if position:
            bench.wait_cycles(position)
        bench.write("Q1_PUSH", count=1)
        bench.wait_end(1, 0)
        bench.read("SWITCH_LATENCY", "counter")
        bench.run()
        push = next(c for c, reg, _ in bench.host_log if reg == "Q1_PUSH")
        start_b = bench.events("start", 1)[0].time
        end_t1 = next(e.time for e in bench.events("end", 0) if e.task_id == 1)
        start_t2 = next(e.time for e in bench.events("start", 0) if e.task_id == 2)
        results.append({
            "position": position,
            "latency": start_b - push,
            "after_end": start_b - end_t1,
            "counter": bench.reads["counter"]["value"],
            "switched": end_t1 < start_b < start_t2,
        })
    return results
