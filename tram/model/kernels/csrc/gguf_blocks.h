// A GGUF block's weights widened to float32 in registers, for the float32-activation kernels
// (gguf_linear.cpp): each chunk of 32 weights is bit for bit what gguf's dequantize gives.
//
// Block layouts (w = the dequantized weight; d, dmin are fp16):
//   Q8_0  34 B / 32 k:   d, q[32] int8                         w = q * d
//   Q4_0  18 B / 32 k:   d, 16 bytes: k j low nibble, j+16 high w = (nibble - 8) * d
//   Q4_1  20 B / 32 k:   d, m, nibbles as Q4_0              w = nibble * d + m
//   Q5_0  22 B / 32 k:   d, qh (uint32: bit j is bit 4 of k j), nibbles as Q4_0
//                                                           w = (q - 16) * d
//   Q5_1  24 B / 32 k:   d, m, qh, nibbles as Q5_0          w = q * d + m
//   Q4_K  144 B / 256 k: d, dmin, 12 B of 6-bit (scale, min) for 8 sub-blocks of 32, 128 B of nibbles
//                        (32 bytes per pair of sub-blocks: low nibbles the first, high the second)
//                        w = (d * scale) * q - dmin * min
//   Q5_K  176 B / 256 k: as Q4_K, plus 32 B of high bits (bit j of byte l: sub-block j, lane l) before
//                        the nibbles
//   Q6_K  210 B / 256 k: 128 B low nibbles, 64 B high 2-bit pairs, 16 int8 scales (one per 16 k), d
//                        w = (d * scale) * (q - 32)
//
// A decoder's load(block) decodes the block's scales, chunk(c, w0, w1) widens its c-th 32 weights.
#pragma once

#include "gguf_common.h"
#include "simd.h"
#include "widen_int8.h"

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

namespace tram::gguf_float {

using namespace tram::simd;
using namespace tram::gguf;

constexpr int64_t kLanes = 16;  // floats per vector
constexpr int64_t kChunk = 32;  // k per decoded chunk: two vectors

// v, rounded to float32 now: without it GCC contracts `q * scale - min` into one FMA, which rounds
// once and makes the weight differ from gguf's dequantized value.
TRAM_INLINE vf16 rounded(vf16 v) {
#if TRAM_VF16_NATIVE
  asm("" : "+v"(v));
  return v;
#elif defined(__AVX__)  // a pair of ymm halves
  asm("" : "+x"(v.lo), "+x"(v.hi));
  return v;
#else
  asm("" : "+m"(v));
  return v;
#endif
}

// Bits `mask` of every byte of v after shifting it left by `shift` (right if negative). x86 has no
// byte shifts: shifting 16-bit lanes, with a mask that drops the bits crossing between bytes, takes
// two instructions where GCC's emulation of `vu8x16 >> n` and the masks after it take three or four.
TRAM_INLINE vu8x16 shifted_bits(vu8x16 v, int64_t shift, uint8_t mask) {
  const vu16x8 w = bitcast<vu16x8>(v);
  const vu16x8 moved = shift >= 0 ? vu16x8(w << shift) : vu16x8(w >> -shift);
  return bitcast<vu8x16>(vu16x8(moved & static_cast<uint16_t>(mask * 0x0101)));
}

#if defined(__AVX512F__)
// 4-bit types on AVX-512: the 16 values a block's nibbles stand for are computed once per block
// (exactly as each weight would be) and each nibble looks its weight up with one vpermps, in place
// of a convert, a multiply and a subtract per 16 weights.
constexpr vf16 kNibbles = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

TRAM_INLINE vf16 lookup(vu8x16 nibbles, vf16 table) {
  const __m512i idx = _mm512_cvtepu8_epi32(bitcast<__m128i>(nibbles));
  return bitcast<vf16>(_mm512_permutexvar_ps(idx, bitcast<__m512>(table)));
}
#endif

// ---- one block of one row: load() decodes its scales, chunk(c) widens its c-th 32 weights ----------

struct Q8_0 {
  static constexpr int64_t kType = kQ8_0, kBlock = 32, kBytes = 34;
  const uint8_t* q;
  float d;
  TRAM_INLINE void load(const uint8_t* b) { d = half_at(b), q = b + 2; }
  TRAM_INLINE void chunk(int64_t, vf16& w0, vf16& w1) const {
    w0 = to_float(vload<vi8x16>(q)) * d;
    w1 = to_float(vload<vi8x16>(q + kLanes)) * d;
  }
};

struct Q4_0 {
  static constexpr int64_t kType = kQ4_0, kBlock = 32, kBytes = 18;
  const uint8_t* q;
  float d;
  TRAM_INLINE void load(const uint8_t* b) { d = half_at(b), q = b + 2; }
  TRAM_INLINE void chunk(int64_t, vf16& w0, vf16& w1) const {
    const vu8x16 bytes = vload<vu8x16>(q);
#if defined(__AVX512F__)
    const vf16 table = (kNibbles - 8.0f) * d;
    w0 = lookup(bytes & 15, table);
    w1 = lookup(shifted_bits(bytes, -4, 15), table);
#else
    w0 = to_float(bitcast<vi8x16>(vu8x16((bytes & 15) - 8))) * d;  // 0..15 - 8 wraps to int8 -8..7
    w1 = to_float(bitcast<vi8x16>(vu8x16((bytes >> 4) - 8))) * d;
#endif
  }
};

// Q4_1 and Q5_1 need no rounded(): d * q is exact (11 significant bits times 4 or 5), so `q * d + m`
// rounds once whether or not GCC fuses it, as gguf's (d * q) + m does.
struct Q4_1 {
  static constexpr int64_t kType = kQ4_1, kBlock = 32, kBytes = 20;
  const uint8_t* q;
  float d, m;
  TRAM_INLINE void load(const uint8_t* b) { d = half_at(b), m = half_at(b + 2), q = b + 4; }
  TRAM_INLINE void chunk(int64_t, vf16& w0, vf16& w1) const {
    const vu8x16 bytes = vload<vu8x16>(q);
#if defined(__AVX512F__)
    const vf16 table = kNibbles * d + m;
    w0 = lookup(bytes & 15, table);
    w1 = lookup(shifted_bits(bytes, -4, 15), table);
#else
    w0 = to_float(vu8x16(bytes & 15)) * d + m;
    w1 = to_float(shifted_bits(bytes, -4, 15)) * d + m;
#endif
  }
};

TRAM_INLINE uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;  // little-endian, as the file (x86 and aarch64 both are)
}

