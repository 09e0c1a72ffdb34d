#include "lib/media/fft.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace swaserve::media {
namespace {

inline Complex Mul(Complex a, Complex b) {
  return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
}

}  // namespace

Fft::Fft(int n) : n_(std::max(n, 1)) {
  int rest = n_;
  for (int p = 2; rest > 1; ++p) {
    while (rest % p == 0) {
      factors_.push_back(p);
      rest /= p;
      max_factor_ = std::max(max_factor_, p);
    }
    if (p * p > rest && rest > 1) {  // rest is prime
      factors_.push_back(rest);
      max_factor_ = std::max(max_factor_, rest);
      break;
    }
  }
  twiddles_.resize(n_);
  for (int j = 0; j < n_; ++j) {
    const double angle = -2.0 * std::numbers::pi * j / n_;
    twiddles_[j] = {static_cast<float>(std::cos(angle)),
                    static_cast<float>(std::sin(angle))};
  }
}

void Fft::Forward(const Complex* in, Complex* out) const {
  std::vector<Complex> scratch(2 * static_cast<size_t>(max_factor_));
  Recurse(in, 1, out, n_, 0, 1, scratch.data());
}

// out[0..m) = DFT of in[0], in[stride], ... (m values); the level's
// twiddle W_m^x is twiddles_[x * tw_step] (m = n / tw_step).
void Fft::Recurse(const Complex* in, int stride, Complex* out, int m, int level,
                  int tw_step, Complex* scratch) const {
  if (m == 1) {
    out[0] = in[0];
    return;
  }
  const int p = factors_[level];
  const int q = m / p;
  for (int r = 0; r < p; ++r) {
    Recurse(in + r * stride, stride * p, out + r * q, q, level + 1, tw_step * p,
            scratch);
  }
  // X[k + q s] = sum_r W_p^{r s} (W_m^{r k} Y_r[k]); the p inputs and the p
  // outputs of one k share the same slots, so the combine is in place.
  Complex* t = scratch;
  Complex* y = scratch + p;
  const int root_step = q * tw_step;  // W_p^1 = twiddles_[n / p]
  for (int k = 0; k < q; ++k) {
    t[0] = out[k];
    for (int r = 1; r < p; ++r) {
      t[r] = Mul(out[r * q + k], twiddles_[r * k * tw_step]);
    }
    if (p == 2) {
      y[0] = {t[0].re + t[1].re, t[0].im + t[1].im};
      y[1] = {t[0].re - t[1].re, t[0].im - t[1].im};
    } else {
      for (int s = 0; s < p; ++s) {
        Complex acc = t[0];
        for (int r = 1; r < p; ++r) {
          const Complex w = twiddles_[((r * s) % p) * root_step];
          const Complex v = Mul(t[r], w);
          acc.re += v.re;
          acc.im += v.im;
        }
        y[s] = acc;
      }
    }
    for (int s = 0; s < p; ++s) out[s * q + k] = y[s];
  }
}

}  // namespace swaserve::media
