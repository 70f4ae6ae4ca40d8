// y = x W^T (+ b) for few rows of x: the linear layers of a decode step on CPU.
//
//   x     [M, K]   contiguous; float32 or bfloat16; M small (a decode batch)
//   W     [N, K]   contiguous, x's dtype (nn.Linear's layout)
//   bias  [N]      optional, x's dtype
//   -> y  [M, N]   x's dtype
//
// Why: with one or a few rows a linear layer is a matrix-vector product, bound by reading W. PyTorch's
// CPU path for it (MKL/oneDNN in nn.Linear's layout) reads W on one thread only (float32), at a
// fraction of the memory bandwidth, and its fixed cost per call dominates small bfloat16 layers.
// Here each thread walks a contiguous range of W's rows front to back (one stream the hardware
// prefetcher follows), every row read once per call and used for up to four rows of x at a time,
// x stays in L1.
//
// Arithmetic: products and sums in float32; each output is two 16-lane partial sums over K (even and
// odd chunks of 16, or of 32 with AVX512-BF16's vdpbf16ps, which multiplies bf16 pairs exactly),
// added and folded in a fixed order, then the bias, then one rounding to the output dtype (as
// MKL/oneDNN round bfloat16). The order never depends on M, on which rows of x share a tile, or on
// the thread count, so a request's result is the same in any batch this kernel serves.
#include "kernels.h"
#include "dynamic_for.h"
#include "prefetch.h"
#include "quant_rows.h"
#include "simd.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace tram::simd;

constexpr int64_t kSkinnyLanes = 16;      // floats per chunk of K
constexpr int64_t kSkinnyGrainRows = 64;  // at least this many rows of W per thread task

// 16 consecutive elements as float32 (bfloat16 -> float32 is exact: the bits move up 16).
template <typename T>
TRAM_INLINE vf16 load_widened(const T* p);

template <>
TRAM_INLINE vf16 load_widened<float>(const float* p) {
  return vload<vf16>(p);
}

template <>
TRAM_INLINE vf16 load_widened<c10::BFloat16>(const c10::BFloat16* p) {
  return widen_bf16x16(p);
}

// The last K % 16 weights of a row, zero-padded, without reading past the row.
template <typename T>
TRAM_INLINE vf16 load_tail(const T* p, int64_t count) {
  T buf[kSkinnyLanes];
  std::memset(static_cast<void*>(buf), 0, sizeof(buf));
  std::memcpy(static_cast<void*>(buf), p, count * sizeof(T));
  return load_widened<T>(buf);
}

// Output column n for rows m0 .. m0 + MB - 1 of x; xf is [M, k_pad] float32, zero-padded. Each chunk
// of the weight row is widened once and used for all MB rows of x. Two partial sums per output (even
// and odd chunks) keep two FMA chains in flight when MB is 1.
template <typename T, int64_t MB>
TRAM_INLINE void tile(const float* xf, int64_t m0, int64_t k_pad, const T* row, float bias, T* y, int64_t N,
                      int64_t K, int64_t n) {
  const int64_t k_full = K - K % kSkinnyLanes;
  vf16 even[MB] = {}, odd[MB] = {};
  int64_t k = 0;
  for (; k + 2 * kSkinnyLanes <= k_full; k += 2 * kSkinnyLanes) {
    prefetch_ahead(row + k, 2 * kSkinnyLanes * sizeof(T));
    const vf16 w0 = load_widened<T>(row + k), w1 = load_widened<T>(row + k + kSkinnyLanes);
    for (int64_t m = 0; m < MB; ++m) {
      const float* xm = xf + (m0 + m) * k_pad + k;
      even[m] += w0 * vload<vf16>(xm);
      odd[m] += w1 * vload<vf16>(xm + kSkinnyLanes);
    }
  }
  if (k < k_full) {
    const vf16 w0 = load_widened<T>(row + k);
    for (int64_t m = 0; m < MB; ++m) even[m] += w0 * vload<vf16>(xf + (m0 + m) * k_pad + k);
    k += kSkinnyLanes;
  }
  if (k < K) {  // the odd partial sum takes the tail, so a chunk never moves between the two sums
    const vf16 w1 = load_tail<T>(row + k, K - k);
    for (int64_t m = 0; m < MB; ++m) odd[m] += w1 * vload<vf16>(xf + (m0 + m) * k_pad + k);
  }
  for (int64_t m = 0; m < MB; ++m) y[(m0 + m) * N + n] = static_cast<T>(hsum(even[m] + odd[m]) + bias);
}

#if defined(__AVX512BF16__)
// bfloat16 with AVX512-BF16: vdpbf16ps multiplies 32 bf16 pairs exactly and adds them into 16 float32
// lanes, so neither operand is widened. xb is [M, k_pad] bfloat16, zero-padded to a multiple of 32.
template <int64_t MB>
TRAM_INLINE void tile_bf16(const c10::BFloat16* xb, int64_t m0, int64_t k_pad, const c10::BFloat16* row,
                           float bias, c10::BFloat16* y, int64_t N, int64_t K, int64_t n) {
  float sums[MB][1];
  tram::rows::dot_tile_bf16<MB, 1>(xb + m0 * k_pad, k_pad, row, K, sums);
  for (int64_t m = 0; m < MB; ++m) y[(m0 + m) * N + n] = static_cast<c10::BFloat16>(sums[m][0] + bias);
}
#endif

