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
//   sp     [16 or 32][16] per row: the sub-scales of the groups (Q4_K/Q5_K: 8 groups of 32 k; Q6_K: 16
//                        of 16 k), then pairs of int16 that vpdpwssd multiplies into the activations'
//                        partial sums: Q4_K/Q5_K the minimums (m_2p, m_2p+1) (Imin); Q6_K
//                        -32 * (sc_2p, sc_2p+1), the zero point's share of I
//   d, dmin [16]         d_w and -dmin_w
template <typename F>
struct PackedBlock {
  static constexpr int kGroups = F::kMins ? 8 : 16, kSteps = 64 / kGroups, kPairs = F::kMins ? 4 : 8;
  static constexpr int kRowsSP = F::kMins ? 16 : 32;
  alignas(64) uint8_t u[64 * kPackRows * 4];
  alignas(64) int32_t sp[kRowsSP][kPackRows];
  alignas(64) float d[kPackRows], dmin[kPackRows];
  const int32_t* scale(int g) const { return sp[g]; }
  const int32_t* pair(int p) const { return sp[kGroups + p]; }
};

// Before the transposes, per row: the quants (256 bytes) and the scale/pair words (16 or 32 int32).
template <typename F>
struct alignas(64) PackStage {
  uint8_t u[kPackRows][kBlock];
  int32_t sp[PackedBlock<F>::kRowsSP / 16][kPackRows][16];
};

// 16 rows of 16 int32 (row i at src + i * stride, 64-byte aligned) transposed: out + 64 j holds int32
// j of rows 0 .. 15 (pairs, quads, then 128-bit lanes).
TRAM_INLINE void transpose16(const uint8_t* src, int64_t stride, uint8_t* out) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(src + i * stride);
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

// Row r's block (or zeros past the tile's rows: block null) into stage and its lane of out's d, dmin.
template <typename F>
TRAM_INLINE void pack_row(const uint8_t* block, int64_t r, PackStage<F>& stage, PackedBlock<F>& out) {
  if (block == nullptr) {
    std::memset(stage.u[r], 0, kBlock);
    for (auto& part : stage.sp) std::memset(part[r], 0, sizeof(part[r]));
    out.d[r] = 0.0f, out.dmin[r] = 0.0f;
    return;
  }
  F blk;
  blk.load(block);
  for (int c = 0; c < 4; ++c) _mm512_store_si512(stage.u[r] + 64 * c, blk.quants(c));
  const __m256i s16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(blk.s));
  if constexpr (F::kMins) {  // sc_0..7 as int32, then the minimums' int16 pairs as they lie
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(s16))),
                                         _mm256_zextsi128_si256(_mm256_extracti128_si256(s16, 1)), 1);
    _mm512_store_si512(stage.sp[0][r], w);
  } else {  // sc_0..15 as int32; then -32 * sc as int16 pairs
    _mm512_store_si512(stage.sp[0][r], _mm512_cvtepi16_epi32(s16));
    const __m256i pairs = _mm256_mullo_epi16(s16, _mm256_set1_epi16(-32));
    _mm512_store_si512(stage.sp[1][r], _mm512_zextsi256_si512(pairs));
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
      const __m512i sc = _mm512_load_si512(pb.scale(g));
      for (int64_t m = 0; m < MB; ++m) iblk[m] = _mm512_add_epi32(iblk[m], _mm512_mullo_epi32(ig[m], sc));
    }
    const __m512 d = _mm512_load_ps(pb.d), dmin = _mm512_load_ps(pb.dmin);
    for (int64_t m = 0; m < MB; ++m) {
      alignas(32) int32_t ap[8];
      activation_pairs<F>(x.bs_at(m0 + m) + b * (kBlock / kSum), ap);
      __m512i ipair = _mm512_setzero_si512();
      for (int p = 0; p < P::kPairs; ++p) {
        ipair = _mm512_dpwssd_epi32(ipair, _mm512_load_si512(pb.pair(p)), _mm512_set1_epi32(ap[p]));
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

constexpr int64_t kGemmRowsX = 4;  // rows of x per register tile (6 or 8 measured no faster)

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
  thread_local std::vector<PackedBlock<F>> buffer;
  thread_local std::vector<PackStage<F>> stages;
  if (static_cast<int64_t>(buffer.size()) < blocks) buffer.resize(static_cast<size_t>(blocks));
  if (static_cast<int64_t>(stages.size()) < blocks) stages.resize(static_cast<size_t>(blocks));
  for (int64_t r = 0; r < kPackRows; ++r) {
    const uint8_t* row = r < rows ? w + r * row_bytes : nullptr;
    for (int64_t b = 0; b < blocks; ++b) {
      if (row != nullptr) tram::simd::prefetch_ahead(row + b * F::kBytes, F::kBytes);
      pack_row<F>(row != nullptr ? row + b * F::kBytes : nullptr, r, stages[b], buffer[b]);
    }
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const PackStage<F>& st = stages[b];
    for (int64_t t0 = 0; t0 < 64; t0 += 16) transpose16(st.u[0] + 4 * t0, kBlock, buffer[b].u + t0 * 64);
    for (int part = 0; part < PackedBlock<F>::kRowsSP / 16; ++part) {
      transpose16(reinterpret_cast<const uint8_t*>(st.sp[part][0]), 64, reinterpret_cast<uint8_t*>(buffer[b].sp[16 * part]));
    }
  }
  return buffer.data();
}
#endif

}  // namespace tram::q8k
