// GGUF weights repacked eight rows at a time (gguf_x8.h: Q4_K type 1012, Q6_K type 1014, Q5_0 type 1006,
// Q8_0 type 1008): the repack and its inverse, and y = x W^T (+ b) with x quantized per 256 k (the
// K-quants) or per 32 k (Q5_0, Q8_0), for any number of rows of x.
//
//   packed  [N, K / L::kBlock * L::kRowBytes] uint8, N a multiple of 8: rows 8g .. 8g + 7 of the file's
//           weight as the layout lays out a group (the tensor's row n is not row n's bytes; its shape keeps N)
#include "kernels.h"
#include "dynamic_for.h"
#include "gguf_x8.h"
#include "gguf_x8_gemm.h"
#include "gguf_common.h"
#include "gguf_q8k.h"
#include "simd.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using tram::x8::kRows;

constexpr int64_t kGrainGroups = 4;  // groups of 8 rows of W per thread task at least
constexpr int64_t kXRows = 64;       // rows of x per pass over a thread's groups (their int8 stays in L2)

void check_rows(const at::Tensor& t, int64_t row_bytes, const char* who, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 2 && t.scalar_type() == at::kByte && t.is_contiguous(), who, ": ",
              what, " must be a contiguous [N, bytes] uint8 CPU tensor");
  TORCH_CHECK(t.size(0) % kRows == 0, who, ": ", t.size(0), " rows is not a multiple of ", kRows);
  TORCH_CHECK(row_bytes > 0 && t.size(1) % row_bytes == 0, who, ": rows of ", t.size(1),
              " bytes are not whole blocks of ", row_bytes);
}

// L from a type id, or an error naming the repacked types.
template <typename Fn>
void with_layout(int64_t type, const char* who, Fn&& fn) {
  TORCH_CHECK(tram::x8::with_any_layout(type, fn), who, ": type ", type,
              " is not a repacked layout (1012 Q4_K x8, 1014 Q6_K x8, 1006 Q5_0 x8, 1008 Q8_0 x8)");
}

#if defined(TRAM_X8_KERNELS)
template <typename T>
TRAM_INLINE void store_outputs(const float* out, const T* bias, T* y, int64_t n0, int64_t rows) {
  for (int64_t j = 0; j < rows; ++j) {
    const float b = bias != nullptr ? tram::simd::load1(bias + n0 + j) : 0.0f;
    tram::simd::store(out[j] + b, y + n0 + j);
  }
}

#if defined(TRAM_X8_GEMM)
// Many rows of x against Q4_K x8: tiles of two groups for gguf_x8_gemm.h's GEMM, each built once.
template <typename T>
void linear_gemm(const tram::q8k::Rows& x, int64_t M, int64_t N, int64_t K, const uint8_t* w, const T* bias, T* y) {
  using tram::x8::kPackRows;
  const int64_t row_bytes = K / tram::q8k::kBlock * tram::x8::Q4K::kRowBytes;
  tram::parallel::dynamic_for((N + kPackRows - 1) / kPackRows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * kPackRows, rows = std::min(kPackRows, N - n0);
      tram::x8::gemm_rows(x, 0, M, w, row_bytes, K, n0, rows,
                          [&](int64_t m, const float* out) { store_outputs(out, bias, y + m * N, n0, rows); });
    }
  });
}
#endif

// Groups g_begin .. g_end - 1 of one weight against every row of x.
template <typename L, typename Rows, typename T>
void groups_times(const Rows& x, int64_t M, int64_t N, int64_t K, const uint8_t* w, const T* bias, T* y,
                  int64_t g_begin, int64_t g_end) {
  const int64_t blocks = K / L::kBlock, group_bytes = blocks * L::kBlockBytes;
  for (int64_t mb = 0; mb < M; mb += kXRows) {
    const int64_t me = std::min(M, mb + kXRows);
    for (int64_t g = g_begin; g < g_end; ++g) {
      const int64_t n0 = g * kRows;
      tram::x8::group_times<L>(x, mb, me, w + g * group_bytes, blocks,
                               [&](int64_t m, const float* out) { store_outputs(out, bias, y + m * N, n0, kRows); });
    }
  }
}

template <typename L, typename Rows, typename T>
void linear(const Rows& x, int64_t M, int64_t N, int64_t K, const uint8_t* w, const T* bias, T* y) {
#if defined(TRAM_X8_GEMM)
  if constexpr (std::is_same_v<L, tram::x8::Q4K>) {
    if (M >= tram::x8::kGemmMinRows) return linear_gemm(x, M, N, K, w, bias, y);
  }
#endif
  tram::parallel::dynamic_for(N / kRows, kGrainGroups, [&](int64_t begin, int64_t end) {
    groups_times<L>(x, M, N, K, w, bias, y, begin, end);
  });
}
#endif

