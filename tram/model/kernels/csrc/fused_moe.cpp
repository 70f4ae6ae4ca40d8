// A mixture-of-experts layer's experts in one call (CPU): out[t] = sum over slots j of
// topk_weights[t, j] * (act(x[t] W13[e]^T + b13[e]) W2[e]^T + b2[e]), e = topk_ids[t, j] (-1: skipped).
//
//   x             [T, H]        float32 or bfloat16, contiguous
//   topk_ids      [T, k]        int32, local expert index or -1
//   topk_weights  [T, k]        float32
//   w13           [E, 2I, ...]  per expert gate rows [0, I), up rows [I, 2I) over H inputs
//   w2            [E, H, ...]   per expert the down projection over I inputs
//   b13 [E, 2I], b2 [E, H]      optional, any float dtype
//   -> out        [T, H]        x's dtype
// Weight formats (each of w13 and w2 has its own): 0 float (x's dtype: [E, N, K]), 1 int8 ([E, N, K]
// int8, scale [E, N]), 2 int4 ([E, N, K / 2] uint8 as quant_linear.cpp packs it, scale [E, N, K / group],
// param = group; with zero [E, N, K / group] uint8 a zero point per group, else 8), 3 GGUF ([E, N,
// row_bytes] uint8, param = ggml type), 4 GGUF K-quants with int8 activations (param 1012 / 1014: Q4_K /
// Q6_K repacked eight rows at a time, gguf_x8.h, [E, N, K / 256 * 156 or 210]).
//
// Why one call: a decode step of a 128-expert top-8 layer touches up to all experts with a token or two
// each. Per-expert linears would be ~2 x 128 small parallel regions, each too short to stream its
// weights at full bandwidth. Here the (token, slot) pairs are grouped by expert (a counting sort), and
// one parallel region runs over (expert, tile of rows) work items for the gate/up projection of every
// active expert, the activation applied on the tile's outputs; a second one runs the down projection,
// and a third combines. Each weight row is read once per call and multiplied by all of its expert's
// tokens. An expert with kGemmTokens tokens or more (prefill) multiplies them with tiled_gemm.h's
// register-blocked kernel on its tile decoded once to float32; fewer go through quant_rows.h's dot
// products (gguf_blocks.h's decoders for GGUF), which stream the weights in their stored form
// (bfloat16 gate/up rows with AVX512-BF16 multiply bf16 x without widening either). Where the CPU has
// AMX, bfloat16 experts with moe_amx.h's kMinTokens or more go to its tile unit instead; elsewhere those
// with moe_aten_gemm.h's kMinTokens or more go to ATen's GEMM (oneDNN) over rows gathered once.
//
// Arithmetic: float32 throughout (vdpbf16ps's bf16 products are exact; it treats subnormal inputs as
// zero), rounded once to x's dtype at the end. Every output of a projection is computed by one work
// item in a fixed order (quant_rows.h's two partial sums, or tiled_gemm.h's single FMA chain, chosen
// by the expert's token count), and out[t] adds its slots' rows in slot order: the result does not
// depend on the thread count. (It does depend on how many tokens share an expert across kGemmTokens,
// as quant_linear and quant_gemm differ in the last bits; on tiles, act is rounded to bfloat16; through
// ATen's GEMM the intermediates are rounded to bfloat16 and the sums are oneDNN's.)
#include "kernels.h"
#include "dynamic_for.h"
#include "gguf_blocks.h"
#include "moe_amx.h"
#include "moe_aten_gemm.h"
#include "moe_formats.h"
#include "moe_phases.h"
#include "moe_state.h"
#include "quant_rows.h"
#include "simd.h"
#include "widen_int8.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

using namespace tram::simd;
using namespace tram::moe;
using namespace tram::moe::phases;

// ---- the weights' formats -----------------------------------------------------------------------

struct WeightArg {
  const at::Tensor& data;
  const c10::optional<at::Tensor>& scale;
  const c10::optional<at::Tensor>& zero;  // int4 only
  int64_t format, param;
  const char* name;
};