// Q5_0 / Q5_1: bit j of the little-endian uint32 qh is bit 4 of weight j; the nibbles are Q4_0's.
// kOffset is what the type subtracts from q: 16 for Q5_0 (w = (q - 16) * d), 0 for Q5_1 (q * d + m).
template <int64_t kOffset>
TRAM_INLINE vf16 q5_weights(vf16 q_minus_offset, float d, float m) {
  if constexpr (kOffset == 0) {
    return q_minus_offset * d + m;
  } else {
    return q_minus_offset * d;  // no + 0.0f: it would turn gguf's -0 weights (q = 16, d < 0) into +0
  }
}

#if defined(__AVX512F__)
// The 5-bit quants look their weight up in a 32-entry table (two vectors) with one vpermt2ps, which
// reads only bits 0..4 of each index: bits 0..3 the nibble, bit 4 the weight's qh bit, rotated there
// from a broadcast of qh. The other bits may hold anything, which saves the masks. One widening of
// the 16 bytes serves both halves, and nothing here is a mask-register move: port 5 (the shuffles)
// is the bottleneck of this loop.
TRAM_INLINE void lookup32(const uint8_t* qs, const uint8_t* qh, vf16 low_table, vf16 high_table, vf16& w0,
                          vf16& w1) {
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m512i bits = _mm512_set1_epi32(static_cast<int32_t>(load_u32(qh)));
  // Lane j of w0 is weight j (qh bit j), of w1 weight 16 + j: rotate left by 4 - j, 4 - 16 - j mod 32.
  const __m512i rot0 = _mm512_setr_epi32(4, 3, 2, 1, 0, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21);
  const __m512i rot1 = _mm512_setr_epi32(20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5);
  const __m512i nibble = _mm512_set1_epi32(15);
  // 0xE4: bits of the first operand where the third is set, of the second elsewhere.
  const __m512i idx0 = _mm512_ternarylogic_epi32(bytes, _mm512_rolv_epi32(bits, rot0), nibble, 0xE4);
  const __m512i idx1 =
      _mm512_ternarylogic_epi32(_mm512_srli_epi32(bytes, 4), _mm512_rolv_epi32(bits, rot1), nibble, 0xE4);
  w0 = bitcast<vf16>(_mm512_permutex2var_ps(bitcast<__m512>(low_table), idx0, bitcast<__m512>(high_table)));
  w1 = bitcast<vf16>(_mm512_permutex2var_ps(bitcast<__m512>(low_table), idx1, bitcast<__m512>(high_table)));
}

