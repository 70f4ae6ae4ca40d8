// y = x W^T (+ b) for few rows of x, W held in 8 or 4 bits: decode steps of a quantized model on CPU.
//
//   x      [M, K]      contiguous; float32 or bfloat16; M small (a decode batch)
//   int8:  qweight [N, K] int8, w[n, k] = q[n, k] * scale[n]             (scale [N] float32)
//   int4:  qweight [N, K / 2] uint8, w[n, k] = (q[n, k] - 8) * scale[n, k / group]   (scale [N, K / group])
//          Each 32 consecutive k of a row are 16 bytes: byte j holds k = j in its low nibble and
//          k = j + 16 in its high one, so one 16-byte load unpacks into two runs of 16 consecutive k.
//   zero   [N, K / group] uint8, optional (int4 only): w[n, k] = (q[n, k] - zero[n, k / group]) * scale[n, k / group],
//          the asymmetric checkpoints' (GPTQ, AWQ) form; without it every group's zero is 8.
//   bias   [N]         optional, x's dtype
//   -> y   [M, N]      x's dtype
//
// Why: decode is bound by reading W, and W in int8 or int4 is a quarter or an eighth of float32's
// bytes. torch's own weight-only CPU ops vectorise only bfloat16 activations; with float32 ones they
// are several times slower than a float32 linear (docs/benchmarks.md). Here every thread
// walks a contiguous range of W's rows once per call, widening each chunk of weights in registers and
// using it for up to four rows of x.
//
// Arithmetic: x (widened to float32) times the weights, summed in float32 as two 16-lane partial sums
// per output (even and odd chunks of 16 k), folded in a fixed order; int8 sums are then scaled per
// row, while int4 weights are scaled per group as they are widened (each is then exactly its
// dequantized value); plus the bias, rounded once to x's dtype. Tiles of up to 4 rows of x and 1-4
// rows of W share registers, but no output's order of additions depends on M, on the tiling or on
// the thread count.
#include "kernels.h"
#include "dynamic_for.h"
#include "prefetch.h"
#include "simd.h"
#include "quant_rows.h"
#include "widen_int8.h"
#include "tiled_gemm.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace tram::simd;


constexpr int64_t kLanes = 16;
constexpr int64_t kGrainRows = 32;


using tram::rows::Int4Rows;
using tram::rows::Int8Rows;

// Outputs n0 .. n0 + NB - 1 for rows m0 .. m0 + MB - 1 of x; xf is [M, k_pad] float32, zero-padded
// (quant_rows.h's dot_tile), then the int8 row scale, the bias and one rounding to y's dtype.
template <typename T, int64_t MB, int64_t NB, typename Rows>
TRAM_INLINE void tile(const float* xf, int64_t m0, int64_t k_pad, const Rows& rows, const float* post_scale,
                      const T* bias, T* y, int64_t N, int64_t K, int64_t n0) {
  float sums[MB][NB];
  tram::rows::dot_tile<MB, NB>(xf + m0 * k_pad, k_pad, rows, K, sums);
  for (int64_t m = 0; m < MB; ++m) {
    for (int64_t j = 0; j < NB; ++j) {
      const float b = bias != nullptr ? load1(bias + n0 + j) : 0.0f;
      const float s = post_scale != nullptr ? post_scale[j] : 1.0f;
      store(sums[m][j] * s + b, y + (m0 + m) * N + n0 + j);
    }
  }
}

struct Args {
  const float* xf;
  int64_t M, K, k_pad, N;
  const void* q;
  const float* scale;
  const uint8_t* zero;  // int4 zero points, or nullptr (all 8)
  int64_t group;  // 0: int8, per row
  const void* bias;
  void* y;
};

template <typename T, int64_t MB, int64_t NB>
TRAM_INLINE void run_tile(const Args& a, int64_t m0, int64_t n0) {
  const T* bias = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y);
  if (a.group == 0) {
    const Int8Rows rows{static_cast<const int8_t*>(a.q) + n0 * a.K, a.K};
    tile<T, MB, NB>(a.xf, m0, a.k_pad, rows, a.scale + n0, bias, y, a.N, a.K, n0);
  } else if (a.zero == nullptr) {
    const Int4Rows<false> rows{static_cast<const uint8_t*>(a.q) + n0 * (a.K / 2), a.scale + n0 * (a.K / a.group),
                               nullptr, a.K, a.group};
    tile<T, MB, NB>(a.xf, m0, a.k_pad, rows, nullptr, bias, y, a.N, a.K, n0);
  } else {
    const int64_t groups = a.K / a.group;
    const Int4Rows<true> rows{static_cast<const uint8_t*>(a.q) + n0 * (a.K / 2), a.scale + n0 * groups,
                              a.zero + n0 * groups, a.K, a.group};
    tile<T, MB, NB>(a.xf, m0, a.k_pad, rows, nullptr, bias, y, a.N, a.K, n0);
  }
}

