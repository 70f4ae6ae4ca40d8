// The K-quants times int8 activations for many rows of x (prefills, large decode batches, experts with
// many tokens): a tile of rows of W repacked so that one instruction multiplies 4 k of every row of the
// tile by 4 k of one row of x (AVX-512 VNNI: 16 rows, vpdpbusd, 64 products; AVX2: 8 rows, vpmaddubsw
// then vpmaddwd by the sub-scales, 32), with the sub-scales applied once per sub-block. Where the build
// has AMX, 16 rows of x at a time go to the tile unit instead (amx:: below).
//
// Why: gguf_q8k.h's row kernel decodes W again for every few rows of x and reduces per output; at 8-16
// rows of x and more it is compute-bound far below the cores' integer rate. Here a tile of W is decoded
// and repacked once per call and every row of x reuses it.
//
// Numerics: gguf_q8k.h's row kernel's, bit for bit, per ISA. Each output computes the same exact
// integers (in another order: integers do not care), then the same float steps (AVX-512: block_step
// on the block's I and Imin; AVX2: per lane of k, then hsum8's order): a row's result does not depend
// on which kernel multiplied it.
#pragma once

#include "amx.h"
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

// Row m of x's block b against a packed block whose exact sums (the scaled quants') are iblk: the pairs'
// share, then the float steps into acc (and, with minimums, accm). kZeroInI: Q6_K's iblk already holds
// the zero point's share, so I is iblk.
template <typename F, bool kZeroInI = false>
TRAM_INLINE void block_step(const Rows& x, int64_t m, int64_t b, const PackedBlock<F>& pb, __m512i iblk, __m512& acc,
                            __m512& accm) {
  if constexpr (kZeroInI && !F::kMins) {
    const __m512 dx = _mm512_set1_ps(x.d_at(m)[b]);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iblk), _mm512_mul_ps(_mm512_load_ps(pb.d), dx), acc);
    return;
  }
  alignas(32) int32_t ap[8];
  activation_pairs<F>(x.bs_at(m) + b * (kBlock / kSum), ap);
  __m512i ipair = _mm512_setzero_si512();
  for (int p = 0; p < PackedBlock<F>::kPairs; ++p) {
    ipair = _mm512_dpwssd_epi32(ipair, _mm512_load_si512(pb.pair(p)), _mm512_set1_epi32(ap[p]));
  }
  const __m512 dx = _mm512_set1_ps(x.d_at(m)[b]), d = _mm512_load_ps(pb.d);
  if constexpr (F::kMins) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iblk), _mm512_mul_ps(d, dx), acc);
    accm = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ipair), _mm512_mul_ps(_mm512_load_ps(pb.dmin), dx), accm);
  } else {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(iblk, ipair)), _mm512_mul_ps(d, dx), acc);
  }
}

// y(m, lanes) for rows m0 .. m0 + MB - 1 of x against a packed tile of `blocks` blocks: store(m, out)
// receives the 16 outputs of row m.
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
    for (int64_t m = 0; m < MB; ++m) block_step<F>(x, m0 + m, b, pb, iblk[m], acc[m], accm[m]);
  }
  for (int64_t m = 0; m < MB; ++m) {
    alignas(64) float out[kPackRows];
    _mm512_store_ps(out, _mm512_add_ps(acc[m], accm[m]));
    store(m0 + m, static_cast<const float*>(out));
  }
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

#if defined(TRAM_AMX) && defined(__AMX_INT8__)
#define TRAM_Q8K_AMX 1

