# amaranth: UnusedElaboratable=no
"""Board tops (``npu_fpga.boards``): the board-independent system simulated over its serial
pins (with a stand-in NPU that holds the bus, so the bridge must win the arbiter between its
bursts), and the iCEBreaker and ULX3S tops elaborated into the toolchain's files (pins,
clock, the ESP32's GPIO0). The real NPU's board files are built in the slow suite."""

import re
import time

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.lib.csr import CSRSignature
from npu.lib.wishbone import WishboneSignature
from npu.top import NPUInfo
from npu_fpga.boards import BOARDS, BoardSystem, BoardTop, board_files, ecp5_pll, ice40_pll
from npu_sim.board_host import BoardConfigError, check_board_config
from npu_sim.streams import run_simulation
from npu_sim.uart_host import (
    BridgeClient,
    decode_words,
    encode_read,
    encode_write,
    uart_receive,
    uart_send,
)
from npu_spec.bridge import NPU_REGS_BASE
from npu_spec.config import PRESETS
from npu_spec.registers import MAGIC, NPU_INFO


class StandInNPU(wiring.Component):
    """``NPU_INFO`` on the host bus, and a bus master that reads word 0 in bursts of
    ``burst`` cycles with ``cyc`` high, dropping ``cyc`` for one cycle between bursts."""

    def __init__(self, config, burst=50):
        self.config = config
        self.burst = burst
        super().__init__({"bus": In(CSRSignature(16)), "irq": Out(1),
                          "mem": Out(WishboneSignature(30, config.mem_width)),
                          "reads": Out(16)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.info = info = NPUInfo(self.config)
        bits = len(info.bus.addr)
        mine = (self.bus.addr >> bits) == 0
        m.d.comb += [info.bus.addr.eq(self.bus.addr), info.bus.w_data.eq(self.bus.w_data),
                     info.bus.w_en.eq(self.bus.w_en & mine), info.bus.r_en.eq(self.bus.r_en & mine),
                     self.bus.r_data.eq(info.bus.r_data)]
        count = Signal(range(self.burst + 1))
        pending = Signal(8)
        m.d.sync += count.eq(count + 1)
        with m.If(count == self.burst):
            m.d.sync += count.eq(0)
        stb = (count != self.burst) & (count < self.burst - 4)
        m.d.comb += [self.mem.cyc.eq((count != self.burst) & (stb | (pending != 0))),
                     self.mem.stb.eq(stb), self.mem.sel.eq(-1)]
        taken = self.mem.cyc & self.mem.stb & ~self.mem.stall
        m.d.sync += pending.eq(pending + taken - self.mem.ack)
        with m.If(self.mem.ack):
            m.d.sync += self.reads.eq(self.reads + 1)
        return m


@pytest.mark.parametrize("preset,registered", [("ice40", False), ("ecp5", False),
                                               ("ecp5", True)])
def test_board_system_over_the_serial_pins(preset, registered):
    """``registered``: the system memory's request register (the ULX3S board's), answers a
    cycle later to the bridge and to the stand-in NPU's bursts."""
    config = PRESETS[preset]
    npu = StandInNPU(config)
    dut = BoardSystem(config, clk_freq=4e6, baud=1e6, mem_bytes=512, timeout_bits=30,
                      led_bits=4, npu=npu, mem_request_register=registered)
    script = [encode_write(2, [0x1111_2222, 0x3333_4444, 0x5555_6666]), encode_read(1, 4),
              encode_read(NPU_REGS_BASE + NPU_INFO["ID"].offset, 1)]
    answer = bytearray()
    seen = {}

    async def host(ctx):
        for frame in script:
            await uart_send(ctx, dut.rx, frame, 4)
        await ctx.tick().repeat(400)
        seen["error_before"] = ctx.get(dut.error)
        await uart_send(ctx, dut.rx, encode_read(1 << 24, 1), 4)     # out of range
        await ctx.tick().repeat(300)
        seen["error_after"] = ctx.get(dut.error)
        seen["reads"] = ctx.get(npu.reads)

    async def receiver(ctx):
        while True:
            answer.extend(await uart_receive(ctx, dut.tx, 1, 4, timeout=1 << 40))

    run_simulation(dut, [host], background=[receiver])
    words = decode_words(bytes(answer))
    assert words[:5] == [0, 0x1111_2222, 0x3333_4444, 0x5555_6666, MAGIC]
    assert words[5:] == [0]
    assert seen["error_before"] == 0 and seen["error_after"] == 1
    assert seen["reads"] > 100          # the stand-in NPU kept using the bus


class _WordsClient:
    """A host client whose register reads come from words read over the serial pins, for
    ``npu_sim.board_host.check_board_config``."""
    name = "the simulated micro board"

    def __init__(self, words):
        self.words = words

    def read_reg(self, offset):
        return self.words[offset]

    def identify(self):
        return BridgeClient.identify(self)


def test_micro_board_system_over_the_serial_pins():
    """The ``icebreaker`` preset's board system is the micro build (``MicroNPU`` with its
    units, ``MicroSystemMemory``): the bridge writes and reads system memory, an address
    beyond it sets the error flag, and ``NPU_INFO`` passes the runtime's identity check for
    the ``icebreaker`` preset (and fails it for another preset)."""
    config = PRESETS["icebreaker"]
    dut = BoardSystem(config, clk_freq=4e6, baud=1e6, timeout_bits=30, led_bits=4)
    assert config.npu_impl == "micro"
    script = [encode_write(5, [0x1111_2222, 0x3333_4444, 0x5555_6666]), encode_read(4, 5),
              encode_read(NPU_REGS_BASE, 7)]
    answer = bytearray()
    seen = {}

    async def host(ctx):
        for frame in script:
            await uart_send(ctx, dut.rx, frame, 4)
        for _ in range(4000):                   # the 12 answer words, 40 cycles a byte
            if len(answer) >= 48:
                break
            await ctx.tick()
        seen["error_before"] = ctx.get(dut.error)
        await uart_send(ctx, dut.rx, encode_read(config.mem_kib * 256, 1), 4)  # beyond memory
        await ctx.tick().repeat(300)
        seen["error_after"] = ctx.get(dut.error)

    async def receiver(ctx):
        while True:
            answer.extend(await uart_receive(ctx, dut.tx, 1, 4, timeout=1 << 40))

    run_simulation(dut, [host], background=[receiver])
    words = decode_words(bytes(answer))
    assert words[1:4] == [0x1111_2222, 0x3333_4444, 0x5555_6666]
    info = words[5:12]
    assert info[0] == MAGIC
    check_board_config(_WordsClient(info), config)
    check_board_config(_WordsClient(info), PRESETS["icebreaker_blocks"])
    with pytest.raises(BoardConfigError, match="buffer_kib board 32 program 64"):
        check_board_config(_WordsClient(info), PRESETS["ice40"])
    assert seen["error_before"] == 0 and seen["error_after"] == 1


def test_board_system_checks_memory_size():
    with pytest.raises(ValueError, match="multiple of 8"):
        BoardSystem(PRESETS["ecp5"], clk_freq=25e6, mem_bytes=1020,
                    npu=StandInNPU(PRESETS["ecp5"]))
    with pytest.raises(ValueError, match="unknown board 'arty'"):
        BoardTop("arty", PRESETS["ice40"])


@pytest.mark.parametrize("board,preset", [("icebreaker", "ice40"), ("ulx3s", "ecp5")])
def test_board_files(board, preset):
    config = PRESETS[preset]
    files = board_files(board, config, npu=StandInNPU(config), mem_bytes=4096)
    design = files["npu_board.il"]
    assert "bridge" in design and "arbiter" in design
    if board == "icebreaker":
        pcf = files["npu_board.pcf"]
        # The FTDI UART (rx 6, tx 9), the 12 MHz clock, both LEDs and the button.
        for line in ("set_io uart_0__rx__io 6", "set_io uart_0__tx__io 9",
                     "set_io clk12_0__io 35", "set_io led_g_0__io 37", "set_io led_r_0__io 11",
                     "set_io button_0__io 10", "set_frequency clk12_0__io 12.0"):
            assert line in pcf
    else:
        lpf = files["npu_board.lpf"]
        for comp, site in (("uart_0__rx__io", "M1"), ("uart_0__tx__io", "L4"),
                           ("clk25_0__io", "G2"), ("wifi_gpio0_0__io", "L2"),
                           ("led_0__io", "B2"), ("led_1__io", "C2")):
            assert f'LOCATE COMP "{comp}" SITE "{site}";' in lpf
        # Only GPIO0 of the ESP32: its enable pin (F1) is left alone.
        assert "F1" not in lpf
        # GPIO0's output buffer is driven by a constant 1 (not inverted).
        buffer = design[design.index("module \\npu_board.wifi_gpio0_0\n"):]
        buffer = buffer[:buffer.index("\nend\n")]
        assert re.search(r"cell \$xor .*\n(.*\n)*?\s*connect \\A 1'1\n\s*connect \\B 1'0\n"
                         r"\s*connect \\Y \\o\n", buffer)
    assert set(BOARDS) == {"icebreaker", "ulx3s"}


@pytest.mark.parametrize("out_mhz", [16, 18, 24, 25, 33.3, 40, 48, 50, 60, 75, 100, 120])
def test_ice40_pll_dividers(out_mhz):
    """The dividers give the frequency the formula of the iCE40 PLL says, within 1%, with the
    phase detector, VCO and output in their ranges."""
    s = ice40_pll(12, out_mhz)
    p = s.params
    pfd = 12 / (p["DIVR"] + 1)
    vco = pfd * (p["DIVF"] + 1)
    assert s.out_mhz == pytest.approx(vco / 2 ** p["DIVQ"])
    assert abs(s.out_mhz - out_mhz) <= 0.01 * out_mhz
    assert 10 <= pfd <= 133 and 533 <= vco <= 1066 and 1 <= p["DIVQ"] <= 6
    assert p["FILTER_RANGE"] == (1 if pfd < 17 else 2 if pfd < 26 else 3)


@pytest.mark.parametrize("out_mhz", [10, 25, 50, 60, 62.5, 65, 75, 100, 125, 133.33, 200])
def test_ecp5_pll_dividers(out_mhz):
    s = ecp5_pll(25, out_mhz)
    p = s.params
    assert s.out_mhz == pytest.approx(25 / p["CLKI_DIV"] * p["CLKFB_DIV"])
    assert abs(s.out_mhz - out_mhz) <= 0.01 * out_mhz
    assert 400 <= s.out_mhz * p["CLKOP_DIV"] <= 800 and 25 / p["CLKI_DIV"] >= 3.125


def test_impossible_pll_frequencies_are_refused():
    with pytest.raises(ValueError, match="SB_PLL40_PAD: the output must be 16 to 275 MHz"):
        ice40_pll(12, 300)
    with pytest.raises(ValueError, match="EHXPLLL: the output must be 3.125 to 400 MHz"):
        ecp5_pll(25, 2)
    with pytest.raises(ValueError, match="input frequency must be a positive"):
        ecp5_pll(0, 50)


@pytest.mark.parametrize("board,mhz,cell,params", [
    ("icebreaker", 25, "SB_PLL40_PAD", ("DIVF", "DIVQ", "FILTER_RANGE")),
    ("ulx3s", 60, "EHXPLLL", ("CLKI_DIV", "CLKFB_DIV", "CLKOP_DIV")),
])
def test_board_top_with_a_pll(board, mhz, cell, params):
    """The PLL instance with its dividers, and the clock constraint of its output."""
    config = PRESETS[board].replace(npu_impl="blocks")      # the stand-in is a bus master
    files = board_files(board, config, npu=StandInNPU(config), mem_bytes=4096, clk_mhz=mhz)
    design = files["npu_board.il"]
    instance = design[design.index(f"cell \\{cell} "):]
    instance = instance[:instance.index("\n  end\n")]
    setting = (ice40_pll(12, mhz) if board == "icebreaker" else ecp5_pll(25, mhz))
    for name in params:
        assert re.search(rf"parameter \\{name} {setting.params[name]}\b", instance), name
    if board == "icebreaker":
        assert "connect \\PACKAGEPIN" in instance
        assert re.search(r"set_frequency \S+ 25.125\n", files["npu_board.pcf"])
    else:
        assert re.search(r'FREQUENCY NET "\S+" 60000000.0 HZ;', files["npu_board.lpf"])


def _system_ports(files):
    """The ports of the board top's ``system`` cell (the :class:`BoardSystem`) in the RTLIL."""
    design = files["npu_board.il"]
    top = design[design.index("module \\npu_board\n"):]
    cell = top[top.index("cell \\npu_board.system "):]
    cell = cell[:cell.index("\n  end\n")]
    return set(re.findall(r"connect \\(\S+) ", cell))


@pytest.mark.parametrize("board", ["icebreaker", "ulx3s"])
def test_one_reset_net_with_a_pll(board):
    """With a PLL, the button joins the PLL's lock in one reset synchroniser: the system gets
    only the domain's reset (the synchroniser's last flip-flop), no second reset input that a
    gate would have to merge in front of every flip-flop. Without a PLL the platform's domain
    is kept and the synchronised button comes in beside it."""
    config = PRESETS[board].replace(npu_impl="blocks")      # the stand-in is a bus master
    with_pll = board_files(board, config, npu=StandInNPU(config), mem_bytes=4096,
                           clk_mhz=BOARDS[board].default_mhz)
    assert _system_ports(with_pll) == {"clk", "rst", "rx", "tx", "busy", "error"}
    without = board_files(board, config, npu=StandInNPU(config), mem_bytes=4096)
    assert "reset" in _system_ports(without)


@pytest.mark.slow
@pytest.mark.parametrize("board,preset", [("icebreaker", "ice40"), ("ulx3s", "ecp5")])
def test_board_files_with_the_npu(board, preset):
    """The whole NPU of the preset on the board: elaborates, and the files name every block."""
    t0 = time.perf_counter()
    files = board_files(board, PRESETS[preset])
    design = files["npu_board.il"]
    for block in ("taskman", "dataproc", "planar", "dma", "bridge", "memory"):
        assert block in design
    print(f"{board}: {time.perf_counter() - t0:.1f} s, RTLIL {len(design)} bytes")


@pytest.mark.slow
@pytest.mark.parametrize("board,preset", [("icebreaker", "ice40"), ("ulx3s", "ecp5")])
def test_board_runs_a_program_over_the_bridge(board, preset):
    """The board's system (NPU, bridge, arbiter, on-chip memory) under Verilator with a host
    on its serial pins: the program is loaded, started, polled and read back through the
    bridge, and the result memory equals the golden model's byte for byte."""
    import numpy as np

    from npu_model.builder import ProgramBuilder
    from npu_model.system import run_program
    from npu_sim.board_sim import board_run
    from npu_sim.programs import int_params
    from npu_spec.taskman import task_manager_map

    cfg = PRESETS[preset]
    rng = np.random.default_rng(1)
    b = ProgramBuilder(cfg)
    x = b.load(b.input("x", rng.integers(-128, 128, (4, 10, 12)).astype(np.int8)))
    weights = rng.integers(-128, 128, (8, 4, 3, 3)).astype(np.int8)
    p = b.conv_relu_pool(x, weights, pad=1, **int_params(rng, 8, 36))
    b.store(p, b.output("y", p.shape))
    program = b.build()
    golden = run_program(program)
    rtl = board_run(program)
    n = len(rtl["memory"])
    assert rtl["memory"] == (golden.memory[:n] + bytes(n - len(golden.memory[:n])))
    assert rtl["memory"] != program.memory[:n].ljust(n, b"\0")    # the program wrote something
    exc = task_manager_map(cfg.task_queues)["EXC_STATUS"].unpack(rtl["EXC_STATUS"],
                                                                  strict=False)
    assert int(exc["cause"]) == 0
    print(f"{board}: {rtl['cycles']} cycles, {rtl['wall']:.1f} s")


@pytest.mark.synth
def test_the_bridge_alone_fits_the_up5k():
    """Yosys and nextpnr-ice40 (router1, seed 1) on the UART bridge alone, as built for the
    iCEBreaker (12 MHz, 1 Mbaud, 64 KiB of memory mapped): small, and faster than the clock."""
    from npu.bridge import UARTBridge
    from npu_fpga.synth import synthesize
    dut = UARTBridge(clk_freq=12e6, baud=1e6, mem_bytes=64 * 1024)
    report = synthesize(dut, "ice40-up5k", name="bridge", freq_mhz=25, seed=1,
                        router="router1", progress=None)
    print(f"bridge on the UP5K: {report.luts - report.harness_luts} LUT4, "
          f"{report.ffs - report.harness_ffs} FF, {report.brams} EBR, "
          f"{report.fmax_mhz:.1f} MHz")
    assert report.luts - report.harness_luts < 700
    assert report.brams <= 1
    assert report.fmax_mhz > 25


@pytest.mark.slow
def test_digits_cnn_on_the_icebreaker_board_system():
    """The int8 digits CNN compiled for the ``icebreaker`` preset, with one test image, through
    the board system under Verilator (loaded, started, polled and read back over the bridge):
    memory and logits equal the golden backend's byte for byte, as on the ``board`` backend's
    golden fake (``tests/sim/test_board_host.py``)."""
    import numpy as np

    from npu_compiler.compile import compile_model
    from npu_runtime.runtime import _outputs, prepare, run, session
    from npu_sim.board_sim import board_run

    from ..compiler.test_digits import MODEL, load_train_module

    x_train, _, x_test, _ = load_train_module().load_split()
    program = compile_model(str(MODEL), PRESETS["icebreaker"], fmt="int8",
                            calibration={"input": x_train[:50]}, evaluator=session).program
    x = {"input": x_test[2:3]}
    golden = run(program, x, "golden")
    prog = prepare(program, x)
    t0 = time.perf_counter()
    rtl = board_run(prog)
    n = len(rtl["memory"])
    assert rtl["memory"] == golden.memory[:n]
    logits = _outputs(prog, rtl["memory"])["logits"]
    assert logits.tobytes() == golden.outputs["logits"].tobytes()
    assert np.argmax(logits) == np.argmax(golden.outputs["logits"])
    print(f"digits on the icebreaker board system: {rtl['cycles']} cycles, "
          f"{time.perf_counter() - t0:.0f} s")


@pytest.mark.slow
def test_two_programs_on_the_board_system():
    """Several programs on the board's system under Verilator (``small``, the blocks build):
    the activation chain on queue 0 and the fp16 digits CNN on queue 1 at a higher priority,
    loaded together over the bridge; the host pushes queue 1 once ``TASKS_RUN`` reaches 5
    (the ``board`` backend's late push, ``npu_sim.board_host``). The memory read back, every
    output of both programs included, equals the golden model's run of the pair byte for
    byte."""
    import numpy as np

    from npu_compiler.compile import compile_model
    from npu_model.system import read_tensor, run_program
    from npu_runtime.runtime import Job, combined
    from npu_sim.board_sim import board_run
    from npu_spec.taskman import task_manager_map

    from ..compiler.models import activation_chain
    from ..compiler.test_digits import MODEL

    cfg = PRESETS["small"]
    rng = np.random.default_rng(4)
    chain = compile_model(activation_chain(16), cfg).program
    digits = compile_model(str(MODEL), cfg, chain=False).program
    jobs = [Job(chain, {"x": rng.standard_normal((1, 4, 5, 5)).astype(np.float32)}),
            Job(digits, {"input": rng.standard_normal((1, 1, 8, 8)).astype(np.float32)},
                priority=1, after=5)]
    program, parts = combined(jobs)
    late = {1: 5}
    golden = run_program(program, arrivals=late)
    assert golden.switches                      # the pair really shares the NPU
    rtl = board_run(program, late=late)
    n = len(rtl["memory"])
    assert rtl["memory"] == golden.memory[:n]
    for part in parts:
        # Each program's outputs lie in the memory read back, and the run wrote them.
        outs = [t for t in part.tensors if t.role == "output"]
        assert outs and all(t.extent[1] <= n for t in outs)
        assert all(read_tensor(rtl["memory"], t).any() for t in outs)
    exc = task_manager_map(cfg.task_queues)["EXC_STATUS"].unpack(rtl["EXC_STATUS"],
                                                                  strict=False)
    assert int(exc["cause"]) == 0
    print(f"two programs on the small board system: {rtl['cycles']} cycles, "
          f"{rtl['wall']:.1f} s")
