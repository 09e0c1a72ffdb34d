#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, and runs swaserve.
# Until `swaserve up` exists this shows the CLI's help, writes the tiny random
# model and inspects it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SWASERVE_BUILD_DIR:-$here/build}"
bash "$here/scripts/build.sh"
"$build/bin/swaserve" --help
model="${TMPDIR:-/tmp}/swaserve-tiny"
echo
echo "\$ swaserve make-model --shape=tiny --out $model --force"
"$build/bin/swaserve" make-model --shape=tiny --out "$model" --force
echo
echo "\$ swaserve inspect $model"
"$build/bin/swaserve" inspect "$model"
