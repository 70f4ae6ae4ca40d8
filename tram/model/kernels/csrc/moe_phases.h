// The fused MoE kernel's two projections (fused_moe.cpp): per work item (an expert and a tile of its
// rows), phase 1 multiplies the gate and up rows by all the expert's tokens and applies the activation,
// phase 2 the down rows; each item chooses its path by the expert's token count and weight format (dot
// products, tiled_gemm.h's GEMM on a decoded tile, the int8 K-quant GEMM, x8 groups, AMX tiles).
#pragma once

#include "dynamic_for.h"
#include "gguf_blocks.h"
#include "moe_amx.h"
#include "moe_formats.h"
#include "moe_state.h"
#include "quant_rows.h"
#include "simd.h"
#include "tiled_gemm.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace tram::moe::phases {

using namespace tram::simd;
using tram::gemm::kTileRows;

constexpr int64_t kGateRows = kTileRows / 2;  // gate rows per w13 work item, and as many up rows
constexpr int64_t kDownRows = kTileRows;      // w2 rows per work item
constexpr int64_t kGemmTokens = 8;            // an expert with this many tokens takes the tiled GEMM
constexpr int64_t kPad = 32;                  // x and act rows are zero-padded to a multiple of this

inline int64_t padded(int64_t k) { return (k + kPad - 1) / kPad * kPad; }

// fn(integral_constant<MB>, m0) over rows 0 .. M - 1 in groups of four, then the rest as one group.
template <typename Fn>
TRAM_INLINE void row_groups(int64_t M, const Fn& fn) {
  int64_t m0 = 0;
  for (; m0 + 4 <= M; m0 += 4) fn(std::integral_constant<int64_t, 4>{}, m0);
  switch (M - m0) {
    case 3: fn(std::integral_constant<int64_t, 3>{}, m0); break;
    case 2: fn(std::integral_constant<int64_t, 2>{}, m0); break;
    case 1: fn(std::integral_constant<int64_t, 1>{}, m0); break;
    default: break;
  }
}

// fn(integral_constant<NB>, n) over rows n0 .. n0 + r - 1 of W in groups of NB: kWideRows for an expert
// with one token, kNarrowRows for a few, then the rest one by one.
template <typename Fn>
TRAM_INLINE void row_tiles(int64_t tokens, int64_t n0, int64_t r, const Fn& fn) {
  int64_t n = n0;
  if (tokens == 1) {
    for (; n + kWideRows <= n0 + r; n += kWideRows) fn(std::integral_constant<int64_t, kWideRows>{}, n);
  } else {
    for (; n + kNarrowRows <= n0 + r; n += kNarrowRows) fn(std::integral_constant<int64_t, kNarrowRows>{}, n);
  }
  for (; n < n0 + r; ++n) fn(std::integral_constant<int64_t, 1>{}, n);
}

// The thread's buffers for a decoded tile (tiled_gemm.h), grown as needed and kept between calls.
struct TileBuffers {
  std::vector<float> rows, panels, partial, sums;
  void reserve(int64_t ld, int64_t K, int64_t tokens) {
    const auto grow = [](std::vector<float>& v, int64_t n) { v.resize(std::max(v.size(), static_cast<size_t>(n))); };
    grow(rows, kTileRows * ld);
    grow(panels, kTileRows * ld);
    grow(partial, K > tram::gemm::kPassK ? tram::gemm::block_rows(K) * kTileRows : 0);
    grow(sums, tokens * kTileRows);
  }
};

inline TileBuffers& tile_buffers() {
  thread_local TileBuffers buffers;
  return buffers;
}

// y[m, n0 + j] (+ bias[n0 + j]) = x[m] . panels' output j, for rows 0 .. M - 1 of x; y's row stride N.
inline void gemm_rows(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t ld, const float* panels, int64_t count,
               const float* bias, float* y, int64_t N, int64_t n0, TileBuffers& buf) {
  const int64_t mc = tram::gemm::block_rows(K);
  for (int64_t m0 = 0; m0 < M; m0 += mc) {
    const int64_t m1 = std::min(M, m0 + mc);
    for (int64_t k0 = 0; k0 < K; k0 += tram::gemm::kPassK) {
      const int64_t k1 = std::min(K, k0 + tram::gemm::kPassK);
      const tram::gemm::Sums<float> s{buf.partial.data(), m0, k0 == 0, k1 == K, bias, y, N};
      tram::gemm::block_times_tile(x, ldx, panels, ld, k0, k1, count, s, m1, n0);
    }
  }
}

