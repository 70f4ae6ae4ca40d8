// Q4_K weights repacked at load eight rows at a time ("Q4_K x8"), times activations quantized per 256 k
// (gguf_q8k.h's Rows), on AVX2: one kernel for every number of rows of x.
//
// Why: on CPUs without VNNI the file's layout left two bad choices. gguf_q8k.h's row kernel decodes each
// block's scales per row and reduces each output across lanes (compute-bound at 12-17 GB/s for one row
// of x), and gguf_q8k_gemm.h repacks W on every call, which pays only from 16 rows of x. Here W is
// repacked once: the eight rows' nibbles interleaved four bytes at a time, so that one load feeds 8 rows
// x 8 k to two vpmaddubsw, with the sub-scales and minimums as bytes laid out for vpmaddwd. The lanes of
// a vector are the eight rows of W, so no output needs a horizontal sum, and a sub-block's eight steps
// add up in 16 bits before its sub-scale multiplies them (|u * q| <= 15 * 127: eight steps of pairs stay
// under 2^15).
//
// Numerics, per row of x and of W and per block b (exact integers, then two float steps):
//   I = sum_j sc_j * sum_{k in sub-block j} u_k * q_k,   Imin = sum_j m_j * bsum_j
//   acc = fma(float(I), d_w * d_x, acc);  accm = fma(-float(Imin), dmin_w * d_x, accm);  y = acc + accm
// The same for every number of rows of x, rows of W and threads: a row's result does not depend on the
// call it shares. They are gguf_q8k_gemm.h's AVX-512 steps, so that many rows of x can take that GEMM
// (gguf_x8_gemm.h); not gguf_q8k.h's AVX2 ones: a weight is either repacked or not for its lifetime.
#pragma once

#include "gguf_q8k.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

namespace tram::x8 {

constexpr int64_t kRows = 8;  // rows of W per group

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define TRAM_X8_KERNELS 1
// GCC reassociates the 16-bit running sums into trees and spills them; one register each is what the
// loops need.
TRAM_INLINE void keep_in_register(__m256i& v) { __asm__("" : "+x"(v)); }

// With VNNI (AVX-512's on 256-bit vectors, or AVX-VNNI) one instruction sums a lane's four products
// u * q into int32 exactly, where AVX2 needs vpmaddubsw, a 16-bit add and, per sub-block, vpmaddwd: the
// same integers in half the instructions, so the same outputs bit for bit.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define TRAM_X8_VNNI 1
TRAM_INLINE __m256i dot4(__m256i acc, __m256i u, __m256i q) { return _mm256_dpbusd_epi32(acc, u, q); }
#elif defined(__AVXVNNI__)
#define TRAM_X8_VNNI 1
TRAM_INLINE __m256i dot4(__m256i acc, __m256i u, __m256i q) { return _mm256_dpbusd_avx_epi32(acc, u, q); }
#endif

// The 4 bytes of x at p in every int32 lane.
TRAM_INLINE __m256i broadcast4(const int8_t* p) {
  int32_t q;
  std::memcpy(&q, p, 4);
  return _mm256_set1_epi32(q);
}

// store(m0 + m, outputs) for each row m of x: acc[m] holds its 8 outputs, one per row of W.
template <int64_t MB, typename Store>
TRAM_INLINE void store_rows(const __m256 (&acc)[MB], int64_t m0, const Store& store) {
  for (int64_t m = 0; m < MB; ++m) {
    alignas(32) float out[kRows];
    _mm256_store_ps(out, acc[m]);
    store(m0 + m, static_cast<const float*>(out));
  }
}
#endif

struct Q4K {
  static constexpr int64_t kType = 1012;  // Tram's own type id (not a ggml type)
  static constexpr int64_t kBlock = tram::q8k::kBlock;  // k per block, and per activation scale
  using Activations = tram::q8k::QuantizedRows;
  static constexpr int64_t kBlockBytes = 1248;  // one block (256 k) of a group of 8 rows
  static constexpr int64_t kRowBytes = kBlockBytes / kRows;  // 156 bytes per row and block
  static constexpr int64_t kSrcBytes = 144;  // the file's Q4_K block