// One repacked weight's checked arguments.
struct Weight {
  const uint8_t* w = nullptr;
  int64_t type = 0, N = 0;
  at::Tensor bias;  // undefined: none
};

Weight check_weight(const at::Tensor& x, const at::Tensor& packed, int64_t type, const c10::optional<at::Tensor>& bias) {
  Weight out{nullptr, type, packed.size(0), {}};
  const int64_t K = x.size(1);
  with_layout(type, "gguf_linear_int8", [&](auto layout) {
    using L = decltype(layout);
    check_rows(packed, L::kRowBytes, "gguf_linear_int8", "repacked data");
    TORCH_CHECK(K % L::kBlock == 0 && packed.size(1) == K / L::kBlock * L::kRowBytes,
                "gguf_linear_int8: repacked rows of ", packed.size(1), " bytes, expected ",
                K / L::kBlock * L::kRowBytes, " for K = ", K);
  });
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == out.N && bias->scalar_type() == x.scalar_type(),
                "gguf_linear_int8: bias must be [N] in x's dtype");
    out.bias = bias->contiguous();
  }
  out.w = packed.data_ptr<uint8_t>();
  return out;
}

#if defined(TRAM_X8_KERNELS)
// Weights of one activation format against x: one weight alone takes linear(), several (q/k/v, gate/up)
// one parallel region over all their groups; each output's arithmetic is the same either way.
template <typename T, typename Rows>
void linear_n(const Rows& x, int64_t M, int64_t K, const std::vector<Weight>& ws, std::vector<at::Tensor>& ys) {
  const auto bias = [&](size_t i) { return ws[i].bias.defined() ? ws[i].bias.data_ptr<T>() : nullptr; };
  const auto run = [&](size_t i, auto fn) {
    tram::x8::with_any_layout(ws[i].type, [&](auto l) {
      using L = decltype(l);
      if constexpr (std::is_same_v<decltype(std::declval<const typename L::Activations&>().rows()), Rows>) fn(L{});
    });
  };
  bool apart = ws.size() == 1;
#if defined(TRAM_X8_GEMM)
  for (const Weight& w : ws) apart = apart || (w.type == tram::x8::Q4K::kType && M >= tram::x8::kGemmMinRows);
#endif
  if (apart) {  // Q4_K x8's GEMM takes its weights one by one
    for (size_t i = 0; i < ws.size(); ++i) {
      run(i, [&](auto l) { linear<decltype(l)>(x, M, ws[i].N, K, ws[i].w, bias(i), ys[i].data_ptr<T>()); });
    }
    return;
  }
  std::vector<int64_t> groups;
  for (const Weight& w : ws) groups.push_back(w.N / kRows);
  tram::parallel::dynamic_for_parts(groups, kGrainGroups, [&](size_t i, int64_t begin, int64_t end) {
    run(i, [&](auto l) { groups_times<decltype(l)>(x, M, ws[i].N, K, ws[i].w, bias(i), ys[i].data_ptr<T>(), begin, end); });
  });
}
#endif

}  // namespace

