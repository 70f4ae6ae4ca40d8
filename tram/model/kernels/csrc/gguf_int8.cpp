// y = x W^T (+ b) with W in a GGUF block layout and x quantized to int8 per 32 k, as llama.cpp's CPU
// backend and vLLM's GGUF kernels compute (the K-quants take x per 256 k instead, llama.cpp's Q8_K,
// in gguf_q8k.h's row kernel and gguf_q8k_gemm.h's repacked GEMM; Q4_K and Q6_K repacked at load, types
// 1012 and 1014, in gguf_x8.cpp): the weights' integer quants meet int8 activations in
// integer dot products (AVX-512 VNNI vpdpbusd; AVX-VNNI; AVX2 vpmaddubsw + vpmaddwd), and floats
// appear once per 4 k. Widening every weight to float32 (gguf_linear.cpp) costs 4-11 instructions
// per 16 weights of Q5_0 or Q6_K, which makes one-row decode compute-bound on those types; here a
// chunk of 64 weights costs ~10 to decode plus 4 per row of x. That wins on decode's few rows; at
// hundreds of rows the float path's tiled GEMM, which reuses each widened weight more, is as fast
// (docs/benchmarks.md, "Per kernel, float32 and int8 activations").
//
//   x     [M, K]          float32 or bfloat16; any M (decode batches and prefills take the same path)
//   data  [N, row_bytes]  uint8, the file's rows (gguf_linear.cpp lists the block layouts)
//   -> y  [M, N]          x's dtype
//
// x's rows: per 32 k, d = max|x| / 127 and q = round-to-nearest-even(x * (1 / d)) in -127..127.
// Weights: every type is an unsigned quant u (0..255) per weight with a float scale S and a float
// offset per sub-block: w = S * (u - z) (Q8_0: z = 128 after flipping the sign bit; Q4_0 8, Q5_0 16,
// Q6_K 32) or w = S * u + m (Q4_1, Q5_1, and Q4_K/Q5_K with m = -dmin * min).
//
// A "chunk" is 64 k = 16 lanes of 4 k. Per output, per chunk, per lane l (k = 4l .. 4l + 3):
//   i_l = sum(u * q) - z * sum(q)        exact int32
//   acc_l = fma(float(i_l), S_l * dx_l, acc_l)          then, for offset types,
//   acc_l = fma(m_l, float(sum(q)) * dx_l, acc_l)
// then y = hsum(acc) + b. Every output's sequence of float operations is fixed by K alone: the same
// for any M, tile shape, thread count or instruction set (the integer sums are exact everywhere),
// so a request's output does not depend on the batch it shares a step with.
#include "kernels.h"
#include "dynamic_for.h"
#include "gguf_int8_blocks.h"
#include "gguf_x8.h"
#include "gguf_x32.h"
#include "gguf_q8k.h"
#include "gguf_q8k_gemm.h"
#include "gguf_q8k_tiles.h"
#include "prefetch.h"
#include "simd.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace tram::simd;
using namespace tram::gguf_int8;


constexpr int64_t kChunk = 64;      // k per chunk
constexpr int64_t kLanes = 16;      // lanes per chunk, 4 k each
constexpr int64_t kXBlock = 32;     // k per activation scale
constexpr int64_t kGrainRows = 32;  // rows of W per thread task at least
constexpr int64_t kXRows = 64;      // rows of x per pass over a thread's rows of W (their int8 stays in L2)


TRAM_INLINE vf16 fmadd(vf16 a, vf16 b, vf16 c) {
#if defined(__AVX512F__)
  return bitcast<vf16>(_mm512_fmadd_ps(bitcast<__m512>(a), bitcast<__m512>(b), bitcast<__m512>(c)));
#elif defined(__FMA__)
  const __m256 lo = _mm256_fmadd_ps(bitcast<__m256>(low8(a)), bitcast<__m256>(low8(b)), bitcast<__m256>(low8(c)));
  const __m256 hi = _mm256_fmadd_ps(bitcast<__m256>(high8(a)), bitcast<__m256>(high8(b)), bitcast<__m256>(high8(c)));
  return join8(bitcast<vf8>(lo), bitcast<vf8>(hi));
#else
  vf16 r;
  for (int i = 0; i < 16; ++i) r[i] = std::fma(a[i], b[i], c[i]);
  return r;
#endif
}

