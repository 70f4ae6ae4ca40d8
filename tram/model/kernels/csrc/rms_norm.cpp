// RMSNorm as Hugging Face computes it, in one pass per row instead of seven PyTorch ops.
//
//   rms_norm(x [T, N], weight [N], eps)                -> weight * to_dtype(x32 * rsqrt(mean(x32^2) + eps))
//   add_rms_norm(x [T, N], residual [T, N], weight, eps) -> (rms_norm(s), s) with s = to_dtype(x + residual)
//   rms_norm_add(x, residual, weight, eps, next_weight)   -> (s, rms_norm(s, next_weight) or an empty tensor)
//                                                            with s = to_dtype(residual + rms_norm(x, weight))
//
// rms_norm_add is Gemma's sandwich (a norm on the branch's output before the residual add, then the
// next norm of the sum): three calls in one, the same roundings as the three.
//
// Why: in a decode step of a small model each op costs a few microseconds of dispatch whatever its
// size, and the norms were 7 of them, twice per layer. Roundings follow transformers: with a weight of
// x's dtype, LlamaRMSNorm's (statistics in float32, the normalised row rounded to the dtype, then
// multiplied by the weight and rounded again); with a float32 weight for a 16-bit x, Gemma's and OLMo
// 2's (the weight multiplies the float32 normalised row, rounded once; Gemma's caller passes 1 + w).
// For float32 x the two coincide. Only the order of the sum of squares differs from PyTorch's (fixed
// here for a build: it never depends on T or on the thread count).
#include "kernels.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <tuple>

// x * r rounds before the weight multiplies it, as in PyTorch's two ops: no FMA contraction.
#pragma GCC optimize("fp-contract=off")

namespace {

constexpr int64_t kNormGrainRows = 8;

template <typename T>
float sum_of_squares(const T* row, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(row[i]);
    acc += v * v;
  }
  return acc;
}

// W = T: the normalised row rounds to T before the weight multiplies it; W = float: it does not.
template <typename T, typename W>
void normalize_row(const T* row, const W* weight, T* out, int64_t n, double eps) {
  const float mean = sum_of_squares(row, n) / static_cast<float>(n);
  const float r = 1.0f / std::sqrt(mean + static_cast<float>(eps));
  for (int64_t i = 0; i < n; ++i) {
    const W normed = static_cast<W>(static_cast<float>(row[i]) * r);
    out[i] = static_cast<T>(static_cast<float>(weight[i]) * static_cast<float>(normed));
  }
}

template <typename T, typename W>
void rms_norm_impl(const at::Tensor& x, const at::Tensor* residual, const at::Tensor& weight, double eps,
                   at::Tensor& out, at::Tensor* sum) {
  const int64_t rows = x.size(0), n = x.size(1);
  const T* xp = x.data_ptr<T>();
  const T* rp = residual != nullptr ? residual->data_ptr<T>() : nullptr;
  T* sp = sum != nullptr ? sum->data_ptr<T>() : nullptr;
  const W* wp = weight.data_ptr<W>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, rows, kNormGrainRows, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* row = xp + t * n;
      if (rp != nullptr) {
        T* srow = sp + t * n;
        const T* rrow = rp + t * n;
        for (int64_t i = 0; i < n; ++i) {
          srow[i] = static_cast<T>(static_cast<float>(rrow[i]) + static_cast<float>(row[i]));
        }
        row = srow;
      }
      normalize_row<T, W>(row, wp, op + t * n, n, eps);
    }
  });
}

