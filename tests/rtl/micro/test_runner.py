# amaranth: UnusedElaboratable=no
"""The micro task runner and register file (``npu.micro.runner``, ``npu.micro.regfile``)
through the micro NPU (``npu_sim.micro.run_micro``) on hand-built descriptor lists: every
task list ends as on the golden system model (``npu_model.system.run_program``): the same
system memory, the same queue status (retired or not, the cause, the descriptor address),
and never a hang. The identity registers are those the runtime checks."""

import dataclasses

import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator

from npu.micro.runner import MicroRunner
from npu_model.system import run_program
from npu_sim.micro import run_micro
from npu_sim.system import setup_writes
from npu_spec import dma
from npu_spec.config import preset
from npu_spec.descriptors import ENTRY, HEADER, MAGIC, Descriptor, encode
from npu_spec.dma import DmaDir, DmaError, DmaFormat, make_transfer, transfer_writes
from npu_spec.engine import Engine
from npu_spec.micro import REGISTER_BLOCKS, UNSUPPORTED, register_row, reset_rows
from npu_spec.program import BaseEntry, Program, QueueSetup
from npu_spec.registers import ADDRESS_WINDOWS, NPU_INFO, npu_info_values
from npu_spec.regmap import WriteBlock
from npu_spec.taskman import Cause, task_manager_map

#: 4 KiB of system memory, so that a run simulates quickly.
SMALL = dataclasses.replace(preset("icebreaker"), mem_kib=4)
HEAD = 16            # word address of the first descriptor
DATA = 2048          # byte address of the data


def _copy(k):
    """A DMA task: 8 bytes from memory into the buffer, then out again 16 bytes further on."""
    return [make_transfer(dir=DmaDir.MEM_TO_BUF, fmt=DmaFormat.INT8, mem_addr=DATA + 8 * k,
                          buf_addr=8 * k, sizes=[8], mem_strides=[1], buf_strides=[1]),
            make_transfer(dir=DmaDir.BUF_TO_MEM, fmt=DmaFormat.INT8,
                          mem_addr=DATA + 512 + 8 * k, buf_addr=8 * k, sizes=[4, 2],
                          mem_strides=[2, 1], buf_strides=[1, 4])]


def _dma_words(task_id, t, **fields):
    writes = sorted(transfer_writes(t))
    block = WriteBlock(writes[0][0], len(writes), tuple(v for _, v in writes))
    return encode(Descriptor(task_id=task_id, engine=Engine.DMA, blocks=(block,), **fields))


def _program(descriptors, *, tasks=None, tail=0, network=0, limit=None, config=SMALL):
    """A program of one queue whose descriptors (lists of words) lie from word HEAD on."""
    rng = np.random.default_rng(len(descriptors))
    memory = bytearray(rng.integers(0, 256, config.mem_kib * 1024, dtype=np.uint8).tobytes())
    words = [w for d in descriptors for w in d]
    memory[4 * HEAD:4 * (HEAD + len(words))] = b"".join(w.to_bytes(4, "little") for w in words)
    limit = config.mem_kib * 256 if limit is None else limit
    queue = QueueSetup(0, network=network, head=HEAD, tail=tail,
                       tasks=len(descriptors) if tasks is None else tasks)
    return Program(config, base_table=(BaseEntry(0, limit),), queues=(queue,),
                   memory=bytes(memory))


def _good(n):
    out = []
    for k in range(n):
        fill, store = _copy(k)
        out += [_dma_words(2 * k, fill), _dma_words(2 * k + 1, store)]
    return out


