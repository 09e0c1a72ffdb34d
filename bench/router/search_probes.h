// How many Redis probes each version of the prefix index's depth search
// makes for a match of d pages among n (policy_sim.cc counts them per
// routing decision; the searches are lib/cluster/prefix_index_scripts.cc's).
#pragma once

#include <cstdint>
#include <vector>

namespace swaserve::router::search_probes {

// The hint probes of v10's and v11's searches (page h, then h + 1, each
// narrowing [lo, hi]: pages 1..lo held, page hi + 1 not); returns the probes.
inline int HintProbes(int64_t d, const std::vector<int64_t>& hints, int64_t* lo_io, int64_t* hi_io) {
  int probes = 0;
  int64_t lo = *lo_io, hi = *hi_io;
  for (const int64_t h : hints) {
    if (lo == hi) break;
    if (h < lo || h > hi) continue;
    if (h > lo) {
      ++probes;
      if (h <= d) {
        lo = h;
      } else {
        hi = h - 1;
        continue;
      }
    }
    if (h + 1 <= hi) {
      ++probes;
      if (h + 1 <= d) lo = h + 1; else hi = h;
    }
  }
  *lo_io = lo;
  *hi_io = hi;
  return probes;
}

// What follows the hints: page n while the bracket is open, then a binary
// search; returns the probes.
inline int FinishProbes(int64_t n, int64_t d, int64_t lo, int64_t hi) {
  int probes = 0;
  if (lo < hi && hi == n) {
    ++probes;
    if (d == n) return probes;
    hi = n - 1;
  }
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    ++probes;
    if (mid <= d) lo = mid; else hi = mid - 1;
  }
  return probes;
}

// Probes of v11's search (policy_sim.cc, RunResult::probes [3]); *page1_missed: whether an earlier
// candidate of the decision missed page 1 (updated).
inline int HintFirstProbes(int64_t n, int64_t d, const std::vector<int64_t>& hints,
                    bool* page1_missed) {
  if (n == 0) return 0;
  int probes = 0;
  int64_t lo = 0, hi = n;  // pages 1..lo held, page hi + 1 not
  if (hints.empty() || *page1_missed) {
    ++probes;
    if (d == 0) {
      *page1_missed = true;
      return probes;
    }
    lo = 1;
  }
  probes += HintProbes(d, hints, &lo, &hi);
  if (lo == 0) {
    if (hi > 0) ++probes;
    if (hi == 0 || d == 0) {
      *page1_missed = true;
      return probes;
    }
    lo = 1;
  }
  return probes + FinishProbes(n, d, lo, hi);
}

// Probes of the hinted search (policy_sim.cc, RunResult::probes [2]); `hints`: earlier candidates'
// depths, most recent first.
inline int HintedProbes(int64_t n, int64_t d, const std::vector<int64_t>& hints) {
  if (n == 0) return 0;
  int probes = 1;
  if (d == 0 || n == 1) return probes;
  int64_t lo = 1, hi = n;
  probes += HintProbes(d, hints, &lo, &hi);
  return probes + FinishProbes(n, d, lo, hi);
}

// Probes of the two depth searches (policy_sim.cc, RunResult::probes [0]
// and [1]; d = pages held, 0 <= d <= n).
inline int SearchProbes(int64_t n, int64_t d, bool from_end) {
  if (n == 0) return 0;
  int probes = 1;  // page 1
  if (d == 0) return probes;
  if (n == 1) return probes;
  ++probes;  // page n
  if (d == n) return probes;
  int64_t lo = 1, hi = n - 1;  // page lo held, page hi + 1 not
  if (from_end) {
    for (int64_t step = 1; n - step > lo; step *= 2) {
      ++probes;
      if (n - step <= d) {
        lo = n - step;
        break;
      }
      hi = n - step - 1;
    }
  }
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    ++probes;
    if (mid <= d) lo = mid; else hi = mid - 1;
  }
  return probes;
}

}  // namespace swaserve::router::search_probes
