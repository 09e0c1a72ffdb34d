#!/usr/bin/env bash
# Installs everything swaserve needs to build, test and run a local cluster on
# Debian 12 (bookworm). Idempotent: packages already present are skipped, and a
# second run does nothing but check.
#
#   bash scripts/install-deps.sh            # build + test + local cluster deps
#   bash scripts/install-deps.sh --torch    # also python3-torch (reference fixtures)
#   bash scripts/install-deps.sh --no-npm   # skip the npm packages
#
# Exit status: 0 when everything is installed; 1 with a message saying why not
# (not root and no sudo, no network, an unknown distribution).
set -euo pipefail

want_torch=0
want_npm=1
for arg in "$@"; do
  case "$arg" in
    --torch) want_torch=1 ;;
    --no-npm) want_npm=0 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Build toolchain and libraries (see CMakeLists.txt for how each is found).
pkgs=(
  build-essential cmake ninja-build ccache pkg-config git
  clang lld libclang-rt-14-dev        # the default compiler (faster builds), libFuzzer, sanitizers
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libucx-dev ucx-utils                # KV transfer; ucx_perftest for benchmarks
  libhiredis-dev redis-server redis-tools
  libspdlog-dev libfmt-dev nlohmann-json3-dev libcpp-httplib-dev
  libevent-dev                        # the router's HTTP API: event-driven streaming
  libssl-dev openssl                  # TLS on the HTTP API (libevent_openssl); test certificates
  libopenblas-dev libxxhash-dev libyaml-cpp-dev libpcre2-dev libutf8proc-dev
  libpng-dev                          # swaserve dashboard's PNG charts, lib/media
  libjpeg62-turbo-dev                 # lib/media: JPEG decode
  libavformat-dev libavcodec-dev libavutil-dev libswscale-dev libswresample-dev  # lib/media
  prometheus                          # promtool and the scrape integration test
  python3-yaml                        # tests/deploy: the rendered manifests
  curl procps iproute2
  nftables iptables                   # the multi-host tests: partitions, loss, delay (NFQUEUE)
)
# Node.js + npm run the tokenizer golden-file generator. Machines that already
# have a node/npm (e.g. from NodeSource) must not get Debian's, which conflict.
if ! command -v npm >/dev/null 2>&1; then
  pkgs+=(nodejs npm)
fi
if [ "$want_torch" = 1 ]; then
  pkgs+=(python3 python3-torch python3-numpy)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: apt-get not found; this script supports Debian 12 only." >&2
    echo "install-deps: missing packages: ${missing[*]}" >&2
    exit 1
  fi
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      SUDO="sudo -n"
    else
      echo "install-deps: not root and no password-less sudo; cannot install:" >&2
      echo "  ${missing[*]}" >&2
      echo "install-deps: run as root, or install them yourself with apt-get." >&2
      exit 1
    fi
  fi
  echo "install-deps: installing ${#missing[@]} package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get update -q >/tmp/swaserve-apt-update.log 2>&1; then
    echo "install-deps: 'apt-get update' failed (no network or no package mirror?):" >&2
    tail -5 /tmp/swaserve-apt-update.log >&2
    exit 1
  fi
  if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" \
      >/tmp/swaserve-apt-install.log 2>&1; then
    echo "install-deps: 'apt-get install' failed; last lines of the log:" >&2
    tail -15 /tmp/swaserve-apt-install.log >&2
    exit 1
  fi
else
  echo "install-deps: all ${#pkgs[@]} Debian packages present"
fi

# npm packages, pinned by the committed package-lock.json (npm ci installs
# exactly what the lock names). Skipped when node_modules already matches.
if [ "$want_npm" = 1 ] && [ -f "$here/package-lock.json" ]; then
  stamp="$here/node_modules/.package-lock.json"   # written by npm on install
  if [ -f "$stamp" ] && [ "$stamp" -nt "$here/package-lock.json" ]; then
    echo "install-deps: npm packages present"
  else
    echo "install-deps: npm ci (pinned by package-lock.json)"
    if ! (cd "$here" && npm ci --no-audit --no-fund --loglevel=error); then
      echo "install-deps: 'npm ci' failed (no network to the npm registry?)" >&2
      exit 1
    fi
  fi
  # llama.cpp's prebuilt CPU library for the engine's oracle test: its own
  # package, installed with `npm install` (pinned by its lock file too): the
  # package names prebuilt binaries for platforms the registry may not carry,
  # which `npm ci` refuses and `npm install` skips as optional.
  oracle="$here/tools/llama_oracle"
  if [ -f "$oracle/node_modules/.package-lock.json" ] &&
     [ "$oracle/node_modules/.package-lock.json" -nt "$oracle/package-lock.json" ]; then
    echo "install-deps: node-llama-cpp present"
  else
    echo "install-deps: npm install in tools/llama_oracle (node-llama-cpp)"
    if ! (cd "$oracle" && npm install --no-audit --no-fund --loglevel=error); then
      echo "install-deps: npm install of node-llama-cpp failed" >&2
      exit 1
    fi
  fi
fi
echo "install-deps: done"
