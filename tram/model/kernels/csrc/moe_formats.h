// The expert weight formats of fused_moe.cpp: a stacked weight [E, N, ...] over K inputs, with
//   dot<MB, NB>(x, ldx, e, n, sums): sums[m][j] = row m of x (float32, stride ldx, zero-padded to a
//       multiple of 32 k) times row n + j of expert e (quant_rows.h's dot_tile, or GGUF blocks);
//   fill(e, n, count, ld, buf): rows n .. n + count - 1 of expert e dequantized to float32 into
//       buf [count, ld], zeros past K (the tiles tiled_gemm.h multiplies).
#pragma once

#include "gguf_blocks.h"
#include "gguf_x8.h"
#include "gguf_x8_gemm.h"
#include "gguf_q8k.h"
#include "gguf_q8k_gemm.h"
#include "prefetch.h"
#include "quant_rows.h"
#include "simd.h"

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace tram::moe {

using namespace tram::simd;

// Every format but GgufQ8KFormat multiplies float32 rows of x; that one int8 rows (Moe quantizes them).
template <typename Fmt>
inline constexpr bool kInt8Rows = false;

template <typename T>
struct FloatFormat {
  const T* w;
  int64_t N, K;
  TRAM_INLINE tram::rows::FloatRows<T> rows(int64_t e, int64_t n) const { return {w + (e * N + n) * K, K}; }
  template <int64_t MB, int64_t NB>
  TRAM_INLINE void dot(const float* x, int64_t ldx, int64_t e, int64_t n, float (&s)[MB][NB]) const {
    tram::rows::dot_tile<MB, NB>(x, ldx, rows(e, n), K, s);
  }
  void fill(int64_t e, int64_t n, int64_t count, int64_t ld, float* buf) const {
    tram::rows::fill_rows(rows(e, n), nullptr, count, K, ld, buf);
  }
};

struct Int8Format {
  const int8_t* q;
  const float* scale;  // [E, N]
  int64_t N, K;
  TRAM_INLINE tram::rows::Int8Rows rows(int64_t e, int64_t n) const { return {q + (e * N + n) * K, K}; }
  template <int64_t MB, int64_t NB>
  TRAM_INLINE void dot(const float* x, int64_t ldx, int64_t e, int64_t n, float (&s)[MB][NB]) const {
    tram::rows::dot_tile<MB, NB>(x, ldx, rows(e, n), K, s);
    for (int64_t m = 0; m < MB; ++m) {
      for (int64_t j = 0; j < NB; ++j) s[m][j] *= scale[e * N + n + j];
    }
  }
  void fill(int64_t e, int64_t n, int64_t count, int64_t ld, float* buf) const {
    tram::rows::fill_rows(rows(e, n), scale + e * N + n, count, K, ld, buf);
  }
};

// kZero: a zero point per group ([E, N, K / group] uint8, a quantized checkpoint's: AWQ, asymmetric
// GPTQ and compressed-tensors), w = (q - zero) * scale; else 8, Tram's symmetric int4.
template <bool kZero>
struct Int4Format {
  const uint8_t* q;
  const float* scale;  // [E, N, K / group]
  const uint8_t* zero;  // [E, N, K / group] (kZero only)
  int64_t N, K, group;
  TRAM_INLINE tram::rows::Int4Rows<kZero> rows(int64_t e, int64_t n) const {
    const int64_t g0 = (e * N + n) * (K / group);
    return {q + (e * N + n) * (K / 2), scale + g0, kZero ? zero + g0 : nullptr, K, group};
  }
  template <int64_t MB, int64_t NB>
  TRAM_INLINE void dot(const float* x, int64_t ldx, int64_t e, int64_t n, float (&s)[MB][NB]) const {
    tram::rows::dot_tile<MB, NB>(x, ldx, rows(e, n), K, s);
  }
  void fill(int64_t e, int64_t n, int64_t count, int64_t ld, float* buf) const {
    tram::rows::fill_rows(rows(e, n), nullptr, count, K, ld, buf);
  }
};

// GGUF blocks of type F: each block's scales decoded once per row, its chunks of 32 widened in
// registers (bit for bit gguf's dequantized weights), summed as quant_rows.h's dot_tile sums.
template <typename F>
struct GgufFormat {
  const uint8_t* data;
  int64_t N, K, row_bytes;
  template <int64_t MB, int64_t NB>
  TRAM_INLINE void dot(const float* x, int64_t ldx, int64_t e, int64_t n, float (&s)[MB][NB]) const {
    using tram::gguf_float::kChunk;
    const uint8_t* w = data + (e * N + n) * row_bytes;
    vf16 even[MB][NB] = {}, odd[MB][NB] = {};
    for (int64_t b = 0; b < K / F::kBlock; ++b) {
      F blk[NB];
      for (int64_t j = 0; j < NB; ++j) {
        blk[j].load(w + j * row_bytes + b * F::kBytes);
        prefetch_ahead(w + j * row_bytes + b * F::kBytes, F::kBytes);
      }
      const float* xb = x + b * F::kBlock;
#pragma GCC unroll 8
      for (int64_t c = 0; c < F::kBlock / kChunk; ++c) {
        vf16 w0[NB], w1[NB];
        for (int64_t j = 0; j < NB; ++j) blk[j].chunk(c, w0[j], w1[j]);
        for (int64_t m = 0; m < MB; ++m) {
          const vf16 x0 = vload<vf16>(xb + m * ldx + c * kChunk), x1 = vload<vf16>(xb + m * ldx + c * kChunk + 16);
          for (int64_t j = 0; j < NB; ++j) {
            even[m][j] += w0[j] * x0;
            odd[m][j] += w1[j] * x1;
          }
        }
      }
    }
    for (int64_t m = 0; m < MB; ++m) {
      for (int64_t j = 0; j < NB; ++j) s[m][j] = hsum(even[m][j] + odd[m][j]);
    }
  }
  void fill(int64_t e, int64_t n, int64_t count, int64_t ld, float* buf) const {
    for (int64_t j = 0; j < count; ++j) {
      tram::gguf_float::dequantize_row<F>(data + (e * N + n + j) * row_bytes, K, buf + j * ld);
      std::fill(buf + j * ld + K, buf + (j + 1) * ld, 0.0f);
    }
  }
};

#if defined(TRAM_Q8K_KERNELS)
// A K-quant (Q4_K, Q5_K, Q6_K) with activations quantized per 256 k (gguf_q8k.h, llama.cpp's
// numerics): dot_q<MB, NB>(x, m0, e, n, sums) multiplies rows m0 .. of the quantized rows x. No
// fill: at every token count the same integer dot products, so a token's result does not depend
// on how many share its expert.
template <typename F>
struct GgufQ8KFormat {
  using Block = F;
  const uint8_t* data;
  int64_t N, K, row_bytes;
  template <int64_t MB, int64_t NB>
  TRAM_INLINE void dot_q(const tram::q8k::Rows& x, int64_t m0, int64_t e, int64_t n, float (&s)[MB][NB]) const {
#if defined(TRAM_Q8K_512)
    tram::q8k::dot_tile<F, MB, NB>(x, m0, data + (e * N + n) * row_bytes, row_bytes, K / tram::q8k::kBlock, s);
#else
    // One row of W per tile with AVX2's 16 registers (two measured slower for Q6_K, as in gguf_int8.cpp).
    for (int64_t j = 0; j < NB; ++j) {
      float one[MB][1];
      tram::q8k::dot_tile<F, MB, 1>(x, m0, data + (e * N + n + j) * row_bytes, row_bytes, K / tram::q8k::kBlock, one);
      for (int64_t m = 0; m < MB; ++m) s[m][j] = one[m][0];
    }
#endif
  }
#if defined(TRAM_Q8K_GEMM)
  // Rows n .. n + rows - 1 (rows <= kPackRows) of expert e times rows p_begin .. p_end - 1 of x, repacked
  // once (gguf_q8k_gemm.h, the same numbers as dot_q): store(p, out) gets row p's kPackRows outputs.
  template <typename Store>
  void gemm(const tram::q8k::Rows& x, int64_t p_begin, int64_t p_end, int64_t e, int64_t n, int64_t rows,
            const Store& store) const {
    const int64_t blocks = K / tram::q8k::kBlock;
    const auto* tile = tram::q8k::pack_tile<F>(data + (e * N + n) * row_bytes, row_bytes, rows, blocks);
    tram::q8k::gemm_tile<F>(x, p_begin, p_end, tile, blocks, store);
  }
#endif
};

template <typename F>
inline constexpr bool kInt8Rows<GgufQ8KFormat<F>> = true;
#endif

// Formats multiplied a group of rows of W at a time, at every token count (no dot, no fill).
template <typename Fmt>
inline constexpr bool kGrouped = false;

#if defined(TRAM_X8_KERNELS)
// K-quant experts repacked eight rows at a time (gguf_x8.h's layout L), int8 rows of x: one kernel at every
// token count, so a token's result does not depend on how many share its expert.
template <typename L>
struct GgufX8Format {
  const uint8_t* data;
  int64_t N, K, row_bytes;
  // Rows n .. n + 7 (n a multiple of 8) of expert e times rows p_begin .. p_end - 1 of x: store(p, out)
  // gets row p's 8 outputs.
  template <typename Store>
  void group(const tram::q8k::Rows& x, int64_t p_begin, int64_t p_end, int64_t e, int64_t n, const Store& store) const {
    tram::x8::group_times<L>(x, p_begin, p_end, data + (e * N + n) * row_bytes, K / tram::q8k::kBlock, store);
  }
#if defined(TRAM_X8_GEMM)
  // Q4_K x8 experts with many tokens: rows n .. n + rows - 1 (rows <= 16) on the 512-bit GEMM, the
  // same numbers as group(): store(p, out) gets row p's 16 outputs.
  static constexpr bool kGemm = std::is_same_v<L, tram::x8::Q4K>;
  template <typename Store>
  void gemm(const tram::q8k::Rows& x, int64_t p_begin, int64_t p_end, int64_t e, int64_t n, int64_t rows,
            const Store& store) const {
    tram::x8::gemm_rows(x, p_begin, p_end, data + e * N * row_bytes, row_bytes, K, n, rows, store);
  }
#else
  static constexpr bool kGemm = false;
#endif
};

template <typename L>
inline constexpr bool kInt8Rows<GgufX8Format<L>> = true;
template <typename L>
inline constexpr bool kGrouped<GgufX8Format<L>> = true;
#endif

}  // namespace tram::moe
