// The driver of the many-rows quantized linears (quant_gemm, gguf_gemm): y = x W^T + b for tens to
// thousands of rows of x without a weight-sized float copy of W.
//
// Why: past a decode step's few rows, dequantizing all of W into a temporary [N, K] and calling
// oneDNN writes and re-reads N * K * 4 bytes per call (a weight-sized transient per layer), which
// can make a quantized layer slower than the float32 one it replaces. Here W is cut into tiles of
// kTileRows rows; a thread decodes a tile once (the caller's fill, the same per-weight decode as its
// dequantizer) into a float32 buffer that stays in L2, repacks it k-major in panels of 16 outputs,
// and multiplies a block of x's rows by it with a register-blocked kernel: kRowsX rows of x times 32
// outputs, one vector FMA per row and panel per k (two 8-lane ones without AVX-512), the weights
// loaded once per kRowsX rows. (A dot-product kernel on the row-major tile, and at::mm on it, are
// slower.)
//
// Arithmetic: each output is one float32 FMA chain over k = 0 .. K - 1 from 0, in that order, plus
// the bias, rounded once to y's dtype (past kPassK the chain is kept in float32 memory between passes
// over k, which changes no bit). Nothing in it depends on M, on which rows share a micro-tile,
// on the tiling or on the thread count: y's rows are bit for bit the same whatever rows come with
// them and however many threads run. (It is not the skinny kernels' order: their 32 partial sums per
// output are what makes them fast on a row or two, so results differ in the last bits across the
// crossover.)
#pragma once

#include "dynamic_for.h"
#include "simd.h"

#include <ATen/Parallel.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tram::gemm {

using namespace tram::simd;

constexpr int64_t kPanel = 16;  // outputs per packed panel: one vector
// Rows of W per tile: whole pairs of panels, few enough that N = 128 is still two tiles for two
// threads; K = 4864 makes it 1.9 MB of float32 buffers per thread (rows + panels), in L2.
constexpr int64_t kTileRows = 64;
// Rows of x and panels of W per micro-tile.
#if defined(__AVX512F__)
constexpr int64_t kRowsX = 12, kPanelsX = 2;  // 24 accumulators of AVX-512's 32 registers
#else
// AVX2 (16 registers): 6 rows x 2 halves = 12 accumulators, 2 weight halves and a broadcast, the
// 6x16 shape of AVX2 SGEMM kernels: 8 loads per 12 FMAs, and 12 chains to cover the FMA latency.
constexpr int64_t kRowsX = 6, kPanelsX = 1;
#endif

// x[k] in every lane, straight from memory: a broadcast load is a load-port uop, where GCC's
// load + register broadcast also takes port 5, which AVX-512 FMAs share.
#if defined(__AVX512F__)
TRAM_INLINE vf16 broadcast(const float* p) { return bitcast<vf16>(_mm512_set1_ps(*p)); }
#else
TRAM_INLINE vf8 broadcast(const float* p) { return vf8{} + *p; }  // vbroadcastss from memory
#endif

// k per pass over a tile: a tile's panels for one pass (64 outputs x 1024 k, 256 KiB) and the
// block of x's rows for it (below) stay in L2 together. Without passes a K = 4864 layer (ffn_down)
// would stream 1.2 MiB of panels and 1.2 MiB of x per tile through a 2 MiB L2.
constexpr int64_t kPassK = 1024;

// x's rows per block: a block's pass (float32) should stay in about 1 MiB of L2 while the thread's
// tiles go by; fewer than 64 rows would decode each tile too often for the rows it serves.
inline int64_t block_rows(int64_t K) {
  const int64_t k = std::min(K, kPassK);
  return std::max<int64_t>(64, (int64_t{1} << 20) / (k * static_cast<int64_t>(sizeof(float))));
}

// Where a pass leaves its sums: a tile's outputs for the block's rows ([rows][kTileRows] float32)
// between passes; the last pass adds the bias and stores y instead.
template <typename T>
struct Sums {
  float* partial;  // row m - m_begin, output j of the tile: partial[(m - m_begin) * kTileRows + j]
  int64_t m_begin;
  bool first, last;
  const T* bias;
  T* y;
  int64_t N;
};