// s = residual + norm(x, w) per row (rounded as PyTorch's add), then norm(s, next_w) where given.
template <typename T, typename W>
void norm_add_impl(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps,
                   const at::Tensor* next_weight, at::Tensor& sum, at::Tensor* next) {
  const int64_t rows = x.size(0), n = x.size(1);
  const T* xp = x.data_ptr<T>();
  const T* rp = residual.data_ptr<T>();
  const W* wp = weight.data_ptr<W>();
  const W* np = next_weight != nullptr ? next_weight->data_ptr<W>() : nullptr;
  T* sp = sum.data_ptr<T>();
  T* op = next != nullptr ? next->data_ptr<T>() : nullptr;
  at::parallel_for(0, rows, kNormGrainRows, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      T* srow = sp + t * n;
      normalize_row<T, W>(xp + t * n, wp, srow, n, eps);
      const T* rrow = rp + t * n;
      for (int64_t i = 0; i < n; ++i) {
        srow[i] = static_cast<T>(static_cast<float>(rrow[i]) + static_cast<float>(srow[i]));
      }
      if (np != nullptr) {
        normalize_row<T, W>(srow, np, op + t * n, n, eps);
      }
    }
  });
}

void check_args(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "rms_norm: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && weight.size(0) == x.size(1),
              "rms_norm: x must be [T, N] and weight [N]");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type() || weight.scalar_type() == at::kFloat,
              "rms_norm: the weight must be x's dtype or float32");
}

template <typename T, typename W>
struct NormTypes {
  using X = T;       // x's element
  using Weight = W;  // the weight's: X (Llama's roundings) or float (Gemma's and OLMo 2's)
};

// fn(NormTypes<T, W>{}) for x's dtype and the weight's.
template <typename F>
void with_norm_types(const at::Tensor& x, const at::Tensor& weight, const char* name, F&& fn) {
  const bool float_weight = weight.scalar_type() == at::kFloat;
  switch (x.scalar_type()) {
    case at::kFloat:
      fn(NormTypes<float, float>{});
      break;
    case at::kBFloat16:
      float_weight ? fn(NormTypes<c10::BFloat16, float>{}) : fn(NormTypes<c10::BFloat16, c10::BFloat16>{});
      break;
    case at::kHalf:
      float_weight ? fn(NormTypes<c10::Half, float>{}) : fn(NormTypes<c10::Half, c10::Half>{});
      break;
    default:
      TORCH_CHECK(false, name, ": unsupported dtype ", x.scalar_type());
  }
}

void dispatch(const at::Tensor& x, const at::Tensor* residual, const at::Tensor& weight, double eps,
              at::Tensor& out, at::Tensor* sum) {
  with_norm_types(x, weight, "rms_norm", [&](auto types) {
    using Types = decltype(types);
    rms_norm_impl<typename Types::X, typename Types::Weight>(x, residual, weight, eps, out, sum);
  });
}

}  // namespace

namespace tram {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_args(x, weight);
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc);
  dispatch(xc, nullptr, wc, eps, out, nullptr);
  return out;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_add(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps,
                                                const c10::optional<at::Tensor>& next_weight) {
  check_args(x, weight);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
              "rms_norm_add: residual must match x");
  const at::Tensor xc = x.contiguous(), rc = residual.contiguous(), wc = weight.contiguous();
  at::Tensor nw;
  if (next_weight.has_value()) {
    nw = next_weight->contiguous();
    TORCH_CHECK(nw.scalar_type() == wc.scalar_type() && nw.sizes() == wc.sizes(),
                "rms_norm_add: next_weight must match weight");
  }
  at::Tensor sum = at::empty_like(xc);
  at::Tensor next = nw.defined() ? at::empty_like(xc) : at::empty({0}, xc.options());
  const at::Tensor* nwp = nw.defined() ? &nw : nullptr;
  at::Tensor* nextp = nw.defined() ? &next : nullptr;
  with_norm_types(xc, wc, "rms_norm_add", [&](auto types) {
    using Types = decltype(types);
    norm_add_impl<typename Types::X, typename Types::Weight>(xc, rc, wc, eps, nwp, sum, nextp);
  });
  return {sum, next};
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  check_args(x, weight);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
              "add_rms_norm: residual must match x");
  const at::Tensor xc = x.contiguous(), rc = residual.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc), sum = at::empty_like(xc);
  dispatch(xc, &rc, wc, eps, out, &sum);
  return {out, sum};
}

}  // namespace tram
