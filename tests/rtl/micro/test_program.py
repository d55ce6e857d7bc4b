# amaranth: UnusedElaboratable=no
"""The micro NPU (``npu.micro.top``) on the digits CNN's int8 program for the ``icebreaker``
preset (``docs/micro.md``): its DMA tasks leave the buffer, the kernel memory and system
memory as the golden system model does, and a task for an engine the build was given no unit
for ends the queue with ``UNSUPPORTED``, never a hang."""

import dataclasses

import pytest

from npu_compiler.compile import compile_model
from npu_model.system import run_program
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
    x_train, _, x_test, _ = load_train_module().load_split()
    compiled = compile_model(str(MODEL), preset("icebreaker"), fmt="int8",
                             calibration={"input": x_train[:50]}, evaluator=session)
    program = compiled.program
    memory = bytearray(program.memory)
    (tensor,) = [t for t in program.tensors if t.role == "input"]
    values = (x_test[0].reshape(-1) * 127).round().astype("int8")
    memory[tensor.addr:tensor.addr + values.size] = values.tobytes()
    return dataclasses.replace(program, memory=bytes(memory))


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
