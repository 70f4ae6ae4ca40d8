// Paged decode attention for CPU: one query token per request attends to its context, read straight
// from the paged KV cache (no gather into padded tensors, no mask).
//
//   query        [B, H, D]              any strides; float32 / bfloat16 / float16
//   kv_cache     [2, N, bs, Hkv, D]     contiguous, query's dtype or fp8 (e4m3fn / e5m2) (index 0 = keys,
//                                       1 = values); fp8 keys are read as stored * k_scale, values * v_scale
//   block_tables [B, M]                 int32 (int64 is narrowed), any strides; token t of request i
//                                       lives in block block_tables[i, t / bs] at offset t % bs
//   seq_lens     [B]                    int32 or int64; the query sits at position seq_lens[i] - 1
//   sliding_window                      0 = none, else only the last W positions are attended
//   logits_soft_cap                     0 = none, else scores become cap * tanh(score / cap) before the
//                                       softmax (Gemma 2)
//   sinks        [H] or None            float32, contiguous: a logit per head that joins the softmax's
//                                       denominator and adds no value row (gpt-oss's attention sinks)
//   -> out       [B, H, D]              contiguous, query's dtype
//
// Work items are requests (or, when there are too few requests for the threads, groups of a
// request's kv heads), handed out dynamically to torch's intra-op threads: torch.set_num_threads
// governs it and unequal context lengths still balance. An item walks its context block by block;
// within a block, for each kv head, the G = H / Hkv query heads sharing it are processed together,
// so each K/V row comes from memory once, and a 16-bit or fp8 row is widened to float32 once (into a
// per-thread buffer) for all G of them. Softmax is exact and two-pass: pass 1 writes the scores
// of the whole context to a per-thread buffer, then max / exp / sum per head, then pass 2 adds the
// weighted V rows. All arithmetic is float32; 16-bit and fp8 K/V are widened as they are loaded (fp8.h),
// k_scale folded into the scaled query and v_scale into the final 1 / sum (both 1 unless fp8).
//
// SIMD comes from GCC/Clang vector extensions (lowered to AVX-512, AVX2, SSE or NEON by -march;
// x86 intrinsics only widen 16-bit floats where AVX2 / F16C exist) and needs no -ffast-math. Every
// sum has a fixed order, so a request's result does not depend on the batch it is in or on the
// number of threads.
#include "fp8.h"
#include "kernels.h"
#include "simd.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using namespace tram::simd;

constexpr int64_t kLanes = 8;      // floats per chunk of a head row (head_dim % 8 == 0 takes the SIMD path)
constexpr int64_t kScorePad = 16;  // score rows are padded (with -inf) to a multiple of this


// ---- 8 consecutive elements of a row, widened to float.

TRAM_INLINE vf8 load8(const float* p) { return vload<vf8>(p); }

