#!/usr/bin/env bash
# A client whose timeout is shorter than its prompt's prefill: the official
# openai npm client with `timeout` 10 s and many retries sends a long
# NON-streamed prompt to the default local cluster (demo model), whose
# prefill takes longer than that on this 2-core machine. The router's
# non-stream keep-alive (15 s) comes too late for such a client, so every
# attempt is abandoned after 10 s and retried. With the prefill worker
# keeping the chunks a cancelled prefill computed (the default,
# --prefill.keep_cancelled_chunks), each retry resumes where the last one
# stood and one of them gets the answer; without it (`off`) every retry
# starts from the first token. One request per mode, each on a freshly
# started cluster (bench/cluster/long_nonstream.sh runs them).
#
#   bash bench/cluster/client_timeout.sh        # WORDS=40000 (~44K tokens)
#
# Knobs (environment): those of long_nonstream.sh; here WORDS (40000),
# TIMEOUT_MS (10000), MAX_RETRIES (12), OUT.
set -euo pipefail
export WORDS=${WORDS:-40000} TIMEOUT_MS=${TIMEOUT_MS:-10000} MAX_RETRIES=${MAX_RETRIES:-12}
export OUT=${OUT:-/tmp/swaserve-client-timeout} WHAT="keep cancelled chunks"
export OFF_FLAGS="--extra_flags.prefill=--prefill.keep_cancelled_chunks=false"
exec bash "$(dirname "$0")/long_nonstream.sh"