// AMX: the tile unit multiplies 16 rows of x by 64 k of the 16 rows of a packed tile in one instruction,
// 16 times a vpdpbusd's products. It has no room for the sub-scales between groups of k, so they go into
// the weights: each quant times its sub-scale (Q4_K u * sc; Q6_K (u - 32) * sc with the zero point;
// exact in int16) split into two bytes, lo = w & 63 and hi = w >> 6, multiplied separately (hi signed).
// 64 * Hi + Lo is then the VNNI loop's exact integer (Q4_K iblk; Q6_K iblk plus the pairs' share), and
// the float steps follow as there: the same bits.
namespace amx {

constexpr int64_t kRowsX = 16;  // rows of x per tile product
// Rows of x from which splitting the tile pays (at 16 the split costs what the tile unit saves).
constexpr int64_t kMinRows = 32;
constexpr int64_t kStepBytes = kPackRows * 4;

using tram::amx::usable;

// A packed block's quants times their sub-scales, split: the tile unit's B layout (16 steps of 4 k of the
// 16 rows per 64 k), as PackedBlock::u.
struct alignas(64) SplitBlock {
  uint8_t lo[64 * kStepBytes];
  int8_t hi[64 * kStepBytes];
};

// A group's sub-scales (an int32 per row) laid over a step's bytes widened by unpacking (part 0: the low
// 8 bytes of each 128-bit lane, part 1: the high 8): int16 lane j of lane L gets row 4L + 2 * part + j / 4.
TRAM_INLINE __m512i row_scales(const int32_t* sc, int part) {
  alignas(64) int16_t idx[32];
  for (int j = 0; j < 32; ++j) idx[j] = static_cast<int16_t>(4 * (j / 8) + 2 * part + (j % 8) / 4);
  const __m256i sc16 = _mm512_cvtepi32_epi16(_mm512_load_si512(sc));
  return _mm512_permutexvar_epi16(_mm512_load_si512(idx), _mm512_castsi256_si512(sc16));
}

// Unpacking and packing back per 128-bit lane keeps the bytes in place: no cross-lane shuffle per step.
template <typename F>
void split_block(const PackedBlock<F>& pb, SplitBlock& out) {
  using P = PackedBlock<F>;
  const __m512i low6 = _mm512_set1_epi16(63), none = _mm512_setzero_si512();
  const __m512i zero = _mm512_set1_epi16(F::kMins ? 0 : 32);  // Q6_K's zero point
  for (int g = 0; g < P::kGroups; ++g) {
    const __m512i sa = row_scales(pb.scale(g), 0), sb = row_scales(pb.scale(g), 1);
    for (int t = g * P::kSteps; t < (g + 1) * P::kSteps; ++t) {
      const __m512i u = _mm512_load_si512(pb.u + t * kStepBytes);
      const __m512i wa = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_unpacklo_epi8(u, none), zero), sa);
      const __m512i wb = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_unpackhi_epi8(u, none), zero), sb);
      const __m512i lo = _mm512_packus_epi16(_mm512_and_si512(wa, low6), _mm512_and_si512(wb, low6));
      _mm512_store_si512(out.lo + t * kStepBytes, lo);
      _mm512_store_si512(out.hi + t * kStepBytes, _mm512_packs_epi16(_mm512_srai_epi16(wa, 6), _mm512_srai_epi16(wb, 6)));
    }
  }
}

template <typename F>
const SplitBlock* split_tile(const PackedBlock<F>* tile, int64_t blocks) {
  thread_local std::vector<SplitBlock> buffer;
  if (static_cast<int64_t>(buffer.size()) < blocks) buffer.resize(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) split_block<F>(tile[b], buffer[static_cast<size_t>(b)]);
  return buffer.data();
}

// Tiles 0-1: Lo and Hi (16 rows of x by 16 rows of W, int32); 2: 64 k of 16 rows of x; 3-4: 64 k of
// lo and of hi.
inline void configure() { tram::amx::configure(5); }

// Block b's Lo and Hi for rows m0 .. m0 + 15 of x, into lo[16][16] and hi[16][16].
TRAM_INLINE void block_sums(const Rows& x, int64_t m0, int64_t b, const SplitBlock& sb, int32_t* lo, int32_t* hi) {
  const int8_t* xb = x.q_at(m0) + b * kBlock;
  _tile_zero(0);
  _tile_zero(1);
  for (int j = 0; j < 4; ++j) {
    _tile_loadd(2, xb + 64 * j, x.ld);
    _tile_loadd(3, sb.lo + 16 * kStepBytes * j, kStepBytes);
    _tile_dpbsud(0, 2, 3);
    _tile_loadd(4, sb.hi + 16 * kStepBytes * j, kStepBytes);
    _tile_dpbssd(1, 2, 4);
  }
  _tile_stored(0, lo, 64);
  _tile_stored(1, hi, 64);
}