TRAM_INLINE vf8 load8(const c10::BFloat16* p) {
  // bfloat16 is the top half of a float32. (GCC splits the generic widening into 128-bit halves.)
#if defined(__AVX2__)
  return bitcast<vf8>(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
#else
  return bitcast<vf8>(__builtin_convertvector(vload<vu16x8>(p), vu32x8) << 16);
#endif
}

TRAM_INLINE vf8 load8(const c10::Half* p) {
#if defined(__F16C__)
  return bitcast<vf8>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  vf8 r;
  for (int i = 0; i < kLanes; ++i) r[i] = static_cast<float>(p[i]);
  return r;
#endif
}

// fp8: the value / kReadFactor (2^8 for e4m3), the factor folded into the query's and the output's scales.
TRAM_INLINE vf8 load8(const c10::Float8_e4m3fn* p) { return tram::fp8::widen8_raw(p); }
TRAM_INLINE vf8 load8(const c10::Float8_e5m2* p) { return tram::fp8::widen8_raw(p); }

// Horizontal sums below (reduce8) add in simd.h's hsum8 order, ((0+1)+(2+3))+((4+5)+(6+7)).
#if defined(__clang__) || __GNUC__ >= 12
#define TRAM_SHUFFLE8(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else  // GCC before 12 has only __builtin_shuffle
typedef int32_t vi8 __attribute__((vector_size(kLanes * sizeof(int32_t))));
#define TRAM_SHUFFLE8(a, b, ...) __builtin_shuffle(a, b, vi8{__VA_ARGS__})
#endif

TRAM_INLINE vf8 pairsum(vf8 a, vf8 b) {  // [a0+a1, a2+a3, a4+a5, a6+a7, b0+b1, ..., b6+b7]
  return TRAM_SHUFFLE8(a, b, 0, 2, 4, 6, 8, 10, 12, 14) + TRAM_SHUFFLE8(a, b, 1, 3, 5, 7, 9, 11, 13, 15);
}

// [hsum8(a0), ..., hsum8(a7)]: eight row dot products finished with 7 adds and 14 shuffles.
TRAM_INLINE vf8 reduce8(vf8 a0, vf8 a1, vf8 a2, vf8 a3, vf8 a4, vf8 a5, vf8 a6, vf8 a7) {
  const vf8 b0 = pairsum(a0, a1), b1 = pairsum(a2, a3), b2 = pairsum(a4, a5), b3 = pairsum(a6, a7);
  const vf8 c0 = pairsum(b0, b1), c1 = pairsum(b2, b3);
  return pairsum(c0, c1);
}

// ---- Softmax over a padded score row.

// x[0 .. n) = cap * tanh(x / cap), n a multiple of kScorePad: soft-capped scores. Only called when a
// cap is set, so an uncapped decode pays nothing for it.
TRAM_INLINE void soft_cap(float* __restrict x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; i += kScorePad) vstore(x + i, tanh16(vload<vf16>(x + i) / cap) * cap);
}

TRAM_INLINE float row_max(const float* __restrict x, int64_t n) {
  vf16 m = splat16(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += kScorePad) {
    const vf16 v = vload<vf16>(x + i);
    m = select(m < v, v, m);
  }
  float mx = m[0];
  for (int l = 1; l < kScorePad; ++l) mx = std::max(mx, m[l]);
  return mx;
}

// x[0 .. n) = exp(x - mx); returns their sum.
TRAM_INLINE float exp_sum(float* __restrict x, int64_t n, float mx) {
  vf16 acc{};
  for (int64_t i = 0; i < n; i += kScorePad) {
    const vf16 e = exp_nonpos(vload<vf16>(x + i) - mx);
    vstore(x + i, e);
    acc += e;
  }
  float s = 0.f;
  for (int l = 0; l < kScorePad; ++l) s += acc[l];
  return s;
}

// x[0 .. n) = softmax numerators exp(x - max x), n a multiple of kScorePad; returns 1 / their sum.
TRAM_INLINE float softmax_numerators(float* __restrict x, int64_t n) { return 1.f / exp_sum(x, n, row_max(x, n)); }

// The same with an attention sink (gpt-oss): a logit that joins the denominator only. The maximum
// includes it, so a sink far above the scores cannot overflow the sum.
TRAM_INLINE float softmax_numerators(float* __restrict x, int64_t n, float sink) {
  const float mx = std::max(row_max(x, n), sink);
  return 1.f / (exp_sum(x, n, mx) + std::exp(sink - mx));
}


// Prefetch into L2 (prefetcht2), not into L1: the next block's rows would crowd the few L1 miss
// buffers.
inline void prefetch(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 0, 1);
}

inline int64_t read_block(const int32_t* table, int64_t i, int64_t table_stride, int64_t num_blocks) {
  const int64_t block = table[i * table_stride];
  TORCH_CHECK(block >= 0 && block < num_blocks, "paged_decode_attention: block id ", block, " out of range [0, ",
              num_blocks, ")");
  return block;
}