// ---- the integer dot product of one chunk: 16 lanes of sum(u[4l..4l+3] * q[4l..4l+3]) + init ----

#if defined(__AVX512VNNI__) || defined(__AVX512BW__)
TRAM_INLINE __m512i m512(vu8x64 v) { return bitcast<__m512i>(v); }
#endif

// u unsigned 0..255 (0..63 without VNNI: vpmaddubsw's pairs must not saturate int16).
TRAM_INLINE vi16 dot_unsigned(vi16 init, vu8x64 u, const int8_t* q) {
  const vu8x64 x = vload<vu8x64>(q);
#if defined(__AVX512VNNI__)
  return bitcast<vi16>(_mm512_dpbusd_epi32(bitcast<__m512i>(init), m512(u), m512(x)));
#elif defined(__AVX512BW__)
  const __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(m512(u), m512(x)), _mm512_set1_epi16(1));
  return init + bitcast<vi16>(p);
#elif defined(__AVX2__)
  __m256i r[2];
  for (int h = 0; h < 2; ++h) {
    __m256i uh, xh, ih;
    std::memcpy(&uh, reinterpret_cast<const char*>(&u) + 32 * h, 32);
    std::memcpy(&xh, reinterpret_cast<const char*>(&x) + 32 * h, 32);
    std::memcpy(&ih, reinterpret_cast<const char*>(&init) + 32 * h, 32);
#if defined(__AVXVNNI__)
    r[h] = _mm256_dpbusd_avx_epi32(ih, uh, xh);
#else
    r[h] = _mm256_add_epi32(ih, _mm256_madd_epi16(_mm256_maddubs_epi16(uh, xh), _mm256_set1_epi16(1)));
#endif
  }
  return bitcast<vi16>(r);
#else
  vi16 r = init;
  for (int l = 0; l < 16; ++l) {
    for (int i = 0; i < 4; ++i) r[l] += static_cast<int32_t>(u[4 * l + i]) * static_cast<int32_t>(q[4 * l + i]);
  }
  return r;
#endif
}

// Q8_0's signed weights w: sum(w * q) per lane. With VNNI, (w ^ 0x80) = w + 128 is unsigned and
// init holds -128 * sum(q); without it, vpmaddubsw takes |w| and q with w's sign (llama.cpp's way,
// exact because q is never -128) and init is not needed. The integers agree.
TRAM_INLINE vi16 dot_signed(vi16 init, vu8x64 w, const int8_t* q) {
#if defined(__AVX512VNNI__) || (defined(__AVXVNNI__) && !defined(__AVX512BW__))
  return dot_unsigned(init, w ^ 0x80, q);
#elif defined(__AVX512BW__)
  (void)init;
  const __m512i x = _mm512_loadu_si512(q);
  const __m512i ws = m512(w);
  const __mmask64 neg = _mm512_movepi8_mask(ws);
  const __m512i xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
  return bitcast<vi16>(_mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(ws), xs), _mm512_set1_epi16(1)));
#elif defined(__AVX2__)
  (void)init;
  __m256i r[2];
  for (int h = 0; h < 2; ++h) {
    __m256i wh, xh;
    std::memcpy(&wh, reinterpret_cast<const char*>(&w) + 32 * h, 32);
    std::memcpy(&xh, q + 32 * h, 32);
    r[h] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wh, wh), _mm256_sign_epi8(xh, wh)),
                             _mm256_set1_epi16(1));
  }
  return bitcast<vi16>(r);
#else
  (void)init;
  vi16 r = {};
  for (int l = 0; l < 16; ++l) {
    for (int i = 0; i < 4; ++i) {
      r[l] += static_cast<int32_t>(static_cast<int8_t>(w[4 * l + i])) * static_cast<int32_t>(q[4 * l + i]);
    }
  }
  return r;
