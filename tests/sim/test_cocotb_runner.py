# amaranth: UnusedElaboratable=no
"""Smoke tests of ``npu_sim.cocotb_runner`` on a tiny Amaranth component.

They check that the Verilog of a ``wiring.Component`` builds and runs under cocotb on Icarus and
Verilator, and that a failing cocotb test makes :func:`run_cocotb` raise, so netlist tests can
fail.
"""

from pathlib import Path

import pytest
from amaranth.hdl import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_sim.cocotb_runner import SIMULATORS, CocotbBuildError, CocotbTestFailure, run_cocotb

HERE = Path(__file__).parent

pytestmark = pytest.mark.cocotb


class RegisteredAdder(wiring.Component):
    """Adds two 8-bit numbers (mod 256) in one register stage.

    Members
    -------
    i : In(stream.Signature(StructLayout({"a": 8, "b": 8})))
        Operands. In the Verilog, ``i__payload`` has ``a`` in bits 7:0 and ``b`` in bits 15:8.
    o : Out(stream.Signature(8))
        ``(a + b) % 256``, one cycle after the input transfer.
    """

    i: In(stream.Signature(data.StructLayout({"a": 8, "b": 8})))
    o: Out(stream.Signature(8))

    def elaborate(self, platform):
        m = Module()

        # The stage takes a new input when it is empty or its output is being taken.
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.i.ready):
            m.d.sync += [
                self.o.valid.eq(self.i.valid),
                self.o.payload.eq(self.i.payload.a + self.i.payload.b),
            ]

        return m


def run_smoke(tmp_path, simulator, **kwargs):
    return run_cocotb(RegisteredAdder(), toplevel="registered_adder", test_module="cocotb_smoke",
                      python_path=[HERE], simulator=simulator, build_dir=tmp_path / "build",
                      seed=1, **kwargs)


@pytest.mark.parametrize("simulator", SIMULATORS)
def test_smoke(tmp_path, simulator):
    result = run_smoke(tmp_path, simulator)
    assert set(result.passed) == {"cocotb_smoke.test_reset", "cocotb_smoke.test_sums"}
    assert result.skipped == ()
    assert "module registered_adder" in result.verilog[0].read_text()


# How a failure is reported does not depend on the simulator: keep the Verilator build (~20 s)
# out of the quick suite.
@pytest.mark.parametrize("simulator", ["icarus", pytest.param("verilator", marks=pytest.mark.slow)])
def test_failing_cocotb_test_raises(tmp_path, simulator):
    # SMOKE_WRONG_MODEL makes test_sums expect a + b + 1, so its assertion must fail.
    with pytest.raises(CocotbTestFailure, match=r"1 of 2 cocotb tests failed") as info:
        run_smoke(tmp_path, simulator, extra_env={"SMOKE_WRONG_MODEL": "1"})
    assert info.value.failed == ("cocotb_smoke.test_sums",)


def test_missing_test_module_raises(tmp_path):
    with pytest.raises(CocotbTestFailure):
        run_cocotb(RegisteredAdder(), toplevel="registered_adder",
                   test_module="no_such_cocotb_module", simulator="icarus",
                   build_dir=tmp_path / "build")


def test_broken_verilog_raises(tmp_path):
    source = tmp_path / "broken.v"
    source.write_text("module broken(input clk;\nendmodule\n")
    with pytest.raises(CocotbBuildError, match=r"Building broken for icarus"):
        run_cocotb(source, toplevel="broken", test_module="cocotb_smoke", python_path=[HERE],
                   simulator="icarus", build_dir=tmp_path / "build")


def test_unknown_simulator(tmp_path):
    with pytest.raises(ValueError, match=r"not 'xsim'"):
        run_smoke(tmp_path, "xsim")
