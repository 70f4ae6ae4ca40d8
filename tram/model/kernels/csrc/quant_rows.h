// Weight rows widened to float32 16 k at a time, and the dot product of a few rows of x with a few of
// them: the inner loop of the weight-streaming kernels (quant_linear.cpp, fused_moe.cpp).
//
// A Rows type gives, for row j of its tile, chunk(j, k): weights k .. k + 15 as float32 (for int4 each
// is exactly its dequantized value; int8 is scaled after the sum, see post_scale), tail(j, k): the
// last K % 16 zero-padded, and prefetch(j, k): a hint ahead of the stream.
#pragma once

#include "prefetch.h"
#include "simd.h"
#include "widen_int8.h"

#include <c10/util/BFloat16.h>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tram::rows {

using namespace tram::simd;

constexpr int64_t kLanes = 16;

TRAM_INLINE vf16 widen_i8(const int8_t* p) { return to_float(vload<vi8x16>(p)); }

// The last K % 16 weights of a row, zero-padded, without reading past the row.
TRAM_INLINE vf16 widen_i8_tail(const int8_t* p, int64_t count) {
  int8_t buf[kLanes] = {};
  std::memcpy(buf, p, count);
  return widen_i8(buf);
}

// 16 consecutive float32 or bfloat16 weights as float32 (bfloat16 -> float32 is exact).
TRAM_INLINE vf16 widen16(const float* p) { return vload<vf16>(p); }
TRAM_INLINE vf16 widen16(const c10::BFloat16* p) { return widen_bf16x16(p); }

// Float32 or bfloat16 rows (nn.Linear's layout), row j at w + j * K.
template <typename T>
struct FloatRows {
  const T* w;
  int64_t K;
  TRAM_INLINE vf16 chunk(int64_t j, int64_t k) const { return widen16(w + j * K + k); }
  TRAM_INLINE void prefetch(int64_t j, int64_t k) const {
    if ((k & (64 / sizeof(T) - 1)) == 0) prefetch_ahead(w + j * K + k, 64);
  }
  TRAM_INLINE vf16 tail(int64_t j, int64_t k) const {
    T buf[kLanes];
    std::memset(static_cast<void*>(buf), 0, sizeof(buf));
    std::memcpy(static_cast<void*>(buf), w + j * K + k, (K - k) * sizeof(T));
    return widen16(buf);
  }
};

// int8 rows as stored (the row's scale multiplies the finished sum).
struct Int8Rows {
  const int8_t* q;
  int64_t K;
  TRAM_INLINE vf16 chunk(int64_t j, int64_t k) const { return widen_i8(q + j * K + k); }
  TRAM_INLINE void prefetch(int64_t j, int64_t k) const {
    if ((k & 63) == 0) prefetch_ahead(q + j * K + k, 64);
  }
  TRAM_INLINE vf16 tail(int64_t j, int64_t k) const { return widen_i8_tail(q + j * K + k, K - k); }
};

// int4 nibbles 0..15 minus their group's zero (8, or the stored zero point: -15..15, still exact in
// int8) times its scale: the dequantized weights themselves.
// kZero: a zero point per group (zero is row 0's); else every zero is 8, as symmetric int4 stores it.
template <bool kZero>
struct Int4Rows {
  const uint8_t* q;  // row 0
  const float* scale;  // row 0's group scales
  const uint8_t* zero;  // row 0's group zero points (kZero only)
  int64_t K, group;
  // Chunk c (16 k) of a run of 32: the run's low nibbles (c even) or high ones (c odd).
  TRAM_INLINE vf16 chunk(int64_t j, int64_t k) const {
    const vu8x16 bytes = vload<vu8x16>(q + j * (K / 2) + (k & ~int64_t{31}) / 2);
    const vu8x16 nibbles = (k & 16) ? vu8x16(bytes >> 4) : vu8x16(bytes & 15);
    const int64_t g = j * (K / group) + k / group;
    const uint8_t z = kZero ? zero[g] : uint8_t{8};
    return to_float(bitcast<vi8x16>(vu8x16(nibbles - z))) * scale[g];
  }
  TRAM_INLINE vf16 tail(int64_t, int64_t) const { return vf16{}; }  // K is a multiple of 32: no tail
  TRAM_INLINE void prefetch(int64_t j, int64_t k) const {
    if ((k & 127) == 0) prefetch_ahead(q + j * (K / 2) + k / 2, 64);
  }
};

// sums[m][j] = row m of x (xf + m * ldx, float32, zero-padded to a multiple of 32 k) times row j of
// `rows`, over K. Each widened chunk of a weight row serves MB rows of x, each chunk of x NB weight
// rows; every output keeps its own two partial sums (even and odd chunks of 16 k, the tail in the odd
// one) folded in a fixed order, so MB and NB change which outputs share registers, never an output's
// order of additions.
template <int64_t MB, int64_t NB, typename Rows>
TRAM_INLINE void dot_tile(const float* xf, int64_t ldx, const Rows& rows, int64_t K, float (&sums)[MB][NB]) {
  const int64_t k_full = K - K % kLanes;
  vf16 even[MB][NB] = {}, odd[MB][NB] = {};
  int64_t k = 0;
  for (; k + 2 * kLanes <= k_full; k += 2 * kLanes) {
    vf16 w0[NB], w1[NB];
    for (int64_t j = 0; j < NB; ++j) {
      rows.prefetch(j, k);
      w0[j] = rows.chunk(j, k);
      w1[j] = rows.chunk(j, k + kLanes);
    }
    for (int64_t m = 0; m < MB; ++m) {
      const float* xm = xf + m * ldx + k;
      const vf16 x0 = vload<vf16>(xm), x1 = vload<vf16>(xm + kLanes);
      for (int64_t j = 0; j < NB; ++j) {
        even[m][j] += w0[j] * x0;
        odd[m][j] += w1[j] * x1;
      }
    }
  }
  if (k < k_full) {
    for (int64_t j = 0; j < NB; ++j) {
      const vf16 w0 = rows.chunk(j, k);
      for (int64_t m = 0; m < MB; ++m) even[m][j] += w0 * vload<vf16>(xf + m * ldx + k);
    }
    k += kLanes;
  }
  if (k < K) {  // the odd partial sum takes the tail, so a chunk never moves between the two sums
    for (int64_t j = 0; j < NB; ++j) {
      const vf16 w1 = rows.tail(j, k);
      for (int64_t m = 0; m < MB; ++m) odd[m][j] += w1 * vload<vf16>(xf + m * ldx + k);
    }
  }
  for (int64_t m = 0; m < MB; ++m) {
    for (int64_t j = 0; j < NB; ++j) sums[m][j] = hsum(even[m][j] + odd[m][j]);
  }
}

