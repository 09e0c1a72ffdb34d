#!/usr/bin/env bash
# One-shot check of swaserve::model_cuda on a machine with an NVIDIA GPU:
# configures a fresh build directory, builds only the CUDA unit tests
# (model_cuda_device_test, model_rmsnorm_cuda_test) with -j16 and runs them.
# A missing device is a FAILURE here, not a skip
# (SWASERVE_REQUIRE_CUDA_DEVICE=1).
#
#   tests/unit/model/run_cuda_check.sh            # sm_90 (H100/H200)
#   CUDA_ARCH=89 tests/unit/model/run_cuda_check.sh
#
# Environment: BUILD_DIR (default <repo>/build-cuda-check, wiped first),
# CUDA_ARCH (default 90), JOBS (default 16), OUT (if set, gtest XML and logs
# go there instead of $BUILD_DIR/reports). Exit 0 only if every test passed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-${ROOT}/build-cuda-check}"
CUDA_ARCH="${CUDA_ARCH:-90}"
JOBS="${JOBS:-16}"
REPORT_DIR="${OUT:-${BUILD_DIR}/reports}"
TESTS=(model_cuda_device_test model_rmsnorm_cuda_test)

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

section "build ${TESTS[*]} (-j${JOBS})"
if ! cmake --build "${BUILD_DIR}" -j "${JOBS}" --target "${TESTS[@]}"; then
  echo "FAIL: build"
  exit 1
fi

export SWASERVE_REQUIRE_CUDA_DEVICE=1
status=0
declare -A results
for t in "${TESTS[@]}"; do
  section "run ${t}"
  bin="${BUILD_DIR}/tests/unit/model/${t}"
  "${bin}" --gtest_also_run_disabled_tests=0 --gtest_color=no \
      --gtest_output="xml:${REPORT_DIR}/${t}.xml" 2>&1 |
      tee "${REPORT_DIR}/${t}.log"
  rc=${PIPESTATUS[0]}
  if [[ ${rc} -eq 0 ]]; then results[${t}]=PASS; else results[${t}]="FAIL (rc=${rc})"; status=1; fi
done

section "summary"
for t in "${TESTS[@]}"; do
  log="${REPORT_DIR}/${t}.log"
  printf '%-26s %-14s %s\n' "${t}" "${results[${t}]}" \
      "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "${log}" | tr '\n' ' ')"
done
grep -h '^\[  SKIPPED \] [A-Za-z]' "${REPORT_DIR}"/*.log | sort -u || true
grep -h 'worst relative error' "${REPORT_DIR}"/*.log | head -40 || true
[[ ${status} -eq 0 ]] && echo "CUDA CHECK: PASS" || echo "CUDA CHECK: FAIL"
exit ${status}