#endif
}

template <typename F>
constexpr bool kLegacy = F::kBlock == 32;

// ---- x quantized: per row, int8 quants padded to whole chunks and per-lane companions -------------

struct QuantizedX {
  int64_t M = 0, chunks = 0;
  std::vector<int8_t> q;      // [M, chunks * 64], zero past K
  std::vector<float> dl;      // [M, chunks * 16] the lane's d
  std::vector<float> sd;      // [M, chunks * 16] float(sum of the lane's q) * d   (offset types)
  std::vector<int32_t> init;  // [M, chunks * 16] -z * sum of the lane's q          (zero-point types)
  const int8_t* qrow(int64_t m) const { return q.data() + m * chunks * kChunk; }
  int64_t lane0(int64_t m) const { return m * chunks * kLanes; }
};

using tram::x32::quantize_block;

void quantize_x(const float* x, int64_t M, int64_t K, int64_t zero, bool offset, QuantizedX& out) {
  out.M = M;
  out.chunks = (K + kChunk - 1) / kChunk;
  const int64_t padded = out.chunks * kChunk, lanes = out.chunks * kLanes;
  out.q.assign(static_cast<size_t>(M * padded), 0);
  out.dl.assign(static_cast<size_t>(M * lanes), 0.0f);
  if (offset) out.sd.assign(static_cast<size_t>(M * lanes), 0.0f);
  if (zero != 0) out.init.assign(static_cast<size_t>(M * lanes), 0);
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      int8_t* q = out.q.data() + m * padded;
      float* dl = out.dl.data() + m * lanes;
      for (int64_t b = 0; b < K / kXBlock; ++b) {
        const float d = quantize_block(x + m * K + b * kXBlock, q + b * kXBlock);
        for (int l = 0; l < 8; ++l) dl[b * 8 + l] = d;
      }
      for (int64_t l = 0; l < lanes; ++l) {
        const int32_t s = q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3];
        if (offset) out.sd[m * lanes + l] = static_cast<float>(s) * dl[l];
        if (zero != 0) out.init[m * lanes + l] = static_cast<int32_t>(-zero * s);
      }
    }
  });
}

// ---- the linear -------------------------------------------------------------------------------

struct Args {
  const QuantizedX* x;
  int64_t K, N, row_bytes;
  const uint8_t* w;
  const void* bias;
  void* y;
};

template <typename F, int64_t MB, int64_t NB>
TRAM_INLINE void accumulate(const Args& a, int64_t m0, int64_t lc, const Chunk (&ch)[NB], vf16 (&acc)[MB][NB]) {
  const QuantizedX& x = *a.x;
  for (int64_t m = 0; m < MB; ++m) {
    const int8_t* q = x.qrow(m0 + m) + lc * kChunk;
    const int64_t l0 = x.lane0(m0 + m) + lc * kLanes;
    const vf16 dl = vload<vf16>(x.dl.data() + l0);
    const vi16 init = F::kZero != 0 ? vload<vi16>(x.init.data() + l0) : vi16{};
    for (int64_t j = 0; j < NB; ++j) {
      const vi16 i = F::kSigned ? dot_signed(init, ch[j].u, q) : dot_unsigned(init, ch[j].u, q);
      acc[m][j] = fmadd(to_float(i), ch[j].s * dl, acc[m][j]);
      if constexpr (F::kOffset) acc[m][j] = fmadd(ch[j].m, vload<vf16>(x.sd.data() + l0), acc[m][j]);
    }
  }
}

alignas(64) constexpr uint8_t kZeroBlock[64] = {};  // a missing second block: d = 0, quants 0

