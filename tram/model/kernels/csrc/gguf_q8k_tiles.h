// The K-quants in the file's layout times int8 activations on AMX tiles, W as the tile product's A
// operand: each block of 16 rows of W decoded once per call straight into tiles, no repacked copy.
//
// Why: gguf_q8k_gemm.h's tile path builds B tiles of W (its quants transposed 4 k at a time across 16
// rows, then split), three passes per weight that cost what the tile unit saves below 32 rows of x, so
// a decode batch of 16 (the LM head above all: 311M Q6_K weights read for 16 rows of x) stayed on the
// vpdpbusd loop, compute-bound far above its bytes' time. As the A operand a row of W is its 64 k in order,
// as the block reader decodes them: one pass, the split in registers. x, small, takes the transposes.
//
// Numerics: as gguf_q8k_gemm.h's tile path, each quant times its sub-scale (Q6_K with its zero point) is
// exact in int16 and split into lo = w & 63 and hi = w >> 6, so 64 * Hi + Lo is the vpdpbusd loop's exact
// integer per block; the float steps are block_step's, per output: fma(float(I), d_w * d_x, acc), with
// the minimums' share beside it (Q4_K/Q5_K). A row's outputs keep their bits whichever kernel ran.
#pragma once

#include "gguf_q8k_gemm.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace tram::q8k::tiles {

#if defined(TRAM_Q8K_AMX)
#define TRAM_Q8K_TILES 1

constexpr int64_t kRowsW = 16;  // rows of W per tile: the A operand's rows
constexpr int64_t kRowsX = 16;  // rows of x per tile: the B operand's columns
constexpr int64_t kChunks = kBlock / 64;  // tile products per block: 64 k each
// Rows of x on the tiles, [kMinRows, kMaxRows): a tile of x costs the same for 1 row as for 16, so
// below kMinRows the vpdpbusd loop is faster; from kMaxRows gguf_q8k_gemm.h's split tiles, which load
// W once for every 16 rows of x, are as fast.
constexpr int64_t kMinRows = 5;
constexpr int64_t kMaxRows = 64;

using tram::amx::usable;

// x in the tile unit's B layout, for all of a call's rows: per tile of 16 rows T and block b, 4 chunks of
// 16 steps (4 k) by 16 rows of x by 4 bytes; beside them d_x and, with minimums, the rows' pairs of sums
// per 32 k (activation_pairs'), each as 16 lanes over the rows of x. Rows past M are zeros.
struct XTiles {
  int64_t tiles = 0, blocks = 0;
  std::vector<int8_t> q;
  std::vector<float> dx;
  std::vector<int32_t> pairs;
  int64_t at(int64_t t, int64_t b, int64_t c) const { return ((t * blocks + b) * kChunks + c) * 1024; }
  const int8_t* chunk(int64_t t, int64_t b, int64_t c) const { return q.data() + at(t, b, c); }
  const float* d(int64_t t, int64_t b) const { return dx.data() + (t * blocks + b) * kRowsX; }
  const int32_t* pair(int64_t t, int64_t b, int p) const { return pairs.data() + ((t * blocks + b) * 4 + p) * kRowsX; }
};

