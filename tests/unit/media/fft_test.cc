#include "lib/media/fft.h"

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace swaserve::media {
namespace {

TEST(Fft, MatchesTheDirectDftForManyLengths) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int n : {1, 2, 3, 4, 5, 7, 8, 12, 30, 97, 128, 200, 400, 512}) {
    std::vector<Complex> in(n), out(n);
    for (Complex& c : in) c = {u(rng), u(rng)};
    Fft(n).Forward(in.data(), out.data());
    for (int k = 0; k < n; ++k) {
      double re = 0, im = 0;
      for (int j = 0; j < n; ++j) {
        const double a =
            -2 * std::numbers::pi * ((static_cast<int64_t>(j) * k) % n) / n;
        re += in[j].re * std::cos(a) - in[j].im * std::sin(a);
        im += in[j].re * std::sin(a) + in[j].im * std::cos(a);
      }
      const double tolerance = 2e-6 * n + 1e-6;
      ASSERT_NEAR(out[k].re, re, tolerance) << "n " << n << " k " << k;
      ASSERT_NEAR(out[k].im, im, tolerance) << "n " << n << " k " << k;
    }
  }
}

}  // namespace
}  // namespace swaserve::media
