#!/usr/bin/env bash
# Builds the swaserve image with podman where no registry is reachable
# (deploy/README.md, "The container image"): a Debian 12 base made here with
# mmdebstrap from the Debian mirror and imported as localhost/debian:12 (and
# :12-slim), then deploy/docker/Containerfile on top of it.
#
#   bash deploy/docker/build-image.sh [TAG]     # default localhost/swaserve:latest
#
# Needs root, podman, runc and mmdebstrap (apt-get install podman runc
# mmdebstrap). Runtime runc and explicit ulimits: on this kind of VM crun
# cannot set cgroups ("cgroups in hybrid mode not supported") and podman's
# default rlimits are refused ("setrlimit RLIMIT_NOFILE / RLIMIT_NPROC:
# Operation not permitted"); RUNTIME=crun ULIMITS= to use podman's defaults.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tag=${1:-localhost/swaserve:latest}
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