// Every row of x for outputs n0 .. n0 + NB - 1, four rows of x at a time.
template <typename T, int64_t NB>
TRAM_INLINE void outputs(const Args& a, int64_t n0) {
  int64_t m0 = 0;
  for (; m0 + 4 <= a.M; m0 += 4) run_tile<T, 4, NB>(a, m0, n0);
  switch (a.M - m0) {
    case 3: run_tile<T, 3, NB>(a, m0, n0); break;
    case 2: run_tile<T, 2, NB>(a, m0, n0); break;
    case 1: run_tile<T, 1, NB>(a, m0, n0); break;
    default: break;
  }
}

template <typename T, int64_t NB>
void walk_rows(const Args& a, int64_t begin, int64_t end) {
  int64_t n = begin;
  for (; n + NB <= end; n += NB) outputs<T, NB>(a, n);
  for (; n < end; ++n) outputs<T, 1>(a, n);
}

template <typename T>
void quant_linear_impl(const Args& a) {
  tram::parallel::dynamic_for(a.N, kGrainRows, [&](int64_t begin, int64_t end) {
    if (a.M == 1) {
      walk_rows<T, kWideRows>(a, begin, end);
    } else {
      walk_rows<T, kNarrowRows>(a, begin, end);
    }
  });
}

// ---- many rows of x (quant_gemm): W decoded a tile at a time (tiled_gemm.h) --------------------

// Rows n0 .. n0 + count - 1 of W into buf [count, k_pad].
void fill_tile(const Args& a, int64_t n0, int64_t count, float* buf) {
  if (a.group == 0) {
    tram::rows::fill_rows(Int8Rows{static_cast<const int8_t*>(a.q) + n0 * a.K, a.K}, a.scale + n0, count, a.K, a.k_pad, buf);
    return;
  }
  const int64_t groups = a.K / a.group;
  const uint8_t* q = static_cast<const uint8_t*>(a.q) + n0 * (a.K / 2);
  if (a.zero == nullptr) {
    tram::rows::fill_rows(Int4Rows<false>{q, a.scale + n0 * groups, nullptr, a.K, a.group}, nullptr, count, a.K, a.k_pad, buf);
  } else {
    tram::rows::fill_rows(Int4Rows<true>{q, a.scale + n0 * groups, a.zero + n0 * groups, a.K, a.group}, nullptr, count, a.K,
              a.k_pad, buf);
  }
}

template <typename T>
void quant_gemm_impl(const Args& a) {
  tram::gemm::tiled_gemm(a.xf, a.k_pad, a.M, a.N, a.K, a.k_pad, static_cast<const T*>(a.bias), static_cast<T*>(a.y),
                         [&](int64_t n0, int64_t count, float* buf) { fill_tile(a, n0, count, buf); });
}

// Row n of W, dequantized into out (float32 or bfloat16): the weights the tiles compute with.
template <typename T>
void dequantize_row(const void* q, const float* scale, const uint8_t* zero, int64_t group, int64_t K, int64_t n,
                    T* out) {
  if (group == 0) {
    const int8_t* row = static_cast<const int8_t*>(q) + n * K;
    for (int64_t k = 0; k < K; ++k) store(static_cast<float>(row[k]) * scale[n], out + k);
    return;
  }
  const uint8_t* row = static_cast<const uint8_t*>(q) + n * (K / 2);
  const float* s = scale + n * (K / group);
  const uint8_t* z = zero != nullptr ? zero + n * (K / group) : nullptr;
  for (int64_t k = 0; k < K; k += 2 * kLanes) {
    const float sg = s[k / group];
    const int zg = z != nullptr ? z[k / group] : 8;
    for (int64_t j = 0; j < kLanes; ++j) {
      const uint8_t byte = row[k / 2 + j];
      store(static_cast<float>((byte & 15) - zg) * sg, out + k + j);
      store(static_cast<float>((byte >> 4) - zg) * sg, out + k + kLanes + j);
    }
  }
}

}  // namespace

