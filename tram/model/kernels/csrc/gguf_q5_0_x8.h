// Q5_0 and Q8_0 weights repacked at load eight rows at a time ("Q5_0 x8", "Q8_0 x8"), times activations
// quantized per 32 k (gguf_x32.h), on AVX2 and AVX-512 alike.
//
// Why: llama.cpp's quantizer stores most of a narrow model's weights as Q5_0 (a row of 576 or 640 k is
// no whole number of K-quant blocks), and gguf_int8.cpp's row kernel spends ~15 512-bit instructions on
// each 64 of them (permutes assembling the fifth bits and the two blocks' scales, a float step per 4 k),
// so a decode step's Q5_0 linears ran at ~20 GB/s even from cache. Here the lanes of a vector are eight
// rows of W: one 32-byte load gives 8 rows x 4 k of nibbles, the fifth bits come from one word per row
// with a shift and a mask, vpdpbusd (or vpmaddubsw) sums 4 k per row, and the floats appear once per 32
// k and eight rows. No output needs a horizontal sum.
//
// Numerics, per row of x and of W and per block b of 32 k (u = nibble | fifth bit << 4, 0..31):
//   I = sum(u * q) - 16 * sum(q)   exact int32
//   acc = fma(float(I), d_w * d_x, acc)   from 0, b in order; y = acc + bias
// The same for every number of rows of x, rows of W, threads and instruction set (llama.cpp's Q5_0 by
// Q8_0 product, one FMA chain per output): a row's result does not depend on the call it shares. It is
// not the file layout's kernel (gguf_int8.cpp, a float step per 4 k): a weight is either repacked or
// not for its lifetime.
#pragma once

#include "gguf_q4k_x8.h"
#include "gguf_x32.h"

#include <cstdint>
#include <cstring>

namespace tram::x8 {

struct Q50 {
  static constexpr int64_t kType = 1006;  // Tram's own type id (not a ggml type)
  static constexpr int64_t kBlock = 32;   // k per block, and per activation scale
  static constexpr int64_t kBlockBytes = 176;  // one block of a group of 8 rows
  static constexpr int64_t kRowBytes = kBlockBytes / kRows;  // 22: the file's size
  static constexpr int64_t kSrcBytes = 22;  // the file's Q5_0 block: d (fp16), qh (32 bits), qs (16 bytes)
  using Activations = tram::x32::QuantizedRows;

  // One block of a group:
  //   qs   [4][8][4]  step j: row r's 4 bytes at 32 j + 4 r, the file's qs[4j .. 4j + 3] (low nibbles k 4j + i,
  //                   high ones k 16 + 4j + i)
  //   bits [8][4]     row r's fifth bits as one word: bit 8i + j is k 4j + i's, bit 8i + 4 + j is k 16 + 4j + i's,
  //                   so that step j's are one shift away from bit 4 of each byte
  //   d    [8]        fp16, as in the file
  static constexpr int64_t kBits = 128, kD = 160;

  static uint32_t arrange_bits(uint32_t qh) {
    uint32_t w = 0;
    for (uint32_t i = 0; i < 4; ++i) {
      for (uint32_t j = 0; j < 4; ++j) {
        w |= ((qh >> (4 * j + i)) & 1u) << (8 * i + j);
        w |= ((qh >> (16 + 4 * j + i)) & 1u) << (8 * i + 4 + j);
      }
    }
    return w;
  }

  static uint32_t file_bits(uint32_t w) {
    uint32_t qh = 0;
    for (uint32_t i = 0; i < 4; ++i) {
      for (uint32_t j = 0; j < 4; ++j) {
        qh |= ((w >> (8 * i + j)) & 1u) << (4 * j + i);
        qh |= ((w >> (8 * i + 4 + j)) & 1u) << (16 + 4 * j + i);
      }
    }
    return qh;
  }

  // Row r's block of the file (src) into a group's packed block o.
  static void pack_row(const uint8_t* src, int64_t r, uint8_t* o) {
    for (int64_t j = 0; j < 4; ++j) std::memcpy(o + 32 * j + 4 * r, src + 6 + 4 * j, 4);
    uint32_t qh;
    std::memcpy(&qh, src + 2, 4);
    const uint32_t w = arrange_bits(qh);
    std::memcpy(o + kBits + 4 * r, &w, 4);
    std::memcpy(o + kD + 2 * r, src, 2);
  }

