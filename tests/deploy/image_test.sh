#!/usr/bin/env bash
# The container image (deploy/docker/Containerfile), run for real with podman:
# every binary starts, the image's default command (`swaserve up`) serves the
# bundled demo model over the OpenAI API as user 10001, /metrics answers, and
# `podman stop` (SIGTERM) stops the whole cluster cleanly within the grace
# period.
#
#   bash tests/deploy/image_test.sh [--build] [IMAGE]   # default localhost/swaserve:latest
#
# --build builds the image first (deploy/docker/build-image.sh: about 7
# minutes on 2 cores from scratch; podman reuses the dependency layer). CTest
# runs it with --build. Exits 77 (CTest: skipped) when podman is missing, as
# in CI, or without --build when the image is. RUNTIME and ULIMITS as in
# build-image.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=0
if [ "${1:-}" = --build ]; then
  build=1
  shift
fi
image=${1:-localhost/swaserve:latest}
runtime=${RUNTIME:-runc}
ulimits=${ULIMITS---ulimit nofile=20000:20000 --ulimit nproc=4096:4096}
if ! command -v podman >/dev/null 2>&1; then
  echo "image_test: SKIPPED: podman is not installed (apt-get install podman runc)"
  exit 77
fi
if [ "$build" = 1 ]; then
  if ! command -v mmdebstrap >/dev/null 2>&1 && ! podman image exists localhost/debian:12; then
    echo "image_test: SKIPPED: mmdebstrap is not installed (apt-get install mmdebstrap runc)"
    exit 77
  fi
  bash "$here/deploy/docker/build-image.sh" "$image"
fi
if ! podman image exists "$image"; then
  echo "image_test: SKIPPED: no image $image (bash deploy/docker/build-image.sh)"
  exit 77
fi
name=swaserve-image-test-$$
fail() {
  echo "image_test: FAILED: $*" >&2
  podman logs --tail 60 "$name" >&2 2>&1 || true
  podman rm -f "$name" >/dev/null 2>&1 || true
  exit 1
}
run() {
  # shellcheck disable=SC2086
  podman --runtime "$runtime" run --rm $ulimits "$@"
}

# Every binary runs in the runtime image (its shared libraries are there).
for bin in swaserve swaserve-router swaserve-worker swaserve-prefill swaserve-decode \
           swaserve-encoder; do
  out=$(run "$image" "$bin" --help 2>&1) || fail "$bin --help: $out"
  grep -qi "usage\|--" <<<"$out" || fail "$bin --help printed no usage: $out"
done
uid=$(run "$image" id -u)
[ "$uid" = 10001 ] || fail "the image runs as uid $uid, not 10001"
echo "image_test: every binary starts; user $uid"

# The default command: a whole cluster on the demo model. Host network, on
# ports free here.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
grpc=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# shellcheck disable=SC2086
podman --runtime "$runtime" run -d --name "$name" --network host $ulimits \
  "$image" swaserve up --host=127.0.0.1 --http_port="$port" --grpc_port="$grpc" \
  --redis_port=0 >/dev/null
deadline=$(( $(date +%s) + 180 ))
until curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "no /health on port $port after 180 s"
  podman container exists "$name" || fail "the container exited"
  sleep 2
done
echo "image_test: swaserve up healthy on port $port"
body='{"model":"demo","messages":[{"role":"user","content":"Tell me about the sea."}],"max_tokens":16,"temperature":0}'
reply=$(curl -fsS -H 'Content-Type: application/json' -d "$body" \
  "http://127.0.0.1:$port/v1/chat/completions") || fail "chat completion failed"
python3 - "$reply" <<'PY' || fail "bad completion: $reply"
import json, sys
r = json.loads(sys.argv[1])
text = r["choices"][0]["message"]["content"]
assert r["usage"]["completion_tokens"] > 0 and text.strip(), r
print("image_test: completion:", repr(text))
PY
curl -fsS "http://127.0.0.1:$port/metrics" | grep -q '^swaserve_router_requests_total' \
  || fail "/metrics lacks swaserve_router_requests_total"

# SIGTERM: everything stops within the grace period, exit status 0.
start=$(date +%s)
podman stop --time 30 "$name" >/dev/null
code=$(podman inspect "$name" --format '{{.State.ExitCode}}')
took=$(( $(date +%s) - start ))
podman rm "$name" >/dev/null
[ "$code" = 0 ] || fail "swaserve up exited with $code after SIGTERM"
[ "$took" -lt 30 ] || fail "the stop took $took s (SIGKILL at 30)"
echo "image_test: stopped cleanly in $took s"
echo "image_test: PASSED ($image)"
