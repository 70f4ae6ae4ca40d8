// fp8 KV cache elements (torch.float8_e4m3fn, torch.float8_e5m2) widened to float32, exactly, on CPUs
// without fp8 instructions.
//
// Scalar: a 256-entry table per format, filled by c10's own conversion. Vectors (8 lanes with AVX2 +
// F16C, 16 with AVX-512): through IEEE half, whose conversion instruction is exact for every input
// (subnormals included, whatever the denormal flags say):
//   * e5m2 has half's exponent bias (15): a byte is the top byte of a half.
//   * e4m3fn's 7 magnitude bits placed as a half's exponent and top mantissa bits read as the value
//     / 2^8 (bias 15 instead of 7), subnormals included, so x 256 (exact) finishes it, or a kernel
//     folds the 256 into its scales. e4m3fn has no infinity; its NaN bytes (0x7F, 0xFF) are set to NaN.
// Both agree with the table on all 256 bytes (tests/model/test_fp8_kv_cache.py reads every byte back).
#pragma once

#include "simd.h"

#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#endif

#include <array>
#include <cstdint>
#include <type_traits>

namespace tram::fp8 {

using simd::vf8;
using simd::vf16;

template <typename F8>
inline const std::array<float, 256> kTable = [] {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) t[i] = static_cast<float>(F8(static_cast<uint8_t>(i), F8::from_bits()));
  return t;
}();

template <typename F8>
TRAM_INLINE float widen1(const F8* p) {
  return kTable<F8>[p->x];
}

// widen8_raw / widen16_raw return value / kReadFactor: e4m3 is read as a half with bias 15, that is
// the value / 2^8. A kernel may fold the factor into its own scales (exact: a power of two).
template <typename T>
inline constexpr float kReadFactor = 1.f;
template <>
inline constexpr float kReadFactor<c10::Float8_e4m3fn> = 256.f;

#if defined(__AVX2__) && defined(__F16C__)
// Bytes, sign-extended to 16 bits, as the halves they stand for (/ kReadFactor).
template <typename V>
TRAM_INLINE V as_half(V b, const c10::Float8_e5m2*) {
  return b << 8;
}

template <typename V>
TRAM_INLINE V as_half(V b, const c10::Float8_e4m3fn*) {
  // Sign extension put the sign in bits 8..15: shifted by 7 it lands in bit 15 and (for negative
  // bytes) bit 14, which the mask clears; the 7 magnitude bits land in bits 7..13.
  return (b << 7) & static_cast<int16_t>(0xBFFF);
}

// e4m3fn's NaN bytes (0x7F, 0xFF) read as +-1.875 (/ 2^8, i.e. 480), which no other byte does.
TRAM_INLINE vf8 fix_nan(vf8 f, const c10::Float8_e4m3fn*) {
  const vf8 a = simd::bitcast<vf8>(simd::bitcast<simd::vu32x8>(f) & 0x7FFFFFFFu);
  return a == 1.875f ? vf8{} + __builtin_nanf("") : f;
}

TRAM_INLINE vf16 fix_nan(vf16 f, const c10::Float8_e4m3fn*) {
  const vf16 a = simd::bitcast<vf16>(simd::bitcast<simd::vu32x16>(f) & 0x7FFFFFFFu);
  return simd::select(a == 1.875f, vf16{} + __builtin_nanf(""), f);
}

template <typename V>
TRAM_INLINE V fix_nan(V f, const c10::Float8_e5m2*) {  // e5m2's NaN and inf bytes are half's own
  return f;
}

typedef int16_t vs8 __attribute__((vector_size(16)));

template <typename F8>
TRAM_INLINE vf8 widen8_raw(const F8* p) {
  const __m128i bytes = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const vs8 h = as_half(simd::bitcast<vs8>(bytes), p);
  return fix_nan(simd::bitcast<vf8>(_mm256_cvtph_ps(simd::bitcast<__m128i>(h))), p);
}
#else
template <typename F8>
TRAM_INLINE vf8 widen8_raw(const F8* p) {
  vf8 r;
  for (int i = 0; i < 8; ++i) r[i] = widen1(p + i) / kReadFactor<F8>;
  return r;
}
#endif

#if defined(__AVX512F__) && defined(__AVX2__) && defined(__F16C__)
typedef int16_t vs16 __attribute__((vector_size(32)));

template <typename F8>
TRAM_INLINE vf16 widen16_raw(const F8* p) {
  const __m256i bytes = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const vs16 h = as_half(simd::bitcast<vs16>(bytes), p);
  return fix_nan(simd::bitcast<vf16>(_mm512_cvtph_ps(simd::bitcast<__m256i>(h))), p);
}
#else
template <typename F8>
TRAM_INLINE vf16 widen16_raw(const F8* p) {
  return simd::join8(widen8_raw(p), widen8_raw(p + 8));
}
#endif

// The values themselves.
template <typename F8>
TRAM_INLINE vf16 widen16(const F8* p) {
  return kReadFactor<F8> == 1.f ? widen16_raw(p) : widen16_raw(p) * kReadFactor<F8>;
}

}  // namespace tram::fp8

namespace tram::simd {

// The scalar loads the kernels use for any element type.
TRAM_INLINE float load1(const c10::Float8_e4m3fn* p) { return fp8::widen1(p); }
TRAM_INLINE float load1(const c10::Float8_e5m2* p) { return fp8::widen1(p); }

}  // namespace tram::simd
