// fused_moe.cpp's bfloat16 experts with many tokens on the AMX tile unit (tdpbf16ps): one instruction
// multiplies 16 rows of W by 32 k of 16 tokens: 8,192 products, 256 vdpbf16ps instructions' worth.
//
// Why: past a few tokens per expert (prefill chunks, large decode batches) the vector paths are bound by
// the FMA units: tiled_gemm.h widens each tile to float32 and multiplies at 32 FMAs a cycle, where the
// tile unit does several hundred bf16 products a cycle (docs/benchmarks.md, "bf16 experts on AMX tiles").
//
// Layout: W stays as stored, row-major bfloat16, and is the A operand (a tile is 16 rows of W by 32 k,
// loaded with W's row stride: no packing pass over the weights). The tokens are B: an expert's tokens
// are transposed once per call into tiles of 16 tokens by 32 k, 16 rows of pairs of k (TileTokens::x).
// So a product tile is [16 outputs][16 tokens]. The gate/up projection writes act(gate, up), rounded to
// bfloat16, straight into the down projection's B tiles (TileTokens::act); the down projection's product
// tiles are transposed into y2's rows.
//
// Arithmetic: bf16 products (exact in float32) summed in float32 by the tile unit, 32 k per instruction
// in its own order, so the outputs differ in the last bits from the vector paths'. act is rounded to
// bfloat16 between the projections (the vector paths keep float32), as transformers' bf16 experts round
// it. An output depends only on its token and its weight row, not on the other tokens of the call or on
// the threads; which path an expert takes depends on its token count (kMinTokens).
#pragma once

#include "amx.h"
#include "dynamic_for.h"
#include "moe_state.h"
#include "tiled_gemm.h"

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#if defined(TRAM_AMX) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define TRAM_MOE_AMX 1

namespace tram::moe::amx_bf16 {

using BF16 = c10::BFloat16;

constexpr int64_t kTokens = 16;          // tokens per B tile
constexpr int64_t kK = 32;               // k per tile product
constexpr int64_t kTileWords = 16 * 16;  // a B tile: 16 rows of 16 bfloat16 pairs
constexpr int64_t kMinTokens = 4;        // an expert with this many tokens multiplies on tiles
// Blocks of k ahead that the rows of W are prefetched: a tile's 16 rows are 16 streams (a page apart
// for H = 2048), too many for the hardware prefetchers to run ahead on.
constexpr int64_t kAhead = 8;

// Whether the call's experts may go to tiles: bfloat16 x and weights, H and I whole blocks of k.
inline bool applies(int64_t H, int64_t I) { return H % kK == 0 && I % kK == 0 && tram::amx::usable(); }

// Expert e's tiles of tokens: those holding them, and those kept for them (an even count: product_2x2
// takes two at a time; an odd one's last is zeros).
inline int64_t token_tiles(const Moe& s, int64_t e) { return (s.count(e) + kTokens - 1) / kTokens; }
inline int64_t kept_tiles(const Moe& s, int64_t e) { return 2 * ((s.count(e) + 2 * kTokens - 1) / (2 * kTokens)); }

// Which experts take the tiles, and room for their tokens.
inline void plan(Moe& s) {
  TileTokens& t = s.tiles;
  t.first.assign(static_cast<size_t>(s.E), -1);
  t.tiles = 0;
  for (int64_t e = 0; e < s.E; ++e) {
    if (s.count(e) < kMinTokens) continue;
    t.first[e] = t.tiles;
    t.tiles += kept_tiles(s, e);
  }
  t.x.grow(t.tiles * (s.H / kK) * kTileWords);
  t.act.grow(t.tiles * (s.I / kK) * kTileWords);
}

// Tile `tile` of expert e's tokens (its pairs 16 * tile ..), every block of k, transposed from x's rows
// (a pair of bfloat16 is one 32-bit lane, so this is transpose16 on 32-bit words); zeros past its last.
inline void pack_tokens(const Moe& s, const BF16* x, int64_t e, int64_t tile) {
  const int64_t p0 = s.start[e] + kTokens * tile, n = std::min(kTokens, s.start[e + 1] - p0);
  uint32_t* out = s.tiles.x.data() + (s.tiles.first[e] + tile) * (s.H / kK) * kTileWords;
  for (int64_t kb = 0; kb < s.H / kK; ++kb) {
    vf16 r[kTokens];
    for (int64_t m = 0; m < kTokens; ++m) r[m] = m < n ? vload<vf16>(x + s.token[p0 + m] * s.H + kb * kK) : vf16{};
    tram::gemm::transpose16(r);
    for (int64_t i = 0; i < 16; ++i) vstore(out + kb * kTileWords + i * 16, r[i]);
  }
}

inline void pack_all_tokens(const Moe& s, const BF16* x) {
  std::vector<std::pair<int64_t, int64_t>> items;
  for (int64_t e = 0; e < s.E; ++e) {
    if (!s.on_tiles(e)) continue;
    for (int64_t t = 0; t < token_tiles(s, e); ++t) items.emplace_back(e, t);
  }
  // The last tile of an expert with an odd number of them stays unwritten above: zero it here.
  for (int64_t e = 0; e < s.E; ++e) {
    if (!s.on_tiles(e) || token_tiles(s, e) == kept_tiles(s, e)) continue;
    const int64_t last = s.tiles.first[e] + token_tiles(s, e);
    uint32_t* out = s.tiles.x.data() + last * (s.H / kK) * kTileWords;
    std::fill(out, out + (s.H / kK) * kTileWords, 0u);
  }
  tram::parallel::dynamic_for(static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) pack_tokens(s, x, items[i].first, items[i].second);
  });
}

