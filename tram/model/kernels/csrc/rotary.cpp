// Rotary position embedding (the rotate-half form of Llama/Qwen/Mistral), in place on query and key.
//
//   rotary_(query [T, H, D], key [T, Hkv, D], cos [T, R], sin [T, R])   R = rotary dim <= D, even;
//   each token's heads contiguous, tokens any stride apart (column slices of one q/k/v GEMM)
//
// For i < R/2, with x1 = x[i], x2 = x[i + R/2]:
//   x[i]       = x1 * cos[i]       + (-x2) * sin[i]
//   x[i + R/2] = x2 * cos[i + R/2] +   x1  * sin[i + R/2]
// and features from R on pass through. Why: PyTorch spends about ten ops per tensor on this (slices,
// a negation, a concatenation, two products, a sum); here it is one call for both tensors. Each
// product and the sum are rounded to the dtype, as those PyTorch ops round them, and nothing is
// contracted into an FMA, so the result is the same as transformers' apply_rotary_pos_emb.
#include "kernels.h"
#include "simd.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

// Every function below rounds each product and sum separately (see the header comment).
#pragma GCC optimize("fp-contract=off")

namespace {

constexpr int64_t kGrainTokens = 16;

template <typename T>
inline T mul(T a, T b) {
  return static_cast<T>(static_cast<float>(a) * static_cast<float>(b));
}

template <typename T>
void rotate_heads(T* x, int64_t heads, int64_t head_dim, const T* cos, const T* sin, int64_t rotary_dim) {
  const int64_t half = rotary_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    T* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const T x1 = v[i], x2 = v[i + half];
      const T a = mul(x1, cos[i]), b = mul(static_cast<T>(-static_cast<float>(x2)), sin[i]);
      const T c = mul(x2, cos[i + half]), d = mul(x1, sin[i + half]);
      v[i] = static_cast<T>(static_cast<float>(a) + static_cast<float>(b));
      v[i + half] = static_cast<T>(static_cast<float>(c) + static_cast<float>(d));
    }
  }
}

// bfloat16, 8 features at a time: the same roundings as the loop above (each product and sum rounded
// to bf16, round_bf16x8 matching c10's rounding bit for bit), without a scalar conversion per
// element, which would make the bf16 loop several times slower than float32's.
void rotate_heads(c10::BFloat16* x, int64_t heads, int64_t head_dim, const c10::BFloat16* cos,
                  const c10::BFloat16* sin, int64_t rotary_dim) {
  using namespace tram::simd;
  const int64_t half = rotary_dim / 2;
  const int64_t vec_end = half / 8 * 8;
  for (int64_t h = 0; h < heads; ++h) {
    c10::BFloat16* v = x + h * head_dim;
    for (int64_t i = 0; i < vec_end; i += 8) {
      const vf8 x1 = widen_bf16x8(v + i), x2 = widen_bf16x8(v + i + half);
      const vf8 a = round_bf16x8(x1 * widen_bf16x8(cos + i)), b = round_bf16x8(-x2 * widen_bf16x8(sin + i));
      const vf8 c = round_bf16x8(x2 * widen_bf16x8(cos + i + half));
      const vf8 d = round_bf16x8(x1 * widen_bf16x8(sin + i + half));
      store_bf16x8(v + i, round_bf16x8(a + b));
      store_bf16x8(v + i + half, round_bf16x8(c + d));
    }
    for (int64_t i = vec_end; i < half; ++i) {
      const c10::BFloat16 x1 = v[i], x2 = v[i + half];
      const c10::BFloat16 a = mul(x1, cos[i]), b = mul(static_cast<c10::BFloat16>(-static_cast<float>(x2)), sin[i]);
      const c10::BFloat16 c = mul(x2, cos[i + half]), d = mul(x1, sin[i + half]);
      v[i] = static_cast<c10::BFloat16>(static_cast<float>(a) + static_cast<float>(b));
      v[i + half] = static_cast<c10::BFloat16>(static_cast<float>(c) + static_cast<float>(d));
    }
  }
}

template <typename T>
void rotary_impl(at::Tensor& query, at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t tokens = query.size(0), hq = query.size(1), hk = key.size(1), d = query.size(2);
  const int64_t r = cos.size(1), qs = query.stride(0), ks = key.stride(0);
  T* q = query.data_ptr<T>();
  T* k = key.data_ptr<T>();
  const T* c = cos.data_ptr<T>();
  const T* s = sin.data_ptr<T>();
  at::parallel_for(0, tokens, kGrainTokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      rotate_heads(q + t * qs, hq, d, c + t * r, s + t * r, r);
      rotate_heads(k + t * ks, hk, d, c + t * r, s + t * r, r);
    }
  });
}

}  // namespace

namespace tram {

void rotary_(at::Tensor& query, at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(query.device().is_cpu() && key.device().is_cpu() && cos.device().is_cpu() && sin.device().is_cpu(),
              "rotary_: CPU tensors only");
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3 && query.size(0) == key.size(0) && query.size(2) == key.size(2),
              "rotary_: query must be [T, H, D] and key [T, Hkv, D]");
  // Each token's heads contiguous and tokens apart (q, k: column slices of one q/k/v GEMM); rows that
  // overlapped (an expanded tensor) would be rotated more than once.
  const auto token_rows = [](const at::Tensor& t) {
    return t.stride(2) == 1 && (t.size(1) == 1 || t.stride(1) == t.size(2)) &&
           (t.size(0) <= 1 || t.stride(0) >= t.size(1) * t.size(2));
  };
  TORCH_CHECK(token_rows(query) && token_rows(key),
              "rotary_: query and key must be rows of tokens, each token's heads contiguous");
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(0) == query.size(0) &&
                  cos.size(1) % 2 == 0 && cos.size(1) <= query.size(2),
              "rotary_: cos and sin must be [T, R] with R even and at most head_dim");
  TORCH_CHECK(query.scalar_type() == key.scalar_type() && cos.scalar_type() == query.scalar_type() &&
                  sin.scalar_type() == query.scalar_type(),
              "rotary_: all tensors must have one dtype");
  const at::Tensor cc = cos.contiguous(), sc = sin.contiguous();
  switch (query.scalar_type()) {
    case at::kFloat:
      rotary_impl<float>(query, key, cc, sc);
      break;
    case at::kBFloat16:
      rotary_impl<c10::BFloat16>(query, key, cc, sc);
      break;
    case at::kHalf:
      rotary_impl<c10::Half>(query, key, cc, sc);
      break;
    default:
      TORCH_CHECK(false, "rotary_: unsupported dtype ", query.scalar_type());
  }
}

}  // namespace tram
