#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, and brings up a
# local cluster with `swaserve up` (redis-server, prefill workers per length
# bucket, a decode worker, the router; the trained demo model models/demo).
# Ctrl-C stops everything. Extra arguments go to `swaserve up`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SWASERVE_BUILD_DIR:-$here/build}"
bash "$here/scripts/build.sh"
cd "$here"
exec "$build/bin/swaserve" up "$@"
