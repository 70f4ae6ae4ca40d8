// fused_moe.cpp's bfloat16 experts with many tokens through ATen's GEMM (oneDNN's bf16 kernels on
// x86): those experts' pairs gathered into contiguous rows, then per expert at::mm_out over its rows for
// the gate/up projection, act(gate, up) on the results, at::mm_out again for the down projection; the
// combine reads their rows beside the vector paths' float32 ones.
//
// Why: with tens of tokens per expert (prefill) the products are bound by the multiply units, and
// oneDNN's packed bf16 kernels multiply in bf16 pairs at most of the vdpbf16ps peak, where tiled_gemm.h
// widens each tile to float32 (half the rate). Inside the kernel rather than a PyTorch loop over the
// experts: the gather, the activation and the combine run over buffers kept from call to call (fresh
// pages for a long prefill's intermediates, hundreds of MB, cost their page faults on every call), and
// the combine sums each token's slots in one pass.
//
// Arithmetic: the GEMMs sum bf16 products in float32 in oneDNN's order; their outputs, act and the
// down projection's rows are rounded to bfloat16 between the stages, as transformers' bf16 experts
// round them. Which experts take this path depends on their token counts (kMinTokens); ATen's kernels
// may split the work differently with the thread count.
#pragma once

#include "moe_state.h"
#include "simd.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tram::moe::aten_gemm {

using BF16 = c10::BFloat16;

// An expert with this many tokens multiplies through ATen: below it the vector paths' dot products,
// which read its weights once for all its tokens, cost less than oneDNN's call; from it oneDNN beats
// them and tiled_gemm.h's float32 products (docs/benchmarks.md, "bf16 experts through oneDNN inside the
// fused kernel": 4 and 6 lost at 32-128 tokens a call, 16 lost to 8).
constexpr int64_t kMinTokens = 8;
// Each expert's GEMMs take its rows rounded up to a multiple of this: oneDNN creates a primitive for
// every new shape (~1 ms each, two per expert), and a prefill's experts have a hundred different token
// counts where they have a few multiples of 16. The extra rows are the next pairs' (or the buffers'
// spare rows past the last): their products land in rows that the next expert's GEMM then overwrites,
// or that no expert reads (experts go in order, each writing from its first row on).
constexpr int64_t kRowMultiple = 16;

// Which experts take ATen's GEMM (bfloat16 x and weights, not on AMX tiles), and room for their rows.
inline void plan(Moe& s, bool applies) {
  s.gemm.assign(static_cast<size_t>(s.E), 0);
  s.any_gemm = false;
  if (!applies) return;
  for (int64_t e = 0; e < s.E; ++e) {
    if (s.count(e) < kMinTokens || s.on_tiles(e)) continue;
    s.gemm[e] = 1;
    s.any_gemm = true;
  }
  if (!s.any_gemm) return;
  const int64_t P = s.start[s.E];
  s.expert_of.resize(static_cast<size_t>(P));
  for (int64_t e = 0; e < s.E; ++e) std::fill(s.expert_of.begin() + s.start[e], s.expert_of.begin() + s.start[e + 1], e);
  const int64_t rows = P + kRowMultiple;
  s.gx.grow(rows * s.H);
  s.gh.grow(rows * 2 * s.I);
  s.ga.grow(rows * s.I);
  s.gy.grow(rows * s.H);
}

// Expert e's rows for its GEMMs: its token count rounded up to kRowMultiple, within the buffers.
inline int64_t gemm_rows(const Moe& s, int64_t e) {
  const int64_t m = (s.count(e) + kRowMultiple - 1) / kRowMultiple * kRowMultiple;
  return std::min(m, s.start[s.E] + kRowMultiple - s.start[e]);
}

inline at::Tensor rows(BF16* p, int64_t m, int64_t n) {
  return at::from_blob(p, {m, n}, at::TensorOptions().dtype(at::kBFloat16));
}

// act(gate + b, up + b) of one pair's gate/up row h [2I] into a [I], rounded to bfloat16.
inline void activate_row(const Moe& s, const BF16* h, const float* bias, BF16* a) {
  int64_t i = 0;
  for (; i + 16 <= s.I; i += 16) {
    vf16 g = widen_bf16x16(h + i), u = widen_bf16x16(h + s.I + i);
    if (bias != nullptr) g += vload<vf16>(bias + i), u += vload<vf16>(bias + s.I + i);
    const vf16 act = s.activation(g, u);
    store_bf16x8(a + i, round_bf16x8(low8(act)));
    store_bf16x8(a + i + 8, round_bf16x8(high8(act)));
  }
  for (; i < s.I; ++i) {
    const float gb = bias != nullptr ? bias[i] : 0.0f, ub = bias != nullptr ? bias[s.I + i] : 0.0f;
    a[i] = BF16(s.activation(static_cast<float>(h[i]) + gb, static_cast<float>(h[s.I + i]) + ub));
  }
}

// Both projections of every expert planned for ATen; the down projection's rows (without b2) in gy.
inline void run(Moe& s, const BF16* x, const BF16* w13, const BF16* w2) {
  if (!s.any_gemm) return;
  const int64_t P = s.start[s.E], H = s.H, I = s.I;
  BF16 *gx = s.gx.data(), *gh = s.gh.data(), *ga = s.ga.data(), *gy = s.gy.data();
  at::parallel_for(0, P, 64, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      if (s.gemm[s.expert_of[p]]) std::memcpy(gx + p * H, x + s.token[p] * H, H * sizeof(BF16));
    }
  });
  for (int64_t e = 0; e < s.E; ++e) {
    if (!s.gemm[e]) continue;
    const int64_t p0 = s.start[e], m = gemm_rows(s, e);
    at::Tensor h = rows(gh + p0 * 2 * I, m, 2 * I);
    at::mm_out(h, rows(gx + p0 * H, m, H), rows(const_cast<BF16*>(w13) + e * 2 * I * H, 2 * I, H).t());
  }
  at::parallel_for(0, P, 16, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t e = s.expert_of[p];
      if (!s.gemm[e]) continue;
      activate_row(s, gh + p * 2 * I, s.b13 != nullptr ? s.b13 + e * 2 * I : nullptr, ga + p * I);
    }
  });
  for (int64_t e = 0; e < s.E; ++e) {
    if (!s.gemm[e]) continue;
    const int64_t p0 = s.start[e], m = gemm_rows(s, e);
    at::Tensor y = rows(gy + p0 * H, m, H);
    at::mm_out(y, rows(ga + p0 * I, m, I), rows(const_cast<BF16*>(w2) + e * H * I, H, I).t());
  }
}

}  // namespace tram::moe::aten_gemm
