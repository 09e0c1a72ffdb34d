#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, and runs swaserve.
# Until `swaserve up` exists this shows the CLI's help and a page-hash example.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SWASERVE_BUILD_DIR:-$here/build}"
bash "$here/scripts/build.sh"
"$build/bin/swaserve" --help
echo
echo "\$ swaserve page-hashes --page-size=4 --tokens=1,2,3,4,5,6,7,8"
"$build/bin/swaserve" page-hashes --page-size=4 --tokens=1,2,3,4,5,6,7,8
