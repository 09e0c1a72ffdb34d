#!/usr/bin/env bash
# Configures and builds swaserve into build/ (or $SWASERVE_BUILD_DIR) with
# Ninja. Extra arguments are passed to cmake's configure step, e.g.
#   bash scripts/build.sh -DSWASERVE_CUDA=OFF
# Set SWASERVE_SKIP_DEPS=1 to skip scripts/install-deps.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SWASERVE_BUILD_DIR:-$here/build}"
if [ "${SWASERVE_SKIP_DEPS:-0}" != 1 ]; then
  bash "$here/scripts/install-deps.sh"
fi
jobs="${SWASERVE_JOBS:-$(nproc)}"
# SWASERVE_CMAKE_EXTRA: more cmake arguments, space-separated (CI's options).
# shellcheck disable=SC2086
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" \
  ${SWASERVE_CMAKE_EXTRA:-} "$@" \
  > "$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
grep -E '^-- swaserve:' "$build.configure.log" || true
echo "build: ninja -C $build -j$jobs"
start=$(date +%s)
ninja -C "$build" -j"$jobs"
echo "build: done in $(( $(date +%s) - start )) s"
