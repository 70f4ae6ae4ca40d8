// gguf_int8.cpp's weight side: one chunk (64 k) of one row of a GGUF weight as unsigned integer quants
// u (one byte per weight, in k order), lane scales s and lane offsets m (16 lanes of 4 k), such that
// the weight is s * (u - kZero), or s * u + m for the types with a minimum.
//
// Two decoders per type, which must give the same bytes and floats: a portable one (GCC vector
// extensions, which -march lowers to AVX2 or AVX-512) and, with AVX-512 VBMI (Ice Lake and later,
// Zen 4), one that gathers a chunk's bytes from a single load with vpermb. The portable decoders spent
// ~20 instructions per chunk assembling 16-byte pieces, more than the dot products themselves.
// The block layouts are listed in gguf_linear.cpp.
#pragma once

#include "gguf_common.h"
#include "simd.h"

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

namespace tram::gguf_int8 {

using namespace tram::simd;
using namespace tram::gguf;

typedef uint8_t vu8x16 __attribute__((vector_size(16)));
typedef uint8_t vu8x32 __attribute__((vector_size(32)));
typedef uint16_t vu16x16_ __attribute__((vector_size(32)));
#if TRAM_VF16_NATIVE
typedef uint8_t vu8x64 __attribute__((vector_size(64)));
#else
using vu8x64 = Pair<vu8x32>;  // in two registers (simd_pair.h)
#endif

#if defined(__AVX512VBMI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define TRAM_GGUF_VBMI 1
#endif

TRAM_INLINE vu8x64 concat(vu8x32 lo, vu8x32 hi) {
#if !TRAM_VF16_NATIVE
  return {lo, hi};
#else
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41,
                                 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62,
                                 63);
#endif
}

// (v >> shift) & mask in every byte, with 16-bit shifts (x86 has no byte shifts; the mask drops
// the bits that cross from the neighbouring byte).
TRAM_INLINE vu8x32 shr_bits(vu8x32 v, int shift, uint8_t mask) {
  const vu16x16_ w = bitcast<vu16x16_>(v) >> shift;
  return bitcast<vu8x32>(vu16x16_(w & static_cast<uint16_t>(mask * 0x0101)));
}

