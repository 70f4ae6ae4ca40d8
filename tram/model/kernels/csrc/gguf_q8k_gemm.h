// The K-quants times int8 activations for many rows of x (prefills, large decode batches, experts with
// many tokens): 16 rows of W repacked so that one vpdpbusd multiplies 4 k of all 16 by 4 k of one row
// of x, 64 products per instruction, with the sub-scales applied once per sub-block.
//
// Why: gguf_q8k.h's row kernel spends two instructions per 64 products (vpmaddubsw, vpdpwssd) plus a
// reduction per block and pair of rows, and decodes W again for every few rows of x; at 16 rows of x
// and more it is compute-bound far below the cores' integer rate. Here a tile of W is decoded and
// repacked once per call and every row of x reuses it.
//
// Numerics: gguf_q8k.h's, bit for bit. Each output lane computes the block's exact integers I and
// Imin (in another order: integers do not care), then the same float steps (block_step): a row's
// result does not depend on which kernel multiplied it. AVX-512 VNNI only; elsewhere the row kernel
// takes every row count.
#pragma once

#include "gguf_q8k.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace tram::q8k {

#if defined(TRAM_Q8K_512) && defined(__AVX512VNNI__)
#define TRAM_Q8K_GEMM 1

constexpr int64_t kPackRows = 16;  // rows of W per packed tile: one int32 lane each

// One block (256 k) of a tile of 16 rows of W:
//   u      [64][16][4]   step t (k 4t .. 4t + 3) of row r at (16 t + r) * 4
//   scale  [groups][16]  the sub-scale of group g (Q4_K/Q5_K: 8 groups of 32 k; Q6_K: 16 of 16 k)
//   pair   [pairs][16]   two int16 per row, multiplied into the activations' partial sums by vpdpwssd:
//                        Q4_K/Q5_K the minimums (m_2p, m_2p+1) (Imin); Q6_K -32 * (sc_2p, sc_2p+1),
//                        the zero point's share of I
//   d, dmin [16]         d_w and -dmin_w
template <typename F>
struct PackedBlock {
  static constexpr int kGroups = F::kMins ? 8 : 16, kSteps = 64 / kGroups, kPairs = F::kMins ? 4 : 8;
  alignas(64) uint8_t u[64 * kPackRows * 4];
  alignas(64) int32_t scale[kGroups * kPackRows];
  alignas(64) int32_t pair[kPairs * kPackRows];
  alignas(64) float d[kPackRows], dmin[kPackRows];
};

TRAM_INLINE int32_t two_int16(int32_t lo, int32_t hi) {
  return static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xFFFFu) | (static_cast<uint32_t>(hi) << 16));
}

// Steps t0 .. t0 + 15 (4 bytes each) of the 16 rows of tmp, step by step: out + 64 t holds step t0 + t
// of rows 0 .. 15 (a 16 x 16 transpose of int32: pairs, quads, then 128-bit lanes).
TRAM_INLINE void transpose16(const uint8_t (&tmp)[kPackRows][kBlock], int64_t t0, uint8_t* out) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(tmp[i] + 4 * t0);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // r[4i + j], 128-bit lane L: rows 4i .. 4i + 3 of step 4L + j
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i a = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44), b = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xEE);
    const __m512i c = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44), d = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xEE);
    _mm512_store_si512(out + 64 * j, _mm512_shuffle_i32x4(a, c, 0x88));
    _mm512_store_si512(out + 64 * (4 + j), _mm512_shuffle_i32x4(a, c, 0xDD));
    _mm512_store_si512(out + 64 * (8 + j), _mm512_shuffle_i32x4(b, d, 0x88));
    _mm512_store_si512(out + 64 * (12 + j), _mm512_shuffle_i32x4(b, d, 0xDD));
  }
}

// Row r's block (or zeros past the tile's rows: block null) into its lane of out, its quants into u.
template <typename F>
TRAM_INLINE void pack_row(const uint8_t* block, int64_t r, PackedBlock<F>& out, uint8_t* u) {
  using P = PackedBlock<F>;
  if (block == nullptr) {
    std::memset(u, 0, kBlock);
    for (int g = 0; g < P::kGroups; ++g) out.scale[g * kPackRows + r] = 0;
    for (int p = 0; p < P::kPairs; ++p) out.pair[p * kPackRows + r] = 0;
    out.d[r] = 0.0f, out.dmin[r] = 0.0f;
    return;
  }
  F blk;
  blk.load(block);
  for (int c = 0; c < 4; ++c) _mm512_store_si512(u + 64 * c, blk.quants(c));
  for (int g = 0; g < P::kGroups; ++g) out.scale[g * kPackRows + r] = blk.s[g];
  for (int p = 0; p < P::kPairs; ++p) {
    out.pair[p * kPackRows + r] = F::kMins ? two_int16(blk.s[8 + 2 * p], blk.s[9 + 2 * p])
                                           : two_int16(-32 * blk.s[2 * p], -32 * blk.s[2 * p + 1]);
  }
  out.d[r] = blk.d, out.dmin[r] = blk.dmin;
}

