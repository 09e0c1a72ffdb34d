#!/usr/bin/env bash
# Longer libFuzzer campaigns than CI's 6 s per target: every target of a
# -DSWASERVE_FUZZ=ON build (CI's build-san) for SECONDS each, JOBS at a time,
# each over its committed seeds plus the build tree's scratch corpus (new
# inputs go there, so a later run starts where this one stopped). Prints one
# line per target (executions, exec/s, coverage, corpus) and exits non-zero
# when a target crashed, leaked or timed out; the input that did it is kept
# in OUT (default /tmp/swaserve-fuzz).
#
#   bash scripts/fuzz-long.sh [BUILD_DIR (build-san)] [SECONDS (120)] [JOBS (2)]
#   ONLY='chat_template|video' bash scripts/fuzz-long.sh ...   # a subset (a grep -E pattern)
set -euo pipefail
build=${1:-build-san}
seconds=${2:-120}
jobs=${3:-2}
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/swaserve-fuzz}
mkdir -p "$out"
fuzzers=$(find "$build/tests/fuzz" -maxdepth 1 -type f -name '*_fuzzer' -perm -u+x | sort |
  grep -E "${ONLY:-.}" || true)
[ -n "$fuzzers" ] || { echo "no *_fuzzer binaries under $build/tests/fuzz (configure with -DSWASERVE_FUZZ=ON)" >&2; exit 2; }
run_one() {
  local bin=$1 name corpus scratch log
  name=$(basename "$bin")
  corpus=${name%_fuzzer}
  scratch="$(dirname "$bin")/corpus-$corpus"
  mkdir -p "$scratch"
  log="$out/$name.log"
  local rc=0
  "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=25 -print_final_stats=1 \
    -artifact_prefix="$out/$name-" "$scratch" "$src/tests/fuzz/corpus/$corpus" > "$log" 2>&1 || rc=$?
  local execs rate cov corp
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corp=$(grep -o 'corp: [0-9]*/[0-9A-Za-z]*' "$log" | tail -1 | cut -d' ' -f2)
  printf '%-24s rc %-3s executions %-10s exec/s %-7s cov %-6s corpus %s\n' \
    "$name" "$rc" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${corp:-?}"
  return "$rc"
}
export -f run_one
export seconds src out
echo "fuzzing $(echo "$fuzzers" | wc -l) targets for ${seconds} s each, $jobs at a time; logs in $out"
if echo "$fuzzers" | xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ {}; then
  echo "no crash, leak or timeout"
else
  echo "FAILED: see $out/*.log and the inputs $out/*-crash-* / -leak-* / -timeout-*" >&2
  exit 1
fi