  // One block of a group:
  //   qs   [32][8][4]  step s = 8c + j (c the 64-k chunk, j 0..7): row r's 4 bytes at 32 s + 4 r, the file's
  //                    qs[32 c + 4 j .. + 3]: low nibbles k 64c + 4j + i (sub-block 2c), high ones
  //                    k 64c + 32 + 4j + i (sub-block 2c + 1)
  //   sc   [8][16]     sub-block j: bytes 2r and 2r + 1 hold row r's sub-scale (vpmovzxbw: an int16 pair)
  //   mins [4][16]     pair p: bytes 2r, 2r + 1 hold row r's minimums m_2p, m_2p+1
  //   d, dmin [8]      fp16, as in the file
  static constexpr int64_t kSc = 1024, kMins = 1152, kD = 1216, kDmin = 1232;

  // Row r's block of the file (src) into a group's packed block o.
  static void pack_row(const uint8_t* src, int64_t r, uint8_t* o) {
    uint8_t sm[16];
    tram::q8k::unpack_k4_scales(src + 4, sm);
    for (int64_t s = 0; s < 32; ++s) std::memcpy(o + 32 * s + 4 * r, src + 16 + 32 * (s / 8) + 4 * (s % 8), 4);
    for (int64_t j = 0; j < 8; ++j) o[kSc + 16 * j + 2 * r] = o[kSc + 16 * j + 2 * r + 1] = sm[j];
    for (int64_t p = 0; p < 4; ++p) {
      o[kMins + 16 * p + 2 * r] = sm[8 + 2 * p];
      o[kMins + 16 * p + 2 * r + 1] = sm[8 + 2 * p + 1];
    }
    std::memcpy(o + kD + 2 * r, src, 2);
    std::memcpy(o + kDmin + 2 * r, src + 2, 2);
  }