// fn(Fmt{...}) for the weight [E, N, ...] over K inputs, after checking its shapes.
template <typename Fn>
void with_weight(const WeightArg& w, int64_t E, int64_t N, int64_t K, at::ScalarType x_dtype, Fn&& fn) {
  const at::Tensor& d = w.data;
  TORCH_CHECK(d.device().is_cpu() && d.dim() == 3 && d.is_contiguous() && d.size(0) == E && d.size(1) == N,
              "fused_moe: ", w.name, " must be a contiguous [", E, ", ", N, ", ...] CPU tensor");
  const bool has_scale = w.scale.has_value() && w.scale->defined();
  const float* scale = nullptr;
  if (has_scale) {
    TORCH_CHECK(w.scale->is_contiguous() && w.scale->scalar_type() == at::kFloat, "fused_moe: ", w.name,
                "'s scale must be contiguous float32");
    scale = w.scale->data_ptr<float>();
  }
  switch (w.format) {
    case 0:
      TORCH_CHECK(d.size(2) == K && d.scalar_type() == x_dtype, "fused_moe: float ", w.name, " must be [E, N, ", K,
                  "] in x's dtype");
      if (x_dtype == at::kFloat) return fn(FloatFormat<float>{d.data_ptr<float>(), N, K});
      return fn(FloatFormat<c10::BFloat16>{d.data_ptr<c10::BFloat16>(), N, K});
    case 1:
      TORCH_CHECK(d.scalar_type() == at::kChar && d.size(2) == K && has_scale && w.scale->numel() == E * N,
                  "fused_moe: int8 ", w.name, " takes [E, N, K] int8 and scale [E, N]");
      return fn(Int8Format{d.data_ptr<int8_t>(), scale, N, K});
    case 2:
      TORCH_CHECK(w.param > 0 && w.param % 32 == 0 && K % w.param == 0, "fused_moe: int4 groups must be multiples "
                  "of 32 dividing K = ", K);
      TORCH_CHECK(d.scalar_type() == at::kByte && d.size(2) == K / 2 && has_scale &&
                      w.scale->numel() == E * N * (K / w.param),
                  "fused_moe: int4 ", w.name, " takes [E, N, K / 2] uint8 and scale [E, N, K / group]");
      if (w.zero.has_value() && w.zero->defined()) {
        TORCH_CHECK(w.zero->scalar_type() == at::kByte && w.zero->is_contiguous() && w.zero->numel() == w.scale->numel(),
                    "fused_moe: int4 ", w.name, "'s zero points must be contiguous uint8 [E, N, K / group]");
        return fn(Int4Format<true>{d.data_ptr<uint8_t>(), scale, w.zero->data_ptr<uint8_t>(), N, K, w.param});
      }
      return fn(Int4Format<false>{d.data_ptr<uint8_t>(), scale, nullptr, N, K, w.param});
    case 3:
      TORCH_CHECK(d.scalar_type() == at::kByte, "fused_moe: GGUF ", w.name, " must be uint8");
      return tram::gguf_float::with_format(w.param, [&](auto fmt) {
        using F = decltype(fmt);
        TORCH_CHECK(K % F::kBlock == 0 && d.size(2) == tram::gguf_float::row_bytes_of<F>(K), "fused_moe: GGUF ",
                    w.name, ": K = ", K, " in blocks of ", F::kBlock, " needs rows of ",
                    tram::gguf_float::row_bytes_of<F>(K), " bytes");
        fn(GgufFormat<F>{d.data_ptr<uint8_t>(), N, K, d.size(2)});
      });
    case 4: {
      TORCH_CHECK(d.scalar_type() == at::kByte && K % tram::q8k::kBlock == 0, "fused_moe: int8-activation GGUF ",
                  w.name, " must be uint8 K-quant rows with K = ", K, " a multiple of 256");
      bool taken = false;
#if defined(TRAM_X8_KERNELS)
      const bool repacked = tram::x8::with_layout(w.param, [&](auto layout) {
        using L = decltype(layout);
        TORCH_CHECK(N % tram::x8::kRows == 0 && d.size(2) == K / tram::q8k::kBlock * L::kRowBytes, "fused_moe: repacked ",
                    w.name, " takes [E, N, ", K / tram::q8k::kBlock * L::kRowBytes, "] uint8 with N a multiple of 8");
        fn(GgufX8Format<L>{d.data_ptr<uint8_t>(), N, K, d.size(2)});
      });
      if (repacked) return;
#endif
#if defined(TRAM_Q8K_KERNELS)
      taken = tram::q8k::with_kquant(w.param, [&](auto fmt) {
        using F = decltype(fmt);
        TORCH_CHECK(d.size(2) == K / tram::q8k::kBlock * F::kBytes, "fused_moe: GGUF ", w.name, " rows of ",
                    d.size(2), " bytes, expected ", K / tram::q8k::kBlock * F::kBytes);
        fn(GgufQ8KFormat<F>{d.data_ptr<uint8_t>(), N, K, d.size(2)});
      });
#endif
      TORCH_CHECK(taken, "fused_moe: int8 activations take Q4_K, Q5_K or Q6_K experts on an AVX2 build, not type ", w.param);
      return;
    }
    default:
      TORCH_CHECK(false, "fused_moe: unknown weight format ", w.format);
  }
}

