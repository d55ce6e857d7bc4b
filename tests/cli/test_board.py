"""``npu run --backend board`` from the command line (``docs/boards.md``): the board is the
golden fake of ``npu_sim.board_model`` behind a pyserial-compatible port, put in place of
``BridgeClient.open``; errors are one line with exit status 2 (bad input, another
configuration) or 1 (a failed run)."""

import json

import pytest

from npu_cli.main import main
from npu_compiler.compile import compile_model
from npu_runtime.runtime import session
from npu_sim.board_model import FakeSerial, GoldenBoard
from npu_sim.uart_host import BridgeClient
from npu_spec.config import preset

from ..compiler.test_digits import MODEL, load_train_module


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import numpy as np
    tmp = tmp_path_factory.mktemp("board")
    x_train, _, x_test, _ = load_train_module().load_split()
    compiled = compile_model(str(MODEL), preset("icebreaker"), fmt="int8",
                             calibration={"input": x_train[:50]}, evaluator=session)
    prog = tmp / "digits.npu"
    compiled.program.save(str(prog))
    image = tmp / "x.npy"
    np.save(image, x_test[4:5])
    device = tmp / "ttyUSB9"
    device.write_bytes(b"")             # exists, like a plugged-in board's port
    return str(prog), str(image), str(device)


def _errors(err):
    """The error lines of stderr (progress lines start with ``[npu]``)."""
    return [line for line in err.splitlines() if not line.startswith("[npu]")]


def _fake_board(monkeypatch, config, **kwargs):
    board = GoldenBoard(config, **kwargs)

    def fake_open(cls, device, baud=1_000_000, *, timeout=1.0, **_):
        return cls(FakeSerial(board), timeout=0.2, name=device, baud=baud)
    monkeypatch.setattr(BridgeClient, "open", classmethod(fake_open))
    return board


def test_golden_and_board_agree_bit_for_bit(files, monkeypatch, capsys):
    prog, image, device = files
    _fake_board(monkeypatch, preset("icebreaker"))
    rc = main(["run", prog, "--backend", "golden,board", "--device", device,
               "--input", f"input={image}", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["bit_exact"] is True and out["backend"] == "board"
    assert out["outputs"]["logits"]["shape"] == [1, 10]
    assert out["counters"]["TASKS_RUN"] == 10          # the int8 digits program's tasks


def test_a_board_of_another_configuration_exits_2(files, monkeypatch, capsys):
    prog, image, device = files
    _fake_board(monkeypatch, preset("ulx3s"))
    rc = main(["run", prog, "--backend", "board", "--device", device,
               "--input", f"input={image}"])
    err = capsys.readouterr().err
    assert rc == 2 and len(_errors(err)) == 1
    assert "built for another configuration" in err and "--preset icebreaker" in err


def test_a_board_that_never_finishes_exits_1(files, monkeypatch, capsys):
    prog, image, device = files
    _fake_board(monkeypatch, preset("icebreaker"), hang=True)
    rc = main(["run", prog, "--backend", "board", "--device", device, "--timeout", "0.2",
               "--input", f"input={image}"])
    err = capsys.readouterr().err
    assert rc == 1 and len(_errors(err)) == 1
    assert "timeout: the NPU on" in err and "did not finish in 0.2 s" in err


@pytest.mark.parametrize("extra,message", [
    ([], "--backend board needs --device"),
    (["--device", "/dev/ttyUSB_no_such_board"], "no such device /dev/ttyUSB_no_such_board"),
    (["--device", "/dev/null", "--timeout", "0"], "expected a positive number of seconds"),
])
def test_bad_board_arguments_exit_2(files, extra, message, capsys):
    prog, image, _ = files
    rc = main(["run", prog, "--backend", "board", "--input", f"input={image}", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(_errors(err)) == 1


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Two programs for ``small`` (the fp16 digits CNN twice, the second copy more urgent)
    and their inputs."""
    import numpy as np
    tmp = tmp_path_factory.mktemp("two")
    compiled = compile_model(str(MODEL), preset("small"), chain=False)
    prog = tmp / "digits.npu"
    compiled.program.save(str(prog))
    rng = np.random.default_rng(2)
    for k in range(2):
        np.save(tmp / f"x{k}.npy", rng.standard_normal((1, 1, 8, 8)).astype(np.float32))
    device = tmp / "ttyUSB8"
    device.write_bytes(b"")
    return str(prog), tmp, str(device)


def test_several_programs_on_golden_and_board_agree(two, monkeypatch, capsys):
    """``npu run A B --priority 0,1 --after 0,4 --backend golden,board``: the second copy is
    pushed by the host after 4 tasks and preempts the first at its next switch point (after
    its task 6); every output of both agrees bit for bit, and the outputs differ between the
    programs (their inputs differ)."""
    import numpy as np
    prog, tmp, device = two
    _fake_board(monkeypatch, preset("small"))
    out = tmp / "out.npz"
    rc = main(["run", prog, prog, "--priority", "0,1", "--after", "0,4", "--backend",
               "golden,board", "--device", device, "--input", f"0:input={tmp / 'x0.npy'}",
               "--input", f"1:input={tmp / 'x1.npy'}", "--output", str(out), "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and summary["bit_exact"] is True and summary["backend"] == "board"
    assert summary["switches"] == [{"from_queue": 0, "after_task": 6, "to_queue": 1}]
    assert summary["counters"]["TASKS_RUN"] == 36 and summary["counters"]["SWITCHES"] == 1
    with np.load(out) as z:
        assert sorted(z.files) == ["0/logits", "1/logits"]
        assert not np.array_equal(z["0/logits"], z["1/logits"])


def test_several_programs_on_the_micro_board_exit_2(files, monkeypatch, capsys):
    prog, image, device = files
    _fake_board(monkeypatch, preset("icebreaker"))
    rc = main(["run", prog, prog, "--priority", "0,1", "--backend", "board", "--device", device,
               "--input", f"input={image}"])
    err = capsys.readouterr().err
    assert rc == 2 and len(_errors(err)) == 1
    assert "does not keep task queue 1" in err and "runs queue 0 only" in err
