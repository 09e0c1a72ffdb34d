#!/usr/bin/env bash
# A client whose timeout is shorter than its prompt's prefill: the official
# openai npm client with `timeout` 10 s and many retries sends a long
# NON-streamed prompt to the default local cluster (demo model), whose
# prefill takes about a minute on this 2-core machine. The router's
# non-stream keep-alive (15 s) comes too late for such a client, so every
# attempt is abandoned after 10 s and retried. With the prefill worker
# keeping the chunks a cancelled prefill computed (the default,
# --prefill.keep_cancelled_chunks), each retry resumes where the last one
# stood and one of them gets the answer; without it (`off`) every retry
# starts from the first token and none can finish. One request per mode,
# each on a freshly started cluster.
#
#   bash bench/cluster/client_timeout.sh        # WORDS=40000 (~44K tokens)
#
# Knobs (environment): BUILD, OUT, WORDS, MODES ("on off"), TIMEOUT_MS
# (10000), MAX_RETRIES (12), UP_FLAGS (extra `swaserve up` flags).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/swaserve-client-timeout}
WORDS=${WORDS:-40000}
MODES=${MODES:-"on off"}
TIMEOUT_MS=${TIMEOUT_MS:-10000}
MAX_RETRIES=${MAX_RETRIES:-12}
BASE_FLAGS=${UP_FLAGS:-}
mkdir -p "$OUT"
PROMPT="$OUT/prompt.txt"
/usr/bin/python3 bench/cluster/kjv_words.py "$WORDS" "$PROMPT"
for mode in $MODES; do
  (
    UP_FLAGS="$BASE_FLAGS"
    [ "$mode" = off ] && UP_FLAGS="$UP_FLAGS --extra_flags.prefill=--prefill.keep_cancelled_chunks=false"
    OUT="$OUT/$mode"
    . bench/cluster/up.sh
    echo "== keep cancelled chunks $mode: $WORDS words, non-streamed, openai $(node -p "require('./node_modules/openai/package.json').version") (timeout ${TIMEOUT_MS} ms, maxRetries $MAX_RETRIES)"
    node bench/cluster/openai_nonstream.mjs "$url" "$PROMPT" "$MAX_RETRIES" "$TIMEOUT_MS"
    sleep 2
    m=$(curl -s "$url/metrics")
    echo "router requests: $(echo "$m" | grep '^swaserve_router_requests_total' | tr '\n' ' ')"
    # The prefill workers' counters (run/prefill-*.ports.json name their ports).
    for f in "$OUT"/run/prefill-*.ports.json; do
      port=$(grep -o '"metrics_port":[0-9]*' "$f" | cut -d: -f2)
      pm=$(curl -s "http://127.0.0.1:$port/metrics" || true)
      echo "$(basename "$f" .ports.json): computed $(echo "$pm" | grep '^swaserve_prefill_step_tokens_sum' | awk '{print $2}') tokens in steps;" \
        "$(echo "$pm" | grep '^swaserve_prefill_partial_kept_' | tr '\n' ' ')"
    done
  )
done