// Rows r[0..15] transposed in place (lane j of row i <-> lane i of row j): four rounds of two-source
// shuffles, exchanging blocks of 8, 4, 2 and 1 lanes between rows h apart. Within a half of 8 lanes
// the rounds of 4, 2 and 1 are the same 8-lane shuffle on both halves; the round of 8 swaps halves.
#define TRAM_ARGS(...) __VA_ARGS__
TRAM_INLINE void transpose16(vf16* r) {
  for (int i = 0; i < 8; ++i) {
    const vf16 a = r[i], b = r[i + 8];
    r[i] = join8(low8(a), low8(b));
    r[i + 8] = join8(high8(a), high8(b));
  }
// LO8 / HI8: a round's 8-lane pattern (a's lanes 0..7, b's 8..15); LO16 / HI16 the same on 16 lanes
// (the upper lanes repeat it 8 higher, b's lanes are 16..31).
#if TRAM_VF16_NATIVE
#define TRAM_ROUND(H, LO8, HI8, LO16, HI16)             \
  for (int i = 0; i < 16; ++i) {                       \
    if (i & H) continue;                               \
    const vf16 a = r[i], b = r[i + H];                 \
    r[i] = __builtin_shufflevector(a, b, LO16);        \
    r[i + H] = __builtin_shufflevector(a, b, HI16);    \
  }
#else
#define TRAM_ROUND(H, LO8, HI8, LO16, HI16)                                                           \
  for (int i = 0; i < 16; ++i) {                                                                     \
    if (i & H) continue;                                                                             \
    const vf16 a = r[i], b = r[i + H];                                                               \
    r[i] = vf16{__builtin_shufflevector(a.lo, b.lo, LO8), __builtin_shufflevector(a.hi, b.hi, LO8)};     \
    r[i + H] = vf16{__builtin_shufflevector(a.lo, b.lo, HI8), __builtin_shufflevector(a.hi, b.hi, HI8)}; \
  }
#endif
  TRAM_ROUND(4, TRAM_ARGS(0, 1, 2, 3, 8, 9, 10, 11), TRAM_ARGS(4, 5, 6, 7, 12, 13, 14, 15),
             TRAM_ARGS(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27),
             TRAM_ARGS(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31))
  TRAM_ROUND(2, TRAM_ARGS(0, 1, 8, 9, 4, 5, 12, 13), TRAM_ARGS(2, 3, 10, 11, 6, 7, 14, 15),
             TRAM_ARGS(0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29),
             TRAM_ARGS(2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31))
  TRAM_ROUND(1, TRAM_ARGS(0, 8, 2, 10, 4, 12, 6, 14), TRAM_ARGS(1, 9, 3, 11, 5, 13, 7, 15),
             TRAM_ARGS(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30),
             TRAM_ARGS(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31))
#undef TRAM_ROUND
}
#undef TRAM_ARGS

// Row-major rows [count, ld] (count <= kTileRows, zero-padded to ld, a multiple of 16) -> panels
// [kTileRows / 16][ld][16]: panel p's k-th vector is weight k of outputs 16p .. 16p + 15 (rows past
// count are zeros, whose outputs are never stored).
inline void pack_panels(const float* rows, int64_t count, int64_t ld, float* panels) {
  for (int64_t p = 0; p < (count + kPanel - 1) / kPanel; ++p) {
    float* panel = panels + p * ld * kPanel;
    for (int64_t k = 0; k < ld; k += kPanel) {
      vf16 r[kPanel];
      for (int64_t i = 0; i < kPanel; ++i) {
        const int64_t row = p * kPanel + i;
        r[i] = row < count ? vload<vf16>(rows + row * ld + k) : vf16{};
      }
      transpose16(r);
      for (int64_t i = 0; i < kPanel; ++i) vstore(panel + (k + i) * kPanel, r[i]);
    }
  }
}

#if defined(__AVX512F__)
using Lanes = vf16;  // one panel of 16 outputs per vector
#else
// Without AVX-512, GCC keeps arrays of 16-lane vectors in memory (a vmovdqa per use: this kernel ran
// at scalar speed), so a panel is two 8-lane halves there; each output's FMA chain is the same.
using Lanes = vf8;
#endif
constexpr int64_t kHalves = kPanel / (sizeof(Lanes) / sizeof(float));  // vectors per panel

// Outputs n0 .. n0 + outputs - 1 (the tile's j0 ..) of rows m0 .. m0 + MR - 1, for k0 <= k < k1, from
// NP panels (NP * 16 >= outputs): each output's FMA chain goes on from where the last pass left it.
template <typename T, int64_t MR, int64_t NP>
TRAM_INLINE void micro_tile(const float* x, int64_t ldx, const float* panels, int64_t ld, int64_t k0, int64_t k1,
                            const Sums<T>& s, int64_t m0, int64_t n0, int64_t j0, int64_t outputs) {
  constexpr int64_t kV = NP * kHalves, kW = kPanel / kHalves;  // vectors per row, lanes per vector
  Lanes acc[MR][kV] = {};
  if (!s.first) {
    for (int64_t r = 0; r < MR; ++r) {
      for (int64_t v = 0; v < kV; ++v) acc[r][v] = vload<Lanes>(s.partial + (m0 + r - s.m_begin) * kTileRows + j0 + v * kW);
    }
  }
  const float* xm = x + m0 * ldx;
  for (int64_t k = k0; k < k1; ++k) {
    Lanes w[kV];
    for (int64_t v = 0; v < kV; ++v) w[v] = vload<Lanes>(panels + ((v / kHalves) * ld + k) * kPanel + (v % kHalves) * kW);
    for (int64_t r = 0; r < MR; ++r) {
      const Lanes xr = broadcast(xm + r * ldx + k);
      for (int64_t v = 0; v < kV; ++v) acc[r][v] += xr * w[v];
    }
  }
  if (!s.last) {
    for (int64_t r = 0; r < MR; ++r) {
      for (int64_t v = 0; v < kV; ++v) vstore(s.partial + (m0 + r - s.m_begin) * kTileRows + j0 + v * kW, acc[r][v]);
    }
    return;
  }
  for (int64_t r = 0; r < MR; ++r) {
    float out[NP * kPanel];
    for (int64_t v = 0; v < kV; ++v) vstore(out + v * kW, acc[r][v]);
    T* yr = s.y + (m0 + r) * s.N + n0;
    for (int64_t j = 0; j < outputs; ++j) store(out[j] + (s.bias != nullptr ? load1(s.bias + n0 + j) : 0.0f), yr + j);
  }
}

