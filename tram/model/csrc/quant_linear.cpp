// y = x W^T (+ b) for few rows of x, W held in 8 or 4 bits: decode steps of a quantized model on CPU.
//
//   x      [M, K]      contiguous; float32 or bfloat16; M small (a decode batch)
//   int8:  qweight [N, K] int8, w[n, k] = q[n, k] * scale[n]             (scale [N] float32)
//   int4:  qweight [N, K / 2] uint8, w[n, k] = (q[n, k] - 8) * scale[n, k / group]   (scale [N, K / group])
//          Each 32 consecutive k of a row are 16 bytes: byte j holds k = j in its low nibble and
//          k = j + 16 in its high one, so one 16-byte load unpacks into two runs of 16 consecutive k.
//   bias   [N]         optional, x's dtype
//   -> y   [M, N]      x's dtype
//
// Why: decode is bound by reading W, and W in int8 or int4 is a quarter or an eighth of float32's
// bytes. torch's own weight-only CPU ops vectorise only bfloat16 activations; with float32 ones they
// ran 10-40x slower than a float32 linear on this project's VM (docs/benchmarks.md). Here every thread
// walks a contiguous range of W's rows once per call, widening each chunk of weights in registers and
// using it for up to four rows of x.
//
// Arithmetic: x (widened to float32) times the integer weights, summed in float32 as two 16-lane
// partial sums (even and odd chunks), times the scale per row (int8) or per group (int4, each group's
// sums scaled then added), folded in a fixed order, plus the bias, rounded once to x's dtype. The
// order depends on neither M nor the thread count.
#include "kernels.h"
#include "simd.h"

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

typedef int8_t vi8x16 __attribute__((vector_size(16)));
typedef uint8_t vu8x16 __attribute__((vector_size(16)));

constexpr int64_t kLanes = 16;
constexpr int64_t kGrainRows = 32;

// 16 int8 lanes to float32. GCC scalarises __builtin_convertvector from int8 (16 cvtsi2ss), so the
// x86 paths say it: vpmovsxbd + vcvtdq2ps, once on AVX-512, twice on AVX2.
TRAM_INLINE vf16 to_float(vi8x16 v) {
#if defined(__AVX512F__)
  return bitcast<vf16>(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bitcast<__m128i>(v))));
#elif defined(__AVX2__)
  const __m128i b = bitcast<__m128i>(v);
  const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b, b)));
  vf16 out;
  std::memcpy(&out, &lo, sizeof(lo));
  std::memcpy(reinterpret_cast<char*>(&out) + sizeof(lo), &hi, sizeof(hi));
  return out;
#else
  return __builtin_convertvector(v, vf16);
#endif
}

TRAM_INLINE vf16 widen_i8(const int8_t* p) { return to_float(vload<vi8x16>(p)); }

// The last K % 16 weights of a row, zero-padded, without reading past the row.
TRAM_INLINE vf16 widen_i8_tail(const int8_t* p, int64_t count) {
  int8_t buf[kLanes] = {};
  std::memcpy(buf, p, count);
  return widen_i8(buf);
}

// int8: output column n for rows m0 .. m0 + MB - 1; xf is [M, k_pad] float32, zero-padded.
template <typename T, int64_t MB>
TRAM_INLINE void tile_int8(const float* xf, int64_t m0, int64_t k_pad, const int8_t* row, float scale, float bias,
                           T* y, int64_t N, int64_t K, int64_t n) {
  const int64_t k_full = K - K % kLanes;
  vf16 even[MB] = {}, odd[MB] = {};
  int64_t k = 0;
  for (; k + 2 * kLanes <= k_full; k += 2 * kLanes) {
    const vf16 w0 = widen_i8(row + k), w1 = widen_i8(row + k + kLanes);
    for (int64_t m = 0; m < MB; ++m) {
      const float* xm = xf + (m0 + m) * k_pad + k;
      even[m] += w0 * vload<vf16>(xm);
      odd[m] += w1 * vload<vf16>(xm + kLanes);
    }
  }
  if (k < k_full) {
    const vf16 w0 = widen_i8(row + k);
    for (int64_t m = 0; m < MB; ++m) even[m] += w0 * vload<vf16>(xf + (m0 + m) * k_pad + k);
    k += kLanes;
  }
  if (k < K) {  // the odd partial sum takes the tail, so a chunk never moves between the two sums
    const vf16 w1 = widen_i8_tail(row + k, K - k);
    for (int64_t m = 0; m < MB; ++m) odd[m] += w1 * vload<vf16>(xf + (m0 + m) * k_pad + k);
  }
  for (int64_t m = 0; m < MB; ++m) store(hsum(even[m] + odd[m]) * scale + bias, y + (m0 + m) * N + n);
}

