// Vector helpers shared by the CPU kernels: GCC/Clang vector extensions, which -march lowers to
// AVX-512, AVX2, SSE or NEON, so the kernels need no per-ISA code for float32 arithmetic.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#define TRAM_INLINE __attribute__((always_inline)) inline

#include "simd_pair.h"

namespace tram::simd {

typedef float vf4 __attribute__((vector_size(4 * sizeof(float))));
typedef float vf8 __attribute__((vector_size(8 * sizeof(float))));
typedef int32_t vi32x8 __attribute__((vector_size(8 * sizeof(int32_t))));
typedef uint16_t vu16x8 __attribute__((vector_size(8 * sizeof(uint16_t))));
typedef uint32_t vu32x8 __attribute__((vector_size(8 * sizeof(uint32_t))));
typedef uint16_t vu16x16 __attribute__((vector_size(16 * sizeof(uint16_t))));

// 16 lanes: one register with AVX-512, two halves elsewhere (simd_pair.h says why). Code that must
// compile both ways uses the helpers below for selects, halves, conversions and lane lists.
#if defined(__AVX512F__)
#define TRAM_VF16_NATIVE 1
typedef float vf16 __attribute__((vector_size(16 * sizeof(float))));
typedef int32_t vi16 __attribute__((vector_size(16 * sizeof(int32_t))));
typedef uint32_t vu32x16 __attribute__((vector_size(16 * sizeof(uint32_t))));
#else
#define TRAM_VF16_NATIVE 0
using vf16 = Pair<vf8>;
using vi16 = Pair<vi32x8>;
using vu32x16 = Pair<vu32x8>;
#endif

// Unaligned loads and stores without aliasing trouble (memcpy compiles to one vector move). A pair
// moves half by half: one memcpy of the whole struct went through the stack in 16-byte pieces.
template <typename V>
TRAM_INLINE V vload(const void* p) {
  if constexpr (kIsPair<V>) {
    using H = decltype(V::lo);
    return V{vload<H>(p), vload<H>(static_cast<const char*>(p) + sizeof(H))};
  } else {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  }
}

template <typename V>
TRAM_INLINE void vstore(void* p, const V& v) {
  if constexpr (kIsPair<V>) {
    vstore(p, v.lo);
    vstore(static_cast<char*>(p) + sizeof(v.lo), v.hi);
  } else {
    std::memcpy(p, &v, sizeof(V));
  }
}

template <typename To, typename From>
TRAM_INLINE To bitcast(const From& v) {
  static_assert(sizeof(To) == sizeof(From));
  if constexpr (kIsPair<To> && kIsPair<From>) {
    using H = decltype(To::lo);
    return To{bitcast<H>(v.lo), bitcast<H>(v.hi)};
  } else {
    To r;
    std::memcpy(&r, &v, sizeof(To));
    return r;
  }
}

// One element widened to float32, and one float32 rounded to the element type.
TRAM_INLINE float load1(const float* p) { return *p; }
TRAM_INLINE float load1(const c10::BFloat16* p) { return static_cast<float>(*p); }
TRAM_INLINE float load1(const c10::Half* p) { return static_cast<float>(*p); }
TRAM_INLINE void store(float v, float* dst) { *dst = v; }
TRAM_INLINE void store(float v, c10::BFloat16* dst) { *dst = c10::BFloat16(v); }
TRAM_INLINE void store(float v, c10::Half* dst) { *dst = c10::Half(v); }

// ---- 16 lanes in either representation.

#if TRAM_VF16_NATIVE
TRAM_INLINE vf8 low8(vf16 v) { return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7); }
TRAM_INLINE vf8 high8(vf16 v) { return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15); }
TRAM_INLINE vf16 join8(vf8 lo, vf8 hi) {
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
TRAM_INLINE vf16 select(vi16 mask, vf16 a, vf16 b) { return mask ? a : b; }
TRAM_INLINE vi16 select(vi16 mask, vi16 a, vi16 b) { return mask ? a : b; }
TRAM_INLINE vf16 to_float(vi16 v) { return __builtin_convertvector(v, vf16); }
TRAM_INLINE vi16 iota16() { return vi16{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}; }
#else
TRAM_INLINE vf8 low8(vf16 v) { return v.lo; }
TRAM_INLINE vf8 high8(vf16 v) { return v.hi; }
TRAM_INLINE vf16 join8(vf8 lo, vf8 hi) { return {lo, hi}; }
TRAM_INLINE vf16 to_float(vi16 v) { return {__builtin_convertvector(v.lo, vf8), __builtin_convertvector(v.hi, vf8)}; }
TRAM_INLINE vi16 iota16() { return {vi32x8{0, 1, 2, 3, 4, 5, 6, 7}, vi32x8{8, 9, 10, 11, 12, 13, 14, 15}}; }
#endif

// Fixed-order horizontal sum: halves folded pairwise, 16 -> 8 -> 4 -> 2 -> 1, in registers.
TRAM_INLINE float hsum(vf16 v) {
  const vf8 s8 = low8(v) + high8(v);
  const vf4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  const float s0 = s4[0] + s4[2], s1 = s4[1] + s4[3];
  return s0 + s1;
}

// Fixed-order horizontal sum of 8 lanes: ((0+1)+(2+3))+((4+5)+(6+7)).
TRAM_INLINE float hsum8(vf8 v) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); }

