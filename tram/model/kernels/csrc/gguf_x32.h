// Activations quantized per 32 k (llama.cpp's Q8_0 for x), as the 32-weight GGUF types take them under
// int8 activations: per 32 values d = max|x| / 127 and q = round-to-nearest-even(x * (1 / d)) in
// -127..127 (0 where d is 0), the same bits as the PyTorch reference (gguf/weight.py's
// quantize_activations). gguf_int8.cpp's row kernel and the x8 layouts of the 32-weight types
// (gguf_q5_0_x8.h) both quantize with quantize_block.
#pragma once

#include <ATen/Parallel.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace tram::x32 {

constexpr int64_t kBlock = 32;

// 32 values -> 32 int8 and their scale.
inline __attribute__((always_inline)) float quantize_block(const float* x, int8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
#if defined(__AVX512F__)
  const __m512 s = _mm512_set1_ps(id);
  for (int h = 0; h < 2; ++h) {
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * h), s));  // nearest even
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * h), _mm512_cvtsepi32_epi8(v));
  }
#else
  for (int i = 0; i < 32; ++i) {
    const float r = std::nearbyint(x[i] * id);
    q[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, r)));
  }
#endif
  return d;
}

// Quantized rows: row m's quants at q + m * ld, its scales and sums of quants per 32 k at
// d + m * (ld / 32), bs + m * (ld / 32).
struct Rows {
  const int8_t* q;
  const float* d;
  const int32_t* bs;
  int64_t ld;
  const int8_t* q_at(int64_t m) const { return q + m * ld; }
  const float* d_at(int64_t m) const { return d + m * (ld / kBlock); }
  const int32_t* bs_at(int64_t m) const { return bs + m * (ld / kBlock); }
};

// Rows quantized per 32 k, owning their buffers.
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> bs;
  int64_t K = 0;
  Rows rows() const { return {q.data(), d.data(), bs.data(), K}; }
  // Rows 0 .. M - 1 of x (stride ldx), K values each (a multiple of 32), in parallel.
  void quantize(const float* x, int64_t ldx, int64_t M, int64_t k) {
    K = k;
    q.resize(static_cast<size_t>(M * K));
    d.resize(static_cast<size_t>(M * K / kBlock));
    bs.resize(static_cast<size_t>(M * K / kBlock));
    at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        for (int64_t b = 0; b < K / kBlock; ++b) {
          int8_t* qb = q.data() + m * K + b * kBlock;
          d[m * (K / kBlock) + b] = quantize_block(x + m * ldx + b * kBlock, qb);
          int32_t s = 0;
          for (int64_t i = 0; i < kBlock; ++i) s += qb[i];
          bs[m * (K / kBlock) + b] = s;
        }
      }
    });
  }
};

}  // namespace tram::x32