// ---- Per kv head and block segment: scores (pass 1) and weighted V sums (pass 2).
// NV = head_dim / 8 when fixed at compile time, 0 when head_dim % 8 == 0 but read at run time,
// -1 for any other head_dim (scalar loops). Rows are `count` consecutive tokens, row_stride apart.

template <int NV, typename scalar_t>
TRAM_INLINE vf8 row_dot(const float* __restrict q, const scalar_t* __restrict k, int64_t nv) {
  const int64_t n = NV > 0 ? NV : nv;
  vf8 acc = vload<vf8>(q) * load8(k);
  for (int64_t c = 1; c < n; ++c) acc += vload<vf8>(q + c * kLanes) * load8(k + c * kLanes);
  return acc;
}

template <int NV, typename scalar_t>
TRAM_INLINE void scores_segment(const float* __restrict q, const scalar_t* __restrict k, int64_t row_stride,
                                int64_t count, int64_t D, float* __restrict s) {
  if constexpr (NV < 0) {
    for (int64_t o = 0; o < count; ++o) {
      const scalar_t* row = k + o * row_stride;
      float acc = 0.f;
      for (int64_t d = 0; d < D; ++d) acc += q[d] * load1(row + d);
      s[o] = acc;
    }
  } else {
    const int64_t nv = D / kLanes;
    int64_t o = 0;
    for (; o + 8 <= count; o += 8) {
      const scalar_t* r = k + o * row_stride;
      vstore(s + o, reduce8(row_dot<NV>(q, r, nv), row_dot<NV>(q, r + row_stride, nv),
                            row_dot<NV>(q, r + 2 * row_stride, nv), row_dot<NV>(q, r + 3 * row_stride, nv),
                            row_dot<NV>(q, r + 4 * row_stride, nv), row_dot<NV>(q, r + 5 * row_stride, nv),
                            row_dot<NV>(q, r + 6 * row_stride, nv), row_dot<NV>(q, r + 7 * row_stride, nv)));
    }
    for (; o < count; ++o) s[o] = hsum8(row_dot<NV>(q, k + o * row_stride, nv));
  }
}

template <int NV, typename scalar_t>
TRAM_INLINE void values_segment(const float* __restrict p, const scalar_t* __restrict v, int64_t row_stride,
                                int64_t count, int64_t D, float* __restrict acc) {
  if constexpr (NV < 0) {
    for (int64_t o = 0; o < count; ++o)
      for (int64_t d = 0; d < D; ++d) acc[d] += p[o] * load1(v + o * row_stride + d);
  } else if constexpr (NV > 0) {  // the head's accumulator lives in registers for the segment
    vf8 a[NV];
    for (int64_t c = 0; c < NV; ++c) a[c] = vload<vf8>(acc + c * kLanes);
    for (int64_t o = 0; o < count; ++o) {
      const vf8 w = vf8{} + p[o];
      for (int64_t c = 0; c < NV; ++c) a[c] += w * load8(v + o * row_stride + c * kLanes);
    }
    for (int64_t c = 0; c < NV; ++c) vstore(acc + c * kLanes, a[c]);
  } else {
    for (int64_t c = 0; c < D; c += kLanes) {
      vf8 a = vload<vf8>(acc + c);
      for (int64_t o = 0; o < count; ++o) a += (vf8{} + p[o]) * load8(v + o * row_stride + c);
      vstore(acc + c, a);
    }
  }
}

// wide[o * D + d] = row o's element d, widened as the segments load it (load8), for `count` rows
// row_stride apart: the floats the direct loads give.
template <typename cache_t>
TRAM_INLINE void widen_rows(const cache_t* __restrict rows, int64_t row_stride, int64_t count, int64_t D,
                            float* __restrict wide) {
  for (int64_t o = 0; o < count; ++o)
    for (int64_t c = 0; c < D; c += kLanes) vstore(wide + o * D + c, load8(rows + o * row_stride + c));
}

