"""The ``board`` backend without a board (``npu_sim.board_host``, ``docs/boards.md``): the host
protocol runs through a pyserial-compatible fake port, the bridge's reference model and the
NPU's registers acted out by the golden system model (``npu_sim.board_model``); outputs and
memory must equal the golden backend's byte for byte. Then the failures: a board built for
another configuration, an NPU that never finishes, a silent line, a framing error. Last,
several programs on one board at different priorities (the host's late push), and the micro
build's one queue."""

import numpy as np
import pytest

from npu_compiler.compile import compile_model
from npu_runtime.runtime import Job, run, run_jobs, session
from npu_sim.board_host import BoardConfigError, BoardQueuesError, BoardRunError, run_on_board
from npu_sim.board_model import FakeSerial, GoldenBoard
from npu_sim.uart_host import BridgeClient, BridgeError
from npu_spec.config import preset
from npu_spec.registers import NPU_INFO

from ..compiler.models import activation_chain
from ..compiler.test_digits import MODEL, load_train_module


@pytest.fixture(scope="module")
def digits():
    x_train, _, x_test, _ = load_train_module().load_split()
    compiled = compile_model(str(MODEL), preset("icebreaker"), fmt="int8",
                             calibration={"input": x_train[:50]}, evaluator=session)
    return compiled.program, x_test


def _client(board, **port):
    return BridgeClient(FakeSerial(board, **port), timeout=0.2, name="fake port")


def test_board_backend_equals_golden_byte_for_byte(digits):
    """Three digits images, one after the other on the same board (so a run must not depend
    on what the previous one left in memory): logits and the loaded memory extent equal the
    golden backend's, bit for bit."""
    program, x_test = digits
    board = GoldenBoard(program.config)
    client = _client(board)
    for k in (0, 7, 3):
        x = {"input": x_test[k:k + 1]}
        golden = run(program, x, "golden")
        got = run(program, x, "board", board=client)
        for name, value in golden.outputs.items():
            assert got.outputs[name].tobytes() == value.tobytes()
        assert len(got.memory) >= len(program.memory)
        assert got.memory == golden.memory[:len(got.memory)]
        # The trace: every task of the program started and ended, in order.
        tasks = program.queues[0].tasks
        assert len(got.tasks) == tasks and [t[0] for t in got.tasks] == sorted(
            t[0] for t in got.tasks)
    # The runs differ (different images give different logits).
    assert not np.array_equal(run(program, {"input": x_test[0:1]}, "golden").outputs["logits"],
                              run(program, {"input": x_test[7:8]}, "golden").outputs["logits"])


def test_run_on_board_reads_counters_queues_and_trace(digits):
    program, x_test = digits
    from npu_runtime.runtime import prepare
    prog = prepare(program, {"input": x_test[:1]})
    res = run_on_board(_client(GoldenBoard(program.config)), prog)
    assert res["registers"]["TASKS_RUN"] == program.queues[0].tasks
    assert res["registers"]["EXC_STATUS"] & 0xFF == 0
    assert res["queues"] == {0: 0}
    assert len(res["trace"]) == 2 * program.queues[0].tasks
    assert res["cycles"] == 2 * program.queues[0].tasks - 1     # task ordinals on the fake


def test_a_board_of_another_configuration_is_refused(digits):
    program, x_test = digits
    board = GoldenBoard(preset("ulx3s"))
    with pytest.raises(BoardConfigError, match=r"another configuration.*macs board 32 "
                                               r"program 8") as info:
        run(program, {"input": x_test[:1]}, "board", board=_client(board))
    assert "\n" not in str(info.value)
    # Nothing was written before the check.
    assert not any(board.memory)


def test_an_npu_that_never_finishes_times_out(digits):
    program, x_test = digits
    board = GoldenBoard(program.config, hang=True)
    with pytest.raises(BoardRunError, match=r"^timeout: the NPU on fake port did not finish "
                                            r"in 0.3 s"):
        run(program, {"input": x_test[:1]}, "board", board=_client(board), board_timeout=0.3)


