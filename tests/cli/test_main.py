# amaranth: UnusedElaboratable=no
"""The ``npu`` command line: outputs, dumps that re-check, and one-line errors."""

import json

import numpy as np
import pytest

from npu_cli.main import main
from npu_model.mac import run_mac_program


def test_generate_writes_verilog(tmp_path):
    out = tmp_path / "mac.v"
    assert main(["generate", "--preset", "ice40", "--block", "mac_array", "-o", str(out)]) == 0
    text = out.read_text()
    assert "module top" in text and "cmd__payload" in text


def test_generate_refuses_a_block_too_wide_for_the_export():
    from amaranth.hdl import Module
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from npu_cli.main import MAX_INPUT_BITS, check_input_bits
    from npu_cli.util import CLIError

    class Wide(wiring.Component):
        def __init__(self, bits):
            super().__init__({"a": In(bits), "b": In(1), "y": Out(1)})

        def elaborate(self, platform):
            return Module()

    ok = Wide(MAX_INPUT_BITS - 1)
    check_input_bits(ok)
    ok._MustUse__silence = True
    with pytest.raises(CLIError, match="65,535 input bits") as e:
        check_input_bits(Wide(MAX_INPUT_BITS))
    assert e.value.status == 2


def test_sim_mac_json_and_dump_recheck(tmp_path, capsys):
    dump = tmp_path / "run.npz"
    rc = main(["sim", "mac", "--preset", "small", "--format", "mixed", "--count", "800",
               "--seed", "4", "--backend", "amaranth", "--json", "--dump", str(dump)])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and summary["match"] and summary["operations"] == 800
    assert summary["cycles"] >= summary["commands"]
    # Anyone can re-check a dump with the golden model alone.
    d = np.load(dump)
    prog = {k[4:]: d[k] for k in d.files if k.startswith("cmd_")}
    expected, _ = run_mac_program(prog, int(d["lanes"]), int(d["slots"]), tuple(d["formats"]))
    assert np.array_equal(np.array([e[2] for e in expected]), d["rtl_acc"])


@pytest.mark.parametrize("argv, needle", [
    (["sim", "mac", "--format", "int8", "--preset", "nope"], "unknown preset 'nope'"),
    (["sim", "mac", "--format", "bf16"], "invalid choice"),
    (["sim", "mac", "--format", "int8", "--count", "0"], "must be positive"),
    (["sim", "mac", "--format", "fp16", "--preset", "ice40"], "no fp16 hardware"),
    (["sim", "mac", "--format", "int8", "--stall", "1.5"], "must be in [0, 1)"),
    (["generate", "--block", "nope", "-o", "x.v"], "invalid choice"),
    (["generate", "-o", "/nonexistent/dir/x.v"], "output directory does not exist"),
    (["synth", "--target", "xc7"], "invalid choice"),
    (["synth", "--target", "ice40-up5k", "--timeout", "-5"], "number of seconds >= 0"),
    (["synth", "--target", "ice40-up5k", "--router", "router3"], "invalid choice"),
    (["synth", "--target", "ice40-up5k", "--block", "bridge", "--lut-mapper", "abc"],
     "supported on the ECP5 only"),
    (["synth", "--target", "ecp5-85f", "--preset", "ulx3s:ne_post_lanes=3"],
     "ne_post_lanes must be 0 or divide macs"),
    (["synth", "--target", "ecp5-85f", "--preset", "ulx3s:formats=int8"], "bad preset change"),
    (["synth", "--target", "ecp5-85f", "--preset", "ulx3s:nope=1"], "bad preset change"),
    ([], "required"),
])
def test_bad_arguments_one_line(argv, needle, capsys):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_preset_with_changed_fields():
    """``--preset NAME:FIELD=VALUE,...`` is the preset with those fields changed."""
    from npu_cli.util import preset_arg
    from npu_spec.config import preset

    config = preset_arg("ulx3s:ne_post_lanes=2,result_queue=0x3,postproc_impl=pipelined")
    assert config == preset("ulx3s").replace(name=config.name, ne_post_lanes=2, result_queue=3)
    assert preset_arg("ulx3s") is preset("ulx3s")