  // The inverse: row r's block of the file (dst) from a group's packed block o.
  static void unpack_row(const uint8_t* o, int64_t r, uint8_t* dst) {
    for (int64_t j = 0; j < 4; ++j) std::memcpy(dst + 6 + 4 * j, o + 32 * j + 4 * r, 4);
    uint32_t w;
    std::memcpy(&w, o + kBits + 4 * r, 4);
    const uint32_t qh = file_bits(w);
    std::memcpy(dst + 2, &qh, 4);
    std::memcpy(dst, o + kD + 2 * r, 2);
  }

#if defined(TRAM_X8_KERNELS)
  // Step j's unsigned quants u of 8 rows x 4 k: the low nibbles (k 4j + i) in lo, the high ones in hi.
  template <int J>
  TRAM_INLINE static void step_quants(const uint8_t* o, __m256i bits, __m256i& lo, __m256i& hi) {
    const __m256i low4 = _mm256_set1_epi8(0x0f), fifth = _mm256_set1_epi8(0x10);
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(o + 32 * J));
    lo = _mm256_or_si256(_mm256_and_si256(w, low4), _mm256_and_si256(_mm256_slli_epi32(bits, 4 - J), fifth));
    hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), low4),
                         _mm256_and_si256(_mm256_srli_epi32(bits, J), fifth));
  }

  // sa[m], sb[m] += step J's sums of u * q for rows m0 .. m0 + MB - 1 of x (int32 with VNNI, else int16
  // pairs: four steps of pairs |u * q| <= 31 * 127 stay under 2^15).
  template <int J, int64_t MB>
  TRAM_INLINE static void step(const tram::x32::Rows& x, int64_t m0, int64_t b, const uint8_t* o, __m256i bits,
                               __m256i (&sa)[MB], __m256i (&sb)[MB]) {
    __m256i lo, hi;
    step_quants<J>(o, bits, lo, hi);
    for (int64_t m = 0; m < MB; ++m) {
      const int8_t* xq = x.q_at(m0 + m) + b * kBlock + 4 * J;
#if defined(TRAM_X8_VNNI)
      sa[m] = dot4(sa[m], lo, broadcast4(xq));
      sb[m] = dot4(sb[m], hi, broadcast4(xq + 16));
#else
      sa[m] = _mm256_add_epi16(sa[m], _mm256_maddubs_epi16(lo, broadcast4(xq)));
      sb[m] = _mm256_add_epi16(sb[m], _mm256_maddubs_epi16(hi, broadcast4(xq + 16)));
#endif
      keep_in_register(sa[m]), keep_in_register(sb[m]);
    }
  }

  // i[m] = I of block b for rows m0 .. m0 + MB - 1 of x: sum(u * q) - 16 * sum(q), exact.
  template <int64_t MB>
  TRAM_INLINE static void block_sums(const tram::x32::Rows& x, int64_t m0, int64_t b, const uint8_t* o,
                                     __m256i (&i)[MB]) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(o + kBits));
    __m256i sa[MB], sb[MB];
    for (int64_t m = 0; m < MB; ++m) sa[m] = sb[m] = _mm256_setzero_si256();
    step<0, MB>(x, m0, b, o, bits, sa, sb);
    step<1, MB>(x, m0, b, o, bits, sa, sb);
    step<2, MB>(x, m0, b, o, bits, sa, sb);
    step<3, MB>(x, m0, b, o, bits, sa, sb);
    for (int64_t m = 0; m < MB; ++m) {
#if defined(TRAM_X8_VNNI)
      i[m] = _mm256_add_epi32(sa[m], sb[m]);
#else
      const __m256i one = _mm256_set1_epi16(1);
      i[m] = _mm256_add_epi32(_mm256_madd_epi16(sa[m], one), _mm256_madd_epi16(sb[m], one));
#endif
      i[m] = _mm256_sub_epi32(i[m], _mm256_set1_epi32(16 * x.bs_at(m0 + m)[b]));
    }
  }

  template <int64_t MB, typename Store>
  static void group_rows(const tram::x32::Rows& x, int64_t m0, const uint8_t* group, int64_t blocks,
                         const Store& store);
#endif
};