// Product tiles c[0..3] = (a0 x b0, a0 x b1, a1 x b0, a1 x b1) over `blocks` blocks of 32 k: a0 and a1
// are 16 rows of W each (row stride lda), b0 and b1 two tiles of tokens. Two by two, each loaded tile
// feeds two products. Tiles 0-3 hold the products, 4-5 W, 6-7 the tokens.
TRAM_INLINE void product_2x2(const BF16* a0, const BF16* a1, int64_t lda, const uint32_t* b0, const uint32_t* b1,
                             int64_t blocks, float (&c)[4][256]) {
  const int64_t stride = lda * static_cast<int64_t>(sizeof(BF16));
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kb = 0; kb < blocks; ++kb) {
    if (kb + kAhead < blocks) {
      for (int64_t i = 0; i < 16; ++i) {
        __builtin_prefetch(a0 + i * lda + (kb + kAhead) * kK, 0, 2);
        __builtin_prefetch(a1 + i * lda + (kb + kAhead) * kK, 0, 2);
      }
    }
    _tile_loadd(4, a0 + kb * kK, stride);
    _tile_loadd(6, b0 + kb * kTileWords, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b1 + kb * kTileWords, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a1 + kb * kK, stride);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
}

// Two rows of act (outputs n and n + 1, 16 tokens each) rounded to bfloat16 and interleaved: one row of
// the down projection's B tile.
TRAM_INLINE void store_pair(uint32_t* out, vf16 even, vf16 odd) {
  const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh((__m512)even));
  const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh((__m512)odd));
  _mm512_storeu_si512(out, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
}

// Gate and up rows i0 .. i0 + 31 of expert e (i0 a multiple of 32) for all its tokens: act into block
// i0 / 32 of its act tiles.
inline void gate_up(const BF16* w13, const Moe& s, int64_t e, int64_t i0) {
  tram::amx::configure(8);
  const int64_t hb = s.H / kK, ib = s.I / kK, first = s.tiles.first[e];
  const float* bias = s.b13 != nullptr ? s.b13 + e * 2 * s.I : nullptr;
  alignas(64) float c[4][256];
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t n = i0 + 16 * half;
    const BF16* gate = w13 + (e * 2 * s.I + n) * s.H;
    const BF16* up = gate + s.I * s.H;
    for (int64_t tile = 0; tile < kept_tiles(s, e); tile += 2) {
      const uint32_t* b0 = s.tiles.x.data() + (first + tile) * hb * kTileWords;
      product_2x2(gate, up, s.H, b0, b0 + hb * kTileWords, hb, c);
      for (int64_t h = 0; h < 2; ++h) {
        uint32_t* out = s.tiles.act.data() + ((first + tile + h) * ib + i0 / kK) * kTileWords;
        for (int64_t j = 0; j < 16; j += 2) {
          vf16 a[2];
          for (int64_t q = 0; q < 2; ++q) {
            const float gb = bias != nullptr ? bias[n + j + q] : 0.0f, ub = bias != nullptr ? bias[s.I + n + j + q] : 0.0f;
            a[q] = s.activation(vload<vf16>(c[h] + (j + q) * 16) + gb, vload<vf16>(c[2 + h] + (j + q) * 16) + ub);
          }
          store_pair(out + (8 * half + j / 2) * 16, a[0], a[1]);
        }
      }
    }
  }
  _tile_release();
}

// Down rows n0 .. n0 + r - 1 of expert e (r a multiple of 32) for all its tokens, into their rows of y2.
inline void down(const BF16* w2, const Moe& s, int64_t e, int64_t n0, int64_t r) {
  tram::amx::configure(8);
  const int64_t ib = s.I / kK, first = s.tiles.first[e], p1 = s.start[e + 1];
  alignas(64) float c[4][256];
  for (int64_t n = n0; n < n0 + r; n += 32) {
    const BF16* a0 = w2 + (e * s.H + n) * s.I;
    for (int64_t tile = 0; tile < kept_tiles(s, e); tile += 2) {
      const uint32_t* b0 = s.tiles.act.data() + (first + tile) * ib * kTileWords;
      product_2x2(a0, a0 + 16 * s.I, s.I, b0, b0 + ib * kTileWords, ib, c);
      for (int64_t q = 0; q < 4; ++q) {
        const int64_t rows = n + 16 * (q / 2), p0 = s.start[e] + kTokens * (tile + q % 2);
        vf16 v[16];
        for (int64_t i = 0; i < 16; ++i) v[i] = vload<vf16>(c[q] + i * 16);
        tram::gemm::transpose16(v);  // v[m]: token m's 16 outputs
        const vf16 b = s.b2 != nullptr ? vload<vf16>(s.b2 + e * s.H + rows) : vf16{};
        for (int64_t m = 0; m < kTokens && p0 + m < p1; ++m) vstore(s.y2_at(p0 + m) + rows, v[m] + b);
      }
    }
  }
  _tile_release();
}

}  // namespace tram::moe::amx_bf16
#endif
