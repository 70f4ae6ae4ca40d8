// A mixture-of-experts router's choice: from router logits, each token's k experts and their weights.
//
//   moe_route(logits [T, E] float32 / bfloat16 / float16, top_k, softmax_first, renormalize)
//     -> (weights [T, k] float32, ids [T, k] int32), each row's experts by weight, largest first
//
// softmax_first: a softmax over all E logits, then the k largest probabilities (Qwen3-MoE, Mixtral),
// divided by their sum when renormalize; else the k largest logits, then a softmax over those k (gpt-oss).
// Ties go to the lower expert id.
//
// Why: in PyTorch the choice is six small ops (float, softmax, topk, sum, div, to), each a dispatch,
// and at decode, right after a layer's weights have streamed through the caches, each costs 10-20 µs;
// a one-token step spent more time there than in the router's linear. Float32 throughout; the exp is
// the C library's, so weights may differ from PyTorch's vectorised softmax in the last bits.
#include "kernels.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

template <typename T>
void route_row(const T* logits, int64_t E, int64_t k, bool softmax_first, bool renormalize, float* w, int32_t* ids,
               std::vector<float>& score, std::vector<int32_t>& order) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t e = 0; e < E; ++e) {
    score[e] = static_cast<float>(logits[e]);
    top = std::max(top, score[e]);
  }
  if (softmax_first) {
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      score[e] = std::exp(score[e] - top);
      sum += score[e];
    }
    for (int64_t e = 0; e < E; ++e) score[e] /= sum;
  }
  for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int32_t>(e);
  // NaN sorts last: it never wins a slot over a number.
  auto better = [&](int32_t a, int32_t b) {
    const float sa = score[a], sb = score[b];
    if (std::isnan(sb)) return !std::isnan(sa) || a < b;
    if (std::isnan(sa)) return false;
    return sa > sb || (sa == sb && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.begin() + E, better);
  for (int64_t j = 0; j < k; ++j) {
    ids[j] = order[j];
    w[j] = score[order[j]];
  }
  if (softmax_first && !renormalize) return;
  if (!softmax_first) {  // softmax over the k chosen logits; w[0] is their largest
    const float m = w[0];
    for (int64_t j = 0; j < k; ++j) w[j] = std::exp(w[j] - m);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) sum += w[j];
  for (int64_t j = 0; j < k; ++j) w[j] /= sum;
}

}  // namespace

namespace tram {

std::tuple<at::Tensor, at::Tensor> moe_route(const at::Tensor& logits, int64_t top_k, bool softmax_first,
                                             bool renormalize) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2, "moe_route: logits must be a [T, E] CPU tensor");
  const int64_t T = logits.size(0), E = logits.size(1);
  TORCH_CHECK(top_k >= 1 && top_k <= E, "moe_route: top_k = ", top_k, " must be in 1 ..", E);
  const at::Tensor l = logits.contiguous();
  at::Tensor weights = at::empty({T, top_k}, logits.options().dtype(at::kFloat));
  at::Tensor ids = at::empty({T, top_k}, logits.options().dtype(at::kInt));
  float* w = weights.data_ptr<float>();
  int32_t* id = ids.data_ptr<int32_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, l.scalar_type(), "moe_route", [&] {
    const scalar_t* x = l.data_ptr<scalar_t>();
    // A few tokens at decode: one thread, no parallel region to wake; a prefill's rows split.
    const int64_t grain = T * E < 65536 ? T : 64;
    at::parallel_for(0, T, grain, [&](int64_t begin, int64_t end) {
      std::vector<float> score(static_cast<size_t>(E));
      std::vector<int32_t> order(static_cast<size_t>(E));
      for (int64_t t = begin; t < end; ++t) {
        route_row(x + t * E, E, top_k, softmax_first, renormalize, w + t * top_k, id + t * top_k, score, order);
      }
    });
  });
  return {weights, ids};
}

}  // namespace tram