// Rows 0 .. count - 1 of `rows` as float32 into buf [count, ld], zeros past K: widened as dot_tile
// widens them, times the row's scale for int8 (row_scale; int4's chunks come scaled), which is each
// weight's dequantized value.
template <typename Rows>
void fill_rows(const Rows& rows, const float* row_scale, int64_t count, int64_t K, int64_t ld, float* buf) {
  for (int64_t j = 0; j < count; ++j) {
    float* out = buf + j * ld;
    const float s = row_scale != nullptr ? row_scale[j] : 1.0f;
    int64_t k = 0;
    for (; k + kLanes <= K; k += kLanes) vstore(out + k, row_scale != nullptr ? rows.chunk(j, k) * s : rows.chunk(j, k));
    if (k < K) {
      vstore(out + k, row_scale != nullptr ? rows.tail(j, k) * s : rows.tail(j, k));
      k += kLanes;
    }
    std::fill(out + k, out + ld, 0.0f);
  }
}

#if defined(__AVX512BF16__)
// dot_tile for bfloat16 x and bfloat16 weights with AVX512-BF16: vdpbf16ps multiplies 32 bf16 pairs
// exactly and adds them into 16 float32 lanes, so neither operand is widened (twice the speed of the
// widening loop on one core). xb's rows are zero-padded to a multiple of 32; w's rows (stride K) are
// read without running past K (a masked load takes the tail). Two partial sums per output (even and
// odd chunks of 32 k, the tail in the odd one), folded in a fixed order: as in dot_tile, MB and NB
// never change an output's order of additions.
template <int64_t MB, int64_t NB>
TRAM_INLINE void dot_tile_bf16(const c10::BFloat16* xb, int64_t ldx, const c10::BFloat16* w, int64_t K,
                               float (&sums)[MB][NB]) {
  constexpr int64_t kStep = 2 * kLanes;
  const int64_t k_full = K - K % kStep;
  __m512 even[MB][NB], odd[MB][NB];
  for (int64_t m = 0; m < MB; ++m) {
    for (int64_t j = 0; j < NB; ++j) even[m][j] = odd[m][j] = _mm512_setzero_ps();
  }
  // At least the next tile's rows ahead (NB rows): 8 KiB fell inside the tile of four 4 KiB rows.
  const int64_t ahead = std::max<int64_t>(NB * K, kPrefetchBytes / sizeof(c10::BFloat16)) - kPrefetchBytes / 2;
  int64_t k = 0;
  for (; k + 2 * kStep <= k_full; k += 2 * kStep) {
    __m512bh w0[NB], w1[NB];
    for (int64_t j = 0; j < NB; ++j) {
      prefetch_ahead(w + j * K + k + ahead, 2 * kStep * sizeof(c10::BFloat16));
      w0[j] = (__m512bh)_mm512_loadu_si512(w + j * K + k);
      w1[j] = (__m512bh)_mm512_loadu_si512(w + j * K + k + kStep);
    }
    for (int64_t m = 0; m < MB; ++m) {
      const c10::BFloat16* xm = xb + m * ldx + k;
      const __m512bh x0 = (__m512bh)_mm512_loadu_si512(xm), x1 = (__m512bh)_mm512_loadu_si512(xm + kStep);
      for (int64_t j = 0; j < NB; ++j) {
        even[m][j] = _mm512_dpbf16_ps(even[m][j], w0[j], x0);
        odd[m][j] = _mm512_dpbf16_ps(odd[m][j], w1[j], x1);
      }
    }
  }
  if (k < k_full) {
    for (int64_t j = 0; j < NB; ++j) {
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + j * K + k);
      for (int64_t m = 0; m < MB; ++m) {
        even[m][j] = _mm512_dpbf16_ps(even[m][j], w0, (__m512bh)_mm512_loadu_si512(xb + m * ldx + k));
      }
    }
    k += kStep;
  }
  if (k < K) {  // a masked load never touches memory past the row
    const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (K - k)) - 1);
    for (int64_t j = 0; j < NB; ++j) {
      const __m512bh w1 = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + j * K + k);
      for (int64_t m = 0; m < MB; ++m) {
        odd[m][j] = _mm512_dpbf16_ps(odd[m][j], w1, (__m512bh)_mm512_loadu_si512(xb + m * ldx + k));
      }
    }
  }
  for (int64_t m = 0; m < MB; ++m) {
    for (int64_t j = 0; j < NB; ++j) sums[m][j] = hsum(bitcast<vf16>(_mm512_add_ps(even[m][j], odd[m][j])));
  }
}
#endif

}  // namespace tram::rows