// The pairs (t, j) grouped by expert (a counting sort: by expert, then token, then slot).
void route(Moe& s, const int32_t* ids) {
  std::vector<int64_t> cursor(static_cast<size_t>(s.E + 1), 0);
  for (int64_t i = 0; i < s.T * s.k; ++i) {
    TORCH_CHECK(ids[i] < s.E, "fused_moe: expert id ", ids[i], " out of range (", s.E, " experts)");
    if (ids[i] >= 0) ++cursor[ids[i] + 1];
  }
  for (int64_t e = 0; e < s.E; ++e) cursor[e + 1] += cursor[e];
  s.start = cursor;
  s.pos.assign(static_cast<size_t>(s.T * s.k), -1);
  s.token.resize(static_cast<size_t>(s.start[s.E]));
  for (int64_t i = 0; i < s.T * s.k; ++i) {
    if (ids[i] >= 0) s.pos[i] = cursor[ids[i]]++, s.token[s.pos[i]] = i / s.k;
  }
}

// Each pair's token as a float32 row of xg (zero-padded); act's padding zeroed (the down projection
// reads it); rows are independent, so in parallel. Pairs of experts on tiles read their own copy.
// bf16_copy: also keep x in bfloat16 (xb) for float w13's bf16 dot products.
template <typename T>
void gather_tokens(Moe& s, const T* x, bool bf16_copy) {
  const int64_t P = s.start[s.E];
  std::vector<uint8_t> skip(static_cast<size_t>(P), 0);
  for (int64_t e = 0; e < s.E; ++e) {
    if (s.on_tiles(e) || s.on_gemm(e)) std::fill(skip.begin() + s.start[e], skip.begin() + s.start[e + 1], 1);
  }
  s.xg.grow(P * s.ldh);
  s.has_xb = false;
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) s.has_xb = bf16_copy;
#endif
  if (s.has_xb) s.xb.grow(P * s.ldh);
  s.act.grow(P * s.ldi);
  s.y2.grow(P * s.H);
  at::parallel_for(0, P, 16, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      if (skip[p]) continue;
      float* dst = s.xg.data() + p * s.ldh;
      const T* src = x + s.token[p] * s.H;
      for (int64_t h = 0; h < s.H; ++h) dst[h] = load1(src + h);
      std::fill(dst + s.H, dst + s.ldh, 0.0f);
      if (s.has_xb) {
        c10::BFloat16* xb = s.xb.data() + p * s.ldh;
        std::copy(src, src + s.H, xb);
        std::fill(xb + s.H, xb + s.ldh, c10::BFloat16(0.0f));
      }
      std::fill(s.act.data() + p * s.ldi + s.I, s.act.data() + (p + 1) * s.ldi, 0.0f);
    }
  });
}

// out[t] = sum over its slots, in slot order, of weight * its pair's down projection (y2, or gy plus
// b2 for an expert through ATen's GEMM); one rounding to out's dtype.
template <typename T>
void combine(const Moe& s, const float* weights, T* out) {
  at::parallel_for(0, s.T, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(static_cast<size_t>(s.H));
    for (int64_t t = begin; t < end; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < s.k; ++j) {
        const int64_t p = s.pos[t * s.k + j];
        if (p < 0) continue;
        const float w = weights[t * s.k + j];
        if (s.any_gemm && s.gemm[s.expert_of[p]]) {
          const c10::BFloat16* y = s.gy.data() + p * s.H;
          const float* b = s.b2 != nullptr ? s.b2 + s.expert_of[p] * s.H : nullptr;
          for (int64_t h = 0; h < s.H; ++h) acc[h] += w * (static_cast<float>(y[h]) + (b != nullptr ? b[h] : 0.0f));
          continue;
        }
        const float* y = s.y2.data() + p * s.H;
        for (int64_t h = 0; h < s.H; ++h) acc[h] += w * y[h];
      }
      for (int64_t h = 0; h < s.H; ++h) store(acc[h], out + t * s.H + h);
    }
  });
}

const float* float_bias(const c10::optional<at::Tensor>& b, int64_t E, int64_t N, at::Tensor& keep, const char* name) {
  if (!b.has_value() || !b->defined()) return nullptr;
  TORCH_CHECK(b->numel() == E * N, "fused_moe: ", name, " must be [E, ", N, "]");
  keep = b->to(at::kFloat).contiguous();
  return keep.data_ptr<float>();
}

}  // namespace

