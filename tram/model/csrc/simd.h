// Vector helpers shared by the CPU kernels: GCC/Clang vector extensions, which -march lowers to
// AVX-512, AVX2, SSE or NEON, so the kernels need no per-ISA code for float32 arithmetic.
#pragma once

#include <cstdint>
#include <cstring>

#define TRAM_INLINE __attribute__((always_inline)) inline

namespace tram::simd {

typedef float vf4 __attribute__((vector_size(4 * sizeof(float))));
typedef float vf8 __attribute__((vector_size(8 * sizeof(float))));
typedef float vf16 __attribute__((vector_size(16 * sizeof(float))));
typedef int32_t vi16 __attribute__((vector_size(16 * sizeof(int32_t))));
typedef uint16_t vu16x8 __attribute__((vector_size(8 * sizeof(uint16_t))));
typedef uint32_t vu32x8 __attribute__((vector_size(8 * sizeof(uint32_t))));
typedef uint16_t vu16x16 __attribute__((vector_size(16 * sizeof(uint16_t))));
typedef uint32_t vu32x16 __attribute__((vector_size(16 * sizeof(uint32_t))));

// Unaligned loads and stores without aliasing trouble (memcpy compiles to one vector move).
template <typename V>
TRAM_INLINE V vload(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <typename V>
TRAM_INLINE void vstore(void* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

}  // namespace tram::simd
