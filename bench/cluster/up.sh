# Sourced by the bench/cluster scripts: starts `swaserve up` with free ports,
# logs and run dir under $OUT and $UP_FLAGS, stops it on exit, and waits until
# it is serving. Sets $up (its pid) and $url (the OpenAI base URL, without
# /v1). Needs BUILD and OUT.
mkdir -p "$OUT"
rm -rf "$OUT/run"
# shellcheck disable=SC2086
"$BUILD/bin/swaserve" up --run_dir="$OUT/run" --http_port=0 --grpc_port=0 ${UP_FLAGS:-} >"$OUT/up.log" 2>&1 &
up=$!
trap 'kill -INT $up 2>/dev/null || true; wait $up 2>/dev/null || true' EXIT
for _ in $(seq 1 900); do grep -q "Ctrl-C" "$OUT/up.log" 2>/dev/null && break; sleep 0.2; done
grep -q "Ctrl-C" "$OUT/up.log" || { cat "$OUT/up.log"; echo "swaserve up did not start" >&2; exit 1; }
url=$(grep -o "OpenAI HTTP *http://[0-9.:]*" "$OUT/up.log" | awk '{print $3}')
