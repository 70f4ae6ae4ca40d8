// fused_moe.cpp's state for one call: the (token, slot) pairs grouped by expert, each pair's copy of its
// token in the forms the expert paths read, and the buffers between the two projections.
#pragma once

#include "gguf_q8k.h"
#include "simd.h"

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

namespace tram::moe {

using namespace tram::simd;

struct Activation {
  int64_t kind;  // 0: silu(gate) * up; 1: gpt-oss's clamped swiglu
  float alpha, limit;
  TRAM_INLINE float operator()(float g, float u) const {
    if (kind == 0) return g / (1.0f + std::exp(-g)) * u;
    g = std::min(g, limit);
    u = std::max(std::min(u, limit), -limit);
    return (u + 1.0f) * (g / (1.0f + std::exp(-alpha * g)));
  }
  // 16 at a time (within an ulp or two of the above): g * sigmoid(a * g) from e = exp(-|a * g|) <= 1,
  // which never overflows.
  TRAM_INLINE vf16 operator()(vf16 g, vf16 u) const {
    const vf16 zero{}, hi = splat16(limit), lo = splat16(-limit);
    if (kind == 1) {
      g = select(hi < g, hi, g);
      u = select(hi < u, hi, select(u < lo, lo, u));
    }
    const vf16 ag = kind == 1 ? g * alpha : g;
    const vf16 e = exp_nonpos(select(ag < zero, ag, -ag));
    const vf16 sigmoid = select(ag < zero, e, splat16(1.0f)) / (e + 1.0f);
    return kind == 1 ? (u + 1.0f) * (g * sigmoid) : g * sigmoid * u;
  }
};

// A buffer kept from call to call (the call's state is thread_local), grown, never cleared: each call
// writes what it reads. Fresh pages for the ~250 MB of buffers of a 1024-token prefill cost their page
// faults and zeroing on every call, with one core waiting for the other in the kernel's page lock.
template <typename T>
class Scratch {
 public:
  T* data() const { return p_.get(); }
  void grow(int64_t n) {
    if (n > n_) p_.reset(new T[static_cast<size_t>(n)]), n_ = n;  // new T[]: no zeroing pass
  }

 private:
  std::unique_ptr<T[]> p_;
  int64_t n_ = 0;
};

// The tokens of the experts that multiply on the tile unit (moe_amx.h), transposed into its B layout:
// per tile of 16 tokens and 32 k, 16 rows (pairs of k) of 16 tokens' bfloat16 pairs.
struct TileTokens {
  std::vector<int64_t> first;  // [E]: expert e's first tile of tokens, -1 where e takes the vector paths
  int64_t tiles = 0;
  Scratch<uint32_t> x;    // [tiles][H / 32][16][16]: the pairs' tokens
  Scratch<uint32_t> act;  // [tiles][I / 32][16][16]: act(gate, up), the down projection's input
};

struct Moe {
  int64_t T, H, I, k, E;
  std::vector<int64_t> start;  // [E + 1]: expert e's pairs are start[e] .. start[e + 1] - 1
  std::vector<int64_t> pos;    // [T * k]: the pair of slot (t, j), or -1
  std::vector<int64_t> token;  // [P]: each pair's token
  Scratch<float> xg;           // [P, ldh]: each pair's token, float32, zero-padded
  Scratch<c10::BFloat16> xb;   // [P, ldh]: the same in bfloat16 when has_xb
  bool has_xb;                 // x and w13 are bfloat16 (AVX512-BF16 builds only)
  Scratch<float> act;          // [P, ldi]: act(gate, up) per pair, zero-padded
  Scratch<float> y2;           // [P, H]: each pair's down projection (plus b2)
  tram::q8k::QuantizedRows xq, aq;  // xg's and act's rows quantized per 256 k (format 4 only)
  TileTokens tiles;
  // Experts multiplied through ATen's GEMM (moe_aten_gemm.h): which ones ([E]), each pair's expert, and
  // per pair its token, gate/up outputs, act and down outputs in bfloat16 ([P, H], [P, 2I], [P, I], [P, H]).
  std::vector<uint8_t> gemm;
  bool any_gemm = false;
  std::vector<int64_t> expert_of;
  Scratch<c10::BFloat16> gx, gh, ga, gy;
  // The work items write disjoint rows and columns of act and y2 through a const Moe.
  float* act_at(int64_t p) const { return act.data() + p * ldi; }
  float* y2_at(int64_t p) const { return y2.data() + p * H; }
  int64_t ldh, ldi;
  const float* b13;  // [E, 2I] float32 or nullptr
  const float* b2;   // [E, H] float32 or nullptr
  Activation activation;
  int64_t count(int64_t e) const { return start[e + 1] - start[e]; }
  bool on_tiles(int64_t e) const { return !tiles.first.empty() && tiles.first[e] >= 0; }
  bool on_gemm(int64_t e) const { return any_gemm && gemm[e] != 0; }
  // Whether fused_moe.cpp's work items (the vector paths, AMX tiles) multiply expert e.
  bool on_items(int64_t e) const { return count(e) > 0 && !on_gemm(e); }
};

}  // namespace tram::moe