// Q8_0 x8: the same for Q8_0 (34 bytes a row and block: d, then 32 int8 quants). Step j (0..7) is 8 rows
// x k 4j .. 4j + 3. Per row of x and of W and per block: I = sum(w * q), exact int32 (with VNNI as
// sum((w + 128) * q) - 128 * sum(q); without it vpmaddubsw takes |w| and q with w's sign, whose pairs
// stay under 2^15 one step at a time), then acc = fma(float(I), d_w * d_x, acc) as Q5_0 x8.
struct Q80 {
  static constexpr int64_t kType = 1008;  // Tram's own type id (not a ggml type)
  static constexpr int64_t kBlock = 32;
  static constexpr int64_t kBlockBytes = 272;  // qs [8][8][4], then d [8] fp16
  static constexpr int64_t kRowBytes = kBlockBytes / kRows;  // 34: the file's size
  static constexpr int64_t kSrcBytes = 34;
  static constexpr int64_t kD = 256;
  using Activations = tram::x32::QuantizedRows;

  static void pack_row(const uint8_t* src, int64_t r, uint8_t* o) {
    for (int64_t j = 0; j < 8; ++j) std::memcpy(o + 32 * j + 4 * r, src + 2 + 4 * j, 4);
    std::memcpy(o + kD + 2 * r, src, 2);
  }

  static void unpack_row(const uint8_t* o, int64_t r, uint8_t* dst) {
    for (int64_t j = 0; j < 8; ++j) std::memcpy(dst + 2 + 4 * j, o + 32 * j + 4 * r, 4);
    std::memcpy(dst, o + kD + 2 * r, 2);
  }

#if defined(TRAM_X8_KERNELS)
  // i[m] = I of block b for rows m0 .. m0 + MB - 1 of x: sum(w * q), exact.
  template <int64_t MB>
  TRAM_INLINE static void block_sums(const tram::x32::Rows& x, int64_t m0, int64_t b, const uint8_t* o,
                                     __m256i (&i)[MB]) {
    for (int64_t m = 0; m < MB; ++m) i[m] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int64_t j = 0; j < 8; ++j) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(o + 32 * j));
#if defined(TRAM_X8_VNNI)
      const __m256i u = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
#else
      const __m256i u = _mm256_sign_epi8(w, w);
#endif
      for (int64_t m = 0; m < MB; ++m) {
        const __m256i q = broadcast4(x.q_at(m0 + m) + b * kBlock + 4 * j);
#if defined(TRAM_X8_VNNI)
        i[m] = dot4(i[m], u, q);
#else
        i[m] = _mm256_add_epi32(i[m], _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(q, w)),
                                                        _mm256_set1_epi16(1)));
#endif
        keep_in_register(i[m]);
      }
    }
#if defined(TRAM_X8_VNNI)
    for (int64_t m = 0; m < MB; ++m) i[m] = _mm256_sub_epi32(i[m], _mm256_set1_epi32(128 * x.bs_at(m0 + m)[b]));
#endif
  }

  template <int64_t MB, typename Store>
  static void group_rows(const tram::x32::Rows& x, int64_t m0, const uint8_t* group, int64_t blocks,
                         const Store& store);
#endif
};

#if defined(TRAM_X8_KERNELS)
// Rows m0 .. m0 + MB - 1 of x times a group's `blocks` packed blocks of a 32-k layout L: store(m, out) gets
// row m's 8 outputs. Per block, L::block_sums gives the exact integers and the floats take one step.
template <typename L, int64_t MB, typename Store>
__attribute__((noinline)) void group_rows32(const tram::x32::Rows& x, int64_t m0, const uint8_t* group, int64_t blocks,
                                            const Store& store) {
  __m256 acc[MB];
  for (int64_t m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* o = group + b * L::kBlockBytes;
    tram::simd::prefetch_ahead(o, L::kBlockBytes);
    __m256i i[MB];
    L::template block_sums<MB>(x, m0, b, o, i);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(o + L::kD)));
    for (int64_t m = 0; m < MB; ++m) {
      const __m256 dx = _mm256_set1_ps(x.d_at(m0 + m)[b]);
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i[m]), _mm256_mul_ps(d, dx), acc[m]);
    }
  }
  store_rows<MB>(acc, m0, store);
}

template <int64_t MB, typename Store>
void Q50::group_rows(const tram::x32::Rows& x, int64_t m0, const uint8_t* group, int64_t blocks, const Store& store) {
  group_rows32<Q50, MB>(x, m0, group, blocks, store);
}

template <int64_t MB, typename Store>
void Q80::group_rows(const tram::x32::Rows& x, int64_t m0, const uint8_t* group, int64_t blocks, const Store& store) {
  group_rows32<Q80, MB>(x, m0, group, blocks, store);
}
#endif

}  // namespace tram::x8