  // The inverse: row r's block of the file (dst) from a group's packed block o.
  static void unpack_row(const uint8_t* o, int64_t r, uint8_t* dst) {
    uint8_t sc[8], m[8];
    for (int64_t j = 0; j < 8; ++j) sc[j] = o[kSc + 16 * j + 2 * r];
    for (int64_t p = 0; p < 4; ++p) m[2 * p] = o[kMins + 16 * p + 2 * r], m[2 * p + 1] = o[kMins + 16 * p + 2 * r + 1];
    for (int64_t j = 0; j < 4; ++j) {  // the file's 12 bytes of 6-bit values (unpack_k4_scales' inverse)
      dst[4 + j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
      dst[8 + j] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
      dst[12 + j] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
    std::memcpy(dst, o + kD + 2 * r, 2);
    std::memcpy(dst + 2, o + kDmin + 2 * r, 2);
    for (int64_t s = 0; s < 32; ++s) std::memcpy(dst + 16 + 32 * (s / 8) + 4 * (s % 8), o + 32 * s + 4 * r, 4);
  }

#if defined(TRAM_X8_KERNELS)
  // isum[m] += sum over sub-blocks 2c and 2c + 1 of sc_j * sum_k u_k * q_k, per row of W (exact).
  template <int64_t MB>
  TRAM_INLINE static void chunk_sums(const tram::q8k::Rows& x, int64_t m0, int64_t b, const uint8_t* o, int64_t c,
                                     int32_t (&isum)[MB][8]) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256i sa[MB], sb[MB];
    for (int64_t m = 0; m < MB; ++m) sa[m] = sb[m] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int64_t j = 0; j < 8; ++j) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(o + 32 * (8 * c + j)));
      const __m256i lo = _mm256_and_si256(w, low4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
      for (int64_t m = 0; m < MB; ++m) {
        const int8_t* xq = x.q_at(m0 + m) + b * tram::q8k::kBlock + 64 * c + 4 * j;
#if defined(TRAM_X8_VNNI)  // sa, sb: int32 per row of W
        sa[m] = dot4(sa[m], lo, broadcast4(xq));
        sb[m] = dot4(sb[m], hi, broadcast4(xq + 32));
#else  // sa, sb: int16 pairs per row of W
        sa[m] = _mm256_add_epi16(sa[m], _mm256_maddubs_epi16(lo, broadcast4(xq)));
        sb[m] = _mm256_add_epi16(sb[m], _mm256_maddubs_epi16(hi, broadcast4(xq + 32)));
#endif
        keep_in_register(sa[m]), keep_in_register(sb[m]);
      }
    }
    const __m128i* sc = reinterpret_cast<const __m128i*>(o + kSc + 32 * c);
#if defined(TRAM_X8_VNNI)  // the byte pairs (sc, sc) as one int32 sc per row
    const __m256i byte = _mm256_set1_epi32(0xff);
    const __m256i sca = _mm256_and_si256(_mm256_cvtepu16_epi32(_mm_loadu_si128(sc)), byte);
    const __m256i scb = _mm256_and_si256(_mm256_cvtepu16_epi32(_mm_loadu_si128(sc + 1)), byte);
#else
    const __m256i sca = _mm256_cvtepu8_epi16(_mm_loadu_si128(sc)), scb = _mm256_cvtepu8_epi16(_mm_loadu_si128(sc + 1));
#endif
    for (int64_t m = 0; m < MB; ++m) {
      __m256i* i = reinterpret_cast<__m256i*>(isum[m]);
#if defined(TRAM_X8_VNNI)
      const __m256i s = _mm256_add_epi32(_mm256_mullo_epi32(sa[m], sca), _mm256_mullo_epi32(sb[m], scb));
#else
      const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(sa[m], sca), _mm256_madd_epi16(sb[m], scb));
#endif
      _mm256_store_si256(i, _mm256_add_epi32(_mm256_load_si256(i), s));
    }
  }

  // Rows m0 .. m0 + MB - 1 of x times a group's `blocks` packed blocks: store(m, out) gets row m's 8 outputs.
  // Not inlined: inside the fused MoE kernel's loops GCC spilled the running sums (as gguf_q8k_gemm.h's).
  template <int64_t MB, typename Store>
  __attribute__((noinline)) static void group_rows(const tram::q8k::Rows& x, int64_t m0, const uint8_t* group, int64_t blocks,
                                            const Store& store) {
    __m256 acc[MB], accm[MB];
    for (int64_t m = 0; m < MB; ++m) acc[m] = accm[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* o = group + b * kBlockBytes;
      tram::simd::prefetch_ahead(o, kBlockBytes);
      alignas(32) int32_t isum[MB][8];
      for (int64_t m = 0; m < MB; ++m) _mm256_store_si256(reinterpret_cast<__m256i*>(isum[m]), _mm256_setzero_si256());
#pragma GCC unroll 1
      for (int64_t c = 0; c < 4; ++c) chunk_sums<MB>(x, m0, b, o, c, isum);
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(o + kD)));
      const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(o + kDmin)));
      __m256i mins[4];
      for (int64_t p = 0; p < 4; ++p) {
        mins[p] = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(o + kMins + 16 * p)));
      }
      for (int64_t m = 0; m < MB; ++m) {
        // The sums of q per 32 k as int16 pairs: (bsum_0, bsum_1), (bsum_2, bsum_3) in the low 128-bit lane's
        // words 0 and 1, (bsum_4, bsum_5), (bsum_6, bsum_7) in the high lane's.
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bs_at(m0 + m) + b * 16));
        alignas(32) int32_t pairs[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(pairs), _mm256_hadd_epi16(bs, bs));
        __m256i imin = _mm256_madd_epi16(mins[0], _mm256_set1_epi32(pairs[0]));
        imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mins[1], _mm256_set1_epi32(pairs[1])));
        imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mins[2], _mm256_set1_epi32(pairs[4])));
        imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mins[3], _mm256_set1_epi32(pairs[5])));
        const __m256 dx = _mm256_set1_ps(x.d_at(m0 + m)[b]);
        const __m256i i = _mm256_load_si256(reinterpret_cast<const __m256i*>(isum[m]));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(d, dx), acc[m]);
        accm[m] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin, dx), accm[m]);
      }
    }
    for (int64_t m = 0; m < MB; ++m) acc[m] = _mm256_add_ps(acc[m], accm[m]);
    store_rows<MB>(acc, m0, store);
  }

#endif
};

}  // namespace tram::x8