// The activations' pairs for one block of one row of x: Q4_K/Q5_K (bsum_2p, bsum_2p+1) over 32 k;
// Q6_K (bs_2p, bs_2p+1) over 16 k.
template <typename F>
TRAM_INLINE void activation_pairs(const int16_t* bs, int32_t* out) {
  if constexpr (F::kMins) {
    const __m128i s = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bs)),
                                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(bs + 8)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), s);
  } else {
    std::memcpy(out, bs, 8 * sizeof(int32_t));
  }
}

// y(m, lanes) for rows m0 .. m0 + MB - 1 of x against a packed tile of `blocks` blocks: store(m, v)
// receives the 16 outputs of row m as a vector.
template <typename F, int64_t MB, typename Store>
TRAM_INLINE void gemm_rows(const Rows& x, int64_t m0, const PackedBlock<F>* tile, int64_t blocks, const Store& store) {
  using P = PackedBlock<F>;
  __m512 acc[MB], accm[MB];
  for (int64_t m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps(), accm[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const P& pb = tile[b];
    __m512i iblk[MB];
    for (int64_t m = 0; m < MB; ++m) iblk[m] = _mm512_setzero_si512();
    for (int g = 0; g < P::kGroups; ++g) {
      __m512i ig[MB];
      for (int64_t m = 0; m < MB; ++m) ig[m] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int t = 0; t < P::kSteps; ++t) {
        const int step = g * P::kSteps + t;
        const __m512i wv = _mm512_load_si512(pb.u + step * 64);
        for (int64_t m = 0; m < MB; ++m) {
          int32_t q4;
          std::memcpy(&q4, x.q_at(m0 + m) + b * kBlock + 4 * step, 4);
          ig[m] = _mm512_dpbusd_epi32(ig[m], wv, _mm512_set1_epi32(q4));
        }
      }
      const __m512i sc = _mm512_load_si512(pb.scale + g * kPackRows);
      for (int64_t m = 0; m < MB; ++m) iblk[m] = _mm512_add_epi32(iblk[m], _mm512_mullo_epi32(ig[m], sc));
    }
    const __m512 d = _mm512_load_ps(pb.d), dmin = _mm512_load_ps(pb.dmin);
    for (int64_t m = 0; m < MB; ++m) {
      alignas(32) int32_t ap[8];
      activation_pairs<F>(x.bs_at(m0 + m) + b * (kBlock / kSum), ap);
      __m512i ipair = _mm512_setzero_si512();
      for (int p = 0; p < P::kPairs; ++p) {
        ipair = _mm512_dpwssd_epi32(ipair, _mm512_load_si512(pb.pair + p * kPackRows), _mm512_set1_epi32(ap[p]));
      }
      const __m512 dx = _mm512_set1_ps(x.d_at(m0 + m)[b]);
      if constexpr (F::kMins) {
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iblk[m]), _mm512_mul_ps(d, dx), acc[m]);
        accm[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ipair), _mm512_mul_ps(dmin, dx), accm[m]);
      } else {
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(iblk[m], ipair)), _mm512_mul_ps(d, dx), acc[m]);
      }
    }
  }
  for (int64_t m = 0; m < MB; ++m) store(m0 + m, _mm512_add_ps(acc[m], accm[m]));
}

constexpr int64_t kGemmRowsX = 4;  // rows of x per register tile

// Rows m_begin .. m_end - 1 of x against a packed tile, in register tiles of kGemmRowsX rows.
template <typename F, typename Store>
void gemm_tile(const Rows& x, int64_t m_begin, int64_t m_end, const PackedBlock<F>* tile, int64_t blocks,
               const Store& store) {
  int64_t m = m_begin;
  for (; m + kGemmRowsX <= m_end; m += kGemmRowsX) gemm_rows<F, kGemmRowsX>(x, m, tile, blocks, store);
  for (; m < m_end; ++m) gemm_rows<F, 1>(x, m, tile, blocks, store);
}

// Rows 0 .. rows - 1 (rows <= 16) of the W at w packed, all `blocks` blocks, into a per-thread buffer.
// Row by row, so that each row's bytes stream in order (block by block, rows apart, the loads missed
// the cache at every block of the long Q6_K rows).
template <typename F>
const PackedBlock<F>* pack_tile(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t blocks) {
  struct alignas(64) Quants {
    uint8_t u[kPackRows][kBlock];
  };
  thread_local std::vector<PackedBlock<F>> buffer;
  thread_local std::vector<Quants> quants;
  if (static_cast<int64_t>(buffer.size()) < blocks) buffer.resize(static_cast<size_t>(blocks));
  if (static_cast<int64_t>(quants.size()) < blocks) quants.resize(static_cast<size_t>(blocks));
  for (int64_t r = 0; r < kPackRows; ++r) {
    const uint8_t* row = r < rows ? w + r * row_bytes : nullptr;
    for (int64_t b = 0; b < blocks; ++b) {
      if (row != nullptr) tram::simd::prefetch_ahead(row + b * F::kBytes, F::kBytes);
      pack_row<F>(row != nullptr ? row + b * F::kBytes : nullptr, r, buffer[b], quants[b].u[r]);
    }
  }
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t t0 = 0; t0 < 64; t0 += 16) transpose16(quants[b].u, t0, buffer[b].u + t0 * 64);
  }
  return buffer.data();
}
#endif

}  // namespace tram::q8k