// 16 bytes of nibbles -> 32 quants: low nibbles first, then high (the legacy types' order).
TRAM_INLINE vu8x32 nibbles16(const uint8_t* p) {
  vu8x16 b;
  std::memcpy(&b, p, 16);
  const vu8x32 both = __builtin_shufflevector(b, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1,
                                              2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const vu8x32 low = both & 15;
  const vu8x32 high = shr_bits(both, 4, 15);
  return __builtin_shufflevector(low, high, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 48, 49, 50, 51,
                                 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63);
}

// Bit j of the little-endian uint32 at p as 0x10 in byte j (Q5_0 / Q5_1's fifth bit).
TRAM_INLINE vu8x32 high_bits32(const uint8_t* p) {
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  typedef uint32_t vu32x8_ __attribute__((vector_size(32)));
  const vu8x32 q = bitcast<vu8x32>(vu32x8_{} + qh);
  const vu8x32 spread = __builtin_shufflevector(q, q, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2,
                                                2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  constexpr vu8x32 bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
                          1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  return vu8x32((spread & bit) == bit) & 0x10;
}

// Lanes 0..7 a, 8..15 b.
TRAM_INLINE vf16 halves(float a, float b) { return join8(vf8{} + a, vf8{} + b); }

struct Chunk {
  vu8x64 u;
  vf16 s, m;
};

// ---- the 32-weight types: a chunk is two blocks ---------------------------------------------------
// kD, kM: byte offsets of d and m (-1: none); kQh: of the 32 fifth bits (-1: none); kQs: of the quants
// (int8 for Q8_0, else 16 bytes of nibbles). chunk() takes the blocks anywhere (the second may be a
// block of zeros, for a row of an odd number of blocks); pair() two adjacent ones.

template <int64_t kType_, int64_t kBytes_, int64_t kZero_, int64_t kM, int64_t kQh, int64_t kQs>
struct Legacy {
  static constexpr int64_t kType = kType_, kBlock = 32, kBytes = kBytes_, kZero = kZero_;
  static constexpr bool kOffset = kM >= 0, kSigned = kQs == 2 && kBytes == 34;

  TRAM_INLINE static vu8x32 quants(const uint8_t* b) {
    if constexpr (kSigned) {
      return vload<vu8x32>(b + kQs);
    } else if constexpr (kQh >= 0) {
      return nibbles16(b + kQs) | high_bits32(b + kQh);
    } else {
      return nibbles16(b + kQs);
    }
  }

  TRAM_INLINE static void chunk(const uint8_t* b0, const uint8_t* b1, Chunk& c) {
    c.u = concat(quants(b0), quants(b1));
    c.s = halves(half_at(b0), half_at(b1));
    if constexpr (kOffset) c.m = halves(half_at(b0 + kM), half_at(b1 + kM));
  }

#if defined(TRAM_GGUF_VBMI)
  // Both blocks from one load (plus Q8_0's last 4 bytes, a masked load that cannot fault).
  TRAM_INLINE static void pair(const uint8_t* b0, Chunk& c) {
    alignas(64) static constexpr auto idx = [] {
      constexpr int64_t kMOff = kM < 0 ? 0 : kM;
      struct { uint8_t q[64]; uint16_t d[32], m[32]; uint8_t h[64]; } t{};
      for (int i = 0; i < 64; ++i) {
        const int blk = i / 32, j = i % 32;
        t.q[i] = static_cast<uint8_t>(kSigned ? (blk * kBytes + kQs + j) : (blk * kBytes + kQs + j % 16));
        t.h[i] = static_cast<uint8_t>(blk * kBytes + (kQh < 0 ? 0 : kQh) + j / 8);
      }
      for (int i = 0; i < 32; ++i) {
        t.d[i] = static_cast<uint16_t>((i < 8 ? 0 : i < 16 ? kBytes : 0) / 2);
        t.m[i] = static_cast<uint16_t>((i < 8 ? kMOff : i < 16 ? kBytes + kMOff : 0) / 2);
      }
      return t;
    }();
    const __m512i q_idx = _mm512_load_si512(idx.q);
    __m512i u;
    __m512i a;
    if constexpr (kSigned) {  // 68 bytes: 64, then 4
      a = _mm512_loadu_si512(b0);
      u = _mm512_permutex2var_epi8(a, q_idx, _mm512_maskz_loadu_epi8(0xF, b0 + 64));
    } else {
      a = _mm512_maskz_loadu_epi8((uint64_t{1} << (2 * kBytes)) - 1, b0);
      // quarters 1 and 3 take the high nibbles: 16-bit shifts by 0, 4, 0, 4
      const __m512i shifts = _mm512_set_epi64(0x0004000400040004, 0x0004000400040004, 0, 0, 0x0004000400040004,
                                              0x0004000400040004, 0, 0);
      u = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi8(q_idx, a), shifts), _mm512_set1_epi8(15));
      if constexpr (kQh >= 0) {
        const __m512i bits = _mm512_set1_epi64(static_cast<int64_t>(0x8040201008040201ull));
        const __mmask64 k = _mm512_test_epi8_mask(_mm512_permutexvar_epi8(_mm512_load_si512(idx.h), a), bits);
        u = _mm512_mask_add_epi8(u, k, u, _mm512_set1_epi8(16));
      }
    }
    c.u = bitcast<vu8x64>(u);
    const __m512i halfs = _mm512_permutexvar_epi16(_mm512_load_si512(idx.d), a);
    c.s = bitcast<vf16>(_mm512_cvtph_ps(_mm512_castsi512_si256(halfs)));
    if constexpr (kOffset) {
      const __m512i mh = _mm512_permutexvar_epi16(_mm512_load_si512(idx.m), a);
      c.m = bitcast<vf16>(_mm512_cvtph_ps(_mm512_castsi512_si256(mh)));
    }
  }
#else
  TRAM_INLINE static void pair(const uint8_t* b0, Chunk& c) { chunk(b0, b0 + kBytes, c); }
#endif
};

using Q8_0 = Legacy<kQ8_0, 34, 128, -1, -1, 2>;
using Q4_0 = Legacy<kQ4_0, 18, 8, -1, -1, 2>;
using Q4_1 = Legacy<kQ4_1, 20, 0, 2, -1, 4>;
using Q5_0 = Legacy<kQ5_0, 22, 16, -1, 2, 6>;
using Q5_1 = Legacy<kQ5_1, 24, 0, 2, 4, 8>;

// ---- the 256-weight K-quants: a block is four chunks ------------------------------------------------

// Q4_K / Q5_K: the 8 sub-blocks' d * scale and -(dmin * min), each product rounded once as gguf's.
TRAM_INLINE void k4_scales(const uint8_t* b, vf16& ds, vf16& dm) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* s = b + 4;
  ds = vf16{}, dm = vf16{};
  for (int j = 0; j < 4; ++j) {
    ds[j] = d * static_cast<float>(s[j] & 63);
    dm[j] = -(dmin * static_cast<float>(s[j + 4] & 63));
    ds[j + 4] = d * static_cast<float>((s[j + 8] & 15) | ((s[j] >> 6) << 4));
    dm[j + 4] = -(dmin * static_cast<float>((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4)));
  }
}

// Lanes 0..7 v[2c], 8..15 v[2c + 1].
TRAM_INLINE vf16 pair_of(vf16 v, int64_t c) {
#if defined(__AVX512F__)
  const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(2 * c)),
                                       _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
  return bitcast<vf16>(_mm512_permutexvar_ps(idx, bitcast<__m512>(v)));
#else
  return halves(v[2 * c], v[2 * c + 1]);
#endif
}

