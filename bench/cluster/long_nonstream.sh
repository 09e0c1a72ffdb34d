#!/usr/bin/env bash
# A long NON-streamed prompt on the default local cluster, asked by the
# official openai npm client with its default timeouts: the router's
# --http.nonstream_keepalive (15 s) on, then off. With it, the 200 and a
# whitespace byte every 15 s come before the JSON body, so Node's fetch
# (300 s without response headers) keeps waiting through a prefill that
# takes longer; without it the client gives up at 300 s and, since the
# router never writes to that connection, the cluster goes on prefilling for
# nobody. One request per mode, on a freshly started cluster (no cache),
# max_tokens 8, the client's retries off (MAX_RETRIES) so that a failure shows
# once instead of three times.
#
#   bash bench/cluster/long_nonstream.sh              # WORDS=180000 (~196K tokens)
#
# Knobs (environment): BUILD, OUT, WORDS, MODES ("on off"), MAX_RETRIES (0),
# UP_FLAGS (extra `swaserve up` flags), TIMEOUT_MS (the client's per-attempt
# timeout; empty: its default), WHAT (what the modes turn on and off) and
# OFF_FLAGS (the `off` mode's flags): bench/cluster/client_timeout.sh sets
# the last three.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/swaserve-long-nonstream}
WORDS=${WORDS:-180000}
MODES=${MODES:-"on off"}
MAX_RETRIES=${MAX_RETRIES:-0}
TIMEOUT_MS=${TIMEOUT_MS:-}
WHAT=${WHAT:-keep-alive}
OFF_FLAGS=${OFF_FLAGS:---extra_flags.router=--http.nonstream_keepalive=0}
BASE_FLAGS=${UP_FLAGS:-}
mkdir -p "$OUT"
PROMPT="$OUT/prompt.txt"
/usr/bin/python3 bench/cluster/kjv_words.py "$WORDS" "$PROMPT"
for mode in $MODES; do
  (
    UP_FLAGS="$BASE_FLAGS"
    [ "$mode" = off ] && UP_FLAGS="$UP_FLAGS $OFF_FLAGS"
    OUT="$OUT/$mode"
    . bench/cluster/up.sh
    echo "== $WHAT $mode: $WORDS words, non-streamed, openai $(node -p "require('./node_modules/openai/package.json').version") (maxRetries $MAX_RETRIES${TIMEOUT_MS:+, timeout $TIMEOUT_MS ms})"
    node bench/cluster/openai_nonstream.mjs "$url" "$PROMPT" "$MAX_RETRIES" $TIMEOUT_MS
    # What the cluster did after the client's answer (or its giving up).
    sleep 5
    m=$(curl -s "$url/metrics")
    echo "router requests: $(echo "$m" | grep '^swaserve_router_requests_total' | tr '\n' ' ')"
    echo "in flight 5 s later: $(echo "$m" | grep '^swaserve_router_inflight_requests' | awk '{print $2}')"
    # The prefill workers' work (run/prefill-*.ports.json name their ports).
    for f in "$OUT"/run/prefill-*.ports.json; do
      port=$(grep -o '"metrics_port":[0-9]*' "$f" | cut -d: -f2)
      pm=$(curl -s "http://127.0.0.1:$port/metrics" || true)
      echo "$(basename "$f" .ports.json): computed $(echo "$pm" | grep '^swaserve_prefill_step_tokens_sum' | awk '{print $2}') tokens in steps;" \
        "$(echo "$pm" | grep '^swaserve_prefill_partial_kept_' | tr '\n' ' ')"
    done
  )
done