// Calls f(j, count, rows, next_rows, next_count) for each stretch of the context positions
// [start, end) that lies in one block: positions start + j .. start + j + count - 1, whose rows
// start at `rows` (head_offset into the first token's row of `cache`, one half of kv_cache), and
// the first next_count rows of the next block at next_rows (for prefetching; next_count may be 0).
template <typename scalar_t, typename F>
TRAM_INLINE void for_each_segment(const scalar_t* cache, const int32_t* table, int64_t table_stride, int64_t start,
                                  int64_t end, int64_t block_size, int64_t num_blocks, int64_t row_stride,
                                  int64_t head_offset, const F& f) {
  int64_t t = start;
  int64_t block_index = t / block_size;
  int64_t block = read_block(table, block_index, table_stride, num_blocks);
  while (t < end) {
    const int64_t off = t % block_size;
    const int64_t count = std::min(block_size - off, end - t);
    const int64_t next_count = std::min(block_size, end - t - count);
    const int64_t next_block = next_count > 0 ? read_block(table, block_index + 1, table_stride, num_blocks) : 0;
    f(t - start, count, cache + (block * block_size + off) * row_stride + head_offset,
      cache + next_block * block_size * row_stride + head_offset, next_count);
    t += count;
    ++block_index;
    block = next_block;
  }
}

