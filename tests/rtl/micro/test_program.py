# amaranth: UnusedElaboratable=no
"""The micro NPU (``npu.micro.top``) on the digits CNN's int8 program for the ``icebreaker``
preset (``docs/micro.md``), with a random int8 input: its DMA tasks leave the buffer, the
kernel memory and system memory as the golden system model does; a task for an engine the
build was given no unit for ends the queue with ``UNSUPPORTED``, never a hang; and (slow) the
whole program with the micro neural and planar units leaves system memory as the golden model
does, byte for byte."""

import dataclasses

import numpy as np
import pytest

from npu.micro.ne import MicroNeural
from npu.micro.pe import MicroPlanar
from npu_compiler.compile import compile_model
from npu_model.system import read_tensor, run_program, write_tensor
from npu_runtime.runtime import session
from npu_sim.micro import run_micro
from npu_spec.config import preset
from npu_spec.descriptors import HEADER
from npu_spec.engine import Engine
from npu_spec.micro import UNSUPPORTED
from npu_spec.taskman import Cause, task_manager_map

from ...compiler.test_digits import MODEL, load_train_module


@pytest.fixture(scope="module")
def digits():
    x_train = load_train_module().load_split()[0]
    compiled = compile_model(str(MODEL), preset("icebreaker"), fmt="int8",
                             calibration={"input": x_train[:50]}, evaluator=session)
    program = compiled.program
    memory = np.frombuffer(program.memory, np.uint8).copy()
    (inp,) = [t for t in program.tensors if t.role == "input"]
    write_tensor(memory, inp, np.random.default_rng(7).integers(-128, 128, inp.shape))
    return dataclasses.replace(program, memory=memory.tobytes())


def _engines(program):
    """The engine of each task of queue 0, in order."""
    (q,) = program.queues
    address, engines = q.head, []
    for _ in range(q.tasks):
        word = int.from_bytes(program.memory[4 * address:4 * address + 4], "little")
        h0 = HEADER[0].unpack(word, strict=False)
        engines.append(h0["engine"])
        address += h0["length"]
    return engines


def test_dma_tasks_equal_golden(digits):
    """The tasks before the first neural one (the input and the first kernels)."""
    engines = _engines(digits)
    first = engines.index(Engine.NEURAL)
    assert first >= 2 and set(engines[:first]) == {Engine.DMA}
    (q,) = digits.queues
    program = dataclasses.replace(digits, queues=(dataclasses.replace(q, tasks=first),))
    golden = run_program(program)
    got = run_micro(program, onchip=True)
    assert not golden.queue(0).retired and golden.queue(0).completed == first
    assert got["memory"] == golden.memory
    assert got["buffer"] == [int(v) for v in golden.buffer]
    assert got["kernel"] == [int(w) for w in golden.kernel_memories[0]]
    assert any(got["kernel"]) and any(got["buffer"])


def test_an_engine_without_a_unit_ends_the_queue(digits):
    engines = _engines(digits)
    first = engines.index(Engine.NEURAL)
    got = run_micro(digits)
    tm = task_manager_map(digits.config.task_queues)
    exc = tm["EXC_STATUS"].unpack(got["registers"]["EXC_STATUS"])
    assert exc["cause"] == Cause.ENGINE and exc["engine"] == Engine.NEURAL
    assert exc["error_code"] == UNSUPPORTED
    status = tm["Q0_STATUS"].unpack(got["registers"]["Q0_STATUS"])
    assert status["retired"] == 1 and status["count"] == 0
    assert first == 2


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True], ids=["two_units", "pooling_in_neural"])
def test_whole_program_equals_golden(digits, shared):
    """The whole program with the micro neural and planar units (``npu.micro.ne``,
    ``npu.micro.pe``), or with one neural unit running the pooling tasks too (the board's
    build, ``npu_fpga.boards.micro_npu``): the logits and the whole system memory equal the
    golden model's, byte for byte, on a random int8 input (about 4 minutes each in the
    Amaranth simulator)."""
    program = digits
    golden = run_program(program)
    if shared:
        unit = MicroNeural(pooling=True)
        units = {"neural": unit, "planar": unit}
    else:
        units = {"neural": MicroNeural(), "planar": MicroPlanar()}
    got = run_micro(program, **units)
    assert not golden.queue(0).retired and golden.queue(0).completed == digits.queues[0].tasks
    assert got["registers"]["EXC_STATUS"] == 0
    (out,) = [t for t in digits.tensors if t.role == "output"]
    assert (read_tensor(got["memory"], out) == read_tensor(golden.memory, out)).all()
    assert got["memory"] == golden.memory