// Rows n0 .. n0 + NB - 1 of W, chunk by chunk: visit(lc, ch) with ch[j] the chunk lc of row n0 + j.
template <typename F, int64_t NB, typename Visit>
TRAM_INLINE void decode_rows(const Args& a, int64_t n0, Visit&& visit) {
  const uint8_t* w = a.w + n0 * a.row_bytes;
  if constexpr (kLegacy<F>) {
    const int64_t blocks = a.K / F::kBlock;
    for (int64_t lc = 0; 2 * lc < blocks; ++lc) {
      Chunk ch[NB];
      for (int64_t j = 0; j < NB; ++j) {
        const uint8_t* b0 = w + j * a.row_bytes + 2 * lc * F::kBytes;
        prefetch_ahead(b0, 2 * F::kBytes);
        if (2 * lc + 1 < blocks) {
          F::pair(b0, ch[j]);
        } else {
          F::chunk(b0, kZeroBlock, ch[j]);
        }
      }
      visit(lc, ch);
    }
  } else {
    for (int64_t b = 0; b < a.K / F::kBlock; ++b) {
      F blk[NB];
      for (int64_t j = 0; j < NB; ++j) {
        blk[j].load(w + j * a.row_bytes + b * F::kBytes);
        prefetch_ahead(w + j * a.row_bytes + b * F::kBytes, F::kBytes);
      }
      for (int64_t c = 0; c < F::kBlock / kChunk; ++c) {
        Chunk ch[NB];
        for (int64_t j = 0; j < NB; ++j) blk[j].chunk(c, ch[j]);
        visit(b * (F::kBlock / kChunk) + c, ch);
      }
    }
  }
}

template <typename T, int64_t MB, int64_t NB>
TRAM_INLINE void store_tile(const Args& a, int64_t m0, int64_t n0, const vf16 (&acc)[MB][NB]) {
  const T* bias = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y);
  for (int64_t m = 0; m < MB; ++m) {
    for (int64_t j = 0; j < NB; ++j) {
      const float bj = bias != nullptr ? load1(bias + n0 + j) : 0.0f;
      store(hsum(acc[m][j]) + bj, y + (m0 + m) * a.N + n0 + j);
    }
  }
}

// Outputs n0 .. n0 + NB - 1 for rows m0 .. m0 + MB - 1 of x, decoding W as it goes (few rows of x).
template <typename F, typename T, int64_t MB, int64_t NB>
TRAM_INLINE void tile(const Args& a, int64_t m0, int64_t n0) {
  vf16 acc[MB][NB] = {};
  decode_rows<F, NB>(a, n0, [&](int64_t lc, const Chunk (&ch)[NB]) { accumulate<F, MB, NB>(a, m0, lc, ch, acc); });
  store_tile<T, MB, NB>(a, m0, n0, acc);
}

// The same outputs from chunks decoded once (dec[j * chunks + lc]) for many rows of x: the same
// chunks and the same operations per output, so the same bits.
template <typename F, typename T, int64_t MB, int64_t NB>
TRAM_INLINE void tile_decoded(const Args& a, const Chunk* dec, int64_t m0, int64_t n0) {
  vf16 acc[MB][NB] = {};
  const int64_t chunks = a.x->chunks;
  for (int64_t lc = 0; lc < chunks; ++lc) {
    Chunk ch[NB];
    for (int64_t j = 0; j < NB; ++j) ch[j] = dec[j * chunks + lc];
    accumulate<F, MB, NB>(a, m0, lc, ch, acc);
  }
  store_tile<T, MB, NB>(a, m0, n0, acc);
}

#if defined(__AVX512F__)
constexpr int64_t kRowsOne = 2, kRowsMany = 4, kXTile = 4;
#else
constexpr int64_t kRowsOne = 1, kRowsMany = 2, kXTile = 2;
#endif