// scalar_t: the query's and the output's type; cache_t: the cache's (scalar_t, or an fp8 type).
template <typename scalar_t, typename cache_t, int NV>
void paged_decode_impl(const at::Tensor& query, const at::Tensor& kv_cache, const at::Tensor& block_tables,
                       const std::vector<int64_t>& lens, float scale, float v_scale, int64_t window, float cap,
                       const float* sinks, at::Tensor& out) {
  const int64_t B = query.size(0), H = query.size(1);
  const int64_t D = NV > 0 ? NV * kLanes : query.size(2);
  const int64_t N = kv_cache.size(1), bs = kv_cache.size(2), Hkv = kv_cache.size(3);
  const int64_t G = H / Hkv;
  // Widening a 16-bit or fp8 row costs more than the products with it; float rows need none, and
  // a head dim that is no multiple of 8 takes the scalar loops.
  const bool widen_once = G > 1 && NV >= 0 && !std::is_same_v<cache_t, float>;
  // Vector loads of an fp8 cache return value / read_factor; scaling q and the output by it instead is
  // exact (a power of two), so the result is bit for bit that of a float cache holding the values.
  constexpr float read_factor = std::is_same_v<cache_t, scalar_t> ? 1.f : tram::fp8::kReadFactor<cache_t>;
  const float q_scale = NV < 0 ? scale : scale * read_factor, out_scale = NV < 0 ? v_scale : v_scale * read_factor;
  const int64_t qs0 = query.stride(0), qs1 = query.stride(1), qs2 = query.stride(2);
  const int64_t ts0 = block_tables.stride(0), ts1 = block_tables.stride(1);
  const int64_t row_stride = Hkv * D;  // between consecutive tokens (all kv heads of a token are one row)
  const int64_t head_bytes = D * static_cast<int64_t>(sizeof(cache_t));
  const scalar_t* q_ptr = query.data_ptr<scalar_t>();
  const cache_t* k_cache = kv_cache.data_ptr<cache_t>();
  const cache_t* v_cache = k_cache + N * bs * Hkv * D;
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  scalar_t* o_ptr = out.data_ptr<scalar_t>();

  int64_t max_ctx = 1;  // the longest attended span, for the score buffers
  for (int64_t b = 0; b < B; ++b) max_ctx = std::max(max_ctx, window > 0 ? std::min(lens[b], window) : lens[b]);
  max_ctx = (max_ctx + kScorePad - 1) / kScorePad * kScorePad;

  // A request's kv heads are best read together (a block is then one contiguous stretch of memory);
  // they are split only when there are too few requests to keep every thread busy.
  const int64_t threads = at::get_num_threads();
  const int64_t kv_per_item = B >= 4 * threads ? Hkv : std::max<int64_t>(1, Hkv * B / (4 * threads));
  const int64_t chunks = (Hkv + kv_per_item - 1) / kv_per_item;
  const int64_t num_items = B * chunks;
  std::atomic<int64_t> next{0};
  const int64_t num_workers = std::max<int64_t>(1, std::min<int64_t>(threads, num_items));
  at::parallel_for(0, num_workers, 1, [&](int64_t /*w0*/, int64_t /*w1*/) {
    // Per-thread scratch: scaled queries, output accumulators, scores, 1 / softmax sums.
    const int64_t max_heads = kv_per_item * G;
    std::vector<float> qbuf(max_heads * D), acc(max_heads * D), scores(max_heads * max_ctx), inv(max_heads);
    std::vector<float> wide(widen_once ? bs * D : 0);  // one block's rows of a kv head, widened
    for (int64_t item = next.fetch_add(1, std::memory_order_relaxed); item < num_items;
         item = next.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t b = item / chunks, h0 = (item % chunks) * kv_per_item;
      const int64_t nkv = std::min(kv_per_item, Hkv - h0), nh = nkv * G;
      const int64_t len = lens[b];
      const int64_t start = (window > 0 && len > window) ? len - window : 0;
      const int64_t n = len - start;
      const int64_t n_pad = (n + kScorePad - 1) / kScorePad * kScorePad;  // score row stride
      scalar_t* o_item = o_ptr + (b * H + h0 * G) * D;
      if (n <= 0) {  // no context (not a real decode): zeros rather than NaN
        for (int64_t i = 0; i < nh * D; ++i) store(0.f, o_item + i);
        continue;
      }
      float* qb = qbuf.data();
      for (int64_t h = 0; h < nh; ++h) {
        const scalar_t* q = q_ptr + b * qs0 + (h0 * G + h) * qs1;
        for (int64_t d = 0; d < D; ++d) qb[h * D + d] = static_cast<float>(q[d * qs2]) * q_scale;
      }
      const int32_t* table = tables + b * ts0;
      float* sc = scores.data();
      float* ab = acc.data();

      // op(h, j, count, rows, stride) for every query head of the item and each stretch of the context
      // that lies in one block; blocks sit anywhere in memory, so the next one's rows are fetched ahead.
      // Where G query heads share a kv head, its rows are widened once into `wide` for all G of them.
      const auto over_context = [&](const cache_t* cache, const auto& op) {
        for_each_segment(cache, table, ts1, start, len, bs, N, row_stride, h0 * D,
                         [&](int64_t j, int64_t count, const cache_t* rows, const cache_t* next_rows,
                             int64_t next_count) {
                           for (int64_t kv = 0; kv < nkv; ++kv) {
                             for (int64_t o = 0; o < next_count; ++o)
                               prefetch(next_rows + o * row_stride + kv * D, head_bytes);
                             if (widen_once) {
                               widen_rows(rows + kv * D, row_stride, count, D, wide.data());
                               for (int64_t g = 0; g < G; ++g) op(kv * G + g, j, count, wide.data(), D);
                             } else {
                               for (int64_t g = 0; g < G; ++g) op(kv * G + g, j, count, rows + kv * D, row_stride);
                             }
                           }
                         });
      };
      // Pass 1: sc[h, j] = q_h . k_j (q already scaled).
      over_context(k_cache, [&](int64_t h, int64_t j, int64_t count, const auto* rows, int64_t stride) {
        scores_segment<NV>(qb + h * D, rows, stride, count, D, sc + h * n_pad + j);
      });
      for (int64_t h = 0; h < nh; ++h) {
        float* s = sc + h * n_pad;
        if (cap > 0.f) soft_cap(s, n_pad, cap);  // the padding's garbage too: it becomes -inf next
        std::fill(s + n, s + n_pad, -std::numeric_limits<float>::infinity());
        inv[h] = (sinks ? softmax_numerators(s, n_pad, sinks[h0 * G + h]) : softmax_numerators(s, n_pad)) * out_scale;
      }
      // Pass 2: acc[h] = sum_j p[h, j] * v_j.
      std::fill(ab, ab + nh * D, 0.f);
      over_context(v_cache, [&](int64_t h, int64_t j, int64_t count, const auto* rows, int64_t stride) {
        values_segment<NV>(sc + h * n_pad + j, rows, stride, count, D, ab + h * D);
      });
      for (int64_t h = 0; h < nh; ++h)
        for (int64_t d = 0; d < D; ++d) store(ab[h * D + d] * inv[h], o_item + h * D + d);
    }
  });
}