// gemm_rows<F, 16>'s outputs for rows m0 .. m0 + 15 of x.
template <typename F, typename Store>
void gemm_rows(const Rows& x, int64_t m0, const PackedBlock<F>* tile, const SplitBlock* split, int64_t blocks,
               const Store& store) {
  __m512 acc[kRowsX], accm[kRowsX];
  alignas(64) int32_t lo[kRowsX][kPackRows], hi[kRowsX][kPackRows];
  for (int64_t m = 0; m < kRowsX; ++m) acc[m] = _mm512_setzero_ps(), accm[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    block_sums(x, m0, b, split[b], &lo[0][0], &hi[0][0]);
    for (int64_t m = 0; m < kRowsX; ++m) {
      const __m512i iblk = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(hi[m]), 6), _mm512_load_si512(lo[m]));
      block_step<F, true>(x, m0 + m, b, tile[b], iblk, acc[m], accm[m]);
    }
  }
  for (int64_t m = 0; m < kRowsX; ++m) {
    alignas(64) float out[kPackRows];
    _mm512_store_ps(out, _mm512_add_ps(acc[m], accm[m]));
    store(m0 + m, static_cast<const float*>(out));
  }
}

}  // namespace amx
#endif

#elif defined(TRAM_Q8K_KERNELS) && !defined(TRAM_Q8K_512)  // AVX2 (AVX-512 without VNNI: the row kernel alone)
#define TRAM_Q8K_GEMM 1

// AVX2: 8 rows of W per tile, one int32 lane each; vpmaddubsw multiplies 4 k of all 8 by 4 k of one row
// of x and vpmaddwd applies the rows' sub-scales, 32 products per pair of instructions. The row kernel
// keeps each output's 8 lanes of k (lane l: k % 32 in 4l .. 4l + 3) apart until the end, so here each
// lane's exact integers are summed on their own (the 8 steps of 4 k that fall in it) and take the row
// kernel's float steps, then its horizontal sum's order.
constexpr int64_t kPackRows = 8;

// One block (256 k) of a tile of 8 rows of W:
//   u     [64][8][4]       step t (k 4t .. 4t + 3) of row r at (8 t + r) * 4
//   sc    [8 or 16][8]     the rows' sub-scales (groups of 32 k for Q4_K/Q5_K, 16 k for Q6_K), each
//                          as an int16 pair (sc, sc) for vpmaddwd
//   pair  [8][8]           int16 pairs that multiply the activations' pair p of partial sums: Q4_K/Q5_K
//                          (m_p, m_p), the minimums (Imin's lane p); Q6_K -32 * (sc_2p, sc_2p+1), the
//                          zero point's share of I's lane p (as gguf_q8k.h's zero_sums)
//   d, dmin [8]            d_w and -dmin_w
template <typename F>
struct PackedBlock {
  static constexpr int kGroups = F::kMins ? 8 : 16, kStepsPerGroup = 64 / kGroups;
  alignas(32) uint8_t u[64 * kPackRows * 4];
  alignas(32) int32_t sc[kGroups][kPackRows];
  alignas(32) int32_t pair[8][kPackRows];
  alignas(32) float d[kPackRows], dmin[kPackRows];
};

TRAM_INLINE int32_t int16_pair(int32_t lo, int32_t hi) {
  return static_cast<int32_t>(static_cast<uint16_t>(lo) | (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
}

// 8 rows of 8 int32 (row i at src + i * stride) transposed: out + 32 j holds int32 j of rows 0 .. 7.
TRAM_INLINE void transpose8(const uint8_t* src, int64_t stride, uint8_t* out) {
  __m256i r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_load_si256(reinterpret_cast<const __m256i*>(src + i * stride));
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // r[4i + j], 128-bit lane L: rows 4i .. 4i + 3 of int32 4L + j
  for (int i = 0; i < 2; ++i) {
    r[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + 32 * j), _mm256_permute2x128_si256(r[j], r[4 + j], 0x20));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + 32 * (4 + j)), _mm256_permute2x128_si256(r[j], r[4 + j], 0x31));
  }
}

