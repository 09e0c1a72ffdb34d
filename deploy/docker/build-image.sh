#!/usr/bin/env bash
# Builds the swaserve image with podman where no registry is reachable
# (deploy/README.md, "The container image"): a Debian 12 base made here with
# mmdebstrap from the Debian mirror and imported as localhost/debian:12 (and
# :12-slim), then deploy/docker/Containerfile on top of it.
#
#   bash deploy/docker/build-image.sh [TAG]     # default localhost/swaserve:latest
#   PUSH=ghcr.io/swaserve/swaserve:v1 bash deploy/docker/build-image.sh
#       # also pushes it (any `podman push` destination; no transport means
#       # docker://), prints the pushed manifest's digest and records it in
#       # RECORD (default deploy/k8s/base/kustomization.yaml; empty: nowhere),
#       # whose `digest: sha256:...` line pins every pod's image
#   bash deploy/docker/build-image.sh --record sha256:<64 hex> [FILE]
#       # records a digest only (an image pushed elsewhere)
#
# The CUDA variant's digest goes to the gpu overlay:
#   RECORD=deploy/k8s/overlays/gpu/kustomization.yaml PUSH=... bash ... (with
#   the CUDA --build-arg's, see the Containerfile).
#
# Needs root, podman, runc and mmdebstrap (apt-get install podman runc
# mmdebstrap). Runtime runc and explicit ulimits: on this kind of VM crun
# cannot set cgroups ("cgroups in hybrid mode not supported") and podman's
# default rlimits are refused ("setrlimit RLIMIT_NOFILE / RLIMIT_NPROC:
# Operation not permitted"); RUNTIME=crun ULIMITS= to use podman's defaults.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)

# Replaces the one `digest: sha256:<hex>` line of a kustomization by $1.
record_digest() {
  local digest=$1 file=$2
  [[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] \
    || { echo "build-image: not a digest: '$digest' (sha256:<64 hex>)" >&2; return 2; }
  [ "$(grep -cE '^\s*digest: sha256:[0-9a-f]{64}\s*$' "$file")" = 1 ] \
    || { echo "build-image: $file must hold exactly one 'digest: sha256:...' line" >&2; return 2; }
  sed -i -E "s/^(\s*digest: )sha256:[0-9a-f]{64}\s*$/\1${digest}/" "$file"
  echo "build-image: recorded $digest in $file"
}
if [ "${1:-}" = --record ]; then
  record_digest "${2:?--record needs a digest}" "${3:-$here/deploy/k8s/base/kustomization.yaml}"
  exit
fi

tag=${1:-localhost/swaserve:latest}
record=${RECORD-$here/deploy/k8s/base/kustomization.yaml}
mirror=${MIRROR:-http://deb.debian.org/debian}
runtime=${RUNTIME:-runc}
ulimits=${ULIMITS---ulimit nofile=20000:20000 --ulimit nproc=4096:4096}
for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "build-image: $tool not found (apt-get install podman runc mmdebstrap)" >&2; exit 2; }
done
if ! podman image exists localhost/debian:12; then
  tar=$(mktemp --suffix=.tar)
  echo "build-image: making the Debian 12 base with mmdebstrap ($mirror)"
  mmdebstrap --variant=minbase --include=ca-certificates bookworm "$tar" "$mirror"
  podman import "$tar" localhost/debian:12
  rm -f "$tar"
fi
podman tag localhost/debian:12 localhost/debian:12-slim
start=$(date +%s)
# shellcheck disable=SC2086
podman --runtime "$runtime" build $ulimits \
  --build-arg BUILDER=localhost/debian:12 --build-arg RUNTIME=localhost/debian:12-slim \
  -f "$here/deploy/docker/Containerfile" -t "$tag" "$here"
echo "build-image: $tag built in $(( $(date +%s) - start )) s"
podman image inspect "$tag" --format 'build-image: {{.Id}} {{.Size}} bytes'
if [ -z "${PUSH:-}" ]; then
  echo "build-image: not pushed (PUSH=...): an image has a digest once pushed; nothing recorded"
  exit 0
fi
dest=$PUSH
[[ $dest == *:/* || $dest =~ ^(docker|oci|oci-archive|docker-archive|dir): ]] || dest=docker://$dest
digestfile=$(mktemp)
podman push --digestfile "$digestfile" "$tag" "$dest"
digest=$(cat "$digestfile"); rm -f "$digestfile"
echo "build-image: pushed $dest: digest $digest"
[ -z "$record" ] || record_digest "$digest" "$record"