template <typename scalar_t, typename cache_t>
void dispatch_head_dim(const at::Tensor& query, const at::Tensor& kv_cache, const at::Tensor& block_tables,
                       const std::vector<int64_t>& lens, float scale, float v_scale, int64_t window, float cap,
                       const float* sinks, at::Tensor& out) {
  const int64_t D = query.size(2);
  if (D % kLanes != 0)
    return paged_decode_impl<scalar_t, cache_t, -1>(query, kv_cache, block_tables, lens, scale, v_scale, window, cap,
                                                    sinks, out);
  if constexpr (!std::is_same_v<scalar_t, cache_t>) {  // fp8: the usual head dims only, to keep the build short
    if (D == 64)
      return paged_decode_impl<scalar_t, cache_t, 8>(query, kv_cache, block_tables, lens, scale, v_scale, window,
                                                     cap, sinks, out);
    if (D == 128)
      return paged_decode_impl<scalar_t, cache_t, 16>(query, kv_cache, block_tables, lens, scale, v_scale, window,
                                                      cap, sinks, out);
    return paged_decode_impl<scalar_t, cache_t, 0>(query, kv_cache, block_tables, lens, scale, v_scale, window, cap,
                                                   sinks, out);
  }
  switch (D / kLanes) {
#define TRAM_HEAD_DIM_CASE(NV)                                                                                   \
  case NV:                                                                                                       \
    return paged_decode_impl<scalar_t, cache_t, NV>(query, kv_cache, block_tables, lens, scale, v_scale, window, \
                                                    cap, sinks, out);
    TRAM_HEAD_DIM_CASE(1)   // 8 (the smallest models: a draft, stories260K)
    TRAM_HEAD_DIM_CASE(4)   // 32
    TRAM_HEAD_DIM_CASE(6)   // 48
    TRAM_HEAD_DIM_CASE(8)   // 64
    TRAM_HEAD_DIM_CASE(10)  // 80
    TRAM_HEAD_DIM_CASE(12)  // 96
    TRAM_HEAD_DIM_CASE(16)  // 128
#undef TRAM_HEAD_DIM_CASE
    default:
      return paged_decode_impl<scalar_t, cache_t, 0>(query, kv_cache, block_tables, lens, scale, v_scale, window,
                                                     cap, sinks, out);
  }
}

// The cache is the query's type (checked by the caller) or fp8.
template <typename scalar_t>
void dispatch_cache(const at::Tensor& query, const at::Tensor& kv_cache, const at::Tensor& block_tables,
                    const std::vector<int64_t>& lens, float scale, float v_scale, int64_t window, float cap,
                    const float* sinks, at::Tensor& out) {
  switch (kv_cache.scalar_type()) {
    case at::kFloat8_e4m3fn:
      return dispatch_head_dim<scalar_t, c10::Float8_e4m3fn>(query, kv_cache, block_tables, lens, scale, v_scale,
                                                             window, cap, sinks, out);
    case at::kFloat8_e5m2:
      return dispatch_head_dim<scalar_t, c10::Float8_e5m2>(query, kv_cache, block_tables, lens, scale, v_scale,
                                                           window, cap, sinks, out);
    default:
      return dispatch_head_dim<scalar_t, scalar_t>(query, kv_cache, block_tables, lens, scale, v_scale, window, cap,
                                                   sinks, out);
  }
}

}  // namespace