namespace tram {

int64_t gguf_x8_type(int64_t ggml_type) {
  if (ggml_type == tram::gguf::kQ4_K) return tram::x8::Q4K::kType;
  if (ggml_type == tram::gguf::kQ6_K) return tram::x8::Q6K::kType;
  if (ggml_type == tram::gguf::kQ5_0) return tram::x8::Q50::kType;
  if (ggml_type == tram::gguf::kQ8_0) return tram::x8::Q80::kType;
  return -1;
}

bool gguf_x8_preferred(int64_t ggml_type) {
#if defined(TRAM_X8_KERNELS)
  // every ISA: the row kernel's per-4-k float steps (and Q5_0's fifth bits) are its bottleneck
  if (ggml_type == tram::gguf::kQ5_0 || ggml_type == tram::gguf::kQ8_0) return true;
#endif
#if defined(TRAM_X8_KERNELS) && !defined(TRAM_Q8K_512)
  return gguf_x8_type(ggml_type) >= 0;  // AVX2 without the AVX-512 K-quant kernels: both layouts
#elif defined(TRAM_X8_GEMM) && defined(TRAM_X8_VNNI)
  // AVX-512 with VNNI: Q4_K x8 multiplies 1-16 rows of x faster than gguf_q8k.h's kernels, and more rows
  // take their GEMM (gguf_x8_gemm.h); the six-bit decode keeps Q6_K x8 slower at every row count, so
  // Q6_K keeps the file's layout.
  return ggml_type == tram::gguf::kQ4_K;
#else
  return false;
#endif
}

at::Tensor gguf_x8_pack(const at::Tensor& data, int64_t ggml_type) {
  const int64_t type = gguf_x8_type(ggml_type);
  at::Tensor out;
  with_layout(type, "gguf_x8_pack", [&](auto layout) {
    using L = decltype(layout);
    check_rows(data, L::kSrcBytes, "gguf_x8_pack", "data");
    const int64_t N = data.size(0), blocks = data.size(1) / L::kSrcBytes;
    out = at::empty({N, blocks * L::kRowBytes}, data.options());
    const uint8_t* src = data.data_ptr<uint8_t>();
    uint8_t* dst = out.data_ptr<uint8_t>();
    at::parallel_for(0, N / kRows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        tram::x8::pack_group<L>(src + g * kRows * data.size(1), data.size(1), blocks, dst + g * blocks * L::kBlockBytes);
      }
    });
  });
  return out;
}

at::Tensor gguf_x8_unpack(const at::Tensor& packed, int64_t type) {
  at::Tensor out;
  with_layout(type, "gguf_x8_unpack", [&](auto layout) {
    using L = decltype(layout);
    check_rows(packed, L::kRowBytes, "gguf_x8_unpack", "packed");
    const int64_t N = packed.size(0), blocks = packed.size(1) / L::kRowBytes, row_bytes = blocks * L::kSrcBytes;
    out = at::empty({N, row_bytes}, packed.options());
    const uint8_t* src = packed.data_ptr<uint8_t>();
    uint8_t* dst = out.data_ptr<uint8_t>();
    at::parallel_for(0, N / kRows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        tram::x8::unpack_group<L>(src + g * blocks * L::kBlockBytes, blocks, row_bytes, dst + g * kRows * row_bytes);
      }
    });
  });
  return out;
}

at::Tensor gguf_x8_linear(const at::Tensor& x, const at::Tensor& packed, int64_t type,
                          const c10::optional<at::Tensor>& bias) {
  std::vector<at::Tensor> ys = gguf_x8_linear_n(x, {packed}, {type}, {bias});
  return ys.front();
}

std::vector<at::Tensor> gguf_x8_linear_n(const at::Tensor& x, const std::vector<at::Tensor>& packed,
                                         const std::vector<int64_t>& types,
                                         const std::vector<c10::optional<at::Tensor>>& biases) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "gguf_linear_int8: x must be a [M, K] float32 or bfloat16 CPU tensor");
  TORCH_CHECK(!packed.empty() && packed.size() == types.size() && packed.size() == biases.size(),
              "gguf_linear_int8: as many types and biases as weights");
  std::vector<Weight> ws;
  for (size_t i = 0; i < packed.size(); ++i) ws.push_back(check_weight(x, packed[i], types[i], biases[i]));
  const int64_t M = x.size(0);
  std::vector<at::Tensor> ys;
  for (const Weight& w : ws) ys.push_back(at::empty({M, w.N}, x.options()));
  if (M == 0) return ys;
  bool done = false;
#if defined(TRAM_X8_KERNELS)
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const auto block = [](int64_t t) {
    int64_t k = 0;
    tram::x8::with_any_layout(t, [&](auto l) { k = decltype(l)::kBlock; });
    return k;
  };
  for (const int64_t t : types) {
    if (block(t) != block(types.front())) {  // x quantized two ways: one call per weight
      for (size_t i = 0; i < packed.size(); ++i) ys[i] = gguf_x8_linear(x, packed[i], types[i], biases[i]);
      return ys;
    }
  }
  with_layout(types.front(), "gguf_linear_int8", [&](auto layout) {
    typename decltype(layout)::Activations qa;
    qa.quantize(xf.data_ptr<float>(), x.size(1), M, x.size(1));
    if (x.scalar_type() == at::kFloat) {
      linear_n<float>(qa.rows(), M, x.size(1), ws, ys);
    } else {
      linear_n<c10::BFloat16>(qa.rows(), M, x.size(1), ws, ys);
    }
  });
  done = true;
#endif
  TORCH_CHECK(done, "gguf_linear_int8: repacked GGUF weights need a build with AVX2, FMA and F16C");
  return ys;
}

}  // namespace tram
