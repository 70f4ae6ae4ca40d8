// paged_prefill.cpp's bfloat16 path on CPUs with AVX512_BF16: scores and the weighted V sum as
// vdpbf16ps dot products of bfloat16 pairs, twice the multiply-adds per instruction of the float32
// FMAs the other paths run. Queries and keys are bfloat16 already, so a score is their exact products
// summed in float32; the probabilities are rounded to bfloat16 for the V sum (as oneDNN's and
// PyTorch's bfloat16 attention do) while their float32 sum stays the softmax's denominator.
//
// Layouts (a word is two bfloat16 side by side, the pair one vdpbf16ps lane multiplies):
//   keys   [chunk][D / 2][16]  word = (K[key][2i], K[key][2i + 1]): a score vector is 16 keys
//   values [key pair][D]       word = (V[2kp][d], V[2kp + 1][d]): an output vector is 16 of D
//   probabilities [row][key]   bfloat16, so word kp of a row is (P[2kp], P[2kp + 1])
// Keys are visited at the same fixed positions as the float32 path, so a query row's result still
// depends only on its position and context.
#pragma once

#if defined(__AVX512BF16__)
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#define TRAM_PREFILL_BF16_DOT 1

namespace tram::prefill_bf16 {

// Keys [first, end) of one kv head, a stretch of the segment that starts at key k0 (first - k0 is a
// multiple of 16), into kt ([chunk][D/2][16] words) and vp ([key pair][D] words as bfloat16 halves);
// the tail of the last chunk is zeros (finite, and masked anyway).
template <typename Request>
void load_segment(const c10::BFloat16* k_cache, const c10::BFloat16* v_cache, const Request& rq, int64_t kv_head, int64_t k0,
                  int64_t first, int64_t end, int64_t bs, int64_t row_stride, int64_t D, int64_t chunk, uint32_t* kt,
                  uint16_t* vp) {
  const int64_t half = D / 2, j_end = (end - k0 + chunk - 1) / chunk * chunk;
  for (int64_t j = first - k0; j < j_end; ++j) {
    uint32_t* kt_col = kt + (j / chunk) * half * chunk + (j % chunk);
    uint16_t* v_col = vp + (j / 2) * D * 2 + (j & 1);
    const int64_t t = k0 + j;
    if (t >= end) {
      for (int64_t i = 0; i < half; ++i) kt_col[i * chunk] = 0;
      for (int64_t d = 0; d < D; ++d) v_col[d * 2] = 0;
      continue;
    }
    const int64_t offset = (static_cast<int64_t>(rq.table[t / bs]) * bs + t % bs) * row_stride + kv_head * D;
    const c10::BFloat16* k_row = k_cache + offset;
    for (int64_t i = 0; i < half; ++i) std::memcpy(kt_col + i * chunk, k_row + 2 * i, sizeof(uint32_t));
    const c10::BFloat16* v_row = v_cache + offset;
    for (int64_t d = 0; d < D; ++d) v_col[d * 2] = v_row[d].x;
  }
}

// Raw scores of `rows` query rows (q: [row][D/2] words) against chunk c of the segment: acc[r] gets
// the 16 keys' dot products with row r.
template <int kRows>
TRAM_INLINE void score_chunk(const uint32_t* q, int64_t half, const uint32_t* ktc, int64_t chunk, __m512* acc) {
  for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < half; ++i) {
    const __m512bh k = (__m512bh)_mm512_loadu_si512(ktc + i * chunk);
    for (int r = 0; r < kRows; ++r)
      acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(static_cast<int>(q[r * half + i])), k);
  }
}

// o[r] += P[r] V over the chunks [c0, c1) (p: [row][segment] bfloat16, vp: [key pair][D] words).
template <int kRows>
TRAM_INLINE void weighted_values(const uint16_t* p, int64_t segment, const uint16_t* vp, int64_t D, int64_t c0,
                                 int64_t c1, int64_t chunk, float* o) {
  const int64_t kp0 = c0 * chunk / 2, kp1 = c1 * chunk / 2;
  for (int64_t dv = 0; dv < D; dv += 16) {
    __m512 acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = _mm512_loadu_ps(o + r * D + dv);
    for (int64_t kp = kp0; kp < kp1; ++kp) {
      const __m512bh v = (__m512bh)_mm512_loadu_si512(vp + (kp * D + dv) * 2);
      for (int r = 0; r < kRows; ++r) {
        uint32_t word;
        std::memcpy(&word, p + r * segment + 2 * kp, sizeof(word));
        acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(static_cast<int>(word)), v);
      }
    }
    for (int r = 0; r < kRows; ++r) _mm512_storeu_ps(o + r * D + dv, acc[r]);
  }
}

// 16 float32 probabilities rounded to bfloat16 (nearest even).
TRAM_INLINE void round_to_bf16(const float* src, uint16_t* dst) {
  const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src));
  std::memcpy(dst, &h, 32);
}

}  // namespace tram::prefill_bf16

#else
#define TRAM_PREFILL_BF16_DOT 0
#endif