def test_a_silent_line_is_a_timeout(digits):
    program, x_test = digits
    with pytest.raises(BridgeError, match=r"^timeout: the read of 1 words .* answered 0 of 4 "
                                          r"bytes in 0.2 s on fake port"):
        run(program, {"input": x_test[:1]}, "board",
            board=_client(GoldenBoard(program.config), silent=True))


def test_a_framing_error_is_reported(digits):
    program, x_test = digits
    with pytest.raises(BridgeError, match=r"the bridge on fake port reports: framing"):
        run(program, {"input": x_test[:1]}, "board",
            board=_client(GoldenBoard(program.config), framing=True))


def test_a_corrupted_identification_is_refused(digits):
    """A byte of the first read frame flipped on the line: the answer is not this NPU's ID
    (or none comes), never a run."""
    program, x_test = digits
    board = GoldenBoard(program.config)
    # Byte 5 is the address's low byte of the first frame (the read of NPU_INFO.ID).
    client = _client(board, corrupt={5: NPU_INFO["VERSION"].offset})
    with pytest.raises(BridgeError, match=r"is not this NPU: ID reads"):
        run(program, {"input": x_test[:1]}, "board", board=client)


def test_another_register_interface_is_refused(digits):
    program, x_test = digits
    board = GoldenBoard(program.config)
    board.regs.ro[NPU_INFO["VERSION"].offset] = NPU_INFO["VERSION"].pack(major=2, minor=0)
    with pytest.raises(BoardConfigError, match=r"has register interface 2.0; this host speaks "
                                               r"1.x"):
        run(program, {"input": x_test[:1]}, "board", board=_client(board))


@pytest.fixture(scope="module")
def long_program():
    """A program of more tasks than the trace buffer holds entries for (32 tasks)."""
    compiled = compile_model(activation_chain(16), preset("small"))
    assert compiled.program.queues[0].tasks > 32
    x = np.random.default_rng(3).standard_normal((1, 4, 5, 5)).astype(np.float32)
    return compiled.program, {"x": x}


def test_the_trace_is_drained_while_polling(long_program):
    """The board's trace buffer holds 64 entries and the program makes more: the host drains
    it while it waits, so every task's start and end arrives, in order, with no overflow."""
    program, x = long_program
    tasks = program.queues[0].tasks
    got = run(program, x, "board", board=_client(GoldenBoard(program.config)))
    assert not got.trace_overflow
    assert [t[0] for t in got.tasks] == list(range(tasks))
    assert [(t[2], t[3]) for t in got.tasks] == [(2 * k, 2 * k + 1) for k in range(tasks)]


def test_a_trace_overflow_is_reported(long_program):
    """Entries coming faster than the host drains them: the buffer drops some, and the
    result says so instead of looking complete."""
    program, x = long_program
    board = GoldenBoard(program.config, trace_depth=8, events_per_read=4)
    got = run(program, x, "board", board=_client(board))
    assert got.trace_overflow
    assert len(got.tasks) < program.queues[0].tasks
    # The outputs do not depend on the trace.
    golden = run(program, x, "golden")
    assert got.outputs["y"].tobytes() == golden.outputs["y"].tobytes()


# --- Several programs on one board (npu_runtime.runtime.run_jobs, backend "board") ---------

#: The digits CNN (queue 1) is pushed once this many of the activation chain's tasks are done.
AFTER = 5


@pytest.fixture(scope="module")
def two_programs(long_program):
    """The activation chain (queue 0, priority 0, pushed at the start) and the fp16 digits CNN
    (queue 1, priority 1, pushed after ``AFTER`` tasks), both for ``small``, and their solo
    golden outputs."""
    chain, x = long_program
    digits = compile_model(str(MODEL), preset("small"), chain=False)
    xd = {"input": np.random.default_rng(5).standard_normal((1, 1, 8, 8)).astype(np.float32)}
    jobs = [Job(chain, x, priority=0), Job(digits.program, xd, priority=1, after=AFTER)]
    solo = [run(j.program, j.inputs, "golden").outputs for j in jobs]
    return jobs, solo