// Rows m_begin .. m_end of x for outputs n0 .. n0 + NB - 1. Past one tile of x rows, W's chunks are
// decoded once into `dec` (NB rows: ~60 KB at K = 4864, in L2) rather than once per tile of x.
template <typename F, typename T, int64_t NB>
TRAM_INLINE void rows_of_x(const Args& a, int64_t m_begin, int64_t m_end, int64_t n0, std::vector<Chunk>& dec) {
  int64_t m = m_begin;
  if (m_end - m_begin <= kXTile) {
    for (; m + kXTile <= m_end; m += kXTile) tile<F, T, kXTile, NB>(a, m, n0);
    for (; m < m_end; ++m) tile<F, T, 1, NB>(a, m, n0);
    return;
  }
  const int64_t chunks = a.x->chunks;
  dec.resize(static_cast<size_t>(NB * chunks));
  decode_rows<F, NB>(a, n0, [&](int64_t lc, const Chunk (&ch)[NB]) {
    for (int64_t j = 0; j < NB; ++j) dec[j * chunks + lc] = ch[j];
  });
  for (; m + kXTile <= m_end; m += kXTile) tile_decoded<F, T, kXTile, NB>(a, dec.data(), m, n0);
  for (; m < m_end; ++m) tile_decoded<F, T, 1, NB>(a, dec.data(), m, n0);
}

template <typename F, typename T>
void linear_impl(const Args& a) {
  const int64_t M = a.x->M;
  tram::parallel::dynamic_for(a.N, kGrainRows, [&](int64_t begin, int64_t end) {
    std::vector<Chunk> dec;
    for (int64_t mb = 0; mb < M; mb += kXRows) {
      const int64_t me = std::min(M, mb + kXRows);
      int64_t n = begin;
      if (me - mb == 1) {
        for (; n + kRowsOne <= end; n += kRowsOne) rows_of_x<F, T, kRowsOne>(a, mb, me, n, dec);
      } else {
        for (; n + kRowsMany <= end; n += kRowsMany) rows_of_x<F, T, kRowsMany>(a, mb, me, n, dec);
      }
      for (; n < end; ++n) rows_of_x<F, T, 1>(a, mb, me, n, dec);
    }
  });
}

// ---- the K-quants: activations per 256 k (gguf_q8k.h) ----------------------------------------------

#if defined(TRAM_Q8K_KERNELS)
// Rows of x per tile past one (then 2, then 1 for the rest) and rows of W per tile then; rows of W
// per tile at one row of x (two measured slower for Q6_K on AVX2).
constexpr int64_t kQ8KRowsX = 4, kQ8KRowsW = 1;
#if defined(TRAM_Q8K_512)
constexpr int64_t kQ8KOneRowW = 2;
#else
constexpr int64_t kQ8KOneRowW = 1;
#endif

// y[m, n0 .. n0 + count) = out[0 .. count) plus the bias: one row of a tile's outputs, in y's dtype.
template <typename T>
TRAM_INLINE void store_row(const Args& a, int64_t m, int64_t n0, int64_t count, const float* out) {
  const T* bias = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y) + m * a.N + n0;
  for (int64_t j = 0; j < count; ++j) store(out[j] + (bias != nullptr ? load1(bias + n0 + j) : 0.0f), y + j);
}

template <typename F, typename T, int64_t MB, int64_t NB>
TRAM_INLINE void q8k_tile(const tram::q8k::Rows& x, const Args& a, int64_t m0, int64_t n0) {
  float s[MB][NB];
  tram::q8k::dot_tile<F, MB, NB>(x, m0, a.w + n0 * a.row_bytes, a.row_bytes, a.K / tram::q8k::kBlock, s);
  for (int64_t m = 0; m < MB; ++m) store_row<T>(a, m0 + m, n0, NB, s[m]);
}

#if defined(TRAM_Q8K_GEMM)
// Many rows of x: tiles of kPackRows rows of W, each packed once and multiplied by every row of x.
template <typename F, typename T>
void q8k_gemm(const tram::q8k::Rows& x, int64_t M, const Args& a) {
  using tram::q8k::kPackRows;
  const int64_t tiles = (a.N + kPackRows - 1) / kPackRows, blocks = a.K / tram::q8k::kBlock;
  tram::parallel::dynamic_for(tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * kPackRows, rows = std::min(kPackRows, a.N - n0);
      const auto* tile = tram::q8k::pack_tile<F>(a.w + n0 * a.row_bytes, a.row_bytes, rows, blocks);
      tram::q8k::gemm_tile<F>(x, 0, M, tile, blocks,
                              [&](int64_t m, const float* out) { store_row<T>(a, m, n0, rows, out); });
    }
  });
}
#endif

