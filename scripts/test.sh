#!/usr/bin/env bash
# Run the test suite in the project's venv with the toolchain environment.
#
#     bash scripts/test.sh                      # quick suite: everything but slow/synth/formal
#     bash scripts/test.sh -m slow              # one marked group (slow, synth, formal, cocotb)
#     bash scripts/test.sh tests/rtl -k mac     # any pytest arguments
#
# Runs from the repository root with two xdist workers. Without an -m of its own the
# quick-suite marker expression is used. The exit status is pytest's, so "no tests collected"
# (5) fails too.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/env.sh
source scripts/env.sh

markexpr=(-m "not slow and not synth and not formal")
for arg in "$@"; do
    case "$arg" in
        -m|-m?*) markexpr=(); break ;;
    esac
done

exec python -m pytest -n 2 -q "${markexpr[@]}" "$@"