def _same_bits(a, b):
    return a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


def test_several_programs_on_the_board_equal_golden(two_programs):
    """The host loads both programs' images (placed apart), pushes the digits CNN once
    ``TASKS_RUN`` reaches 5, and it preempts the chain at the chain's next switch point: each
    program's outputs equal the golden backend's run of the pair and its solo run, bit for
    bit, and the trace shows the switch."""
    jobs, solo = two_programs
    golden = run_jobs(jobs, "golden")
    got = run_jobs(jobs, "board", board=_client(GoldenBoard(preset("small"))))
    for k in range(2):
        assert _same_bits(got.results[k].outputs, golden.results[k].outputs), k
        assert _same_bits(got.results[k].outputs, solo[k]), k
    n0, n1 = (j.program.queues[0].tasks for j in jobs)
    # The chain's switch points are after its tasks 2 and 45; the push comes after task 5.
    assert got.switches == golden.switches == [(0, 45, 1)]
    queues = [q for q, _, _ in got.order]
    assert queues == [0] * 46 + [1] * n1 + [0] * (n0 - 46)
    assert [len(r.tasks) for r in got.results] == [n0, n1]
    assert got.cycles == 2 * (n0 + n1) - 1          # task ordinals on the fake
    assert got.counters["TASKS_RUN"] == n0 + n1 and got.counters["SWITCHES"] == 1
    assert not got.trace_overflow


def test_a_program_pushed_when_the_first_has_ended(two_programs):
    """Pushed after all of the chain's tasks: the NPU is idle when the host pushes, runs the
    digits CNN then, and nothing is switched."""
    jobs, solo = two_programs
    n0 = jobs[0].program.queues[0].tasks
    jobs = [jobs[0], Job(jobs[1].program, jobs[1].inputs, priority=1, after=n0)]
    got = run_jobs(jobs, "board", board=_client(GoldenBoard(preset("small"))))
    assert got.switches == [] and got.counters["SWITCHES"] == 0
    assert [q for q, _, _ in got.order] == [0] * n0 + [1] * jobs[1].program.queues[0].tasks
    for k in range(2):
        assert _same_bits(got.results[k].outputs, solo[k]), k


def test_a_late_push_that_never_comes_times_out(two_programs):
    jobs, _ = two_programs
    board = GoldenBoard(preset("small"), hang=True)
    with pytest.raises(BoardRunError, match=r"^timeout: the NPU on fake port did not finish in "
                                            r"0.3 s \(0 of the 5 tasks after which queue 1 is "
                                            r"pushed completed\)$"):
        run_jobs(jobs, "board", board=_client(board), board_timeout=0.3)


def test_the_micro_board_refuses_several_programs(digits):
    """The micro build (the icebreaker preset) keeps queue 0's registers only, though its
    NPU_INFO is the preset's: the host reads back each queue's setup and refuses, before the
    start, with one line that says why."""
    program, x_test = digits
    x = {"input": x_test[:1]}
    board = GoldenBoard(program.config)
    jobs = [Job(program, x, priority=0), Job(program, x, priority=1, after=2)]
    with pytest.raises(BoardQueuesError) as info:
        run_jobs(jobs, "board", board=_client(board))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("the board on fake port does not keep task queue 1 (Q1_TAIL "
                              "reads 0x0 after a write of 0x")
    assert "the micro build of the icebreaker preset runs queue 0 only" in message
    assert not board.regs.done and board.regs.completed == 0     # never started
    # The same pair runs on a build that keeps both queues (the blocks' icebreaker_blocks).
    both = GoldenBoard(program.config, kept_queues=2)
    got = run_jobs(jobs, "board", board=_client(both))
    solo = run(program, x, "golden").outputs
    assert all(_same_bits(r.outputs, solo) for r in got.results)
