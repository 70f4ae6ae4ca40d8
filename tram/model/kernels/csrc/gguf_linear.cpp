// y = x W^T (+ b) for few rows of x, W kept in a GGUF file's own block layout (llama.cpp's ggml-quants):
// decode steps of a GGUF model on CPU without first widening its weights to float.
//
//   x     [M, K]          contiguous; float32 or bfloat16; M small (a decode batch; any M works)
//   data  [N, row_bytes]  uint8: each row is K / block blocks of one ggml type, as stored in the file
//   type  ggml type id    Q8_0 (8), Q4_0 (2), Q4_1 (3), Q5_0 (6), Q5_1 (7), Q4_K (12), Q5_K (13), Q6_K (14)
//   bias  [N]             optional, x's dtype
//   -> y  [M, N]          x's dtype
//
// Block layouts and their decoders: gguf_blocks.h.
//
// Design as quant_linear.cpp: threads take ranges of W's rows as they come for them (dynamic_for.h);
// a block's scales are decoded once per row, then each chunk of 32 weights is widened to float32 in
// registers, scale folded in, and used for up to four rows of x (five to eight with AVX-512:
// walk_many_rows). Each widened weight is bit for bit the float gguf's dequantize gives (products
// rounded before the K-quants subtract their min), so the result is a float32 dot product with the
// dequantized weight: two 16-lane partial sums per output (even and odd chunks of 16 k), folded in a
// fixed order, plus the bias, rounded once to x's dtype. No output's order of additions depends on M,
// on the tiling, on passes over k or on the thread count.
#include "kernels.h"
#include "dynamic_for.h"
#include "gguf_blocks.h"
#include "gguf_common.h"
#include "prefetch.h"
#include "simd.h"
#include "widen_int8.h"
#include "tiled_gemm.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <type_traits>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace tram::simd;
using namespace tram::gguf;
using namespace tram::gguf_float;
using tram::gemm::kPassK;

constexpr int64_t kGrainRows = 32;   // at least this many rows of W per thread task
#if defined(__AVX512F__)
constexpr int64_t kManyRows = 8;     // rows of x per decoded chunk from 8 rows on (walk_many_rows)
#else
constexpr int64_t kManyRows = 4;     // AVX2's 16 registers hold no more than four rows' sums
#endif

// ---- the linear ---------------------------------------------------------------------------------

struct Args {
  const float* xf;  // [M, K] float32
  int64_t M, K, N, row_bytes;
  const uint8_t* w;
  const void* bias;
  void* y;
};

// A pass over blocks b0 .. b1 - 1 of K. `carry` (MB * NB * 2 vectors) holds the outputs' sums between
// passes: read unless the pass starts at k = 0, written unless it ends at K, where the sums are
// folded and stored instead. Sums kept in float32 memory between passes change no bit.
struct Pass {
  int64_t b0, b1;
  vf16* carry;
};

// Outputs n0 .. n0 + NB - 1 for rows m0 .. m0 + MB - 1 of x. Each widened chunk serves MB rows of x,
// each chunk of x NB weight rows; every output keeps its own two partial sums, so MB and NB change
// which outputs share registers, never an output's order of additions.
template <typename F, typename T, int64_t MB, int64_t NB>
TRAM_INLINE void tile(const Args& a, int64_t m0, int64_t n0, Pass pass = {0, -1, nullptr}) {
  const int64_t blocks = a.K / F::kBlock, b1 = pass.b1 < 0 ? blocks : pass.b1;
  const uint8_t* w = a.w + n0 * a.row_bytes;
  vf16 even[MB][NB] = {}, odd[MB][NB] = {};
  if (pass.b0 > 0) {
    for (int64_t i = 0; i < MB * NB; ++i) {
      even[i / NB][i % NB] = pass.carry[2 * i], odd[i / NB][i % NB] = pass.carry[2 * i + 1];
    }
  }
  for (int64_t b = pass.b0; b < b1; ++b) {
    F blk[NB];
    for (int64_t j = 0; j < NB; ++j) {
      blk[j].load(w + j * a.row_bytes + b * F::kBytes);
      prefetch_ahead(w + j * a.row_bytes + b * F::kBytes, F::kBytes);
    }
    const float* xb = a.xf + m0 * a.K + b * F::kBlock;
#pragma GCC unroll 8
    for (int64_t c = 0; c < F::kBlock / kChunk; ++c) {
      vf16 w0[NB], w1[NB];
      for (int64_t j = 0; j < NB; ++j) blk[j].chunk(c, w0[j], w1[j]);
      for (int64_t m = 0; m < MB; ++m) {
        const vf16 x0 = vload<vf16>(xb + m * a.K + c * kChunk), x1 = vload<vf16>(xb + m * a.K + c * kChunk + kLanes);
        for (int64_t j = 0; j < NB; ++j) {
          even[m][j] += w0[j] * x0;
          odd[m][j] += w1[j] * x1;
        }
      }
    }
  }
  if (b1 < blocks) {
    for (int64_t i = 0; i < MB * NB; ++i) {
      pass.carry[2 * i] = even[i / NB][i % NB], pass.carry[2 * i + 1] = odd[i / NB][i % NB];
    }
    return;
  }
  const T* bias = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y);
  for (int64_t m = 0; m < MB; ++m) {
    for (int64_t j = 0; j < NB; ++j) {
      const float bj = bias != nullptr ? load1(bias + n0 + j) : 0.0f;
      store(hsum(even[m][j] + odd[m][j]) + bj, y + (m0 + m) * a.N + n0 + j);
    }
  }
}