// MR rows of x (m0 ..) times the tile's count outputs, kPanelsX panels at a time.
template <typename T, int64_t MR>
void rows_times_tile(const float* x, int64_t ldx, const float* panels, int64_t ld, int64_t k0, int64_t k1,
                     int64_t count, const Sums<T>& s, int64_t m0, int64_t n0) {
  constexpr int64_t kStep = kPanelsX * kPanel;
  int64_t j = 0;
  for (; j + kStep <= count; j += kStep) {
    micro_tile<T, MR, kPanelsX>(x, ldx, panels + j * ld, ld, k0, k1, s, m0, n0 + j, j, kStep);
  }
  if (j < count) {
    if (kPanelsX == 2 && count - j > kPanel) {
      micro_tile<T, MR, kPanelsX>(x, ldx, panels + j * ld, ld, k0, k1, s, m0, n0 + j, j, count - j);
    } else {
      micro_tile<T, MR, 1>(x, ldx, panels + j * ld, ld, k0, k1, s, m0, n0 + j, j, count - j);
    }
  }
}

template <typename T, int64_t MR>
void tail_rows(const float* x, int64_t ldx, const float* panels, int64_t ld, int64_t k0, int64_t k1, int64_t count,
               const Sums<T>& s, int64_t m0, int64_t n0, int64_t rows) {
  if constexpr (MR > 1) {
    if (rows < MR) return tail_rows<T, MR - 1>(x, ldx, panels, ld, k0, k1, count, s, m0, n0, rows);
  }
  rows_times_tile<T, MR>(x, ldx, panels, ld, k0, k1, count, s, m0, n0);
}

// Rows m_begin .. m_end - 1 of x times the packed tile (outputs n0 .. n0 + count - 1), k0 <= k < k1.
template <typename T>
void block_times_tile(const float* x, int64_t ldx, const float* panels, int64_t ld, int64_t k0, int64_t k1,
                      int64_t count, const Sums<T>& s, int64_t m_end, int64_t n0) {
  int64_t m = s.m_begin;
  for (; m + kRowsX <= m_end; m += kRowsX) rows_times_tile<T, kRowsX>(x, ldx, panels, ld, k0, k1, count, s, m, n0);
  if (m < m_end) tail_rows<T, kRowsX - 1>(x, ldx, panels, ld, k0, k1, count, s, m, n0, m_end - m);
}

// y [M, N] = x [M, K] (float32, row stride ldx) times W^T + bias, W decoded by fill(n0, count, rows):
// rows n0 .. n0 + count - 1 of W as float32 into rows [count, ld], ld >= K a multiple of 16, zeros
// past K. Each thread allocates its buffers once; a tile is decoded again for each block of x past
// the first (a block is >= 64 rows, so that costs little), and multiplied in passes of kPassK k.
template <typename T, typename Fill>
void tiled_gemm(const float* x, int64_t ldx, int64_t M, int64_t N, int64_t K, int64_t ld, const T* bias, T* y,
                const Fill& fill) {
  const int64_t tiles = (N + kTileRows - 1) / kTileRows;
  const int64_t mc = block_rows(K);
  // Tiles are handed out as threads come for them (dynamic_for.h); each thread's buffers outlive the
  // call (thread_local, grown as needed), where allocating ~2.5 MB per call showed up as munmap.
  tram::parallel::dynamic_for(tiles, 1, [&](int64_t t_begin, int64_t t_end) {
    thread_local std::vector<float> rows, panels, partial;
    rows.resize(std::max(rows.size(), static_cast<size_t>(kTileRows * ld)));
    panels.resize(std::max(panels.size(), static_cast<size_t>(kTileRows * ld)));
    partial.resize(std::max(partial.size(), static_cast<size_t>(K > kPassK ? mc * kTileRows : 0)));
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
      const int64_t m1 = std::min(M, m0 + mc);
      for (int64_t t = t_begin; t < t_end; ++t) {
        const int64_t n0 = t * kTileRows, count = std::min(kTileRows, N - n0);
        fill(n0, count, rows.data());
        pack_panels(rows.data(), count, ld, panels.data());
        for (int64_t k0 = 0; k0 < K; k0 += kPassK) {
          const int64_t k1 = std::min(K, k0 + kPassK);
          const Sums<T> s{partial.data(), m0, k0 == 0, k1 == K, bias, y, N};
          block_times_tile(x, ldx, panels.data(), ld, k0, k1, count, s, m1, n0);
        }
      }
    }
  });
}

}  // namespace tram::gemm
