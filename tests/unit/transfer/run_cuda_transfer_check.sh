#!/usr/bin/env bash
# One-shot check of the KV device-memory path (lib/transfer/device_transfer.h,
# lib/transfer/cuda/) on a machine with an NVIDIA GPU: configures a fresh
# build directory with CUDA, builds only transfer_device_transfer_test and
# runs it: CUDA copier round trips (pinned and bounce host paths) and device
# pages -> gather -> two TransferEngines over UCX shared memory -> scatter ->
# device pages, every byte compared, with "device transfer [...]" bandwidth
# lines. A missing device is a FAILURE here, not a skip
# (SWASERVE_REQUIRE_CUDA_DEVICE=1).
#
#   tests/unit/transfer/run_cuda_transfer_check.sh            # sm_90 (H100/H200)
#   CUDA_ARCH=89 MIB=1024 tests/unit/transfer/run_cuda_transfer_check.sh
#
# Environment: BUILD_DIR (default <repo>/build-cuda-transfer-check, wiped
# first), CUDA_ARCH (default 90), JOBS (default 16), MIB (bytes per
# end-to-end transfer, default 256), OUT (if set, gtest XML and logs go there
# instead of $BUILD_DIR/reports). Needs the project's build dependencies
# (UCX, gRPC, abseil, ...: scripts/install-deps.sh). Exit 0 only if every
# test passed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-${ROOT}/build-cuda-transfer-check}"
CUDA_ARCH="${CUDA_ARCH:-90}"
JOBS="${JOBS:-16}"
MIB="${MIB:-256}"
REPORT_DIR="${OUT:-${BUILD_DIR}/reports}"
TEST=transfer_device_transfer_test

section() { printf '\n===== %s =====\n' "$*"; }

section "GPU"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total \
      --format=csv || true
else
  echo "nvidia-smi not found"
fi
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
"${NVCC}" --version | tail -2 || { echo "FAIL: nvcc not found"; exit 1; }
command -v ucx_info >/dev/null 2>&1 && ucx_info -v | head -2

section "configure (${BUILD_DIR}, sm_${CUDA_ARCH})"
rm -rf "${BUILD_DIR}"
mkdir -p "${REPORT_DIR}"
CONFIGURE_LOG="${REPORT_DIR}/configure.log"
GENERATOR=()
command -v ninja >/dev/null 2>&1 && GENERATOR=(-G Ninja)
cmake -S "${ROOT}" -B "${BUILD_DIR}" "${GENERATOR[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSWASERVE_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="${NVCC}" \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH}" \
    -DSWASERVE_BUILD_SERVICES=OFF \
    -DSWASERVE_BUILD_BENCH=OFF \
    > "${CONFIGURE_LOG}" 2>&1
rc=$?
tail -5 "${CONFIGURE_LOG}"
if [[ ${rc} -ne 0 ]]; then
  echo "FAIL: configure (rc=${rc}); full log: ${CONFIGURE_LOG}"
  tail -40 "${CONFIGURE_LOG}"
  exit 1
fi

section "build ${TEST} (-j${JOBS})"
if ! cmake --build "${BUILD_DIR}" -j "${JOBS}" --target "${TEST}"; then
  echo "FAIL: build"
  exit 1
fi

section "run ${TEST} (${MIB} MiB per end-to-end transfer)"
export SWASERVE_REQUIRE_CUDA_DEVICE=1
export SWASERVE_DEVICE_TRANSFER_MIB="${MIB}"
"${BUILD_DIR}/tests/unit/transfer/${TEST}" --gtest_color=no \
    --gtest_output="xml:${REPORT_DIR}/${TEST}.xml" 2>&1 |
    tee "${REPORT_DIR}/${TEST}.log"
rc=${PIPESTATUS[0]}

section "summary"
log="${REPORT_DIR}/${TEST}.log"
grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "${log}" || true
grep -E '^(copier \[|device transfer \[)' "${log}" || true
if [[ ${rc} -eq 0 ]]; then
  echo "CUDA TRANSFER CHECK: PASS"
else
  echo "CUDA TRANSFER CHECK: FAIL (rc=${rc})"
fi
exit ${rc}
