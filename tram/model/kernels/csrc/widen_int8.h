// What the weight-only kernels (quant_linear.cpp, gguf_linear.cpp) share: 16 int8 (or 7-bit
// unsigned) lanes widened to float32, and the skinny kernels' tile shape. GCC scalarises __builtin_convertvector from int8 (16
// cvtsi2ss), so the x86 paths say it: vpmovsxbd + vcvtdq2ps, once on AVX-512, twice on AVX2.
#pragma once

#include "simd.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

namespace tram::simd {

typedef int8_t vi8x16 __attribute__((vector_size(16)));
typedef uint8_t vu8x16 __attribute__((vector_size(16)));

TRAM_INLINE vf16 to_float(vi8x16 v) {
#if defined(__AVX512F__)
  return bitcast<vf16>(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bitcast<__m128i>(v))));
#elif defined(__AVX2__)
  const __m128i b = bitcast<__m128i>(v);
  const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b, b)));
  return join8(bitcast<vf8>(lo), bitcast<vf8>(hi));
#else
  typedef int8_t vi8x8 __attribute__((vector_size(8)));
  const vi8x8 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const vi8x8 hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  return join8(__builtin_convertvector(lo, vf8), __builtin_convertvector(hi, vf8));
#endif
}

TRAM_INLINE vf16 to_float(vu8x16 v) { return to_float(bitcast<vi8x16>(v)); }  // values 0..127

// The skinny kernels' weight rows per tile: enough independent sums to hide the FMA latency when x has one row, few
// enough that the sums stay in registers (32 vector registers with AVX-512, 16 with AVX2).
#if defined(__AVX512F__)
constexpr int64_t kWideRows = 4, kNarrowRows = 2;
#else
constexpr int64_t kWideRows = 2, kNarrowRows = 1;
#endif

}  // namespace tram::simd
