"""Reference model of the neural task manager, and the behavioural engines' data semantics.

Plain Python (no Amaranth, no numpy). Three parts:

* **Behavioural engines** (:func:`engine_cycles`, :func:`engine_error`, :func:`task_value`,
  :class:`DataSpace`), one for each engine of :class:`npu_spec.engine.Engine` (neural, planar,
  DMA): a task runs for the number of cycles written to its engine's first register (the first
  word of the engine's address window, :data:`ENGINE_WINDOW`; a simulation convention of the
  behavioural models only) and ends with the error code written to the second register (0: it
  ran; a failed task writes nothing), reads ``src_len`` words at ``src`` from the data buffer or
  from system memory (``base + src``), and writes one tagged word, a hash of its network, task
  ID and inputs, to the buffer at ``dst`` and, when told to, to system memory at ``base +
  dst``. Every access is logged, so a test sees where each task read its input and wrote its output.
* **Memory images** (:func:`layout`): descriptor lists placed in system memory for the queues.
* **Models**: :func:`serial_run` executes task lists one after the other with no switch (the
  results every switched run must reproduce); :class:`TaskManagerModel` models the task
  manager's decisions — fetch target, fetch-queue replacement, commit (blocked behind an
  uncompleted TSR task), configuration queue, task buffer (per-engine order, dependencies,
  switch-point barriers, drain on a queue change, skew limit), switch rules 1-5 and errors
  (descriptor checks, bus errors on descriptor reads, engine errors, the watchdog) — with
  engine run times in cycles and no pipeline latency. It gives the order in which tasks start
  and end and where each read and wrote. (Secure mode is not modelled.)
"""

import zlib
from dataclasses import dataclass
from typing import NamedTuple

from npu_spec.descriptors import (
    NE,
    PE,
    AddressError,
    DecodeError,
    Descriptor,
    DescriptorError,
    WindowError,
    decode,
    encode,
)
from npu_spec.engine import ERROR_BITS, Engine
from npu_spec.registers import ADDRESS_WINDOWS
from npu_spec.regmap import WriteBlock
from npu_spec.taskman import Cause

__all__ = [
    "ENGINE_WINDOW",
    "DataSpace",
    "Event",
    "Placed",
    "Raised",
    "TaskManagerModel",
    "engine_cycles",
    "engine_error",
    "layout",
    "program",
    "serial_run",
    "task",
    "task_value",
]

#: First register word of each engine's window; the behavioural engines take their run length
#: from the last word written there.
ENGINE_WINDOW = {NE: ADDRESS_WINDOWS["NEURAL_ENGINE"][0], PE: ADDRESS_WINDOWS["PLANAR_ENGINE"][0],
                 Engine.DMA: ADDRESS_WINDOWS["DMA"][0]}


def engine_cycles(engine, writes):
    """Run length of a task of ``engine`` whose program is ``writes`` [(address, word)]."""
    cycles = 1
    for address, word in writes:
        if address == ENGINE_WINDOW[engine]:
            cycles = word
    return max(1, cycles)


def engine_error(engine, writes):
    """Error code a task of ``engine`` whose program is ``writes`` ends with (0: it ran): the
    last word written to the second register of the engine's window."""
    code = 0
    for address, word in writes:
        if address == ENGINE_WINDOW[engine] + 1:
            code = word
    return code & ((1 << ERROR_BITS) - 1)


def task_value(network, task_id, inputs):
    """The tagged output word of a task: a hash of its identity and its input words."""
    text = f"{network}:{task_id}:" + ",".join(f"{w:08x}" for w in inputs)
    return zlib.crc32(text.encode()) & 0xFFFF_FFFF


def program(engine, cycles, extra=(), error=0):
    """Entries of a behavioural program: the run length (and the error code the task ends
    with, if not 0), then ``extra`` blocks."""
    words = (cycles, error) if error else (cycles,)
    return (WriteBlock(ENGINE_WINDOW[engine], len(words), words),) + tuple(extra)


def task(task_id, engine=NE, cycles=8, error=0, **fields):
    """A :class:`Descriptor` with a behavioural program of ``cycles`` cycles that ends with
    error code ``error``."""
    return Descriptor(task_id=task_id, engine=engine,
                      blocks=program(engine, cycles, error=error), **fields)


