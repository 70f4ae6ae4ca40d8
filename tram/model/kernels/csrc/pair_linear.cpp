// bfloat16 linear layers on a weight packed in pairs of k, for CPUs with AVX512-BF16 (and no AMX).
//
//   packed [ceil(N / 16), ceil(K / 2), 16] int32: block b holds output columns 16 b .. 16 b + 15, and
//          its int32 [j, c] is the pair (W[16 b + c, 2 j], W[16 b + c, 2 j + 1]) of bfloat16, the
//          first in the low half; zeros past N and K.
//   x      [M, K] bfloat16, any row stride  ->  y [M, N] bfloat16 (float32 sums rounded once)
//
// Why: vdpbf16ps multiplies one 64-byte line of such a block (16 outputs x 2 k) by a pair of x
// broadcast to every lane and adds both products into 16 float32 sums. With up to 16 rows of x in 16
// accumulators, each line of W is read from memory once per 16 rows and feeds 16 instructions, so at a
// decode batch W streams while the products run: the LM head of a bf16 model is read at the memory's
// speed from one row of x and its products run at the bf16 peak from about 16. oneDNN's inner product
// on its own packed layout reaches 70% of that peak at 16 rows and reads W at 25 GB/s at 8 on an AVX-512
// CPU without AMX (docs/benchmarks.md, "The LM head's decode batch on pairs of k"). Past 16 rows, each
// further 16 re-read a block from the L2.
//
// Every output is the same sum in the same order (k pair by k pair, as vdpbf16ps adds a pair) whatever
// the number of rows of x, the row it sits in or the number of threads.
#include "dynamic_for.h"
#include "kernels.h"

#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace {

constexpr int64_t kCols = 16;        // outputs of a block: one vector of float32 sums
constexpr int64_t kRows = 16;        // rows of x a pass over a block multiplies
constexpr int64_t kGrainBlocks = 8;  // 128 outputs: a chunk of work for a thread
// Lines of W asked for ahead of the products (4 KiB): the hardware prefetcher alone kept W at 16-24 GB/s
// from 8-16 rows of x, where a stream from one row runs at 29-31 (docs/benchmarks.md).
constexpr int64_t kAhead = 64;

inline void check_packed(const at::Tensor& packed, int64_t N, int64_t K) {
  TORCH_CHECK(packed.device().is_cpu() && packed.scalar_type() == at::kInt && packed.dim() == 3 &&
                  packed.is_contiguous(),
              "pair_linear: packed must be a contiguous int32 CPU tensor [N/16, K/2, 16] from pair_pack");
  TORCH_CHECK(packed.size(0) == (N + kCols - 1) / kCols && packed.size(1) == (K + 1) / 2 && packed.size(2) == kCols,
              "pair_linear: packed ", packed.sizes(), " is not a packed [", N, ", ", K, "] weight");
}

// Elements 2 j and 2 j + 1 of a bfloat16 row (stride apart; zero past K) as one int32, the first low.
inline uint32_t pair_at(const uint16_t* row, int64_t stride, int64_t j, int64_t K) {
  const uint32_t lo = row[2 * j * stride], hi = 2 * j + 1 < K ? row[(2 * j + 1) * stride] : 0u;
  return lo | (hi << 16);
}

#if defined(__AVX512BF16__)
// y[m, 0 .. cols) = the block's outputs for rows m < MB of one group of x (xg: [K2, MB] pairs), + bias.
template <int MB>
void block_rows(const uint32_t* __restrict w, const uint32_t* __restrict xg, int64_t K2, const float* bias,
                c10::BFloat16* y, int64_t ldy, int64_t cols) {
  __m512 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t j = 0; j < K2; ++j) {
    const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + j * kCols);
    const uint32_t* xj = xg + j * MB;
    __builtin_prefetch(w + (j + kAhead) * kCols, 0, 3);
    for (int m = 0; m < MB; ++m)
      acc[m] = _mm512_dpbf16_ps(acc[m], wv, (__m512bh)_mm512_set1_epi32(static_cast<int>(xj[m])));
  }
  const __mmask16 mask = cols >= kCols ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1);
  const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int m = 0; m < MB; ++m) {
    const __m256bh r = _mm512_cvtneps_pbh(_mm512_add_ps(acc[m], b));
    _mm256_mask_storeu_epi16(y + m * ldy, mask, (__m256i)r);
  }
}

