// Software prefetch for the skinny kernels, which stream every weight byte once per call.
//
// Measured on the 2-core Xeon VM (docs/benchmarks.md, "Prefetching the weight stream"): a Q8_0
// 151936 x 896 LM head read at 8-9 GB/s by two threads whose kernels could compute at ~20 GB/s from
// cache; fp32 torch GEMV read the same memory at 18 GB/s. The hardware prefetchers did not run far
// enough ahead of a loop with this much arithmetic per byte, so compute and memory waits added up
// instead of overlapping. Asking for the line 8 KiB ahead of the one being decoded into L2 (T1)
// brought that head to 18-20 GB/s; 2 KiB and 4 KiB recovered less. Past the end of a tensor a
// prefetch is a no-op, not a fault.
#pragma once

#include <cstdint>

namespace tram::simd {

constexpr int64_t kPrefetchBytes = 8192;

// The lines of [p + kPrefetchBytes, p + kPrefetchBytes + bytes), into L2.
inline __attribute__((always_inline)) void prefetch_ahead(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p) + kPrefetchBytes;
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 2);
}

}  // namespace tram::simd
