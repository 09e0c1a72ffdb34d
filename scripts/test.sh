#!/usr/bin/env bash
# Runs every test: installs dependencies, builds into build/, runs ctest.
#   bash scripts/test.sh              # all tests
#   bash scripts/test.sh -L kv        # only a module's tests (ctest arguments)
# Exit status is ctest's; the summary ends with ctest's pass/fail line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SWASERVE_BUILD_DIR:-$here/build}"
bash "$here/scripts/build.sh"
jobs="${SWASERVE_TEST_JOBS:-2}"
ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 300 "$@"