#if defined(TRAM_Q8K_TILES)
// Rows of x on AMX tiles: x laid out once per call, each tile of 16 rows of W decoded once into A tiles.
template <typename F, typename T>
void q8k_tiles(const tram::q8k::Rows& x, int64_t M, const Args& a) {
  namespace tiles = tram::q8k::tiles;
  thread_local tiles::XTiles kept;
  tiles::XTiles& xt = kept;  // the lambda runs on other threads: each would name its own thread_local
  const int64_t count = (a.N + tiles::kRowsW - 1) / tiles::kRowsW;
  tiles::build_x<F>(x, M, a.K / tram::q8k::kBlock, xt);
  tram::parallel::dynamic_for(count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * tiles::kRowsW, rows = std::min(tiles::kRowsW, a.N - n0);
      tiles::gemm_rows<F>(xt, M, a.w + n0 * a.row_bytes, a.row_bytes, rows,
                          [&](int64_t m, const float* out) { store_row<T>(a, m, n0, rows, out); });
    }
  });
}

// Whether M rows of x take the tiles.
inline bool on_tiles(int64_t M) {
  return M >= tram::q8k::tiles::kMinRows && M < tram::q8k::tiles::kMaxRows && tram::q8k::tiles::usable();
}
#else
inline bool on_tiles(int64_t) { return false; }
#endif

// Outputs begin .. end - 1 of every row of x, on the row kernel.
template <typename F, typename T>
void q8k_rows(const tram::q8k::Rows& x, int64_t M, const Args& a, int64_t begin, int64_t end) {
  for (int64_t mb = 0; mb < M; mb += kXRows) {
    const int64_t me = std::min(M, mb + kXRows);
    int64_t n = begin;
    if (me - mb == 1) {
      for (; n + kQ8KOneRowW <= end; n += kQ8KOneRowW) q8k_tile<F, T, 1, kQ8KOneRowW>(x, a, mb, n);
      for (; n < end; ++n) q8k_tile<F, T, 1, 1>(x, a, mb, n);
      continue;
    }
    for (; n + kQ8KRowsW <= end; n += kQ8KRowsW) {
      int64_t m = mb;
      for (; m + kQ8KRowsX <= me; m += kQ8KRowsX) q8k_tile<F, T, kQ8KRowsX, kQ8KRowsW>(x, a, m, n);
      for (; m + 2 <= me; m += 2) q8k_tile<F, T, 2, kQ8KRowsW>(x, a, m, n);
      for (; m < me; ++m) q8k_tile<F, T, 1, kQ8KRowsW>(x, a, m, n);
    }
    for (; n < end; ++n) {
      for (int64_t m = mb; m < me; ++m) q8k_tile<F, T, 1, 1>(x, a, m, n);
    }
  }
}

template <typename F, typename T>
void q8k_linear(const tram::q8k::Rows& x, int64_t M, const Args& a) {
#if defined(TRAM_Q8K_TILES)
  if (on_tiles(M)) return q8k_tiles<F, T>(x, M, a);
#endif
#if defined(TRAM_Q8K_GEMM)
  if (M >= tram::q8k::kGemmMinRows<F>) return q8k_gemm<F, T>(x, M, a);
#endif
  tram::parallel::dynamic_for(a.N, kGrainRows, [&](int64_t begin, int64_t end) { q8k_rows<F, T>(x, M, a, begin, end); });
}

// Several K-quant weights that read one x (q/k/v) on the row kernel: one parallel region over all their
// outputs; each output's arithmetic is the one q8k_linear gives it.
template <typename T>
void q8k_linear_n(const tram::q8k::Rows& x, int64_t M, const std::vector<Args>& args, const std::vector<int64_t>& types) {
  std::vector<int64_t> sizes;
  for (const Args& a : args) sizes.push_back(a.N);
  tram::parallel::dynamic_for_parts(sizes, kGrainRows, [&](size_t i, int64_t begin, int64_t end) {
    tram::q8k::with_kquant(types[i], [&](auto fmt) { q8k_rows<decltype(fmt), T>(x, M, args[i], begin, end); });
  });
}
#endif