class DataSpace:
    """System memory and the data buffer as seen by the behavioural engines, with a log."""

    def __init__(self, memory=None):
        self.mem = dict(memory or {})
        self.buf = {}
        self.log = []       # (kind, location, address, value, task key)

    def read(self, key, src_mem, base, src, src_len):
        where = "mem" if src_mem else "buf"
        values = []
        for i in range(src_len):
            if src_mem:
                value = self.mem.get(base + src + i, 0)
                self.log.append(("read", "mem", base + src + i, value, key))
            else:
                value = self.buf.get(src + i, 0)
                self.log.append(("read", "buf", src + i, value, key))
            values.append(value)
        return where, tuple(values)

    def write(self, key, value, dst_mem, base, dst):
        self.buf[dst] = value
        self.log.append(("write", "buf", dst, value, key))
        if dst_mem:
            self.mem[base + dst] = value
            self.log.append(("write", "mem", base + dst, value, key))


@dataclass
class Placed:
    """A task list placed in memory: its descriptors, their addresses, head and tail."""
    descriptors: list
    addresses: list
    head: int
    tail: int


def layout(lists, start=0x100, gap=0):
    """Place task lists one after the other from ``start``.

    ``lists`` maps a name to a list of :class:`Descriptor` (or of raw word lists, to place
    malformed descriptors). Returns ``(image, {name: Placed})`` with ``image`` a dict of word
    address to word.
    """
    image = {}
    placed = {}
    address = start
    for name, descs in lists.items():
        head = address
        addresses = []
        for desc in descs:
            words = list(desc) if isinstance(desc, (list, tuple)) else encode(desc)
            addresses.append(address)
            for k, w in enumerate(words):
                image[address + k] = w
            address += len(words)
        placed[name] = Placed(list(descs), addresses, head, address)
        address += gap
    return image, placed


def serial_run(descs, base, memory=None, space=None):
    """Run ``descs`` in list order with no task switch: static locations only.

    Returns ``({task_id: (input location, inputs, output)}, space)``.
    """
    space = space or DataSpace(memory)
    results = {}
    for desc in descs:
        key = (desc.network, desc.task_id)
        where, inputs = space.read(key, desc.src_mem, base, desc.src, desc.src_len)
        value = task_value(desc.network, desc.task_id, inputs)
        space.write(key, value, desc.dst_mem, base, desc.dst)
        results[desc.task_id] = (where, inputs, value)
    return results, space


@dataclass
class Event:
    """One line of a trace: a task started or ended (or was aborted, or failed)."""
    kind: str           # "start", "end", "abort" (watchdog) or "error" (engine error code)
    time: int
    queue: int
    task_id: int
    engine: int
    src_mem: bool = False
    dst_mem: bool = False
    inputs: tuple = ()
    value: int = 0
    error: int = 0      # the engine's error code ("error" events)


class Raised(NamedTuple):
    """An exception: its cause, the queue it retired, the descriptor's address, and for
    ``ENGINE`` and ``TIMEOUT`` the task's engine (for ``ENGINE`` also the error code)."""
    cause: Cause
    queue: int
    address: int
    engine: int = 0
    code: int = 0


@dataclass
class _Queue:
    priority: int = 0
    network: int = 0
    base: int = 0
    limit: int = 1 << 30
    head: int = 0
    tail: int = 0
    count: int = 0
    tqsp: bool = False
    retired: bool = False
    drop: bool = False


@dataclass
class _Slot:
    queue: int
    desc: Descriptor
    address: int


@dataclass
class _Entry:
    seq: int
    queue: int
    desc: Descriptor
    address: int
    base: int
    limit: int
    started: bool = False
    end: int = None
    src_mem: bool = False
    inputs: tuple = ()