// ---- phase 1: gate and up rows i0 .. i0 + r - 1 of expert e for all its tokens, then act ----------

// Rows n .. n + NB - 1 of expert e's w13 times pairs p .. p + MB - 1. Bfloat16 weights and x with
// AVX512-BF16 multiply in bf16 pairs (dot_tile_bf16: exact products, no widening); else float32.
template <int64_t MB, int64_t NB, typename Fmt>
TRAM_INLINE void gate_up_dot(const Fmt& f, const Moe& s, int64_t p, int64_t e, int64_t n, float (&out)[MB][NB]) {
  if constexpr (kInt8Rows<Fmt>) {
    return f.template dot_q<MB, NB>(s.xq.rows(), p, e, n, out);
  } else {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<Fmt, FloatFormat<c10::BFloat16>>) {
    if (s.has_xb) {
      return tram::rows::dot_tile_bf16<MB, NB>(s.xb.data() + p * s.ldh, s.ldh, f.w + (e * f.N + n) * f.K, f.K, out);
    }
  }
#endif
    f.template dot<MB, NB>(s.xg.data() + p * s.ldh, s.ldh, e, n, out);
  }
}

template <int64_t NB, typename Fmt>
TRAM_INLINE void gate_up_rows(const Fmt& f, const Moe& s, int64_t e, int64_t n) {
  const int64_t p0 = s.start[e];
  const float* bg = s.b13 != nullptr ? s.b13 + e * 2 * s.I : nullptr;
  row_groups(s.count(e), [&](auto mb, int64_t m0) {
    constexpr int64_t MB = decltype(mb)::value;
    float g[MB][NB], u[MB][NB];
    gate_up_dot<MB, NB>(f, s, p0 + m0, e, n, g);
    gate_up_dot<MB, NB>(f, s, p0 + m0, e, s.I + n, u);
    float* act = s.act_at(p0 + m0) + n;
    for (int64_t m = 0; m < MB; ++m) {
      for (int64_t j = 0; j < NB; ++j) {
        const float gb = bg != nullptr ? bg[n + j] : 0.0f, ub = bg != nullptr ? bg[s.I + n + j] : 0.0f;
        act[m * s.ldi + j] = s.activation(g[m][j] + gb, u[m][j] + ub);
      }
    }
  });
}

template <typename Fmt>
void gate_up_gemm(const Fmt& f, const Moe& s, int64_t e, int64_t i0, int64_t r) {
  const int64_t p0 = s.start[e], M = s.count(e);
  TileBuffers& buf = tile_buffers();
  buf.reserve(s.ldh, s.H, M);
  f.fill(e, i0, r, s.ldh, buf.rows.data());  // gate rows first, then the up rows: outputs j and r + j
  f.fill(e, s.I + i0, r, s.ldh, buf.rows.data() + r * s.ldh);
  tram::gemm::pack_panels(buf.rows.data(), 2 * r, s.ldh, buf.panels.data());
  float bias[kTileRows];
  for (int64_t j = 0; j < r; ++j) {
    bias[j] = s.b13 != nullptr ? s.b13[e * 2 * s.I + i0 + j] : 0.0f;
    bias[r + j] = s.b13 != nullptr ? s.b13[e * 2 * s.I + s.I + i0 + j] : 0.0f;
  }
  gemm_rows(s.xg.data() + p0 * s.ldh, s.ldh, M, s.H, s.ldh, buf.panels.data(), 2 * r,
            s.b13 != nullptr ? bias : nullptr, buf.sums.data(), kTileRows, 0, buf);
  float* act = s.act_at(p0) + i0;
  for (int64_t m = 0; m < M; ++m) {
    const float* h = buf.sums.data() + m * kTileRows;
    for (int64_t j = 0; j < r; ++j) act[m * s.ldi + j] = s.activation(h[j], h[r + j]);
  }
}