bool is_kquant(int64_t type) {
  return type == tram::gguf::kQ4_K || type == tram::gguf::kQ5_K || type == tram::gguf::kQ6_K;
}

template <typename Fn>
void with_format(int64_t type, Fn&& fn) {
  with_one_of<Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K>(type, "gguf_linear_int8", fn);
}

}  // namespace

namespace {

// One weight's checked arguments: its row bytes, the activation zero point and offset its format takes,
// and its bias (undefined: none).
struct Checked {
  int64_t row_bytes = 0, zero = 0;
  bool offset = false;
  at::Tensor bias;
};

Checked check_weight(const at::Tensor& x, const at::Tensor& data, int64_t ggml_type,
                     const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "gguf_linear_int8: x must be a [M, K] CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "gguf_linear_int8: x must be float32 or bfloat16");
  TORCH_CHECK(data.device().is_cpu() && data.dim() == 2 && data.scalar_type() == at::kByte && data.is_contiguous(),
              "gguf_linear_int8: data must be a contiguous [N, row_bytes] uint8 CPU tensor");
  const int64_t K = x.size(1), N = data.size(0);
  Checked c;
  with_format(ggml_type, [&](auto fmt) {
    using F = decltype(fmt);
    TORCH_CHECK(K % F::kBlock == 0, "gguf_linear_int8: K = ", K, " is not a multiple of the block of ", F::kBlock);
    c.row_bytes = K / F::kBlock * F::kBytes;
#if defined(__AVX512VNNI__) || (defined(__AVXVNNI__) && !defined(__AVX512BW__))
    c.zero = F::kZero;
#else
    c.zero = F::kSigned ? 0 : F::kZero;
#endif
    c.offset = F::kOffset;
  });
  TORCH_CHECK(data.size(1) == c.row_bytes, "gguf_linear_int8: rows of ", data.size(1), " bytes, expected ",
              c.row_bytes);
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == x.scalar_type(),
                "gguf_linear_int8: bias must be [N] in x's dtype");
    c.bias = bias->contiguous();
  }
  return c;
}

const void* bias_ptr(const Checked& c) { return c.bias.defined() ? c.bias.data_ptr() : nullptr; }

}  // namespace

