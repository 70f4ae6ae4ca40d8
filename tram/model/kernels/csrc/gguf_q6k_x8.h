// Q6_K weights repacked at load eight rows at a time ("Q6_K x8"), times activations quantized per 256 k:
// gguf_q4k_x8.h's idea for the 6-bit K-quant (LM heads, some down and v projections of Q4_K_M files).
//
// The six bits stay six: a row's four bytes of low nibbles and of high bits interleaved with the seven
// other rows', as the file splits them, so that three loads give 8 rows x 16 k. A sub-block (16 k) is
// four steps of 4 k; |u * q| <= 63 * 127, so two steps of pairs add up in 16 bits before the sub-scale
// multiplies them. The zero point (u - 32) enters as -32 * sc times the activations' sums per 16 k.
//
// Numerics, per row of x and of W and per block b:
//   I = sum_s sc_s * (sum_{k in s} u_k * q_k - 32 * bs_s)   (exact), then acc = fma(float(I), d_w * d_x, acc)
#pragma once

#include "gguf_q4k_x8.h"

namespace tram::x8 {

struct Q6K {
  static constexpr int64_t kType = 1014;  // Tram's own type id (not a ggml type)
  static constexpr int64_t kBlock = tram::q8k::kBlock;  // k per block, and per activation scale
  using Activations = tram::q8k::QuantizedRows;
  static constexpr int64_t kBlockBytes = 1680;  // one block (256 k) of a group of 8 rows
  static constexpr int64_t kRowBytes = kBlockBytes / kRows;  // 210 bytes per row and block, the file's
  static constexpr int64_t kSrcBytes = 210;  // the file's Q6_K block: ql[128], qh[64], scales[16], d

  // One block of a group (half h = k / 128, step j = 0..7: k 128h + 4j .. + 3 and the three quarters
  // 32, 64, 96 above):
  //   ql  [2][8][2][8][4]  (h, j, a): row r's file bytes ql[64h + 32a + 4j .. + 3] at 32 * (16h + 2j + a) + 4r;
  //                        a = 0: low nibbles quarter 0, high quarter 2; a = 1: quarters 1 and 3
  //   qh  [2][8][8][4]     row r's qh[32h + 4j .. + 3] (bits 2q, 2q + 1: quarter q's top bits)
  //   sc  [16][8]          sub-block s: byte r holds row r's sub-scale (int8)
  //   d   [8]              fp16, as in the file
  static constexpr int64_t kQh = 1024, kSc = 1536, kD = 1664;

  // Row r's block of the file (src) into a group's packed block o.
  static void pack_row(const uint8_t* src, int64_t r, uint8_t* o) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t j = 0; j < 8; ++j) {
        for (int64_t a = 0; a < 2; ++a) std::memcpy(o + 32 * (16 * h + 2 * j + a) + 4 * r, src + 64 * h + 32 * a + 4 * j, 4);
        std::memcpy(o + kQh + 32 * (8 * h + j) + 4 * r, src + 128 + 32 * h + 4 * j, 4);
      }
    }
    for (int64_t s = 0; s < 16; ++s) o[kSc + 8 * s + r] = src[192 + s];
    std::memcpy(o + kD + 2 * r, src + 208, 2);
  }

  // The inverse: row r's block of the file (dst) from a group's packed block o.
  static void unpack_row(const uint8_t* o, int64_t r, uint8_t* dst) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t j = 0; j < 8; ++j) {
        for (int64_t a = 0; a < 2; ++a) std::memcpy(dst + 64 * h + 32 * a + 4 * j, o + 32 * (16 * h + 2 * j + a) + 4 * r, 4);
        std::memcpy(dst + 128 + 32 * h + 4 * j, o + kQh + 32 * (8 * h + j) + 4 * r, 4);
      }
    }
    for (int64_t s = 0; s < 16; ++s) dst[192 + s] = o[kSc + 8 * s + r];
    std::memcpy(dst + 208, o + kD + 2 * r, 2);
  }