#if defined(TRAM_Q8K_GEMM)
// An int8-activation expert with many tokens: its rows repacked kPackRows at a time (gguf_q8k_gemm.h), the
// gate rows' outputs kept while the up rows' arrive, the activation applied on those.
template <typename Fmt>
void gate_up_int8_gemm(const Fmt& f, const Moe& s, int64_t e, int64_t i0, int64_t r) {
  using tram::q8k::kPackRows;
  const int64_t p0 = s.start[e], p1 = s.start[e + 1];
  const float* bg = s.b13 != nullptr ? s.b13 + e * 2 * s.I : nullptr;
  thread_local std::vector<float> gate;
  gate.resize(static_cast<size_t>((p1 - p0) * kPackRows));
  for (int64_t n = i0; n < i0 + r; n += kPackRows) {
    const int64_t rows = std::min(kPackRows, i0 + r - n);
    f.gemm(s.xq.rows(), p0, p1, e, n, rows, [&](int64_t p, const float* g) {
      std::copy(g, g + kPackRows, gate.data() + (p - p0) * kPackRows);
    });
    f.gemm(s.xq.rows(), p0, p1, e, s.I + n, rows, [&](int64_t p, const float* up) {
      const float* g = gate.data() + (p - p0) * kPackRows;
      float* act = s.act_at(p) + n;
      for (int64_t j = 0; j < rows; ++j) {
        const float gb = bg != nullptr ? bg[n + j] : 0.0f, ub = bg != nullptr ? bg[s.I + n + j] : 0.0f;
        act[j] = s.activation(g[j] + gb, up[j] + ub);
      }
    });
  }
}

template <typename Fmt>
void down_int8_gemm(const Fmt& f, const Moe& s, int64_t e, int64_t n0, int64_t r) {
  using tram::q8k::kPackRows;
  for (int64_t n = n0; n < n0 + r; n += kPackRows) {
    const int64_t rows = std::min(kPackRows, n0 + r - n);
    f.gemm(s.aq.rows(), s.start[e], s.start[e + 1], e, n, rows, [&](int64_t p, const float* out) {
      float* y = s.y2_at(p) + n;
      for (int64_t j = 0; j < rows; ++j) y[j] = out[j] + (s.b2 != nullptr ? s.b2[e * s.H + n + j] : 0.0f);
    });
  }
}
#endif

// A grouped format's gate and up rows i0 .. i0 + r - 1 (whole groups) for all of expert e's tokens.
template <typename Fmt>
void gate_up_grouped(const Fmt& f, const Moe& s, int64_t e, int64_t i0, int64_t r) {
  constexpr int64_t G = tram::x8::kRows;
  const int64_t p0 = s.start[e], p1 = s.start[e + 1];
  const float* bg = s.b13 != nullptr ? s.b13 + e * 2 * s.I : nullptr;
  thread_local std::vector<float> gate;
  gate.resize(static_cast<size_t>((p1 - p0) * G));
  for (int64_t n = i0; n < i0 + r; n += G) {
    f.group(s.xq.rows(), p0, p1, e, n, [&](int64_t p, const float* g) {
      std::copy(g, g + G, gate.data() + (p - p0) * G);
    });
    f.group(s.xq.rows(), p0, p1, e, s.I + n, [&](int64_t p, const float* up) {
      const float* g = gate.data() + (p - p0) * G;
      float* act = s.act_at(p) + n;
      for (int64_t j = 0; j < G; ++j) {
        const float gb = bg != nullptr ? bg[n + j] : 0.0f, ub = bg != nullptr ? bg[s.I + n + j] : 0.0f;
        act[j] = s.activation(g[j] + gb, up[j] + ub);
      }
    });
  }
}

template <typename Fmt>
void gate_up_item(const Fmt& f, const Moe& s, int64_t e, int64_t i0) {
  const int64_t r = std::min(kGateRows, s.I - i0);
#if defined(TRAM_MOE_AMX)
  if constexpr (std::is_same_v<Fmt, FloatFormat<c10::BFloat16>>) {
    if (s.on_tiles(e)) return tram::moe::amx_bf16::gate_up(f.w, s, e, i0);
  }
#endif
  if constexpr (kGrouped<Fmt>) {
#if defined(TRAM_X8_GEMM)
    if constexpr (Fmt::kGemm) {
      if (s.count(e) >= tram::x8::kGemmMinRows) return gate_up_int8_gemm(f, s, e, i0, r);
    }
#endif
    gate_up_grouped(f, s, e, i0, r);
  } else {
    if constexpr (!kInt8Rows<Fmt>) {
      if (s.count(e) >= kGemmTokens) return gate_up_gemm(f, s, e, i0, r);
    } else {
#if defined(TRAM_Q8K_GEMM)
      if (s.count(e) >= tram::q8k::kGemmMinRows<typename Fmt::Block>) return gate_up_int8_gemm(f, s, e, i0, r);
#endif
    }
    row_tiles(s.count(e), i0, r, [&](auto nb, int64_t n) { gate_up_rows<decltype(nb)::value>(f, s, e, n); });
  }
}

