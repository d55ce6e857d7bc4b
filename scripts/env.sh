# Toolchain environment for the project's scripts. Source it, don't run it:
#
#     source scripts/env.sh
#
# It activates the repository's .venv (made by scripts/setup.sh) and exports the toolchain
# variables (YOSYS, NEXTPNR_ECP5, ECPPACK, NEXTPNR_ICE40, ICEPACK, SBY, SMTBMC, WITNESS,
# AMARANTH_USE_YOSYS). Their values live in one place, TOOL_DEFAULTS in fpga/npu_fpga/toolenv.py,
# which Python code applies by itself too; a variable that is already set is kept.

NPU_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export NPU_ROOT

if [ ! -x "$NPU_ROOT/.venv/bin/python" ]; then
    echo "error: $NPU_ROOT/.venv does not exist; run 'bash scripts/setup.sh' first" >&2
    return 1 2>/dev/null || exit 1
fi

# shellcheck disable=SC1091
. "$NPU_ROOT/.venv/bin/activate"
eval "$(python "$NPU_ROOT/fpga/npu_fpga/toolenv.py")" || {
    echo "error: could not read the tool defaults from fpga/npu_fpga/toolenv.py" >&2
    return 1 2>/dev/null || exit 1
}
