#!/usr/bin/env bash
# The multi-host fault table and KV transfer table (bench/RESULTS.md, *Across
# hosts*): runs tests/e2e/hosts_e2e_test — every process of a small cluster
# in its own network namespace (tests/integration/router/host_network.h) —
# and prints its FAULT-ROW and TRANSFER-ROW lines as two Markdown tables.
# Needs root (namespaces, tc, nftables); the test skips itself otherwise.
#
# Usage: bash bench/cluster/hosts_faults.sh [BUILD_DIR] [GTEST_FILTER]
#   BUILD_DIR     default build (ninja -C build hosts_e2e_test swaserve_cli
#                 worker_main router_main first)
#   GTEST_FILTER  default '*' (all cases, ~4 min on 2 cores)
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$here/build}"
filter="${2:-*}"
bin="$build/tests/e2e/hosts_e2e_test"
[ -x "$bin" ] || { echo "hosts_faults: $bin not built" >&2; exit 1; }
log="$(mktemp -t hosts_faults.XXXXXX)"
trap 'rm -f "$log"' EXIT
# Each case in its own process, as ctest runs them (one network per process).
for case in $("$bin" --gtest_list_tests --gtest_filter="$filter" |
              awk '/^[^ ]/ {suite=$1} /^  / {print suite $1}'); do
  echo "hosts_faults: $case" >&2
  nice -n 10 "$bin" --gtest_filter="$case" >>"$log" 2>&1 || echo "hosts_faults: $case FAILED" >&2
done
echo "| fault | requests | completed | identical | detection | added latency p50 | p99 | notes |"
echo "|---|---|---|---|---|---|---|---|"
grep '^FAULT-ROW |' "$log" | sed 's/^FAULT-ROW //' || true
echo
echo "| link (prefill host) | prompt | bytes shipped (window-only) | transfer time | bandwidth alone | TTFT | all-SWA |"
echo "|---|---|---|---|---|---|---|"
grep '^TRANSFER-ROW |' "$log" | sed 's/^TRANSFER-ROW //' || true