// fn(std::integral_constant<int64_t, MB>{}, m0) for rows 0 .. M - 1 of x in groups: as many of kMax
// rows as fit, then the rest as one group.
template <int64_t R, typename Fn>
TRAM_INLINE void last_group(int64_t rest, int64_t m0, const Fn& fn) {
  if constexpr (R > 0) {
    if (rest == R) return fn(std::integral_constant<int64_t, R>{}, m0);
    last_group<R - 1>(rest, m0, fn);
  }
}

template <int64_t kMax, typename Fn>
TRAM_INLINE void row_groups(int64_t M, const Fn& fn) {
  int64_t m0 = 0;
  for (; m0 + kMax <= M; m0 += kMax) fn(std::integral_constant<int64_t, kMax>{}, m0);
  last_group<kMax - 1>(M - m0, m0, fn);
}

// Every row of x for outputs n0 .. n0 + NB - 1, four rows of x at a time.
template <typename F, typename T, int64_t NB>
TRAM_INLINE void outputs(const Args& a, int64_t n0) {
  row_groups<4>(a.M, [&](auto mb, int64_t m0) { tile<F, T, decltype(mb)::value, NB>(a, m0, n0); });
}

template <typename F, typename T, int64_t NB>
void walk_rows(const Args& a, int64_t begin, int64_t end) {
  int64_t n = begin;
  for (; n + NB <= end; n += NB) outputs<F, T, NB>(a, n);
  for (; n < end; ++n) outputs<F, T, 1>(a, n);
}

// Rows m0 .. m0 + MB - 1 of x times weight rows n0 .. n1 - 1, one weight row at a time, in passes of
// kPassK k: a pass's x (eight rows of 1024 k, 32 KiB) stays in L1 while the weight rows go by, where
// at K = 4864 eight whole rows of x (152 KiB) would come from L2 for every weight row.
template <typename F, typename T, int64_t MB>
void rows_times_block(const Args& a, int64_t m0, int64_t n0, int64_t n1, std::vector<vf16>& carry) {
  const int64_t blocks = a.K / F::kBlock, per_pass = std::max<int64_t>(1, kPassK / F::kBlock);
  if (blocks <= per_pass) {
    for (int64_t n = n0; n < n1; ++n) tile<F, T, MB, 1>(a, m0, n);
    return;
  }
  carry.resize(static_cast<size_t>((n1 - n0) * MB * 2));
  for (int64_t b0 = 0; b0 < blocks; b0 += per_pass) {
    const int64_t b1 = std::min(blocks, b0 + per_pass);
    for (int64_t n = n0; n < n1; ++n) tile<F, T, MB, 1>(a, m0, n, Pass{b0, b1, carry.data() + (n - n0) * MB * 2});
  }
}

// From eight rows of x on (five with AVX-512). With AVX-512 each decoded chunk serves eight rows
// (kManyRows; five to seven when that is all there is), where decoding it again for every four cost
// as much as their FMAs; AVX2 has registers for four.
// A block of weight rows (~256 KiB, in L2) meets every group of rows before the next block is read
// (walking all rows of x per weight row kept 16 rows' x, 56 KiB at K = 896, in L2 and lost the gain).
template <typename F, typename T>
void walk_many_rows(const Args& a, int64_t begin, int64_t end) {
  const int64_t step = std::max<int64_t>(1, (int64_t{256} << 10) / a.row_bytes);
  std::vector<vf16> carry;
  for (int64_t n0 = begin; n0 < end; n0 += step) {
    const int64_t n1 = std::min(end, n0 + step);
    row_groups<kManyRows>(a.M, [&](auto mb, int64_t m0) {
      rows_times_block<F, T, decltype(mb)::value>(a, m0, n0, n1, carry);
    });
  }
}

