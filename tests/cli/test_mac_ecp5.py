# amaranth: UnusedElaboratable=no
"""``npu sim mac --mac-impl ecp5``: the ECP5 MAC array from the command line."""

import json

from npu_cli.main import main


def test_sim_mac_ecp5_twin(capsys):
    rc = main(["sim", "mac", "--preset", "small", "--mac-impl", "ecp5", "--format", "fp16",
               "--count", "256", "--seed", "2", "--backend", "amaranth", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and summary["match"] and summary["operations"] == 256


def test_sim_mac_ecp5_needs_float(capsys):
    rc = main(["sim", "mac", "--preset", "ice40", "--mac-impl", "ecp5", "--format", "int8"])
    err = capsys.readouterr().err
    assert rc == 2 and "needs a float format" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_sim_mac_ulx3s_shared_float_units(capsys):
    """The ulx3s preset's own array (ecp5_shared, a float unit per 16 lanes); switching it to
    ecp5 drops fp_share, which only the shared array has."""
    for extra in ([], ["--mac-impl", "ecp5"]):
        rc = main(["sim", "mac", "--preset", "ulx3s", "--format", "mixed", "--count", "256",
                   "--seed", "3", "--backend", "amaranth", "--json", *extra])
        summary = json.loads(capsys.readouterr().out)
        assert rc == 0 and summary["match"] and summary["operations"] == 256