// The two inner kernels behind one interface: X is the element type of the padded copy of x.
struct WidenTile {
  using X = float;
  static constexpr int64_t kPad = kSkinnyLanes;
  template <typename T, int64_t MB>
  static TRAM_INLINE void run(const X* xs, int64_t m0, int64_t k_pad, const T* row, float bias, T* y, int64_t N,
                              int64_t K, int64_t n) {
    tile<T, MB>(xs, m0, k_pad, row, bias, y, N, K, n);
  }
};

#if defined(__AVX512BF16__)
struct DotBf16Tile {
  using X = c10::BFloat16;
  static constexpr int64_t kPad = 2 * kSkinnyLanes;
  template <typename T, int64_t MB>
  static TRAM_INLINE void run(const X* xs, int64_t m0, int64_t k_pad, const T* row, float bias, T* y, int64_t N,
                              int64_t K, int64_t n) {
    tile_bf16<MB>(xs, m0, k_pad, row, bias, y, N, K, n);
  }
};
#endif

// Output column n for every row of x, in groups of up to four rows of x.
template <typename Tile, typename T>
TRAM_INLINE void column(const typename Tile::X* xs, int64_t M, int64_t k_pad, const T* w, const T* bias, T* y,
                        int64_t N, int64_t K, int64_t n) {
  const T* row = w + n * K;
  const float b = bias != nullptr ? static_cast<float>(bias[n]) : 0.0f;
  int64_t m0 = 0;
  for (; m0 + 4 <= M; m0 += 4) Tile::template run<T, 4>(xs, m0, k_pad, row, b, y, N, K, n);
  switch (M - m0) {
    case 3: Tile::template run<T, 3>(xs, m0, k_pad, row, b, y, N, K, n); break;
    case 2: Tile::template run<T, 2>(xs, m0, k_pad, row, b, y, N, K, n); break;
    case 1: Tile::template run<T, 1>(xs, m0, k_pad, row, b, y, N, K, n); break;
    default: break;
  }
}

// One weight of a call: y [M, N] = x W^T + b; its rows are rows first .. first + N - 1 of the call.
struct Part {
  const void* w;
  const void* b;  // nullptr: no bias
  void* y;
  int64_t n;
  int64_t first;
};

// All parts share one copy of x and one parallel region: the threads split the concatenated rows.
template <typename Tile, typename T>
void skinny_linear_impl(const at::Tensor& x, const std::vector<Part>& parts, int64_t total_rows) {
  using X = typename Tile::X;
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t k_pad = (K + Tile::kPad - 1) / Tile::kPad * Tile::kPad;
  std::vector<X> xs(static_cast<size_t>(M * k_pad), X(0.0f));  // zero padding: the tails multiply by 0
  const T* xp = x.data_ptr<T>();
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) xs[m * k_pad + k] = static_cast<X>(xp[m * K + k]);
  }
  tram::parallel::dynamic_for(total_rows, kSkinnyGrainRows, [&](int64_t begin, int64_t end) {
    for (const Part& part : parts) {
      const int64_t lo = std::max(begin, part.first), hi = std::min(end, part.first + part.n);
      const T* w = static_cast<const T*>(part.w);
      const T* b = static_cast<const T*>(part.b);
      T* y = static_cast<T*>(part.y);
      for (int64_t row = lo; row < hi; ++row) column<Tile, T>(xs.data(), M, k_pad, w, b, y, part.n, K, row - part.first);
    }
  });
}

}  // namespace

namespace tram {

std::vector<at::Tensor> skinny_linear_n(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                        const std::vector<c10::optional<at::Tensor>>& biases) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "skinny_linear: x must be a [M, K] CPU tensor");
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(), "skinny_linear: one bias (or None) per weight");
  const at::Tensor xc = x.contiguous();
  std::vector<at::Tensor> outs, kept_biases;
  std::vector<Part> parts;
  int64_t total_rows = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& weight = weights[i];
    TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2, "skinny_linear: weight must be a [N, K] CPU tensor");
    TORCH_CHECK(x.size(1) == weight.size(1), "skinny_linear: x has ", x.size(1), " columns, weight ",
                weight.size(1));
    TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "skinny_linear: x and weight dtypes differ");
    TORCH_CHECK(weight.is_contiguous(), "skinny_linear: weight must be contiguous");
    const void* b = nullptr;
    if (!biases.empty() && biases[i].has_value() && biases[i]->defined()) {
      const at::Tensor& bias = *biases[i];
      TORCH_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0) && bias.scalar_type() == x.scalar_type(),
                  "skinny_linear: bias must be [N] in x's dtype");
      kept_biases.push_back(bias.contiguous());
      b = kept_biases.back().data_ptr();
    }
    outs.push_back(at::empty({x.size(0), weight.size(0)}, x.options()));
    parts.push_back(Part{weight.data_ptr(), b, outs.back().data_ptr(), weight.size(0), total_rows});
    total_rows += weight.size(0);
  }
  if (x.size(0) == 0 || total_rows == 0) return outs;
  switch (x.scalar_type()) {
    case at::kFloat:
      skinny_linear_impl<WidenTile, float>(xc, parts, total_rows);
      break;
    case at::kBFloat16:
#if defined(__AVX512BF16__)
      skinny_linear_impl<DotBf16Tile, c10::BFloat16>(xc, parts, total_rows);
#else
      skinny_linear_impl<WidenTile, c10::BFloat16>(xc, parts, total_rows);
#endif
      break;
    default:
      TORCH_CHECK(false, "skinny_linear: unsupported dtype ", x.scalar_type());
  }
  return outs;
}

at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  return skinny_linear_n(x, {weight}, {bias})[0];
}

}  // namespace tram