// Outputs begin .. end - 1 of one weight: the walk M calls for.
template <typename F, typename T>
void linear_rows(const Args& a, int64_t begin, int64_t end) {
  if (a.M == 1) {
    walk_rows<F, T, kWideRows>(a, begin, end);
  } else if (a.M >= 8 || (kManyRows == 8 && a.M >= 5)) {
    walk_many_rows<F, T>(a, begin, end);
  } else {
    walk_rows<F, T, kNarrowRows>(a, begin, end);
  }
}

template <typename F, typename T>
void linear_impl(const Args& a) {
  tram::parallel::dynamic_for(a.N, kGrainRows, [&](int64_t begin, int64_t end) { linear_rows<F, T>(a, begin, end); });
}

// Several weights that read one x (q/k/v, gate/up): one parallel region over all their outputs, where
// a region each paid its wake-up and its tail three and two times a layer; each output's arithmetic is
// the one linear_impl gives it.
template <typename T>
void linear_n_impl(const std::vector<Args>& args, const std::vector<int64_t>& types) {
  std::vector<int64_t> sizes;
  for (const Args& a : args) sizes.push_back(a.N);
  tram::parallel::dynamic_for_parts(sizes, kGrainRows, [&](size_t i, int64_t begin, int64_t end) {
    with_format(types[i], [&](auto fmt) { linear_rows<decltype(fmt), T>(args[i], begin, end); });
  });
}

// ---- dequantize ---------------------------------------------------------------------------------

template <typename T>
void dequantize_rows(const uint8_t* data, int64_t type, int64_t N, int64_t K, int64_t row_bytes, T* out) {
  with_format(type, [&](auto fmt) {
    using F = decltype(fmt);
    at::parallel_for(0, N, kGrainRows, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) dequantize_row<F>(data + n * row_bytes, K, out + n * K);
    });
  });
}

// ---- many rows of x (gguf_gemm): W decoded a tile at a time (tiled_gemm.h) ---------------------

template <typename F, typename T>
void gemm_impl(const Args& a) {
  tram::gemm::tiled_gemm(a.xf, a.K, a.M, a.N, a.K, a.K, static_cast<const T*>(a.bias), static_cast<T*>(a.y),
                         [&](int64_t n0, int64_t count, float* buf) {
                           for (int64_t j = 0; j < count; ++j) {
                             dequantize_row<F>(a.w + (n0 + j) * a.row_bytes, a.K, buf + j * a.K);
                           }
                         });
}

// The row size the type gives K, checking that data [N, row_bytes] holds it.
int64_t check_data(const at::Tensor& data, int64_t type, int64_t K, const char* who) {
  TORCH_CHECK(data.device().is_cpu() && data.dim() == 2 && data.scalar_type() == at::kByte && data.is_contiguous(),
              who, ": data must be a contiguous [N, row_bytes] uint8 CPU tensor");
  int64_t block = 0, row_bytes = 0;
  with_format(type, [&](auto fmt) {
    using F = decltype(fmt);
    block = F::kBlock;
    row_bytes = row_bytes_of<F>(K);
  });
  TORCH_CHECK(K % block == 0, who, ": K = ", K, " is not a multiple of the type's block of ", block);
  TORCH_CHECK(data.size(1) == row_bytes, who, ": rows of ", data.size(1), " bytes, expected ", row_bytes);
  return row_bytes;
}

}  // namespace

