// The gated MLP's middle: silu(gate) * up from one [T, 2I] tensor (gate and up side by side, what one
// GEMM over the stacked gate/up weights writes), in one pass.
//
//   silu_and_mul(gate_up [T, 2I]) -> [T, I]    silu(gate_up[:, :I]) * gate_up[:, I:]
//
// Why: PyTorch runs silu and the product as two ops over the [T, I] intermediate, five passes over
// memory with a prefill's thousands of rows; this reads each input once and writes once. Roundings
// follow transformers' act(gate) * up: silu rounded to the dtype, then the product rounded.
// silu(g) = g / (1 + e^-g), with e = exp(-|g|) <= 1 so that it never overflows:
// g >= 0: g / (1 + e);  g < 0: g * e / (1 + e).
#include "kernels.h"
#include "simd.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

// silu rounds to the dtype before the product, as PyTorch's two ops do: no FMA contraction across.
#pragma GCC optimize("fp-contract=off")

namespace {

using namespace tram::simd;

constexpr int64_t kGrainRows = 4;

TRAM_INLINE vf16 silu16(vf16 g) {
  const vf16 zero{};
  const vf16 neg_abs = g < zero ? g : -g;
  const vf16 e = exp_nonpos(neg_abs);
  const vf16 num = g < zero ? g * e : g;
  return num / (e + 1.0f);
}

TRAM_INLINE float silu1(float g) {
  const vf16 v = silu16(splat16(g));
  return v[0];
}

template <typename T>
TRAM_INLINE void load16(const T* p, float* out) {
  for (int j = 0; j < 16; ++j) out[j] = load1(p + j);
}

void row(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const vf16 s = silu16(vload<vf16>(gate + i));
    vstore(out + i, s * vload<vf16>(up + i));
  }
  for (; i < n; ++i) out[i] = silu1(gate[i]) * up[i];
}

template <typename T>
void row(const T* gate, const T* up, T* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    alignas(64) float g[16], u[16];
    load16(gate + i, g);
    load16(up + i, u);
    const vf16 s = silu16(vload<vf16>(g));
    alignas(64) float sv[16];
    vstore(sv, s);
    for (int j = 0; j < 16; ++j) {
      T rounded;
      store(sv[j], &rounded);  // silu's result in the dtype, then the product
      store(load1(&rounded) * u[j], out + i + j);
    }
  }
  for (; i < n; ++i) {
    T rounded;
    store(silu1(load1(gate + i)), &rounded);
    store(load1(&rounded) * load1(up + i), out + i);
  }
}

template <typename T>
void silu_and_mul_impl(const at::Tensor& x, at::Tensor& out) {
  const int64_t rows = x.size(0), n = out.size(1);
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, rows, kGrainRows, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) row(xp + t * 2 * n, xp + t * 2 * n + n, op + t * n, n);
  });
}

}  // namespace

namespace tram {

at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.device().is_cpu() && gate_up.dim() == 2 && gate_up.size(1) % 2 == 0,
              "silu_and_mul: gate_up must be a [T, 2I] CPU tensor");
  const at::Tensor x = gate_up.contiguous();
  at::Tensor out = at::empty({x.size(0), x.size(1) / 2}, x.options());
  switch (x.scalar_type()) {
    case at::kFloat:
      silu_and_mul_impl<float>(x, out);
      break;
    case at::kBFloat16:
      silu_and_mul_impl<c10::BFloat16>(x, out);
      break;
    case at::kHalf:
      silu_and_mul_impl<c10::Half>(x, out);
      break;
    default:
      TORCH_CHECK(false, "silu_and_mul: unsupported dtype ", x.scalar_type());
  }
  return out;
}

}  // namespace tram
