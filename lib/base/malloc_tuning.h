// Process-wide allocator settings for servers that allocate and free large
// transient buffers again and again (L3 page fetches of hundreds of MiB,
// KV staging). glibc serves every allocation above its mmap threshold (at
// most 32 MiB, adapted dynamically) with fresh mmap'd pages and unmaps them
// on free, so each such buffer pays a page fault per 4 KiB page on first
// touch. On this project's VMs that dominates: an L3 -> L2 fetch of a 4K-token
// MiMo-V2.5-Pro prompt (238 MiB) ran at 0.07 GB/s with the defaults and
// 1.5 GB/s with freed memory kept (bench/RESULTS.md, KV tiers).
//
// KeepFreedMemory(max_retained_bytes): allocations below max_retained_bytes
// come from the heap and freed memory is kept for reuse, up to
// max_retained_bytes at the top of the heap (beyond it glibc trims as
// usual). Call once at the start of main(), before threads start. No-op
// where glibc's mallopt is not available.
#pragma once

#include <cstddef>

namespace swaserve::base {

void KeepFreedMemory(size_t max_retained_bytes);

}  // namespace swaserve::base
