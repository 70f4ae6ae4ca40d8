// The gated MLP's middle: silu(gate) * up from one [T, 2I] tensor (gate and up side by side, what one
// GEMM over the stacked gate/up weights writes), in one pass.
//
//   silu_and_mul(gate_up [T, 2I]) -> [T, I]    silu(gate_up[:, :I]) * gate_up[:, I:]
//   silu_and_mul_pair(gate, up [T, I]) -> [T, I]  the same from two tensors (quantized models' gate
//                                                and up are two linears, and torch's silu and mul
//                                                are a visible share of a GGUF prefill)
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

constexpr int64_t kSiluGrainRows = 4;

TRAM_INLINE vf16 silu16(vf16 g) {
  const vf16 zero{};
  const vf16 neg_abs = select(g < zero, g, -g);
  const vf16 e = exp_nonpos(neg_abs);
  const vf16 num = select(g < zero, g * e, g);
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

// Rows of gate and up [T, I] with row strides ldg and ldu: side by side in one [T, 2I] tensor, or
// two tensors (a quantized model's gate and up come from two linears).
template <typename T>
void silu_and_mul_impl(const T* gate, int64_t ldg, const T* up, int64_t ldu, at::Tensor& out) {
  const int64_t rows = out.size(0), n = out.size(1);
  T* op = out.data_ptr<T>();
  at::parallel_for(0, rows, kSiluGrainRows, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) row(gate + t * ldg, up + t * ldu, op + t * n, n);
  });
}

// out [T, I] = silu(gate) * up; gate and up row-major with unit column stride.
at::Tensor run(const at::Tensor& gate, const at::Tensor& up, int64_t inter) {
  at::Tensor out = at::empty({gate.size(0), inter}, gate.options());
  const int64_t ldg = gate.stride(0), ldu = up.stride(0);
  switch (gate.scalar_type()) {
    case at::kFloat:
      silu_and_mul_impl<float>(gate.data_ptr<float>(), ldg, up.data_ptr<float>(), ldu, out);
      break;
    case at::kBFloat16:
      silu_and_mul_impl<c10::BFloat16>(gate.data_ptr<c10::BFloat16>(), ldg, up.data_ptr<c10::BFloat16>(), ldu, out);
      break;
    case at::kHalf:
      silu_and_mul_impl<c10::Half>(gate.data_ptr<c10::Half>(), ldg, up.data_ptr<c10::Half>(), ldu, out);
      break;
    default:
      TORCH_CHECK(false, "silu_and_mul: unsupported dtype ", gate.scalar_type());
  }
  return out;
}

}  // namespace

namespace tram {

at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.device().is_cpu() && gate_up.dim() == 2 && gate_up.size(1) % 2 == 0,
              "silu_and_mul: gate_up must be a [T, 2I] CPU tensor");
  const at::Tensor x = gate_up.contiguous();
  const int64_t inter = x.size(1) / 2;
  return run(x, x.narrow(1, inter, inter), inter);
}

at::Tensor silu_and_mul_pair(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.device().is_cpu() && up.device().is_cpu() && gate.dim() == 2 && gate.sizes() == up.sizes() &&
                  gate.scalar_type() == up.scalar_type(),
              "silu_and_mul_pair: gate and up must be [T, I] CPU tensors of one dtype");
  // Row-major rows are what the kernel walks; a slice of a wider tensor's columns needs no copy.
  const at::Tensor g = gate.stride(1) == 1 ? gate : gate.contiguous();
  const at::Tensor u = up.stride(1) == 1 ? up : up.contiguous();
  return run(g, u, gate.size(1));
}

}  // namespace tram
