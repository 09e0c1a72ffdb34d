// A small mixed-radix complex FFT for the log-mel front end (mel.h): any
// length n >= 1, decimation in time over the prime factors of n (2s first,
// then 3, 5, ...; each butterfly a direct p-point DFT, so lengths with large
// prime factors cost O(n * p)). Single precision, fixed evaluation order:
// deterministic. Twiddles come from a table of e^{-2 pi i j / n} computed
// in double.
//
// Thread-safety: immutable after construction; Forward may run on many
// threads at once (each with its own buffers).
#pragma once

#include <vector>

namespace swaserve::media {

struct Complex {
  float re = 0;
  float im = 0;
};

class Fft {
 public:
  // n >= 1.
  explicit Fft(int n);

  // out[k] = sum_j in[j] e^{-2 pi i j k / n}, k < n. `in` and `out` hold n
  // values each and must not overlap.
  void Forward(const Complex* in, Complex* out) const;

  int size() const { return n_; }

 private:
  void Recurse(const Complex* in, int stride, Complex* out, int m, int level,
               int tw_step, Complex* scratch) const;

  int n_;
  int max_factor_ = 1;
  std::vector<int> factors_;
  std::vector<Complex> twiddles_;  // e^{-2 pi i j / n}, j < n
};

}  // namespace swaserve::media
