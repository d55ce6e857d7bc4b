"""Compiled networks sharing the NPU: the compiler's task-switch flags, several programs at
different priorities through the runtime (``run_jobs``) and ``npu run A B --priority``, and
``--timeline``. The digits CNN (higher priority, pushed while the larger handmade CNN runs)
preempts it; both outputs equal their solo runs byte for byte."""

import json

import numpy as np
import pytest

from npu_cli.main import main
from npu_compiler.compile import compile_model
from npu_compiler.graph import CompileError
from npu_runtime.runtime import Job, place, run, run_jobs
from npu_runtime.timeline import intervals, order_intervals
from npu_spec.config import preset

from .models import small_cnn

CFG = preset("small")
DIGITS = "models/digits/digits_cnn.onnx"
#: The digits CNN is pushed once this many of the large CNN's tasks have completed.
AFTER = 5


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The large CNN (queue 0, priority 0) and the digits CNN (queue 1, priority 1): the
    compiled programs, their inputs and their solo golden outputs."""
    rng = np.random.default_rng(11)
    # Without conv -> planar chains (npu_compiler.chain), so that every fp16 layer's end is
    # a safe point and the task counts below hold.
    big = compile_model(small_cnn(size=24), CFG, shapes={"x": (1, 3, 24, 24)}, chain=False)
    digits = compile_model(DIGITS, CFG, chain=False)
    xa = {"x": rng.standard_normal((1, 3, 24, 24)).astype(np.float32)}
    xb = {"input": rng.standard_normal((1, 1, 8, 8)).astype(np.float32)}
    jobs = [Job(big.program, xa, priority=0), Job(digits.program, xb, priority=1, after=AFTER)]
    solo = [run(j.program, j.inputs).outputs for j in jobs]
    d = tmp_path_factory.mktemp("pair")
    big.program.save(d / "big.npu")
    digits.program.save(d / "digits.npu")
    np.save(d / "xa.npy", xa["x"])
    np.save(d / "xb.npy", xb["input"])
    return jobs, solo, (big, digits), d


def _same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k].view(np.uint32),
                                                       b[k].view(np.uint32)) for k in a)


def test_switch_points_are_the_layer_ends(pair):
    """fp16 layers pass their tensors through system memory, so every layer's last task is
    a safe point (the program's last task ends the list and needs none); a layer of
    independent copies (the handmade CNN's Concat, one load and store per input) has more."""
    big, digits = pair[2]
    for compiled in (big, digits):
        points = compiled.program.metadata["compiler"]["switch_points"]
        ends = sorted({r["last_task"] for r in compiled.plan if r["tasks"]})
        assert ends[-1] == compiled.program.queues[0].tasks - 1
        assert set(ends[:-1]) <= set(points) and ends[-1] not in points
    assert digits.program.metadata["compiler"]["switch_points"] == [3, 6, 10, 13]
    concat = next(r for r in big.plan if r["op"] == "Concat")
    inner = [p for p in big.program.metadata["compiler"]["switch_points"]
             if concat["first_task"] <= p < concat["last_task"]]
    assert inner == [concat["first_task"] + 1]


def _check_preempted(result, solo):
    """Both outputs equal the solo runs; queue 1 ran whole between two parts of queue 0,
    right after one of queue 0's switch points."""
    for k in range(2):
        assert _same(result.results[k].outputs, solo[k]), k
    assert len(result.switches) == 1
    left, task, taken = result.switches[0]
    assert (left, taken) == (0, 1) and task >= AFTER
    queues = [q for q, _, _ in result.order]
    first = queues.index(1)
    assert queues[:first] == [0] * first and first == task + 1
    assert queues[first:first + 18] == [1] * 18 and queues[first + 18] == 0


def test_digits_preempts_a_larger_cnn_golden(pair):
    jobs, solo, compiled, _ = pair
    result = run_jobs(jobs, "golden")
    _check_preempted(result, solo)
    assert result.switches[0][1] in compiled[0].program.metadata["compiler"]["switch_points"]


@pytest.mark.slow
def test_digits_preempts_a_larger_cnn_rtl(pair):
    jobs, solo, compiled, _ = pair
    result = run_jobs(jobs, "rtl")
    _check_preempted(result, solo)
    assert result.switches[0][1] in compiled[0].program.metadata["compiler"]["switch_points"]
    # The trace's queue-1 tasks all lie between two of queue 0's.
    ones = [t for t in result.tasks if t[5] == 1]
    assert len(ones) == 18
    before = max(t[3] for t in result.tasks if t[5] == 0 and t[0] <= result.switches[0][1])
    after = min(t[2] for t in result.tasks if t[5] == 0 and t[0] > result.switches[0][1])
    assert before < min(t[2] for t in ones) and max(t[3] for t in ones) < after


def test_programs_that_do_not_fit_together(pair):
    jobs = pair[0]
    programs = [j.program for j in jobs]
    assert place(programs) == [0, -(-len(programs[0].memory) // 256) * 256]
    small = CFG.replace(mem_kib=64)
    too_big = [compile_model(DIGITS, small, chain=False).program] * 9
    with pytest.raises(CompileError, match=r"need \d+ bytes .*program 8: \d+ .*65536"):
        place(too_big)


def test_cli_two_programs_json_and_timeline(pair, capsys):
    _, solo, _, d = pair
    png = d / "run.png"
    args = ["run", str(d / "big.npu"), str(d / "digits.npu"), "--priority", "0,1",
            "--after", f"0,{AFTER}", "--input", f"0:x={d / 'xa.npy'}",
            "--input", f"1:input={d / 'xb.npy'}", "--output", str(d / "out.npz"),
            "--timeline", str(png), "--json"]
    capsys.readouterr()
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [p["priority"] for p in summary["programs"]] == [0, 1]
    assert [(s["from_queue"], s["to_queue"]) for s in summary["switches"]] == [(0, 1)]
    with np.load(d / "out.npz") as z:
        assert _same({k.split("/")[1]: z[k] for k in z.files if k.startswith("1/")}, solo[1])
        assert _same({k.split("/")[1]: z[k] for k in z.files if k.startswith("0/")}, solo[0])
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    from matplotlib.image import imread
    image = imread(str(png))
    # A picture, not a blank page: many distinct colours, bars on most of the width.
    colours = {tuple(p) for p in (image[..., :3] * 255).astype(int).reshape(-1, 3)[::7]}
    assert len(colours) > 20


@pytest.mark.parametrize("extra, message", [
    (["--priority", "0"], "--priority takes 2 comma-separated integers"),
    (["--priority", "0,16"], "from 0 to 15"),
    (["--after", "x,1"], "--after takes 2"),
    (["--backend", "board"], "--backend board needs --device"),
    (["--backend", "golden,fpga"], "unknown backend 'fpga'"),
    (["--input", "2:x=x.npy"], "there are 2 programs"),
    (["--after", "0,56"], "pushed after 56 tasks, but the programs there before it have 55"),
])
def test_cli_bad_options_for_several_programs(pair, extra, message, capsys):
    d = pair[3]
    capsys.readouterr()
    inputs = ["--input", f"x={d / 'xa.npy'}", "--input", f"input={d / 'xb.npy'}"]
    if "--input" in extra:
        inputs = []
    assert main(["run", str(d / "big.npu"), str(d / "digits.npu")] + inputs + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "".join(err)


def test_cli_programs_too_large_together(tmp_path, capsys):
    prog = tmp_path / "d.npu"
    assert main(["compile", DIGITS, "--mem-kib", "16", "--no-chain", "-o", str(prog)]) == 0
    capsys.readouterr()
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 1, 8, 8), np.float32))
    assert main(["run", str(prog), str(prog), str(prog), "--input", f"input={x}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the programs need" in err and "program 2:" in err and "16384" in err


def test_timeline_intervals_follow_the_trace():
    # (task, engine, start, end, error, queue), as RunResult.tasks holds them.
    trace = [(0, "DMA", 100, 150, 0, 0), (1, "NEURAL", 151, 400, 0, 0),
             (2, "DMA", 160, 170, 0, 0), (0, "DMA", 420, 430, 0, 1),
             (3, "PLANAR", 401, 500, 0, 0)]
    lanes = intervals(trace)
    assert list(lanes) == ["NE", "PE", "DMA", "queue 0", "queue 1"]
    spans = {lane: [(iv.start, iv.end, iv.queue, iv.task) for iv in ivs]
             for lane, ivs in lanes.items()}
    assert spans["NE"] == [(51, 300, 0, 1)]
    assert spans["PE"] == [(301, 400, 0, 3)]
    assert spans["DMA"] == [(0, 50, 0, 0), (60, 70, 0, 2), (320, 330, 1, 0)]
    assert [t for *_, t in spans["queue 0"]] == [0, 1, 2, 3]
    assert spans["queue 1"] == [(320, 330, 1, 0)]


@pytest.mark.slow
def test_timeline_of_an_rtl_run_matches_its_trace(pair):
    jobs, _, _, _ = pair
    result = run(jobs[1].program, jobs[1].inputs, "rtl")
    lanes = intervals(result.tasks)
    t0 = min(t[2] for t in result.tasks)
    for lane, engine in (("NE", "NEURAL"), ("PE", "PLANAR"), ("DMA", "DMA")):
        assert [(iv.start, iv.end) for iv in lanes[lane]] == sorted(
            (t[2] - t0, t[3] - t0) for t in result.tasks if t[1] == engine)
        # An engine runs one task at a time.
        assert all(a.end <= b.start for a, b in zip(lanes[lane], lanes[lane][1:]))


def test_timeline_of_a_golden_run_is_the_task_order(pair):
    jobs, _, _, _ = pair
    result = run_jobs(jobs, "golden")
    lanes = order_intervals(result.order)
    slots = sorted((iv.start, iv.queue, iv.task) for lane in ("NE", "PE", "DMA")
                   for iv in lanes[lane])
    assert [(q, t) for _, q, t in slots] == [(q, t) for q, t, _ in result.order]
    assert [s for s, _, _ in slots] == list(range(len(result.order)))


def test_cli_switch_points_none_and_single_program_timeline(pair, tmp_path, capsys):
    from npu_spec.descriptors import decode
    from npu_spec.program import load
    d = pair[3]
    prog = tmp_path / "d0.npu"
    capsys.readouterr()
    assert main(["compile", DIGITS, "--switch-points", "none", "--no-chain", "-o",
                 str(prog)]) == 0
    assert "switch points: none" in capsys.readouterr().out
    flagged = {}
    for path in (prog, d / "digits.npu"):
        p = load(str(path))
        q = p.queues[0]
        words = np.frombuffer(p.memory, "<u4")[q.head:q.tail]
        at, flagged[path] = 0, []
        for k in range(q.tasks):
            desc = decode([int(w) for w in words[at:at + 32]], max_length=32)
            flagged[path].append((k, desc.tse, desc.tsr, desc.spl))
            at += desc.length
    assert all(not any(f[1:]) for f in flagged[prog])
    points = [3, 6, 10, 13]
    assert flagged[d / "digits.npu"] == [(k, k in points, k in points, k - 1 in points)
                                         for k in range(18)]
    png = tmp_path / "one.png"
    assert main(["run", str(prog), "--input", f"input={d / 'xb.npy'}", "--timeline",
                 str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_int8_layers_become_switch_points_when_spilled(pair):
    """int8 activations stay in the buffer, so an int8 program has no safe point; with
    ``switch_points="layers"`` each layer's live activations go to system memory and back, every
    layer end becomes one, the outputs stay bit for bit, and the program can be preempted."""
    from npu_runtime.runtime import session
    rng = np.random.default_rng(12)
    cal = {"input": rng.standard_normal((8, 1, 8, 8)).astype(np.float32)}
    x = {"input": rng.standard_normal((1, 1, 8, 8)).astype(np.float32)}
    safe, layers = (compile_model(DIGITS, CFG, fmt="int8", calibration=cal, evaluator=session,
                                  switch_points=sp) for sp in ("safe", "layers"))
    assert safe.program.metadata["compiler"]["switch_points"] == []
    points = layers.program.metadata["compiler"]["switch_points"]
    # After every layer with tasks but the last: the stores of the live activations end there.
    assert len(points) == sum(1 for r in layers.plan if r["tasks"]) - 1
    solo = run(safe.program, x).outputs
    assert _same(run(layers.program, x).outputs, solo)
    urgent = pair[0][1]
    result = run_jobs([Job(layers.program, x, priority=0),
                       Job(urgent.program, urgent.inputs, priority=1, after=2)])
    assert [(a, c) for a, _, c in result.switches] == [(0, 1)]
    assert result.switches[0][1] == points[0]
    assert _same(result.results[0].outputs, solo)
    assert _same(result.results[1].outputs, pair[1][1])