using BlockFn = void (*)(const uint32_t*, const uint32_t*, int64_t, const float*, c10::BFloat16*, int64_t, int64_t);

template <int... MB>
constexpr auto block_table(std::integer_sequence<int, MB...>) {
  return std::array<BlockFn, sizeof...(MB)>{&block_rows<MB + 1>...};
}
constexpr auto kBlockFns = block_table(std::make_integer_sequence<int, kRows>{});

// x's rows as groups of 16 (the last group: its rows), [K2, rows] pairs each, group g at g * 16 * K2;
// zeros past K.
std::vector<uint32_t> pack_x(const at::Tensor& x, int64_t K2) {
  const int64_t M = x.size(0), K = x.size(1), groups = (M + kRows - 1) / kRows;
  std::vector<uint32_t> xp(static_cast<size_t>(groups * K2 * kRows), 0u);
  const uint16_t* src = reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>());
  const int64_t ld = x.stride(0), lk = x.stride(1);
  for (int64_t m = 0; m < M; ++m) {
    const int64_t g0 = m / kRows * kRows, rows = std::min(kRows, M - g0);
    uint32_t* dst = xp.data() + g0 * K2 + m % kRows;
    const uint16_t* row = src + m * ld;
    for (int64_t j = 0; j < K2; ++j) dst[j * rows] = pair_at(row, lk, j, K);
  }
  return xp;
}
#endif

}  // namespace

namespace tram {

bool pair_linear_built() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

bool pair_linear_preferred() {
#if defined(__AVX512BF16__) && !defined(__AMX_BF16__)
  return true;
#else
  return false;
#endif
}

at::Tensor pair_pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2 && weight.scalar_type() == at::kBFloat16,
              "pair_pack: weight must be a [N, K] bfloat16 CPU tensor");
  const at::Tensor w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1), blocks = (N + kCols - 1) / kCols, K2 = (K + 1) / 2;
  at::Tensor packed = at::zeros({blocks, K2, kCols}, w.options().dtype(at::kInt));
  const uint16_t* src = reinterpret_cast<const uint16_t*>(w.data_ptr<c10::BFloat16>());
  uint32_t* dst = reinterpret_cast<uint32_t*>(packed.data_ptr<int32_t>());
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t c = 0; c < kCols && b * kCols + c < N; ++c) {
        const uint16_t* row = src + (b * kCols + c) * K;
        uint32_t* out = dst + b * K2 * kCols + c;
        for (int64_t j = 0; j < K2; ++j) out[j * kCols] = pair_at(row, 1, j, K);
      }
    }
  });
  return packed;
}

at::Tensor pair_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kBFloat16,
              "pair_linear: x must be a [M, K] bfloat16 CPU tensor");
  const int64_t M = x.size(0), K = x.size(1);
  check_packed(packed, N, K);
  at::Tensor bias_f;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, "pair_linear: bias must be [N]");
    bias_f = bias->to(at::kFloat).contiguous();
  }
  at::Tensor y = at::empty({M, N}, x.options().memory_format(at::MemoryFormat::Contiguous));
  if (M == 0 || N == 0) return y;
#if defined(__AVX512BF16__)
  const int64_t K2 = packed.size(1), blocks = packed.size(0);
  const std::vector<uint32_t> xp = pack_x(x, K2);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>());
  const float* bp = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  c10::BFloat16* yp = y.data_ptr<c10::BFloat16>();
  tram::parallel::dynamic_for(blocks, kGrainBlocks, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kCols, cols = std::min(kCols, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += kRows) {
        const int64_t rows = std::min(kRows, M - m0);
        kBlockFns[rows - 1](w + b * K2 * kCols, xp.data() + m0 * K2, K2,
                            bp != nullptr ? bp + n0 : nullptr, yp + m0 * N + n0, N, cols);
      }
    }
  });
#else
  TORCH_CHECK(false, "pair_linear: this build has no AVX512-BF16 (pair_linear_built() is False)");
#endif
  return y;
}

}  // namespace tram