template <int64_t kOffset>
TRAM_INLINE void q5_chunk(const uint8_t* qs, const uint8_t* qh, float d, float m, vf16& w0, vf16& w1) {
  const vf16 low_table = q5_weights<kOffset>(kNibbles - static_cast<float>(kOffset), d, m);
  const vf16 high_table = q5_weights<kOffset>(kNibbles + static_cast<float>(16 - kOffset), d, m);
  lookup32(qs, qh, low_table, high_table, w0, w1);
}
#else
typedef uint32_t vu32x4 __attribute__((vector_size(16)));

// qh's bits as bit 4 of one byte per weight: bytes 0..15 of `lo` for weights 0..15, of `hi` for
// 16..31. Each byte of qh is copied to eight lanes and each lane tests its own bit.
TRAM_INLINE void q5_high_bits(uint32_t qh, vu8x16& lo, vu8x16& hi) {
  const vu8x16 q = bitcast<vu8x16>(vu32x4{qh, 0, 0, 0});
  constexpr vu8x16 bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const vu8x16 l = __builtin_shufflevector(q, q, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const vu8x16 h = __builtin_shufflevector(q, q, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  lo = vu8x16((l & bit) == bit) & 16;
  hi = vu8x16((h & bit) == bit) & 16;
}

template <int64_t kOffset>
TRAM_INLINE void q5_chunk(const uint8_t* qs, const uint8_t* qh, float d, float m, vf16& w0, vf16& w1) {
  const vu8x16 bytes = vload<vu8x16>(qs);
  vu8x16 lo, hi;
  q5_high_bits(load_u32(qh), lo, hi);
  // q - kOffset is -16..31: exact as int8, and to_float's sign extension widens it.
  constexpr uint8_t offset = kOffset;
  const vi8x16 q0 = bitcast<vi8x16>(vu8x16(((bytes & 15) | lo) - offset));
  const vi8x16 q1 = bitcast<vi8x16>(vu8x16((shifted_bits(bytes, -4, 15) | hi) - offset));
  w0 = q5_weights<kOffset>(to_float(q0), d, m);
  w1 = q5_weights<kOffset>(to_float(q1), d, m);
}
#endif

struct Q5_0 {
  static constexpr int64_t kType = kQ5_0, kBlock = 32, kBytes = 22;
  const uint8_t *qh, *qs;
  float d;
  TRAM_INLINE void load(const uint8_t* b) { d = half_at(b), qh = b + 2, qs = b + 6; }
  TRAM_INLINE void chunk(int64_t, vf16& w0, vf16& w1) const { q5_chunk<16>(qs, qh, d, 0.0f, w0, w1); }
};

struct Q5_1 {
  static constexpr int64_t kType = kQ5_1, kBlock = 32, kBytes = 24;
  const uint8_t *qh, *qs;
  float d, m;
  TRAM_INLINE void load(const uint8_t* b) { d = half_at(b), m = half_at(b + 2), qh = b + 4, qs = b + 8; }
  TRAM_INLINE void chunk(int64_t, vf16& w0, vf16& w1) const { q5_chunk<0>(qs, qh, d, m, w0, w1); }
};

// Q4_K / Q5_K: (d * scale_j, dmin * min_j) of the 8 sub-blocks, from the 12 bytes of 6-bit values
// (llama.cpp's get_scale_min_k4). Both products are exact: 11-bit significands times 6 bits.
TRAM_INLINE void k4_scales(const uint8_t* b, float* ds, float* dm) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* s = b + 4;
  for (int j = 0; j < 4; ++j) {
    ds[j] = d * static_cast<float>(s[j] & 63);
    dm[j] = dmin * static_cast<float>(s[j + 4] & 63);
    ds[j + 4] = d * static_cast<float>((s[j + 8] & 15) | ((s[j] >> 6) << 4));
    dm[j + 4] = dmin * static_cast<float>((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
  }
}

// Sub-block c's nibbles, lanes 16 * half .. + 15: low nibbles for even c, high for odd.
TRAM_INLINE vu8x16 k4_nibbles(const uint8_t* qs, int64_t c, int64_t half) {
  const vu8x16 bytes = vload<vu8x16>(qs + (c / 2) * kChunk + half * kLanes);
  return shifted_bits(bytes, (c & 1) ? -4 : 0, 15);
}

struct Q4_K {
  static constexpr int64_t kType = kQ4_K, kBlock = 256, kBytes = 144;
  const uint8_t* qs;
  float ds[8], dm[8];
  TRAM_INLINE void load(const uint8_t* b) { k4_scales(b, ds, dm), qs = b + 16; }
  TRAM_INLINE void chunk(int64_t c, vf16& w0, vf16& w1) const {
#if defined(__AVX512F__)
    const vf16 table = rounded(kNibbles * ds[c]) - dm[c];
    w0 = lookup(k4_nibbles(qs, c, 0), table);
    w1 = lookup(k4_nibbles(qs, c, 1), table);
#else
    w0 = rounded(to_float(k4_nibbles(qs, c, 0)) * ds[c]) - dm[c];
    w1 = rounded(to_float(k4_nibbles(qs, c, 1)) * ds[c]) - dm[c];
#endif
  }
};

struct Q5_K {
  static constexpr int64_t kType = kQ5_K, kBlock = 256, kBytes = 176;
  const uint8_t *qh, *qs;
  float ds[8], dm[8];
  TRAM_INLINE void load(const uint8_t* b) { k4_scales(b, ds, dm), qh = b + 16, qs = b + 48; }
  TRAM_INLINE vf16 q(int64_t c, int64_t half) const {
    const vu8x16 high = shifted_bits(vload<vu8x16>(qh + half * kLanes), 4 - c, 16);  // bit c -> bit 4
    return to_float(vu8x16(k4_nibbles(qs, c, half) | high));
  }
  TRAM_INLINE void chunk(int64_t c, vf16& w0, vf16& w1) const {
    w0 = rounded(q(c, 0) * ds[c]) - dm[c];
    w1 = rounded(q(c, 1) * ds[c]) - dm[c];
  }
};

// Q6_K: chunk c = 4 * h + r (h: which 128 k) takes low nibbles (r < 2) or high ones (r >= 2) of the
// 32 bytes at 64 h + 32 (r & 1), and bits 2r, 2r + 1 of the 32 high-bit bytes at 32 h.
struct Q6_K {
  static constexpr int64_t kType = kQ6_K, kBlock = 256, kBytes = 210;
  const uint8_t *ql, *qh;
  float ds[16];  // d * scale of each 16 k (exact: 11 bits times 8)
  TRAM_INLINE void load(const uint8_t* b) {
    const float d = half_at(b + 208);
    for (int i = 0; i < 16; ++i) ds[i] = d * static_cast<float>(static_cast<int8_t>(b[192 + i]));
    ql = b, qh = b + 128;
  }
  TRAM_INLINE vf16 q(int64_t c, int64_t half) const {
    const int64_t h = c / 4, r = c % 4;
    const vu8x16 low = vload<vu8x16>(ql + 64 * h + 32 * (r & 1) + half * kLanes);
    const vu8x16 nib = shifted_bits(low, r >= 2 ? -4 : 0, 15);
    const vu8x16 high = shifted_bits(vload<vu8x16>(qh + 32 * h + half * kLanes), 4 - 2 * r, 48);  // -> bits 4, 5
    return to_float(bitcast<vi8x16>(vu8x16((nib | high) - 32)));  // 0..63 - 32 as int8
  }
  TRAM_INLINE void chunk(int64_t c, vf16& w0, vf16& w1) const {
    w0 = q(c, 0) * ds[2 * c];
    w1 = q(c, 1) * ds[2 * c + 1];
  }
};

// Calls fn(F{}) with the block decoder of a ggml type.
template <typename Fn>
void with_format(int64_t type, Fn&& fn) {
  with_one_of<Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K>(type, "gguf", fn);
}

template <typename F>
int64_t row_bytes_of(int64_t K) {
  return K / F::kBlock * F::kBytes;
}

// ---- a whole row dequantized (gguf_dequantize_, and the tiles the many-rows GEMMs decode) ----------

TRAM_INLINE void store16(vf16 v, float* out) { vstore(out, v); }

TRAM_INLINE void store16(vf16 v, c10::BFloat16* out) {
  store_bf16x8(out, round_bf16x8(low8(v)));
  store_bf16x8(out + 8, round_bf16x8(high8(v)));
}

// One row of W ([K / block] blocks) into out (float32 or bfloat16): the weights the tiles compute with.
template <typename F, typename T>
void dequantize_row(const uint8_t* row, int64_t K, T* out) {
  for (int64_t b = 0; b < K / F::kBlock; ++b) {
    F blk;
    blk.load(row + b * F::kBytes);
#pragma GCC unroll 8
    for (int64_t c = 0; c < F::kBlock / kChunk; ++c) {
      vf16 w0, w1;
      blk.chunk(c, w0, w1);
      store16(w0, out + b * F::kBlock + c * kChunk);
      store16(w1, out + b * F::kBlock + c * kChunk + kLanes);
    }
  }
}

}  // namespace tram::gguf_float