namespace tram {

at::Tensor fused_moe(const at::Tensor& x, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                     const at::Tensor& w13, const c10::optional<at::Tensor>& w13_scale, int64_t w13_format,
                     int64_t w13_param, const at::Tensor& w2, const c10::optional<at::Tensor>& w2_scale,
                     int64_t w2_format, int64_t w2_param, const c10::optional<at::Tensor>& b13,
                     const c10::optional<at::Tensor>& b2, int64_t activation, double alpha, double limit,
                     const c10::optional<at::Tensor>& w13_zero, const c10::optional<at::Tensor>& w2_zero) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "fused_moe: x must be a [T, H] float32 or bfloat16 CPU tensor");
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) == x.size(0) && topk_ids.scalar_type() == at::kInt &&
                  topk_weights.sizes() == topk_ids.sizes() && topk_weights.scalar_type() == at::kFloat,
              "fused_moe: topk_ids [T, k] int32 and topk_weights [T, k] float32");
  TORCH_CHECK(activation == 0 || activation == 1, "fused_moe: activation 0 (silu) or 1 (swiglu_oai)");
  TORCH_CHECK(w13.dim() == 3 && w13.size(1) % 2 == 0, "fused_moe: w13 must be [E, 2I, ...]");
  TORCH_CHECK(w13_format != 4 || !tram::x8::is_repacked(w13_param) || w13.size(1) % 16 == 0,
              "fused_moe: repacked w13 needs the intermediate size a multiple of 8");
  // Its buffers are kept for the next call (Scratch). Named through a reference: a lambda names a
  // thread_local itself on the thread it runs on, where it captures a reference.
  thread_local Moe state;
  Moe& s = state;
  s.T = x.size(0), s.H = x.size(1), s.k = topk_ids.size(1), s.E = w13.size(0), s.I = w13.size(1) / 2;
  s.ldh = padded(s.H), s.ldi = padded(s.I);
  s.tiles.first.clear();  // no expert on tiles unless plan() says so
  s.activation = Activation{activation, static_cast<float>(alpha), static_cast<float>(limit)};
  at::Tensor out = at::empty({s.T, s.H}, x.options());
  at::Tensor b13_keep, b2_keep;
  s.b13 = float_bias(b13, s.E, 2 * s.I, b13_keep, "b13");
  s.b2 = float_bias(b2, s.E, s.H, b2_keep, "b2");
  const at::Tensor xc = x.contiguous(), ids = topk_ids.contiguous(), wts = topk_weights.contiguous();
  route(s, ids.data_ptr<int32_t>());
  const bool bf16_float = x.scalar_type() == at::kBFloat16 && w13_format == 0 && w2_format == 0;
#if defined(TRAM_MOE_AMX)
  const bool tiles = bf16_float && tram::moe::amx_bf16::applies(s.H, s.I);
  if (tiles) tram::moe::amx_bf16::plan(s);
#endif
  tram::moe::aten_gemm::plan(s, bf16_float);
  if (x.scalar_type() == at::kFloat) gather_tokens(s, xc.data_ptr<float>(), false);
  else gather_tokens(s, xc.data_ptr<c10::BFloat16>(), w13_format == 0);
#if defined(TRAM_MOE_AMX)
  if (tiles) tram::moe::amx_bf16::pack_all_tokens(s, xc.data_ptr<c10::BFloat16>());
#endif
  const WeightArg a13{w13, w13_scale, w13_zero, w13_format, w13_param, "w13"};
  const WeightArg a2{w2, w2_scale, w2_zero, w2_format, w2_param, "w2"};
  if (w13_format == 4) s.xq.quantize(s.xg.data(), s.ldh, s.start[s.E], s.H);
  with_weight(a13, s.E, 2 * s.I, s.H, x.scalar_type(), [&](const auto& f) {
    for_expert_tiles(s, s.I, kGateRows, [&](int64_t e, int64_t i0) { gate_up_item(f, s, e, i0); });
  });
  if (w2_format == 4) s.aq.quantize(s.act.data(), s.ldi, s.start[s.E], s.I);
  with_weight(a2, s.E, s.H, s.I, x.scalar_type(), [&](const auto& f) {
    for_expert_tiles(s, s.H, kDownRows, [&](int64_t e, int64_t n0) { down_item(f, s, e, n0); });
  });
  if (s.any_gemm) {  // after with_weight checked the weights' shapes
    tram::moe::aten_gemm::run(s, xc.data_ptr<c10::BFloat16>(), w13.data_ptr<c10::BFloat16>(),
                              w2.data_ptr<c10::BFloat16>());
  }
  if (x.scalar_type() == at::kFloat) combine(s, wts.data_ptr<float>(), out.data_ptr<float>());
  else combine(s, wts.data_ptr<float>(), out.data_ptr<c10::BFloat16>());
  return out;
}

bool fused_moe_tiles(int64_t hidden, int64_t intermediate) {
#if defined(TRAM_MOE_AMX)
  return tram::moe::amx_bf16::applies(hidden, intermediate);
#else
  (void)hidden, (void)intermediate;
  return false;
#endif
}

}  // namespace tram
