// Internal to lib/model: the AVX2 + FMA + F16C kernels cpu_kernels.cc
// dispatches to on machines without AVX-512 (cpu_kernels_avx2.cc). Same
// results, bit for bit, as the AVX-512 kernels and the portable loops.
// Thread-safe (pure functions).
#pragma once

#include <cstdint>

#include "lib/model/cpu_kernels.h"

namespace swaserve::model::avx2 {

// The CPU has AVX2, FMA and F16C (checked once).
bool Have();
// Call only when Have().
float Dot(const float* a, const float* b, int64_t n);
void Axpy(float a, const float* x, float* y, int64_t n);
// Columns [n0, n1) of y = x · w (n0 a multiple of 32).
void MatMulRange(const float* x, int64_t M, const PackedWeight& w, int64_t n0, int64_t n1,
                 float* y, int64_t ldy);

}  // namespace swaserve::model::avx2