// Row r's block (or zeros past the tile's rows: block null): its quants into stage (to be transposed),
// its scales, pairs and d into out.
template <typename F>
TRAM_INLINE void pack_row(const uint8_t* block, int64_t r, uint8_t (&stage)[kPackRows][kBlock], PackedBlock<F>& out) {
  using P = PackedBlock<F>;
  if (block == nullptr) {
    std::memset(stage[r], 0, kBlock);
    for (int g = 0; g < P::kGroups; ++g) out.sc[g][r] = 0;
    for (int p = 0; p < 8; ++p) out.pair[p][r] = 0;
    out.d[r] = 0.0f, out.dmin[r] = 0.0f;
    return;
  }
  F blk;
  blk.load(block);
  for (int c = 0; c < 4; ++c) {
    const V q = blk.quants(c);
    _mm256_store_si256(reinterpret_cast<__m256i*>(stage[r] + 64 * c), q.lo);
    _mm256_store_si256(reinterpret_cast<__m256i*>(stage[r] + 64 * c + 32), q.hi);
  }
  for (int g = 0; g < P::kGroups; ++g) out.sc[g][r] = int16_pair(blk.s[g], blk.s[g]);
  for (int p = 0; p < 8; ++p) {
    out.pair[p][r] = F::kMins ? int16_pair(blk.s[8 + p], blk.s[8 + p]) : int16_pair(-32 * blk.s[2 * p], -32 * blk.s[2 * p + 1]);
  }
  out.d[r] = blk.d, out.dmin[r] = blk.dmin;
}

// GCC reassociates the integer sums into a tree of 32 products per lane and spills them; a running
// sum in a register per row of x is what the loop needs.
TRAM_INLINE void keep_in_register(__m256i& v) { __asm__("" : "+x"(v)); }

// Rows 0 .. rows - 1 (rows <= 8) of the W at w packed, all `blocks` blocks, into a per-thread buffer.
template <typename F>
const PackedBlock<F>* pack_tile(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t blocks) {
  thread_local std::vector<PackedBlock<F>> buffer;
  if (static_cast<int64_t>(buffer.size()) < blocks) buffer.resize(static_cast<size_t>(blocks));
  alignas(32) uint8_t stage[kPackRows][kBlock];
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t r = 0; r < kPackRows; ++r) {
      const uint8_t* block = r < rows ? w + r * row_bytes + b * F::kBytes : nullptr;
      if (block != nullptr) tram::simd::prefetch_ahead(block, F::kBytes);
      pack_row<F>(block, r, stage, buffer[b]);
    }
    for (int64_t t0 = 0; t0 < 64; t0 += 8) transpose8(stage[0] + 4 * t0, kBlock, buffer[b].u + t0 * 32);
  }
  return buffer.data();
}