template <typename F>
void build_x(const Rows& x, int64_t M, int64_t blocks, XTiles& out) {
  out.tiles = (M + kRowsX - 1) / kRowsX, out.blocks = blocks;
  const auto n = static_cast<size_t>(out.tiles * blocks);
  out.q.assign(n * kChunks * 1024, 0);
  out.dx.assign(n * kRowsX, 0.0f);
  out.pairs.assign(F::kMins ? n * 4 * kRowsX : 0, 0);
  for (int64_t m = 0; m < M; ++m) {
    const int64_t t = m / kRowsX, i = m % kRowsX;
    for (int64_t b = 0; b < blocks; ++b) {
      const int8_t* src = x.q_at(m) + b * kBlock;
      for (int64_t c = 0; c < kChunks; ++c) {
        int8_t* dst = out.q.data() + out.at(t, b, c) + 4 * i;
        for (int64_t s = 0; s < 16; ++s) std::memcpy(dst + 64 * s, src + 64 * c + 4 * s, 4);
      }
      out.dx[static_cast<size_t>((t * blocks + b) * kRowsX + i)] = x.d_at(m)[b];
      if constexpr (F::kMins) {
        alignas(32) int32_t ap[8];
        activation_pairs<F>(x.bs_at(m) + b * (kBlock / kSum), ap);
        for (int p = 0; p < 4; ++p) out.pairs[static_cast<size_t>(((t * blocks + b) * 4 + p) * kRowsX + i)] = ap[p];
      }
    }
  }
}

// One block of 16 rows of W as A tiles: per chunk, row r's 64 k (quant times sub-scale) split into lo and
// hi; the rows' d_w, -dmin_w and minimums' int16 pairs (m_2p, m_2p+1).
struct alignas(64) WBlock {
  uint8_t lo[kChunks][kRowsW][64];
  int8_t hi[kChunks][kRowsW][64];
  float d[kRowsW], dmin[kRowsW];
  int32_t pairs[kRowsW][4];
};

// Per chunk, the sub-scale of each int16 lane as unpacking by bytes lays them: lane L of 128 bits (k
// 16L .. 16L + 15 of the chunk) is Q4_K/Q5_K's group 2c + L / 2 (32 k), Q6_K's 4c + L (16 k).
template <typename F>
struct ScaleIdx {
  __m512i chunk[kChunks];
  ScaleIdx() {
    alignas(64) int16_t idx[32];
    for (int64_t c = 0; c < kChunks; ++c) {
      for (int w = 0; w < 32; ++w) idx[w] = static_cast<int16_t>(F::kMins ? 2 * c + w / 16 : 4 * c + w / 8);
      chunk[c] = _mm512_load_si512(idx);
    }
  }
};

template <typename F>
TRAM_INLINE void build_row(const uint8_t* block, int64_t r, const ScaleIdx<F>& idx, WBlock& out) {
  if (block == nullptr) {
    for (int64_t c = 0; c < kChunks; ++c) std::memset(out.lo[c][r], 0, 64), std::memset(out.hi[c][r], 0, 64);
    out.d[r] = 0.0f, out.dmin[r] = 0.0f;
    std::memset(out.pairs[r], 0, sizeof(out.pairs[r]));
    return;
  }
  F blk;
  blk.load(block);
  const __m512i s16 = _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk.s)));
  const __m512i low6 = _mm512_set1_epi16(63), none = _mm512_setzero_si512();
  const __m512i zero = _mm512_set1_epi16(F::kMins ? 0 : 32);  // Q6_K's zero point
  for (int64_t c = 0; c < kChunks; ++c) {
    const __m512i u = blk.quants(static_cast<int>(c)), sc = _mm512_permutexvar_epi16(idx.chunk[c], s16);
    const __m512i wa = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_unpacklo_epi8(u, none), zero), sc);
    const __m512i wb = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_unpackhi_epi8(u, none), zero), sc);
    _mm512_store_si512(out.lo[c][r], _mm512_packus_epi16(_mm512_and_si512(wa, low6), _mm512_and_si512(wb, low6)));
    _mm512_store_si512(out.hi[c][r], _mm512_packs_epi16(_mm512_srai_epi16(wa, 6), _mm512_srai_epi16(wb, 6)));
  }
  out.d[r] = blk.d, out.dmin[r] = blk.dmin;
  if constexpr (F::kMins) std::memcpy(out.pairs[r], blk.s + 8, sizeof(out.pairs[r]));
}

TRAM_INLINE void prefetch_block(const uint8_t* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 2);
  __builtin_prefetch(p + bytes - 1, 0, 2);
}

