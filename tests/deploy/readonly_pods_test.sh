#!/usr/bin/env bash
# The cpu overlay's Redis, router, a prefill and a decode worker run as their
# pods' securityContext says (user 10001, no capabilities, no_new_privs, a
# read-only root filesystem, writable storage only on their volumes) and
# serve a chat completion with an API key from the Secret (run_as_pods.py).
# A mount namespace makes the root read-only for them: needs root, unshare
# and setpriv; skipped (77) otherwise.
#   bash tests/deploy/readonly_pods_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
src=$1; bin=$(cd "$2" && pwd)
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || ! command -v setpriv >/dev/null; then
  echo "skipped: needs root, unshare and setpriv (util-linux)"; exit 77
fi
unshare --mount true 2>/dev/null || { echo "skipped: cannot make a mount namespace here"; exit 77; }
py=/usr/bin/python3; [ -x "$py" ] || py=python3
# Outside /tmp, which the namespace covers with its own tmpfs.
scratch=$(mktemp -d -p "$(dirname "$bin")" readonly-pods.XXXXXX); trap 'rm -rf "$scratch"' EXIT
chmod 0755 "$scratch"  # the pods' user walks into it
kubectl kustomize "$src/deploy/k8s/overlays/cpu" > "$scratch/cpu.yaml"
mkdir "$scratch/work"
# Inside: /tmp (the pods' emptyDir) and the test's storage are tmpfs, then
# the root is remounted read-only; the namespace's mounts go with it.
unshare --mount --propagation private bash -euo pipefail -c '
  scratch=$1; src=$2; bin=$3; py=$4
  mount -t tmpfs -o mode=0755 work "$scratch/work"
  cp "$scratch/cpu.yaml" "$scratch/work/cpu.yaml"
  mount -o remount,bind,ro /
  mount -t tmpfs -o mode=1777 tmp /tmp
  if touch /.swaserve-rw-probe 2>/dev/null; then rm -f /.swaserve-rw-probe; echo "root still writable" >&2; exit 1; fi
  "$py" "$src/tests/deploy/run_as_pods.py" "$scratch/work/cpu.yaml" "$bin" "$src/models/demo" \
    "$scratch/work/run"
' bash "$scratch" "$src" "$bin" "$py"