// ---- phase 2: down rows n0 .. n0 + r - 1 of expert e for all its tokens --------------------------

template <int64_t NB, typename Fmt>
TRAM_INLINE void down_rows(const Fmt& f, const Moe& s, int64_t e, int64_t n) {
  const int64_t p0 = s.start[e];
  row_groups(s.count(e), [&](auto mb, int64_t m0) {
    constexpr int64_t MB = decltype(mb)::value;
    float d[MB][NB];
    if constexpr (kInt8Rows<Fmt>) {
      f.template dot_q<MB, NB>(s.aq.rows(), p0 + m0, e, n, d);
    } else {
      f.template dot<MB, NB>(s.act.data() + (p0 + m0) * s.ldi, s.ldi, e, n, d);
    }
    float* y = s.y2_at(p0 + m0) + n;
    for (int64_t m = 0; m < MB; ++m) {
      for (int64_t j = 0; j < NB; ++j) y[m * s.H + j] = d[m][j] + (s.b2 != nullptr ? s.b2[e * s.H + n + j] : 0.0f);
    }
  });
}

template <typename Fmt>
void down_gemm(const Fmt& f, const Moe& s, int64_t e, int64_t n0, int64_t r) {
  const int64_t p0 = s.start[e];
  TileBuffers& buf = tile_buffers();
  buf.reserve(s.ldi, s.I, 0);
  f.fill(e, n0, r, s.ldi, buf.rows.data());
  tram::gemm::pack_panels(buf.rows.data(), r, s.ldi, buf.panels.data());
  gemm_rows(s.act.data() + p0 * s.ldi, s.ldi, s.count(e), s.I, s.ldi, buf.panels.data(), r,
            s.b2 != nullptr ? s.b2 + e * s.H : nullptr, s.y2_at(p0), s.H, n0, buf);
}

template <typename Fmt>
void down_grouped(const Fmt& f, const Moe& s, int64_t e, int64_t n0, int64_t r) {
  constexpr int64_t G = tram::x8::kRows;
  for (int64_t n = n0; n < n0 + r; n += G) {
    f.group(s.aq.rows(), s.start[e], s.start[e + 1], e, n, [&](int64_t p, const float* out) {
      float* y = s.y2_at(p) + n;
      for (int64_t j = 0; j < G; ++j) y[j] = out[j] + (s.b2 != nullptr ? s.b2[e * s.H + n + j] : 0.0f);
    });
  }
}

template <typename Fmt>
void down_item(const Fmt& f, const Moe& s, int64_t e, int64_t n0) {
  const int64_t r = std::min(kDownRows, s.H - n0);
#if defined(TRAM_MOE_AMX)
  if constexpr (std::is_same_v<Fmt, FloatFormat<c10::BFloat16>>) {
    if (s.on_tiles(e)) return tram::moe::amx_bf16::down(f.w, s, e, n0, r);
  }
#endif
  if constexpr (kGrouped<Fmt>) {
#if defined(TRAM_X8_GEMM)
    if constexpr (Fmt::kGemm) {
      if (s.count(e) >= tram::x8::kGemmMinRows) return down_int8_gemm(f, s, e, n0, r);
    }
#endif
    down_grouped(f, s, e, n0, r);
  } else {
    if constexpr (!kInt8Rows<Fmt>) {
      if (s.count(e) >= kGemmTokens) return down_gemm(f, s, e, n0, r);
    } else {
#if defined(TRAM_Q8K_GEMM)
      if (s.count(e) >= tram::q8k::kGemmMinRows<typename Fmt::Block>) return down_int8_gemm(f, s, e, n0, r);
#endif
    }
    row_tiles(s.count(e), n0, r, [&](auto nb, int64_t n) { down_rows<decltype(nb)::value>(f, s, e, n); });
  }
}

// fn(e, row) for every active expert's tiles of `rows` in steps of `step`, in one parallel region;
// an expert's tiles are neighbours, so a thread's chunk streams contiguous weights.
template <typename Fn>
void for_expert_tiles(const Moe& s, int64_t rows, int64_t step, const Fn& fn) {
  std::vector<std::pair<int32_t, int32_t>> items;
  for (int64_t e = 0; e < s.E; ++e) {
    if (!s.on_items(e)) continue;
    for (int64_t n = 0; n < rows; n += step) items.emplace_back(static_cast<int32_t>(e), static_cast<int32_t>(n));
  }
  tram::parallel::dynamic_for(static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fn(items[i].first, items[i].second);
  });
}

}  // namespace tram::moe::phases