#if defined(TRAM_X8_KERNELS)
  // The 8 bytes at p, each twice (16 bytes: a sub-scale per int16 pair of the rows' products).
  TRAM_INLINE static __m128i dup_bytes(const uint8_t* p) {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm_unpacklo_epi8(v, v);
  }

  // Quarter q's 6-bit values of step (h, j) for the 8 rows: (nibbles of ql a = q % 2, low for q < 2) | (qh's
  // bits 2q, 2q + 1) << 4. 16-bit shifts; the masks drop what crosses a byte.
  template <int Q>
  TRAM_INLINE static __m256i quarter(const uint8_t* o, int64_t h, int64_t j) {
    const __m256i low4 = _mm256_set1_epi8(0x0f), top2 = _mm256_set1_epi8(0x30);
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(o + 32 * (16 * h + 2 * j + Q % 2)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(o + kQh + 32 * (8 * h + j)));
    const __m256i nib = Q < 2 ? _mm256_and_si256(ql, low4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), low4);
    __m256i hi;
    if constexpr (Q == 0) hi = _mm256_slli_epi16(qh, 4);
    if constexpr (Q == 1) hi = _mm256_slli_epi16(qh, 2);
    if constexpr (Q == 2) hi = qh;
    if constexpr (Q == 3) hi = _mm256_srli_epi16(qh, 2);
    return _mm256_or_si256(nib, _mm256_and_si256(hi, top2));
  }

  // Quarter Q of half h, both sub-blocks (steps 0..3 and 4..7), for rows m0 .. of x, into isum.
  template <int Q, int64_t MB>
  TRAM_INLINE static void quarter_sums(const tram::q8k::Rows& x, int64_t m0, int64_t b, const uint8_t* o, int64_t h,
                                       __m256i (&isum)[MB]) {
#pragma GCC unroll 2
    for (int64_t half = 0; half < 2; ++half) {  // sub-block 8h + 2Q + half: steps 4 half .. 4 half + 3
      const uint8_t* sc_bytes = o + kSc + 8 * (8 * h + 2 * Q + half);
      const int64_t k0 = b * tram::q8k::kBlock + 128 * h + 32 * Q + 16 * half;
#if defined(TRAM_X8_VNNI)  // a sub-block's 16 products per row of W in int32, then its int32 sub-scale
      const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc_bytes)));
      __m256i s[MB];
      for (int64_t m = 0; m < MB; ++m) s[m] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int64_t jj = 0; jj < 4; ++jj) {
        const __m256i u = quarter<Q>(o, h, 4 * half + jj);
        for (int64_t m = 0; m < MB; ++m) s[m] = dot4(s[m], u, broadcast4(x.q_at(m0 + m) + k0 + 4 * jj));
      }
      for (int64_t m = 0; m < MB; ++m) isum[m] = _mm256_add_epi32(isum[m], _mm256_mullo_epi32(s[m], sc));
#else  // two steps' int16 pairs per row of W, then vpmaddwd by the sub-scale pairs
      const __m256i sc = _mm256_cvtepi8_epi16(dup_bytes(sc_bytes));
#pragma GCC unroll 2
      for (int64_t jj = 0; jj < 4; jj += 2) {
        const __m256i u0 = quarter<Q>(o, h, 4 * half + jj), u1 = quarter<Q>(o, h, 4 * half + jj + 1);
        for (int64_t m = 0; m < MB; ++m) {
          const int8_t* q = x.q_at(m0 + m) + k0 + 4 * jj;
          __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(u0, broadcast4(q)), _mm256_maddubs_epi16(u1, broadcast4(q + 4)));
          keep_in_register(s);
          isum[m] = _mm256_add_epi32(isum[m], _mm256_madd_epi16(s, sc));
          keep_in_register(isum[m]);  // else GCC sums the 32 products of a block as a tree, on the stack
        }
      }
#endif
    }
  }

  // Rows m0 .. m0 + MB - 1 of x times a group's `blocks` packed blocks: store(m, out) gets row m's 8 outputs.
  template <int64_t MB, typename Store>
  __attribute__((noinline)) static void group_rows(const tram::q8k::Rows& x, int64_t m0, const uint8_t* group,
                                                   int64_t blocks, const Store& store) {
    __m256 acc[MB];
    for (int64_t m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* o = group + b * kBlockBytes;
      tram::simd::prefetch_ahead(o, kBlockBytes);
      __m256i isum[MB];
      for (int64_t m = 0; m < MB; ++m) isum[m] = _mm256_setzero_si256();
#pragma GCC unroll 1
      for (int64_t h = 0; h < 2; ++h) {
        quarter_sums<0, MB>(x, m0, b, o, h, isum);
        quarter_sums<1, MB>(x, m0, b, o, h, isum);
        quarter_sums<2, MB>(x, m0, b, o, h, isum);
        quarter_sums<3, MB>(x, m0, b, o, h, isum);
      }
      // The zero point: -32 * (sc_2p, sc_2p+1) per row against the activations' (bs_2p, bs_2p+1).
      const __m256i minus32 = _mm256_set1_epi16(-32);
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(o + kD)));
      for (int64_t p = 0; p < 8; ++p) {
        const __m128i even = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(o + kSc + 16 * p));
        const __m128i odd = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(o + kSc + 16 * p + 8));
        const __m256i zp = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(even, odd)), minus32);
        for (int64_t m = 0; m < MB; ++m) {
          int32_t bs2;
          std::memcpy(&bs2, x.bs_at(m0 + m) + b * 16 + 2 * p, 4);
          isum[m] = _mm256_add_epi32(isum[m], _mm256_madd_epi16(zp, _mm256_set1_epi32(bs2)));
        }
      }
      for (int64_t m = 0; m < MB; ++m) {
        const __m256 dx = _mm256_set1_ps(x.d_at(m0 + m)[b]);
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[m]), _mm256_mul_ps(d, dx), acc[m]);
      }
    }
    store_rows<MB>(acc, m0, store);
  }
#endif
};

}  // namespace tram::x8