class TaskManagerModel:
    """The task manager's decisions with engine run times and no pipeline latency.

    Parameters
    ----------
    image : dict
        System memory (descriptors and input data), word address to word.
    queues : int
        Number of task queues.
    config_depth, buffer_depth : int
        Configuration-queue and task-buffer depths.
    slot_words : int
        Largest descriptor accepted, in words.
    skew : int
        Skew limit (0: the buffer depth).
    watchdog : int
        Watchdog limit in cycles (0: off).
    bus_errors : set
        Word addresses whose reads the bus answers with an error. A descriptor fetch that reads
        one (word 0, or any word of a descriptor whose length is known) raises ``BUS`` before
        any check of the descriptor (the RTL checks words in order; tests place bus errors in
        otherwise good descriptors).
    """

    def __init__(self, image, queues=4, *, config_depth=2, buffer_depth=4, slot_words=32, skew=0,
                 watchdog=0, bus_errors=()):
        self.space = DataSpace(image)
        self.slot_words = slot_words
        self.image = dict(image)
        self.q = [_Queue() for _ in range(queues)]
        self.config_depth = config_depth
        self.buffer_depth = buffer_depth
        self.skew = skew or buffer_depth
        self.watchdog = watchdog
        self.bus_errors = set(bus_errors)
        self.cur = None
        self.gtsp = False
        self.tsr_pending = False
        self.fetch = None            # (queue, address) of the fetch queue, if any
        self.cfg = []
        self.tb = []
        self.seq = 0
        self.last_queue = None
        self.run_q = None
        self.running = dict.fromkeys(Engine)
        self.time = 0
        self.trace = []
        self.errors = []             # Raised
        self.fetches = []            # (queue, address) of every descriptor fetch started
        self.triggers = []           # (kind, queue, task_id, action)

    # Host interface.

    def set_queue(self, i, *, priority=None, network=None, base=None, limit=None, tail=None):
        q = self.q[i]
        for name, value in (("priority", priority), ("network", network), ("base", base),
                            ("limit", limit), ("tail", tail)):
            if value is not None:
                setattr(q, name, value)

    def set_head(self, i, address):
        q = self.q[i]
        q.head, q.retired, q.drop, q.tqsp = address, False, False, False

    def push(self, i, count):
        self.q[i].count += count

    def on(self, kind, queue, task_id, action):
        """Call ``action(model)`` when task ``task_id`` of ``queue`` has event ``kind``."""
        self.triggers.append((kind, queue, task_id, action))

    # Decisions.

    def _request_above(self, priority):
        best = self._arbiter()
        return best is not None and self.q[best].priority > priority

    def _arbiter(self):
        best = None
        for i, q in enumerate(self.q):
            if q.count and not q.retired and (best is None or q.priority > self.q[best].priority):
                best = i
        return best

    def _target(self):
        if self.cur is not None and self.q[self.cur].count and not self.q[self.cur].retired:
            return self.cur
        return self._arbiter()

    def _words(self, address):
        words = []
        h0 = self.image.get(address, 0)
        length = (h0 >> 8) & 0xFF
        for k in range(max(length, 1)):
            words.append(self.image.get(address + k, 0))
        return words

    def _fetch_and_commit(self):
        target = self._target()
        if self.fetch is not None and (target is None or self.fetch[0] != target
                                       or self.q[target].head != self.fetch[1]):
            self.fetch = None                        # replaced: no side effects
        if target is None:
            return False
        q = self.q[target]
        if self.fetch is None:
            self.fetch = (target, q.head)
            self.fetches.append(self.fetch)
            words = self._words(q.head)
            try:
                if any(q.head + k in self.bus_errors for k in range(len(words))):
                    cause = Cause.BUS
                else:
                    cause = None
                    desc = decode(words, network=q.network, window=(q.base, q.limit),
                                  address=q.head, tail=q.tail, max_length=self.slot_words)
            except DescriptorError as e:
                cause = {DecodeError: Cause.DECODE, AddressError: Cause.ADDRESS,
                         WindowError: Cause.WINDOW}[type(e)]
            if cause is not None:
                self.errors.append(Raised(cause, target, q.head))
                q.retired = True
                if self.cur == target:
                    self.cur = None
                self.fetch = None
                return True
            self.fetch_desc = desc
        if len(self.cfg) < self.config_depth and not self.tsr_pending:
            desc = self.fetch_desc
            self.cfg.append(_Slot(target, desc, q.head))
            q.head += desc.length
            q.count -= 1
            self.cur = target
            if desc.tsr:
                self.tsr_pending = True
            self.fetch = None
            return True
        return False

    def _load(self):
        if not self.cfg:
            return False
        slot = self.cfg[0]
        if self.q[slot.queue].drop:
            self.cfg.pop(0)
            if slot.desc.tsr:
                self.tsr_pending = False
            return True
        if len(self.tb) >= self.buffer_depth:
            return False
        if any(self.seq - e.seq >= self.skew for e in self.tb):
            return False
        if self.tb and slot.queue != self.last_queue:
            return False
        self.cfg.pop(0)
        self.tb.append(_Entry(self.seq, slot.queue, slot.desc, slot.address,
                              self.q[slot.queue].base, self.q[slot.queue].limit))
        self.last_queue = slot.queue
        self.seq += 1
        return True

    def _start(self):
        progress = False
        for engine in Engine:
            if self.running[engine] is not None:
                continue
            pending = [e for e in self.tb if not e.started and e.desc.engine == engine]
            if not pending:
                continue
            e = pending[0]
            older = [o for o in self.tb if o.seq < e.seq]
            if e.desc.dep and any(o.seq == e.seq - e.desc.dep for o in older):
                continue
            if any(o.desc.tse or o.desc.tsr or o.desc.spl for o in older):
                continue
            if (e.desc.tse or e.desc.tsr or e.desc.spl) and older:
                continue
            if self.run_q != e.queue:
                self.gtsp = False
            self.run_q = e.queue
            d = e.desc
            e.started = True
            e.src_mem = d.src_mem or (d.spc and self.q[e.queue].tqsp)
            _, e.inputs = self.space.read((e.queue, d.task_id), e.src_mem, e.base, d.src,
                                          d.src_len)
            writes = [(b.address + i, w) for b in d.blocks for i, w in enumerate(b.words)]
            cycles = engine_cycles(engine, writes)
            e.error = engine_error(engine, writes)
            if self.watchdog and cycles >= self.watchdog:
                e.end = self.time + self.watchdog
                e.timeout = True
            else:
                e.end = self.time + cycles
                e.timeout = False
            self.running[engine] = e
            self.trace.append(Event("start", self.time, e.queue, d.task_id, engine, e.src_mem,
                                    d.dst_mem, e.inputs))
            self._fire("start", e.queue, d.task_id)
            progress = True
        return progress

    def _finish(self):
        done = [e for e in self.running.values() if e is not None and e.end == self.time]
        for e in done:
            d = e.desc
            self.running[d.engine] = None
            self.tb.remove(e)
            if d.tsr:
                self.tsr_pending = False
            if e.timeout or e.error:
                if e.timeout:
                    self.errors.append(Raised(Cause.TIMEOUT, e.queue, e.address, d.engine))
                    self.trace.append(Event("abort", self.time, e.queue, d.task_id, d.engine))
                else:
                    self.errors.append(Raised(Cause.ENGINE, e.queue, e.address, d.engine,
                                              e.error))
                    self.trace.append(Event("error", self.time, e.queue, d.task_id, d.engine,
                                            e.src_mem, d.dst_mem, e.inputs, error=e.error))
                self.q[e.queue].retired = self.q[e.queue].drop = True
                if self.cur == e.queue:
                    self.cur = None
                for o in list(self.tb):
                    if o.queue == e.queue and not o.started:
                        self.tb.remove(o)
                continue
            if d.tse and self._request_above(self.q[e.queue].priority):
                self.gtsp = True                                   # rule 1
            dst_mem = d.dst_mem or (d.dpc and self.gtsp)          # rule 2
            value = task_value(d.network, d.task_id, e.inputs)
            self.space.write((e.queue, d.task_id), value, dst_mem, e.base, d.dst)
            if d.tsr and self.gtsp:                                # rule 3
                self.q[e.queue].tqsp = True
                self.gtsp = False
                self.cur = None
            if d.spl:                                              # rule 5
                self.q[e.queue].tqsp = False
            self.trace.append(Event("end", self.time, e.queue, d.task_id, d.engine, e.src_mem,
                                    dst_mem, e.inputs, value))
            self._fire("end", e.queue, d.task_id)
        return bool(done)

    def _fire(self, kind, queue, task_id):
        for trig in list(self.triggers):
            if trig[:3] == (kind, queue, task_id):
                self.triggers.remove(trig)
                trig[3](self)

    def run(self, max_time=1_000_000):
        """Run until nothing is left to do; returns the trace."""
        while self.time < max_time:
            self._finish()
            while self._fetch_and_commit() | self._load() | self._start():
                pass
            busy = any(e is not None for e in self.running.values())
            if not busy and not self.cfg and not self.tb and self._target() is None:
                return self.trace
            if not busy and (self.cfg or self.tb):
                raise RuntimeError("model deadlock")
            self.time += 1
        raise RuntimeError("model did not finish")