namespace tram {

void gguf_dequantize_(at::Tensor& out, const at::Tensor& data, int64_t ggml_type) {
  TORCH_CHECK(out.device().is_cpu() && out.is_contiguous() && out.dim() == 2 &&
                  (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16),
              "gguf_dequantize_: out must be a contiguous [N, K] float32 or bfloat16 CPU tensor");
  const int64_t N = out.size(0), K = out.size(1);
  const int64_t row_bytes = check_data(data, ggml_type, K, "gguf_dequantize_");
  TORCH_CHECK(data.size(0) == N, "gguf_dequantize_: out has ", N, " rows, data ", data.size(0));
  const uint8_t* d = data.data_ptr<uint8_t>();
  if (out.scalar_type() == at::kFloat) {
    dequantize_rows(d, ggml_type, N, K, row_bytes, out.data_ptr<float>());
  } else {
    dequantize_rows(d, ggml_type, N, K, row_bytes, out.data_ptr<c10::BFloat16>());
  }
}

namespace {

void check_x(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "gguf_linear: x must be a [M, K] CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "gguf_linear: x must be float32 or bfloat16");
}

// The bias's data (nullptr: none), kept alive by `keep`.
const void* checked_bias(const at::Tensor& x, int64_t N, const c10::optional<at::Tensor>& bias, at::Tensor& keep) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == x.scalar_type(),
              "gguf_linear: bias must be [N] in x's dtype");
  keep = bias->contiguous();
  return keep.data_ptr();
}

// x as float32 rows: its own data, or widened into `buf` (K is a multiple of 32: no padding).
const float* float_rows(const at::Tensor& xc, std::vector<float>& buf) {
  if (xc.scalar_type() == at::kFloat) return xc.data_ptr<float>();
  buf.resize(static_cast<size_t>(xc.numel()));
  const c10::BFloat16* xb = xc.data_ptr<c10::BFloat16>();
  for (int64_t i = 0; i < xc.numel(); ++i) buf[i] = static_cast<float>(xb[i]);
  return buf.data();
}

// gguf_linear and gguf_gemm: the same checks and the same float32 x; `many` picks the tiled GEMM.
at::Tensor gguf_linear_or_gemm(const at::Tensor& x, const at::Tensor& data, int64_t ggml_type,
                               const c10::optional<at::Tensor>& bias, bool many) {
  check_x(x);
  const int64_t M = x.size(0), K = x.size(1), N = data.size(0);
  const int64_t row_bytes = check_data(data, ggml_type, K, "gguf_linear");
  at::Tensor bias_c;
  const void* b = checked_bias(x, N, bias, bias_c);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const at::Tensor xc = x.contiguous();
  std::vector<float> xf;
  const Args a{float_rows(xc, xf), M, K, N, row_bytes, data.data_ptr<uint8_t>(), b, y.data_ptr()};
  with_format(ggml_type, [&](auto fmt) {
    using F = decltype(fmt);
    if (x.scalar_type() == at::kFloat) {
      many ? gemm_impl<F, float>(a) : linear_impl<F, float>(a);
    } else {
      many ? gemm_impl<F, c10::BFloat16>(a) : linear_impl<F, c10::BFloat16>(a);
    }
  });
  return y;
}

}  // namespace

at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& data, int64_t ggml_type,
                       const c10::optional<at::Tensor>& bias) {
  return gguf_linear_or_gemm(x, data, ggml_type, bias, false);
}

at::Tensor gguf_gemm(const at::Tensor& x, const at::Tensor& data, int64_t ggml_type,
                     const c10::optional<at::Tensor>& bias) {
  return gguf_linear_or_gemm(x, data, ggml_type, bias, true);
}

std::vector<at::Tensor> gguf_linear_n(const at::Tensor& x, const std::vector<at::Tensor>& data,
                                      const std::vector<int64_t>& ggml_types,
                                      const std::vector<c10::optional<at::Tensor>>& biases) {
  TORCH_CHECK(data.size() == ggml_types.size() && data.size() == biases.size(),
              "gguf_linear_n: as many types and biases as weights");
  check_x(x);
  const int64_t M = x.size(0), K = x.size(1);
  std::vector<at::Tensor> ys, kept(data.size());
  std::vector<Args> args;
  const at::Tensor xc = x.contiguous();
  std::vector<float> xf;
  const float* xp = float_rows(xc, xf);
  for (size_t i = 0; i < data.size(); ++i) {
    const int64_t N = data[i].size(0), row_bytes = check_data(data[i], ggml_types[i], K, "gguf_linear_n");
    const void* b = checked_bias(x, N, biases[i], kept[i]);
    ys.push_back(at::empty({M, N}, x.options()));
    args.push_back(Args{xp, M, K, N, row_bytes, data[i].data_ptr<uint8_t>(), b, ys.back().data_ptr()});
  }
  if (M == 0) return ys;
  if (x.scalar_type() == at::kFloat) {
    linear_n_impl<float>(args, ggml_types);
  } else {
    linear_n_impl<c10::BFloat16>(args, ggml_types);
  }
  return ys;
}

}  // namespace tram
