# amaranth: UnusedElaboratable=no
"""The formal runner's file generation and argument checks (no tool is run)."""

import pytest

from npu.taskman import Arbiter
from npu_sim.formal import prove, sby_text


def test_sby_text():
    text = sby_text("prove", 5)
    assert "mode prove" in text and "depth 5" in text
    assert "read_rtlil top.il" in text and "smtbmc boolector" in text


@pytest.mark.parametrize("mode,depth", [("sim", 5), ("bmc", 0), ("prove", 1.5)])
def test_sby_text_bad(mode, depth):
    with pytest.raises(ValueError):
        sby_text(mode, depth)


def test_workdir_outside_cwd_is_refused():
    with pytest.raises(ValueError, match="under the current directory"):
        prove(Arbiter(2), "x", workdir="/tmp/formal-x")