// int4: as tile_int8, over groups of `group` k (a multiple of 32), each group's sums scaled.
template <typename T, int64_t MB>
TRAM_INLINE void tile_int4(const float* xf, int64_t m0, int64_t k_pad, const uint8_t* row, const float* scales,
                           int64_t group, float bias, T* y, int64_t N, int64_t K, int64_t n) {
  vf16 even[MB] = {}, odd[MB] = {};
  for (int64_t g0 = 0; g0 < K; g0 += group) {
    vf16 ge[MB] = {}, go[MB] = {};
    for (int64_t k = g0; k < g0 + group; k += 2 * kLanes) {
      const vu8x16 bytes = vload<vu8x16>(row + k / 2);
      const vf16 w0 = to_float(bitcast<vi8x16>(vu8x16((bytes & 15) - 8)));  // nibbles 0..15 -> -8..7
      const vf16 w1 = to_float(bitcast<vi8x16>(vu8x16((bytes >> 4) - 8)));
      for (int64_t m = 0; m < MB; ++m) {
        const float* xm = xf + (m0 + m) * k_pad + k;
        ge[m] += w0 * vload<vf16>(xm);
        go[m] += w1 * vload<vf16>(xm + kLanes);
      }
    }
    const float s = scales[g0 / group];
    for (int64_t m = 0; m < MB; ++m) {
      even[m] += ge[m] * s;
      odd[m] += go[m] * s;
    }
  }
  for (int64_t m = 0; m < MB; ++m) store(hsum(even[m] + odd[m]) + bias, y + (m0 + m) * N + n);
}

struct Args {
  const float* xf;
  int64_t M, K, k_pad, N;
  const void* q;
  const float* scale;
  int64_t group;  // 0: int8, per row
  const void* bias;
  void* y;
};

template <typename T, int64_t MB>
TRAM_INLINE void run_tile(const Args& a, int64_t m0, int64_t n) {
  const float b = a.bias != nullptr ? load1(static_cast<const T*>(a.bias) + n) : 0.0f;
  T* y = static_cast<T*>(a.y);
  if (a.group == 0) {
    tile_int8<T, MB>(a.xf, m0, a.k_pad, static_cast<const int8_t*>(a.q) + n * a.K, a.scale[n], b, y, a.N, a.K, n);
  } else {
    tile_int4<T, MB>(a.xf, m0, a.k_pad, static_cast<const uint8_t*>(a.q) + n * (a.K / 2), a.scale + n * (a.K / a.group),
                     a.group, b, y, a.N, a.K, n);
  }
}

template <typename T>
void quant_linear_impl(const Args& a) {
  at::parallel_for(0, a.N, kGrainRows, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      int64_t m0 = 0;
      for (; m0 + 4 <= a.M; m0 += 4) run_tile<T, 4>(a, m0, n);
      switch (a.M - m0) {
        case 3: run_tile<T, 3>(a, m0, n); break;
        case 2: run_tile<T, 2>(a, m0, n); break;
        case 1: run_tile<T, 1>(a, m0, n); break;
        default: break;
      }
    }
  });
}

// Row n of W, dequantized into out (float32 or bfloat16): the weight tile_int8 / tile_int4 multiply by.
template <typename T>
void dequantize_row(const void* q, const float* scale, int64_t group, int64_t K, int64_t n, T* out) {
  if (group == 0) {
    const int8_t* row = static_cast<const int8_t*>(q) + n * K;
    for (int64_t k = 0; k < K; ++k) store(static_cast<float>(row[k]) * scale[n], out + k);
    return;
  }
  const uint8_t* row = static_cast<const uint8_t*>(q) + n * (K / 2);
  const float* s = scale + n * (K / group);
  for (int64_t k = 0; k < K; k += 2 * kLanes) {
    const float sg = s[k / group];
    for (int64_t j = 0; j < kLanes; ++j) {
      const uint8_t byte = row[k / 2 + j];
      store(static_cast<float>((byte & 15) - 8) * sg, out + k + j);
      store(static_cast<float>((byte >> 4) - 8) * sg, out + k + kLanes + j);
    }
  }
}

}  // namespace

namespace tram {

void quant_dequantize_(at::Tensor& out, const at::Tensor& qweight, const at::Tensor& scale, int64_t group) {
  TORCH_CHECK(out.is_contiguous() && out.dim() == 2 && qweight.is_contiguous() && scale.is_contiguous() &&
                  scale.scalar_type() == at::kFloat,
              "quant_dequantize_: contiguous out [N, K], qweight and float32 scale");
  const int64_t N = out.size(0), K = out.size(1);
  TORCH_CHECK(qweight.size(0) == N && qweight.size(1) == (group == 0 ? K : K / 2), "quant_dequantize_: shapes");
  at::parallel_for(0, N, kGrainRows, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      if (out.scalar_type() == at::kFloat) {
        dequantize_row(qweight.data_ptr(), scale.data_ptr<float>(), group, K, n, out.data_ptr<float>() + n * K);
      } else {
        dequantize_row(qweight.data_ptr(), scale.data_ptr<float>(), group, K, n,
                       out.data_ptr<c10::BFloat16>() + n * K);
      }
    }
  });
}

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale, int64_t group,
                        const c10::optional<at::Tensor>& bias) {
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
  Args a{xf.data(), M, K, k_pad, N, qweight.data_ptr(), scale.data_ptr<float>(), group, b, y.data_ptr()};
  if (x.scalar_type() == at::kFloat) {
    const float* xp = xc.data_ptr<float>();
    for (int64_t m = 0; m < M; ++m) std::memcpy(&xf[m * k_pad], xp + m * K, K * sizeof(float));
    quant_linear_impl<float>(a);
  } else {
    const c10::BFloat16* xp = xc.data_ptr<c10::BFloat16>();
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) xf[m * k_pad + k] = static_cast<float>(xp[m * K + k]);
    }
    quant_linear_impl<c10::BFloat16>(a);
  }
  return y;
}

}  // namespace tram