def _compare(program, **units):
    """The micro run equals the golden run: memory and queue 0's status."""
    golden = run_program(program)
    got = run_micro(program, **units)
    assert got["memory"] == golden.memory
    tm = task_manager_map(program.config.task_queues)
    status = tm["Q0_STATUS"].unpack(got["registers"]["Q0_STATUS"])
    exc = tm["EXC_STATUS"].unpack(got["registers"]["EXC_STATUS"])
    q = golden.queue(0)
    assert bool(status["retired"]) == q.retired
    assert exc["cause"] == q.cause
    if q.retired:
        assert got["registers"]["EXC_ADDR"] == q.address
        assert exc["count"] == 1
        assert exc["engine"] == (q.engine or 0) and exc["error_code"] == q.code
        assert tm["IRQ_STATUS"].unpack(got["registers"]["IRQ_STATUS"])["error"] == 1
    return got, golden


def test_a_good_list_runs_every_task():
    program = _program(_good(3))
    got, golden = _compare(program)
    assert not golden.queue(0).retired and golden.queue(0).completed == 6
    # The copies really happened (the test can fail): the stored bytes differ from before.
    assert got["memory"][DATA + 512:DATA + 512 + 24] != program.memory[DATA + 512:DATA + 536]


def test_identity_registers():
    got = run_micro(_program(_good(1)))
    want = npu_info_values(SMALL)
    for name, fields in want.items():
        assert got["registers"][name] == NPU_INFO[name].pack(**fields)


def _bad(word_index, value):
    """Good list of four, the third descriptor's word ``word_index`` replaced."""
    descs = _good(2)
    descs[2] = list(descs[2])
    descs[2][word_index] = value
    return descs


def _h0(**fields):
    base = dict(magic=MAGIC, length=21, engine=Engine.DMA)
    base.update(fields)
    return HEADER[0].pack(strict=False, **base)