// The largest lane (the order does not matter for a maximum).
TRAM_INLINE float hmax(vf16 v) {
  const vf8 m8 = low8(v), h8 = high8(v);
  const vf8 s8 = m8 < h8 ? h8 : m8;
  float m = s8[0];
  for (int i = 1; i < 8; ++i) m = std::max(m, s8[i]);
  return m;
}

TRAM_INLINE vf16 splat16(float x) { return vf16{} + x; }

// ---- bfloat16 in vectors of 8: widening is exact (bf16 is a float32's top half); narrowing rounds
// to nearest even with NaN -> 0x7FC0, bit for bit what c10::BFloat16(float) does per element.

TRAM_INLINE vf8 widen_bf16x8(const c10::BFloat16* p) {
  return bitcast<vf8>(__builtin_convertvector(vload<vu16x8>(p), vu32x8) << 16);
}

// x rounded to bfloat16 and widened back: the float the stored bf16 stands for.
TRAM_INLINE vf8 round_bf16x8(vf8 x) {
  const vu32x8 u = bitcast<vu32x8>(x);
  const vu32x8 rounded = (u + (((u >> 16) & 1u) + 0x7FFFu)) & 0xFFFF0000u;
  return x != x ? bitcast<vf8>(vu32x8{} + 0x7FC00000u) : bitcast<vf8>(rounded);
}

// Stores x, which round_bf16x8 has already rounded (its low 16 bits are zero).
TRAM_INLINE void store_bf16x8(c10::BFloat16* p, vf8 rounded) {
  vstore(p, __builtin_convertvector(bitcast<vu32x8>(rounded) >> 16, vu16x8));
}

// 16 bfloat16 widened to float32 (exact).
TRAM_INLINE vf16 widen_bf16x16(const c10::BFloat16* p) {
#if TRAM_VF16_NATIVE
  return bitcast<vf16>(__builtin_convertvector(vload<vu16x16>(p), vu32x16) << 16);
#else
  return {widen_bf16x8(p), widen_bf16x8(p + 8)};
#endif
}

// exp(x) for x <= 0 (scores minus their max): Cephes expf's range reduction and polynomial (about
// 1 ulp); below -87 (and for the -inf padding) the result is 0.
TRAM_INLINE vf16 exp_nonpos(vf16 x) {
  const vf16 lo = splat16(-87.0f);
  const vf16 xc = select(x < lo, lo, x);
  const vf16 magic = splat16(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const vf16 t = xc * 1.44269504088896341f + magic;
  const vf16 fx = t - magic;  // round(xc / ln 2), in [-126, 0]
  const vi16 n = bitcast<vi16>(t) - bitcast<vi16>(magic);
  vf16 r = xc - fx * 0.693359375f;
  r = r + fx * 2.12194440e-4f;
  vf16 y = splat16(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3333451907e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const vf16 scaled = y * bitcast<vf16>((n + 127) << 23);
  return select(x < lo, vf16{}, scaled);
}

// tanh(x), within a few ulp (soft-capped attention scores): Cephes tanhf's odd polynomial below
// |x| = 0.625, above it (1 - e) / (1 + e) with e = exp(-2|x|) (e < 0.29 there: no cancellation).
TRAM_INLINE vf16 tanh16(vf16 x) {
  const vf16 zero{};
  const vf16 a = select(x < zero, -x, x);
  const vf16 e = exp_nonpos(-2.f * a);
  const vf16 large = (1.f - e) / (1.f + e);
  const vf16 s = x * x;
  vf16 p = splat16(-5.70498872745e-3f);
  p = p * s + 2.06390887954e-2f;
  p = p * s - 5.37397155531e-2f;
  p = p * s + 1.33314422036e-1f;
  p = p * s - 3.33332819422e-1f;
  const vf16 small = p * s * x + x;
  return select(a < splat16(0.625f), small, select(x < zero, -large, large));
}

}  // namespace tram::simd
