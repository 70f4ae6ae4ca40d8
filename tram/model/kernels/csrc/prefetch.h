// Software prefetch for the skinny kernels, which stream every weight byte once per call.
//
// Why: the hardware prefetchers do not run far enough ahead of a loop with this much arithmetic per
// byte, so compute and memory waits add up instead of overlapping, and a quantized weight is read
// well below the bandwidth a plain float32 GEMV gets. Each loop asks for the line 8 KiB ahead of the
// one being decoded, into L2 (T1); nearer distances recover less (docs/benchmarks.md, "One request
// at a time", has the measurements). Past the end of a tensor a prefetch is a no-op, not a fault.
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