BAD = {
    "bad magic": lambda: _bad(0, _h0(magic=0x55)),
    "engine code 3": lambda: _bad(0, _h0(engine=3)),
    "reserved bit in H0": lambda: _bad(0, _h0() | 1 << 31),
    "length below the header": lambda: _bad(0, _h0(length=3)),
    "length above the slot": lambda: _bad(0, _h0(length=65)),
    "reserved bit in H2": lambda: _bad(2, 1 << 30),
    "reserved bit in H3": lambda: _bad(3, 1 << 20),
    "source past the window": lambda: _bad(2, HEADER[2].pack(src=1000, src_len=30)),
    "destination past the window": lambda: _bad(3, HEADER[3].pack(dst=1024)),
    "entry of count 0": lambda: _bad(4, ENTRY.pack(address=dma.BASE + 8, count=0)),
    "entry past the length": lambda: _bad(4, ENTRY.pack(address=dma.BASE + 8, count=17)),
    "entry outside every window": lambda: _bad(
        4, ENTRY.pack(address=ADDRESS_WINDOWS["DMA"][0] + ADDRESS_WINDOWS["DMA"][1] - 8,
                      count=16)),
    "entry from one window into the next": lambda: _bad(
        4, ENTRY.pack(address=ADDRESS_WINDOWS["DMA"][0] - 8, count=16)),
    "entry in no window at all": lambda: _bad(
        4, ENTRY.pack(address=ADDRESS_WINDOWS["DMA"][0] + 0x1000, count=16)),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_descriptor_retires_the_queue_like_golden(case):
    program = _program(BAD[case]())
    got, golden = _compare(program)
    assert golden.queue(0).retired and golden.queue(0).completed == 2


def test_wrong_network_is_a_decode_error():
    program = _program(_good(1), network=3)
    _, golden = _compare(program)
    assert golden.queue(0).cause == Cause.DECODE


def test_descriptor_past_the_tail_and_the_window():
    descs = _good(2)
    tail = HEAD + sum(len(d) for d in descs[:3])
    _, golden = _compare(_program(descs, tail=tail))
    assert golden.queue(0).cause == Cause.WINDOW and golden.queue(0).completed == 3
    _, golden = _compare(_program(descs, limit=HEAD + 10))
    assert golden.queue(0).cause == Cause.WINDOW and golden.queue(0).completed == 0


def test_window_of_word_0_before_the_network_of_word_1():
    """Word 0's window check (made with word 1) decides the cause before word 1's network."""
    _, golden = _compare(_program(_good(1), limit=HEAD + 10, network=3))
    assert golden.queue(0).cause == Cause.WINDOW and golden.queue(0).completed == 0


def test_more_tasks_than_descriptors():
    """A queue pushed with more tasks than descriptors runs into the data after them."""
    descs = _good(1)
    program = _program(descs, tasks=3)
    _, golden = _compare(program)
    assert golden.queue(0).cause == Cause.DECODE


def test_dma_error_ends_the_queue():
    bad = make_transfer(dir=DmaDir.MEM_TO_BUF, fmt=DmaFormat.HALF, mem_addr=DATA + 1,
                        buf_addr=0, sizes=[2], mem_strides=[2], buf_strides=[1])
    descs = _good(1) + [_dma_words(9, bad)] + _good(1)
    _, golden = _compare(_program(descs))
    assert golden.queue(0).code == DmaError.ALIGN and golden.queue(0).completed == 2


@pytest.mark.parametrize("engine", [Engine.NEURAL, Engine.PLANAR])
def test_an_absent_unit_ends_the_task_with_unsupported(engine):
    descs = _good(1) + [encode(Descriptor(task_id=5, engine=engine,
                                          blocks=(WriteBlock(dma.BASE + 8, 1, (0,)),)))]
    got = run_micro(_program(descs))
    tm = task_manager_map(SMALL.task_queues)
    exc = tm["EXC_STATUS"].unpack(got["registers"]["EXC_STATUS"])
    assert exc["cause"] == Cause.ENGINE and exc["engine"] == engine
    assert exc["error_code"] == UNSUPPORTED
    assert tm["Q0_STATUS"].unpack(got["registers"]["Q0_STATUS"])["retired"] == 1


def test_register_rows():
    """Every register an engine of the micro build reads has a row of its own, and the RAM
    starts with the reset values."""
    from npu_spec import dataproc, neural, planar
    maps = [(neural.core_base(0), neural.NEURAL_ENGINE), (planar.BASE, planar.PLANAR_ENGINE),
            (dma.BASE, dma.DMA)]
    addresses = [base + r.offset for base, regmap in maps for r in regmap.registers]
    addresses += [dataproc.DATA_PROCESSOR.address(r.name)
                  for r in dataproc.DATA_PROCESSOR.registers if r.name != "NE_CORES"]
    rows = [register_row(a) for a in addresses]
    assert None not in rows and len(set(rows)) == len(rows)
    assert register_row(dataproc.NE_CORES) is None
    assert register_row(REGISTER_BLOCKS[0] - 1) is None
    reset = reset_rows()
    assert reset[register_row(neural.core_base(0) + neural.NEURAL_ENGINE["POST_SEED"].offset)] \
        == neural.NEURAL_ENGINE["POST_SEED"].reset


def test_a_neural_task_without_core_0_runs_nothing():
    """``NE_CORES`` 0: the golden model runs no core and the task ends with 0; so does the
    micro runner, without starting the (absent) neural unit. Then ``NE_CORES`` 1: the absent
    unit ends the next neural task with ``UNSUPPORTED``."""
    from npu_spec import dataproc

    def neural(task_id, mask):
        return encode(Descriptor(task_id=task_id, engine=Engine.NEURAL,
                                 blocks=(WriteBlock(dataproc.NE_CORES, 1, (mask,)),)))

    _, golden = _compare(_program(_good(1) + [neural(7, 0)]))
    assert not golden.queue(0).retired and golden.queue(0).completed == 3
    got = run_micro(_program(_good(1) + [neural(7, 0), neural(8, 1)]))
    tm = task_manager_map(SMALL.task_queues)
    exc = tm["EXC_STATUS"].unpack(got["registers"]["EXC_STATUS"])
    assert exc["cause"] == Cause.ENGINE and exc["error_code"] == UNSUPPORTED
    assert got["registers"]["EXC_ADDR"] == HEAD + sum(len(d) for d in _good(1)) + 6


def _push_race(delay):
    """The runner alone with a memory of header-only DMA descriptors (4 words each) and a unit
    that ends each task ``done`` a few cycles after its start. The host pushes one task, then
    a second one ``delay`` cycles after the first task's ``done``. Returns the number of tasks
    started and the final ``Q0_STATUS.count``."""
    words = [w for k in range(8) for w in encode(Descriptor(task_id=k, engine=Engine.DMA,
                                                            blocks=()))]
    assert len(words) == 8 * 4
    runner = MicroRunner(SMALL)
    m = Module()
    m.submodules.runner = runner
    m.submodules.mem = mem = Memory(shape=32, depth=64, init=words)
    rd = mem.read_port()
    m.d.comb += [rd.addr.eq(runner.mem_addr), rd.en.eq(runner.mem_re),
                 runner.mem_rdata.eq(rd.data)]
    tm = task_manager_map(SMALL.task_queues)
    bus = runner.bus
    result = {}

    async def write(ctx, name, value):
        ctx.set(bus.addr, tm.address(name))
        ctx.set(bus.w_data, value)
        ctx.set(bus.w_en, 1)
        await ctx.tick()
        ctx.set(bus.w_en, 0)

    async def host(ctx):
        for name, value in (("BASE0", 0), ("LIMIT0", 64), ("Q0_HEAD", 0), ("CTRL", 1),
                            ("Q0_PUSH", 1)):
            await write(ctx, name, value)
        starts, pushed = 0, False
        for _ in range(400):
            if ctx.get(runner.start):
                starts += 1
                for _ in range(3):
                    await ctx.tick()
                ctx.set(runner.done, 1)
                await ctx.tick()
                ctx.set(runner.done, 0)
                if not pushed:
                    for _ in range(delay):
                        await ctx.tick()
                    await write(ctx, "Q0_PUSH", 1)
                    pushed = True
                continue
            await ctx.tick()
        ctx.set(bus.addr, tm.address("Q0_STATUS"))
        ctx.set(bus.r_en, 1)
        await ctx.tick()
        ctx.set(bus.r_en, 0)
        result["count"] = tm["Q0_STATUS"].unpack(ctx.get(bus.r_data))["count"]
        result["starts"] = starts

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(host)
    sim.run()
    return result["starts"], result["count"]


@pytest.mark.parametrize("delay", [0, 1, 2])
def test_a_push_as_a_task_retires_is_kept(delay):
    """A host write to ``Q0_PUSH`` in any cycle around the one in which the runner retires a
    task (delay 0: the cycle after ``done``, when it takes the count down) adds its tasks:
    both pushed tasks run and the queue ends empty."""
    assert _push_race(delay) == (2, 0)


def test_registers_of_queue_1_read_0():
    """The micro build keeps queue 0 only: the setup of queue 1 is dropped and reads back 0,
    which is how the board backend tells it from a build with two queues
    (``npu_sim.board_host``: the same ``NPU_INFO``, ``task_queues`` 2). Queue 0 still runs."""
    program = _program(_good(1))
    tm = task_manager_map(SMALL.task_queues)
    tail = tm["Q1_TAIL"].pack(address=0x123)
    writes = setup_writes(program) + [
        (tm.address("Q1_CTRL"), tm["Q1_CTRL"].pack(priority=3)),
        (tm.address("Q1_TAIL"), tail),
        (tm.address("Q1_HEAD"), tm["Q1_HEAD"].pack(address=HEAD)),
        (tm.address("Q1_PUSH"), tm["Q1_PUSH"].pack(count=2))]
    assert tail != 0
    got = run_micro(program, writes=writes, reads=("Q1_TAIL", "Q1_CTRL"))
    assert got["registers"]["Q1_TAIL"] == 0 and got["registers"]["Q1_CTRL"] == 0
    assert got["registers"]["Q1_STATUS"] == 0
    assert got["memory"] == run_program(program).memory