// Tiles 0-1: Lo and Hi (16 rows of W by 16 rows of x, int32); 2-3: 64 k of lo and hi; 4: 64 k of x.
inline void configure() { tram::amx::configure(5); }

// Block b's Lo and Hi of W's tile against x's tile t, then the float steps into acc and accm ([row of
// W][row of x]).
template <typename F>
TRAM_INLINE void block_tile(const WBlock& w, const XTiles& xt, int64_t t, int64_t b, float* acc, float* accm) {
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t c = 0; c < kChunks; ++c) {
    _tile_loadd(2, w.lo[c], 64);
    _tile_loadd(3, w.hi[c], 64);
    _tile_loadd(4, xt.chunk(t, b, c), 64);
    _tile_dpbusd(0, 2, 4);
    _tile_dpbssd(1, 3, 4);
  }
  alignas(64) int32_t lo[kRowsW][kRowsX], hi[kRowsW][kRowsX];
  _tile_stored(0, lo, 64);
  _tile_stored(1, hi, 64);
  const __m512 dx = _mm512_loadu_ps(xt.d(t, b));
  for (int64_t r = 0; r < kRowsW; ++r) {
    const __m512i i = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(hi[r]), 6), _mm512_load_si512(lo[r]));
    float* a = acc + r * kRowsX;
    _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(_mm512_set1_ps(w.d[r]), dx), _mm512_loadu_ps(a)));
    if constexpr (F::kMins) {
      __m512i ip = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) ip = _mm512_dpwssd_epi32(ip, _mm512_set1_epi32(w.pairs[r][p]), _mm512_loadu_si512(xt.pair(t, b, p)));
      float* am = accm + r * kRowsX;
      _mm512_storeu_ps(am, _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), _mm512_mul_ps(_mm512_set1_ps(w.dmin[r]), dx), _mm512_loadu_ps(am)));
    }
  }
}

// Rows 0 .. rows - 1 (rows <= 16) of the W at w times every row of x (xt): store(m, out) gets row m's
// `rows` outputs. Configures the tiles and releases them.
template <typename F, typename Store>
void gemm_rows(const XTiles& xt, int64_t M, const uint8_t* w, int64_t row_bytes, int64_t rows, const Store& store) {
  thread_local std::vector<float> sums;
  const auto per_tile = static_cast<size_t>(2 * kRowsW * kRowsX);
  sums.assign(per_tile * static_cast<size_t>(xt.tiles), 0.0f);
  alignas(64) WBlock wb;
  const ScaleIdx<F> idx;
  configure();
  for (int64_t b = 0; b < xt.blocks; ++b) {
    for (int64_t r = 0; r < kRowsW; ++r) {
      const uint8_t* block = r < rows ? w + r * row_bytes + b * F::kBytes : nullptr;
      // The next tile's block at the same place: 16 rows read a block apart miss the prefetchers.
      if (block != nullptr) prefetch_block(block + kRowsW * row_bytes, F::kBytes);
      build_row<F>(block, r, idx, wb);
    }
    for (int64_t t = 0; t < xt.tiles; ++t) {
      float* acc = sums.data() + per_tile * static_cast<size_t>(t);
      block_tile<F>(wb, xt, t, b, acc, acc + kRowsW * kRowsX);
    }
  }
  _tile_release();
  for (int64_t t = 0; t < xt.tiles; ++t) {
    const float* acc = sums.data() + per_tile * static_cast<size_t>(t);
    for (int64_t i = 0; i < kRowsX && t * kRowsX + i < M; ++i) {
      float out[kRowsW];
      for (int64_t r = 0; r < kRowsW; ++r) out[r] = acc[r * kRowsX + i] + acc[(kRowsW + r) * kRowsX + i];
      store(t * kRowsX + i, static_cast<const float*>(out));
    }
  }
}

#endif

}  // namespace tram::q8k::tiles
