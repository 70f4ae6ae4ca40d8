// 16-bit floats widened to float32: the logits' cast after a bfloat16 / float16 LM head.
//
//   widen_to_float(x [any shape], bfloat16 or float16) -> float32, same shape, contiguous
//
// Why: the cast is exact and only moves memory, yet PyTorch's CPU .float() of the logits takes longer
// than that memory traffic needs, and every step of a bf16 model pays it.
// bfloat16 is a float32's top half, so a widening is a shift; float16 goes through F16C where the
// CPU has it.
#include "kernels.h"
#include "simd.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace {

using namespace tram::simd;

constexpr int64_t kGrain = 1 << 16;  // elements per task: small casts stay on one thread

TRAM_INLINE vf8 widen8(const c10::BFloat16* p) { return widen_bf16x8(p); }

TRAM_INLINE vf8 widen8(const c10::Half* p) {
#if defined(__F16C__)
  return bitcast<vf8>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  vf8 r;
  for (int i = 0; i < 8; ++i) r[i] = static_cast<float>(p[i]);
  return r;
#endif
}

template <typename T>
void widen_impl(const T* src, float* dst, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) vstore(dst + i, widen8(src + i));
    for (; i < end; ++i) dst[i] = static_cast<float>(src[i]);
  });
}

}  // namespace

namespace tram {

at::Tensor widen_to_float(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu(), "widen_to_float: CPU tensors only");
  if (x.scalar_type() == at::kFloat) return x;
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
              "widen_to_float: bfloat16 or float16 expected, got ", x.scalar_type());
  const at::Tensor src = x.contiguous();
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(at::kFloat));
  if (x.scalar_type() == at::kBFloat16)
    widen_impl(src.data_ptr<c10::BFloat16>(), out.data_ptr<float>(), src.numel());
  else
    widen_impl(src.data_ptr<c10::Half>(), out.data_ptr<float>(), src.numel());
  return out;
}

}  // namespace tram