namespace tram {

at::Tensor gguf_linear_int8(const at::Tensor& x, const at::Tensor& data, int64_t ggml_type,
                            const c10::optional<at::Tensor>& bias) {
  if (tram::x8::is_repacked(ggml_type)) return gguf_x8_linear(x, data, ggml_type, bias);
  const Checked c = check_weight(x, data, ggml_type, bias);
  const int64_t M = x.size(0), K = x.size(1), N = data.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  if (is_kquant(ggml_type)) {
    tram::q8k::QuantizedRows qa;
    qa.quantize(xf.data_ptr<float>(), K, M, K);
    const Args a{nullptr, K, N, c.row_bytes, data.data_ptr<uint8_t>(), bias_ptr(c), y.data_ptr()};
    const bool done = tram::q8k::with_kquant(ggml_type, [&](auto fmt) {
      using F = decltype(fmt);
#if defined(TRAM_Q8K_KERNELS)
      if (x.scalar_type() == at::kFloat) {
        q8k_linear<F, float>(qa.rows(), M, a);
      } else {
        q8k_linear<F, c10::BFloat16>(qa.rows(), M, a);
      }
#endif
    });
    TORCH_CHECK(done, "gguf_linear_int8: the K-quants need a build with AVX2");
    return y;
  }
  QuantizedX qx;
  quantize_x(xf.data_ptr<float>(), M, K, c.zero, c.offset, qx);
  const Args a{&qx, K, N, c.row_bytes, data.data_ptr<uint8_t>(), bias_ptr(c), y.data_ptr()};
  with_format(ggml_type, [&](auto fmt) {
    using F = decltype(fmt);
    if (x.scalar_type() == at::kFloat) {
      linear_impl<F, float>(a);
    } else {
      linear_impl<F, c10::BFloat16>(a);
    }
  });
  return y;
}

std::vector<at::Tensor> gguf_linear_int8_n(const at::Tensor& x, const std::vector<at::Tensor>& data,
                                           const std::vector<int64_t>& ggml_types,
                                           const std::vector<c10::optional<at::Tensor>>& biases) {
  TORCH_CHECK(data.size() == ggml_types.size() && data.size() == biases.size(),
              "gguf_linear_int8_n: as many types and biases as weights");
  bool repacked = !ggml_types.empty();
  for (const int64_t type : ggml_types) repacked = repacked && tram::x8::is_repacked(type);
  if (repacked) return gguf_x8_linear_n(x, data, ggml_types, biases);
  const int64_t M = x.dim() == 2 ? x.size(0) : 0;
  bool together = M > 0;
#if !defined(TRAM_Q8K_KERNELS)
  together = false;
#elif defined(TRAM_Q8K_GEMM)
  together = together && M < tram::q8k::kGemmMinRowsAny;  // the GEMM repacks per weight: one call each
  together = together && !on_tiles(M);  // the tiles decode per weight as well
#endif
  for (const int64_t type : ggml_types) together = together && is_kquant(type);
  std::vector<at::Tensor> ys;
  if (!together) {
    for (size_t i = 0; i < data.size(); ++i) ys.push_back(gguf_linear_int8(x, data[i], ggml_types[i], biases[i]));
    return ys;
  }
#if defined(TRAM_Q8K_KERNELS)
  const int64_t K = x.size(1);
  std::vector<Checked> checked;
  std::vector<Args> args;
  for (size_t i = 0; i < data.size(); ++i) {
    checked.push_back(check_weight(x, data[i], ggml_types[i], biases[i]));
    ys.push_back(at::empty({M, data[i].size(0)}, x.options()));
  }
  for (size_t i = 0; i < data.size(); ++i) {
    args.push_back(Args{nullptr, K, data[i].size(0), checked[i].row_bytes, data[i].data_ptr<uint8_t>(),
                        bias_ptr(checked[i]), ys[i].data_ptr()});
  }
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  tram::q8k::QuantizedRows qa;
  qa.quantize(xf.data_ptr<float>(), K, M, K);
  if (x.scalar_type() == at::kFloat) {
    q8k_linear_n<float>(qa.rows(), M, args, ggml_types);
  } else {
    q8k_linear_n<c10::BFloat16>(qa.rows(), M, args, ggml_types);
  }
#endif
  return ys;
}

std::vector<at::Tensor> quantize_activations_int8(const at::Tensor& x, int64_t block) {
  TORCH_CHECK(block == kXBlock || block == tram::q8k::kBlock, "quantize_activations_int8: block 32 or 256");
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.size(1) % block == 0,
              "quantize_activations_int8: x must be a [M, K] CPU tensor with K a multiple of ", block);
  const int64_t M = x.size(0), K = x.size(1);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor d = at::empty({M, K / block}, x.options().dtype(at::kFloat));
  if (block == tram::q8k::kBlock) {
    tram::q8k::QuantizedRows qa;
    qa.quantize(xf.data_ptr<float>(), K, M, K);
    std::memcpy(q.data_ptr<int8_t>(), qa.q.data(), static_cast<size_t>(M * K));
    std::memcpy(d.data_ptr<float>(), qa.d.data(), static_cast<size_t>(M * (K / block)) * sizeof(float));
    return {q, d};
  }
  QuantizedX qx;
  quantize_x(xf.data_ptr<float>(), M, K, 0, false, qx);
  for (int64_t m = 0; m < M; ++m) {
    std::memcpy(q.data_ptr<int8_t>() + m * K, qx.qrow(m), static_cast<size_t>(K));
    for (int64_t blk = 0; blk < K / kXBlock; ++blk) d.data_ptr<float>()[m * (K / kXBlock) + blk] = qx.dl[qx.lane0(m) + 8 * blk];
  }
  return {q, d};
}

}  // namespace tram