namespace tram {

at::Tensor paged_decode_attention(const at::Tensor& query, const at::Tensor& kv_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                                  int64_t sliding_window, double k_scale, double v_scale, double logits_soft_cap,
                                  const c10::optional<at::Tensor>& sinks) {
  TORCH_CHECK(query.device().is_cpu() && kv_cache.device().is_cpu() && block_tables.device().is_cpu() &&
                  seq_lens.device().is_cpu(),
              "paged_decode_attention: CPU tensors only");
  TORCH_CHECK(query.dim() == 3, "query must be [B, H, D]");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2, "kv_cache must be [2, num_blocks, block_size, Hkv, D]");
  TORCH_CHECK(kv_cache.is_contiguous(), "kv_cache must be contiguous");
  const bool fp8 = kv_cache.scalar_type() == at::kFloat8_e4m3fn || kv_cache.scalar_type() == at::kFloat8_e5m2;
  TORCH_CHECK(fp8 || kv_cache.scalar_type() == query.scalar_type(), "kv_cache dtype ", kv_cache.scalar_type(),
              " is neither the query's (", query.scalar_type(), ") nor fp8");
  const int64_t B = query.size(0), H = query.size(1), D = query.size(2);
  const int64_t Hkv = kv_cache.size(3);
  TORCH_CHECK(kv_cache.size(4) == D, "head_dim mismatch: query ", D, ", kv_cache ", kv_cache.size(4));
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, "num_heads ", H, " is not a multiple of num_kv_heads ", Hkv);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == B, "block_tables must be [B, max_blocks]");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.size(0) == B, "seq_lens must be [B]");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt || block_tables.scalar_type() == at::kLong,
              "block_tables must be int32 or int64");
  TORCH_CHECK(sliding_window >= 0, "sliding_window must be >= 0 (0 = none)");
  TORCH_CHECK(logits_soft_cap >= 0, "logits_soft_cap must be >= 0 (0 = none)");
  const float* sinks_ptr = tram::sinks_data(sinks, H, "paged_decode_attention");

  // Context lengths on the host (B values), validated against the block table width.
  const at::Tensor lens_t = seq_lens.to(at::kLong).contiguous();
  const int64_t* lp = lens_t.data_ptr<int64_t>();
  std::vector<int64_t> lens(lp, lp + B);
  const int64_t bs = kv_cache.size(2), max_tokens = block_tables.size(1) * bs;
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(lens[b] >= 0 && lens[b] <= max_tokens, "seq_lens[", b, "] = ", lens[b],
                " does not fit the block table (", max_tokens, " slots)");

  at::Tensor out = at::empty({B, H, D}, query.options().memory_format(at::MemoryFormat::Contiguous));
  if (B == 0 || H == 0 || D == 0) return out;
  // k_scale multiplies every score: folded into the query's scale (x 1 is exact, so a 16/32-bit cache's
  // results are bit for bit what they were without it).
  const float fscale = static_cast<float>(scale * k_scale), fv_scale = static_cast<float>(v_scale);
  const float cap = static_cast<float>(logits_soft_cap);
  // Tables are tiny ([B, M]); int64 ones are narrowed rather than doubling the instantiations.
  const at::Tensor tables = block_tables.scalar_type() == at::kInt ? block_tables : block_tables.to(at::kInt);
  switch (query.scalar_type()) {
    case at::kFloat:
      dispatch_cache<float>(query, kv_cache, tables, lens, fscale, fv_scale, sliding_window, cap, sinks_ptr, out);
      break;
    case at::kBFloat16:
      dispatch_cache<c10::BFloat16>(query, kv_cache, tables, lens, fscale, fv_scale, sliding_window, cap, sinks_ptr,
                                    out);
      break;
    case at::kHalf:
      dispatch_cache<c10::Half>(query, kv_cache, tables, lens, fscale, fv_scale, sliding_window, cap, sinks_ptr, out);
      break;
    default:
      TORCH_CHECK(false, "paged_decode_attention: unsupported dtype ", query.scalar_type());
  }
  return out;
}

}  // namespace tram
