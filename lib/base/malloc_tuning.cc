#include "lib/base/malloc_tuning.h"

#include <climits>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace swaserve::base {

void KeepFreedMemory(size_t max_retained_bytes) {
#if defined(__GLIBC__)
  const int bytes = max_retained_bytes > static_cast<size_t>(INT_MAX)
                        ? INT_MAX
                        : static_cast<int>(max_retained_bytes);
  mallopt(M_MMAP_THRESHOLD, bytes);
  mallopt(M_TRIM_THRESHOLD, bytes);
#else
  (void)max_retained_bytes;
#endif
}

}  // namespace swaserve::base
