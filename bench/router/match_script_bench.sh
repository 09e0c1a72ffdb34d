#!/usr/bin/env bash
# The prefix-match Lua script alone (lib/cluster/prefix_index_scripts.cc MatchScript),
# timed by Redis itself: INFO commandstats' usec per EVALSHA (the script's
# execution, without the connection's I/O), so the comparison does not depend
# on the client. Compares the script of the working tree with the one at a git
# revision, alternating, ROUNDS times.
#
# Data: a fresh redis-server holding 10^6 page hashes in 8 worker SETs
# (125,000 each) whose every worker also holds a shared 32-page system prompt
# (512 tokens: what every request of the Mooncake conversation trace starts
# with). Prompt: 256 pages (4K tokens), 8 candidates, no predictions, no
# SWA-gone or lower-tier pages (window check per WP). Cases:
#   full    worker 1 holds all 256 pages, the others the shared 32;
#   half    worker 1 holds 128, the others 32;
#   shared  every worker holds the shared 32 only (a new conversation);
#   nshare  (no shared prefix in the prompt) worker 1 holds 128, the others
#           none: the decision_bench "half" case.
#
# Usage: bash bench/router/match_script_bench.sh [REV] [ROUNDS] [CALLS] [WP]
#   REV     git revision of the other script (default e6745e3: prefix_match_v8)
#   ROUNDS  alternating rounds (default 3); CALLS: EVALSHA per cell (10000)
#   WP      window pages of the window check (default 0: off; the router
#           sends 8 for a 128-token window at 16 tokens per page)
# Needs redis-server, redis-cli, redis-benchmark and python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
REV=${1:-e6745e3}
ROUNDS=${2:-3}
CALLS=${3:-10000}
WP=${4:-0}
for tool in redis-server redis-cli redis-benchmark python3; do
  command -v "$tool" >/dev/null || { echo "match_script_bench: needs $tool" >&2; exit 2; }
done
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() { redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

extract() {  # extract <file with prefix_index.cc> <out.lua>
  python3 - "$1" "$2" <<'EOF'
import re, sys
src = open(sys.argv[1]).read()
m = re.search(r'RedisScript\{"(prefix_match_v\d+)", R"lua\((.*?)\)lua"', src, re.S)
if not m: sys.exit("no prefix_match script in " + sys.argv[1])
open(sys.argv[2], 'w').write(m.group(2))
print(m.group(1))
EOF
}
source_at() {  # source_at <rev or "tree"> -> the file holding MatchScript
  local f=lib/cluster/prefix_index_scripts.cc
  if [ "$1" = tree ]; then cat "$f"; return; fi
  git show "$1:$f" 2>/dev/null || git show "$1:lib/cluster/prefix_index.cc"
}
source_at "$REV" > "$work/old.cc"
source_at tree > "$work/new.cc"
old_name=$(extract "$work/old.cc" "$work/old.lua")
new_name=$(extract "$work/new.cc" "$work/new.lua")

python3 - "$work" "$WP" <<'EOF'
import sys
work = sys.argv[1]
def prompt(owner, shared=32, n=256):
    pages = []
    for i in range(1, n + 1):
        if i <= shared: pages.append('S%07d' % i)
        elif i <= owner: pages.append('%08d' % (1000000 + i))
        else: pages.append('F%07d' % i)
    return ''.join(pages)
# v8..v10 take 4 keys per candidate; v11 on adds its tier summary (5).
for per in (4, 5):
    keys = []
    for c in range(1, 9):
        keys += ['s%d' % c, 'p%d' % c, 'g%d' % c, 'l%d' % c] + (['t%d' % c] if per == 5 else [])
    keys.append('pu')
    keys += ['load%d' % i for i in range(1, 11)]
    for name, owner, shared in [('full', 256, 32), ('half', 128, 32), ('shared', 32, 32),
                                ('nshare', 128, 0)]:
        args = [prompt(owner, shared), '8', sys.argv[2]] + ['w%d' % i for i in range(1, 9)]
        open('%s/%s.%d.args' % (work, name, per), 'w').write(
            ' '.join([str(len(keys))] + keys + args))
EOF

redis-server --port "$port" --save '' --appendonly no --daemonize yes \
  --logfile "$work/redis.log" --dir "$work" >/dev/null
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$port" EVAL "
for w = 1, 8 do
  local k = 's' .. w
  for b = 0, 124 do
    local a = {}
    for i = 1, 1000 do a[i] = string.format('%08d', w * 1000000 + b * 1000 + i) end
    redis.call('SADD', k, unpack(a))
  end
  for i = 1, 32 do redis.call('SADD', k, string.format('S%07d', i)) end
  redis.call('SET', 'load' .. w, '12345')
  redis.call('SET', 't' .. w, '0')  -- v11's tier summary: no SWA-gone, no lower-tier pages
  redis.call('HSET', 'pu', 'w' .. w, '1')
end
return redis.call('DBSIZE')" 0 >/dev/null

cell() {  # cell <sha> <case> -> usec per EVALSHA
  redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
  # shellcheck disable=SC2046  # the args file holds space-separated arguments
  redis-benchmark -p "$port" -n "$CALLS" -c 1 -q EVALSHA "$1" $(cat "$work/$2.args") >/dev/null
  redis-cli -p "$port" INFO commandstats | tr -d '\r' | grep '^cmdstat_evalsha:' |
    sed 's/.*calls=\([0-9]*\),usec=\([0-9]*\).*/\2 \1/' | awk '{printf "%.1f", $1 / $2}'
}
keys_per_candidate() {  # <script name> -> 4 (v8..v10) or 5 (v11 on: + tier summary)
  local v=${1#prefix_match_v}; v=${v%% *}
  if [ "$v" -ge 11 ]; then echo 5; else echo 4; fi
}
old_sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/old.lua")")
new_sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/new.lua")")
echo "match script alone, µs of Redis execution per EVALSHA (INFO commandstats), $CALLS calls per cell"
echo "10^6 hashes in 8 SETs + a shared 32-page prefix; 256-page prompt, 8 candidates, window pages $WP"
printf '%-6s %-28s %8s %8s %8s %8s\n' round script full half shared nshare
for r in $(seq "$ROUNDS"); do
  for which in old new; do
    if [ "$which" = old ]; then sha=$old_sha; name="$old_name ($REV)"; else sha=$new_sha; name="$new_name (tree)"; fi
    k=$(keys_per_candidate "$name")
    printf '%-6s %-28s %8s %8s %8s %8s\n' "$r" "$name" "$(cell "$sha" full.$k)" \
      "$(cell "$sha" half.$k)" "$(cell "$sha" shared.$k)" "$(cell "$sha" nshare.$k)"
  done
done