namespace tram {

// The int4 zero points [N, K / group] uint8, checked; nullptr when absent (all 8) or int8 (group 0).
const uint8_t* zero_points(const c10::optional<at::Tensor>& zero, int64_t N, int64_t K, int64_t group) {
  if (!zero.has_value() || !zero->defined()) return nullptr;
  TORCH_CHECK(group != 0 && zero->is_contiguous() && zero->scalar_type() == at::kByte &&
                  zero->numel() == N * (K / group),
              "quant: zero points are int4 only, a contiguous uint8 [N, K / group] (values 0..15)");
  return zero->data_ptr<uint8_t>();
}

void quant_dequantize_(at::Tensor& out, const at::Tensor& qweight, const at::Tensor& scale, int64_t group,
                       const c10::optional<at::Tensor>& zero) {
  TORCH_CHECK(out.is_contiguous() && out.dim() == 2 && qweight.is_contiguous() && scale.is_contiguous() &&
                  scale.scalar_type() == at::kFloat,
              "quant_dequantize_: contiguous out [N, K], qweight and float32 scale");
  const int64_t N = out.size(0), K = out.size(1);
  TORCH_CHECK(qweight.size(0) == N && qweight.size(1) == (group == 0 ? K : K / 2), "quant_dequantize_: shapes");
  TORCH_CHECK(out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16,
              "quant_dequantize_: out must be float32 or bfloat16");
  const void* q = qweight.data_ptr();
  const float* s = scale.data_ptr<float>();
  const uint8_t* z = zero_points(zero, N, K, group);
  if (out.scalar_type() == at::kFloat) {
    float* o = out.data_ptr<float>();
    at::parallel_for(0, N, kGrainRows, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) dequantize_row(q, s, z, group, K, n, o + n * K);
    });
  } else {
    c10::BFloat16* o = out.data_ptr<c10::BFloat16>();
    at::parallel_for(0, N, kGrainRows, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) dequantize_row(q, s, z, group, K, n, o + n * K);
    });
  }
}

namespace {

// quant_linear and quant_gemm: the same checks and the same widened x; `many` picks the tiled GEMM.
at::Tensor quant_linear_or_gemm(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                                int64_t group, const c10::optional<at::Tensor>& bias,
                                const c10::optional<at::Tensor>& zero, bool many) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "quant_linear: x must be a [M, K] CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "quant_linear: x must be float32 or bfloat16");
  TORCH_CHECK(qweight.is_contiguous() && qweight.dim() == 2 && scale.is_contiguous() &&
                  scale.scalar_type() == at::kFloat,
              "quant_linear: qweight and a float32 scale must be contiguous");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  if (group == 0) {
    TORCH_CHECK(qweight.scalar_type() == at::kChar && qweight.size(1) == K && scale.numel() == N,
                "quant_linear: int8 takes qweight [N, K] int8 and scale [N]");
  } else {
    TORCH_CHECK(group % 32 == 0 && K % group == 0, "quant_linear: int4 groups must be multiples of 32 dividing K");
    TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.size(1) == K / 2 && scale.numel() == N * (K / group),
                "quant_linear: int4 takes qweight [N, K / 2] uint8 and scale [N, K / group]");
  }
  const void* b = nullptr;
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == x.scalar_type(),
                "quant_linear: bias must be [N] in x's dtype");
    bias_c = bias->contiguous();
    b = bias_c.data_ptr();
  }
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const int64_t k_pad = (K + 2 * kLanes - 1) / (2 * kLanes) * (2 * kLanes);
  std::vector<float> xf(static_cast<size_t>(M * k_pad), 0.0f);  // zero padding: the tails multiply by 0
  const at::Tensor xc = x.contiguous();
  Args a{xf.data(), M, K, k_pad, N, qweight.data_ptr(), scale.data_ptr<float>(), zero_points(zero, N, K, group),
         group, b, y.data_ptr()};
  if (x.scalar_type() == at::kFloat) {
    const float* xp = xc.data_ptr<float>();
    for (int64_t m = 0; m < M; ++m) std::memcpy(&xf[m * k_pad], xp + m * K, K * sizeof(float));
    many ? quant_gemm_impl<float>(a) : quant_linear_impl<float>(a);
  } else {
    const c10::BFloat16* xp = xc.data_ptr<c10::BFloat16>();
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) xf[m * k_pad + k] = static_cast<float>(xp[m * K + k]);
    }
    many ? quant_gemm_impl<c10::BFloat16>(a) : quant_linear_impl<c10::BFloat16>(a);
  }
  return y;
}

}  // namespace

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale, int64_t group,
                        const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& zero) {
  return quant_linear_or_gemm(x, qweight, scale, group, bias, zero, false);
}

at::Tensor quant_gemm(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale, int64_t group,
                      const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& zero) {
  return quant_linear_or_gemm(x, qweight, scale, group, bias, zero, true);
}

}  // namespace tram