#if defined(TRAM_GGUF_VBMI)
// The 32 bytes at p in both halves; 16-bit shifts by `lo` in the first half, `hi` in the second.
TRAM_INLINE __m512i both_halves_shifted(const uint8_t* p, int lo, int hi) {
  const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i shifts = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(lo)),
                                            _mm256_set1_epi16(static_cast<int16_t>(hi)), 1);
  return _mm512_srlv_epi16(v, shifts);
}
#endif

// Chunk c: sub-blocks 2c (low nibbles of qs's 32 bytes at 32c) and 2c + 1 (high nibbles); Q5_K's
// fifth bits: bit j of qh's byte l for sub-block j's weight l.
template <bool kFifthBit>
struct K4 {
  static constexpr int64_t kType = kFifthBit ? kQ5_K : kQ4_K, kBlock = 256, kBytes = kFifthBit ? 176 : 144, kZero = 0;
  static constexpr bool kOffset = true, kSigned = false;
  vf16 ds, dm;
  const uint8_t *qh, *qs;
  TRAM_INLINE void load(const uint8_t* b) {
    k4_scales(b, ds, dm);
    qh = b + 16, qs = b + (kFifthBit ? 48 : 16);
  }
  TRAM_INLINE void chunk(int64_t c, Chunk& out) const {
#if defined(TRAM_GGUF_VBMI)
    __m512i u = _mm512_and_si512(both_halves_shifted(qs + 32 * c, 0, 4), _mm512_set1_epi8(15));
    if constexpr (kFifthBit) {
      const __m512i h = both_halves_shifted(qh, static_cast<int>(2 * c), static_cast<int>(2 * c + 1));
      u = _mm512_or_si512(u, _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(1)), 4));
    }
    out.u = bitcast<vu8x64>(u);
#else
    const vu8x32 v = vload<vu8x32>(qs + 32 * c);
    vu8x32 lo = v & 15, hi = shr_bits(v, 4, 15);
    if constexpr (kFifthBit) {
      const vu8x32 h = vload<vu8x32>(qh);
      lo |= shr_bits(h, static_cast<int>(2 * c), 1) << 4;
      hi |= shr_bits(h, static_cast<int>(2 * c + 1), 1) << 4;
    }
    out.u = concat(lo, hi);
#endif
    out.s = pair_of(ds, c);
    out.m = pair_of(dm, c);
  }
};

using Q4_K = K4<false>;
using Q5_K = K4<true>;

// Q6_K: chunk c = 2h + j covers k 128h + 64j ..: low 4 bits from the 64 bytes at 64h (nibble j), bits
// 4-5 from the 32 bytes at 128 + 32h (shift 4j for its first 32 weights, 4j + 2 for the next).
// One scale per 16 k: lanes 4s .. 4s + 3 of the chunk share scale 4c + s.
struct Q6_K {
  static constexpr int64_t kType = kQ6_K, kBlock = 256, kBytes = 210, kZero = 32;
  static constexpr bool kOffset = false, kSigned = false;
  vf16 ds;  // d * scale of each 16 k (exact: 11 bits times 8)
  const uint8_t *ql, *qh;
  TRAM_INLINE void load(const uint8_t* b) {
    const float d = half_at(b + 208);
    for (int i = 0; i < 16; ++i) ds[i] = d * static_cast<float>(static_cast<int8_t>(b[192 + i]));
    ql = b, qh = b + 128;
  }
  TRAM_INLINE void chunk(int64_t c, Chunk& out) const {
    const int64_t h = c / 2, j = c % 2;
#if defined(TRAM_GGUF_VBMI)
    const __m512i l = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(ql + 64 * h), static_cast<unsigned>(4 * j)),
                                       _mm512_set1_epi8(15));
    const __m512i hb = both_halves_shifted(qh + 32 * h, static_cast<int>(4 * j), static_cast<int>(4 * j + 2));
    out.u = bitcast<vu8x64>(_mm512_or_si512(l, _mm512_slli_epi16(_mm512_and_si512(hb, _mm512_set1_epi8(3)), 4)));
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(4 * c)),
                                         _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0));
    out.s = bitcast<vf16>(_mm512_permutexvar_ps(idx, bitcast<__m512>(ds)));
#else
    const int lo_shift = static_cast<int>(4 * j);
    const vu8x32 l0 = shr_bits(vload<vu8x32>(ql + 64 * h), lo_shift, 15);
    const vu8x32 l1 = shr_bits(vload<vu8x32>(ql + 64 * h + 32), lo_shift, 15);
    const vu8x32 hb = vload<vu8x32>(qh + 32 * h);
    const vu8x32 h0 = shr_bits(hb, static_cast<int>(4 * j), 3) << 4;
    const vu8x32 h1 = shr_bits(hb, static_cast<int>(4 * j + 2), 3) << 4;
    out.u = concat(l0 | h0, l1 | h1);
    const float s0 = ds[4 * c], s1 = ds[4 * c + 1], s2 = ds[4 * c + 2], s3 = ds[4 * c + 3];
    out.s = join8(vf8{s0, s0, s0, s0, s1, s1, s1, s1}, vf8{s2, s2, s2, s2, s3, s3, s3, s3});
#endif
  }
};

}  // namespace tram::gguf_int8