// Rows m0 .. m0 + MB - 1 of x against a packed tile: store(m, out) receives the 8 outputs of row m.
// Per block and lane l: the 8 steps t = l + 8s (one per sub-block of 32 k) summed exactly, then
// acc_l = fma(I_l, d_w * d_x, acc_l) and (Q4_K/Q5_K) acc_l = fma(Imin_l, -dmin_w * d_x, acc_l).
// Not inlined: inside the fused MoE kernel's loops GCC spilled the running sums to the stack.
template <typename F, int64_t MB, typename Store>
__attribute__((noinline)) void gemm_rows(const Rows& x, int64_t m0, const PackedBlock<F>* tile, int64_t blocks, const Store& store) {
  using P = PackedBlock<F>;
  alignas(32) float acc[MB][8][kPackRows] = {};
  for (int64_t b = 0; b < blocks; ++b) {
    const P& pb = tile[b];
    const int8_t* xq[MB];
    for (int64_t m = 0; m < MB; ++m) xq[m] = x.q_at(m0 + m) + b * kBlock;
    const __m256 d = _mm256_load_ps(pb.d), dmin = _mm256_load_ps(pb.dmin);
#pragma GCC unroll 1
    for (int l = 0; l < 8; ++l) {
      __m256i isum[MB];
      for (int64_t m = 0; m < MB; ++m) isum[m] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int s = 0; s < 8; ++s) {
        const int t = l + 8 * s;
        const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb.u + 32 * t));
        const __m256i sc = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb.sc[t / P::kStepsPerGroup]));
        for (int64_t m = 0; m < MB; ++m) {
          int32_t q4;
          std::memcpy(&q4, xq[m] + 4 * t, 4);
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, _mm256_set1_epi32(q4)), sc);
          isum[m] = _mm256_add_epi32(isum[m], p);
          keep_in_register(isum[m]);
        }
      }
      const __m256i pair = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb.pair[l]));
      for (int64_t m = 0; m < MB; ++m) {
        int32_t bs2;  // the activations' partial sums 2l and 2l + 1
        std::memcpy(&bs2, x.bs_at(m0 + m) + b * (kBlock / kSum) + 2 * l, 4);
        const __m256i ip = _mm256_madd_epi16(pair, _mm256_set1_epi32(bs2));
        const __m256 dx = _mm256_set1_ps(x.d_at(m0 + m)[b]);
        __m256 a = _mm256_load_ps(acc[m][l]);
        if constexpr (F::kMins) {
          a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[m]), _mm256_mul_ps(d, dx), a);
          a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ip), _mm256_mul_ps(dmin, dx), a);
        } else {
          a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(isum[m], ip)), _mm256_mul_ps(d, dx), a);
        }
        _mm256_store_ps(acc[m][l], a);
      }
    }
  }
  for (int64_t m = 0; m < MB; ++m) {  // tram::simd::hsum8's order over the lanes
    const auto lane = [&](int l) { return _mm256_load_ps(acc[m][l]); };
    const __m256 lo = _mm256_add_ps(_mm256_add_ps(lane(0), lane(1)), _mm256_add_ps(lane(2), lane(3)));
    const __m256 hi = _mm256_add_ps(_mm256_add_ps(lane(4), lane(5)), _mm256_add_ps(lane(6), lane(7)));
    alignas(32) float out[kPackRows];
    _mm256_store_ps(out, _mm256_add_ps(lo, hi));
    store(m0 + m, static_cast<const float*>(out));
  }
}
#endif

#if defined(TRAM_Q8K_GEMM)
constexpr int64_t kGemmRowsX = 4;  // rows of x per register tile (2, 6 or 8 measured no faster)
// Rows of x from which repacking W (of block type F) pays. AVX-512: from 5 for Q4_K/Q5_K; Q6_K's row
// kernel takes 5 or 6 rows in two passes over W as fast as the GEMM packs its tile, 7 in three
// (docs/benchmarks.md, "On an AVX-512 CPU without AMX"). AVX2: the pack (and its 8-row tiles) costs
// more, and the GEMM only matches the row kernel at 16 rows.
#if defined(TRAM_Q8K_512)
template <typename F>
inline constexpr int64_t kGemmMinRows = F::kMins ? 5 : 7;
constexpr int64_t kGemmMinRowsAny = 5;  // the fewest over the types
#else
template <typename F>
inline constexpr int64_t kGemmMinRows = 16;
constexpr int64_t kGemmMinRowsAny = 16;
#endif

// Rows m_begin .. m_end - 1 of x against a packed tile, in register tiles of kGemmRowsX rows.
template <typename F, typename Store>
void gemm_tile(const Rows& x, int64_t m_begin, int64_t m_end, const PackedBlock<F>* tile, int64_t blocks,
               const Store& store) {
  int64_t m = m_begin;
#if defined(TRAM_Q8K_AMX)
  if (m_end - m >= amx::kMinRows && amx::usable()) {
    const amx::SplitBlock* split = amx::split_tile<F>(tile, blocks);
    amx::configure();
    for (; m + amx::kRowsX <= m_end; m += amx::kRowsX) amx::gemm_rows<F>(x, m, tile, split, blocks, store);
    _tile_release();
  }
#endif
  for (; m + kGemmRowsX <= m_end; m += kGemmRowsX) gemm_rows<F, kGemmRowsX>(x, m, tile, blocks, store);
  for (; m < m_end; ++m) gemm_rows<F, 1>(x, m, tile, blocks, store);
}
#endif

}  // namespace tram::q8k
