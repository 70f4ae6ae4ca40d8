// Paged prefill attention for CPU: each request's chunk of query tokens attends causally to its whole
// context (cached prefix + the chunk itself), read straight from the paged KV cache.
//
//   out          [T, H, D]          contiguous, query's dtype; only the requests' rows are written
//   query        [T, H, D]          any strides; float32 / bfloat16 / float16; D % 16 == 0
//   kv_cache     [2, N, bs, Hkv, D] contiguous, query's dtype or fp8 (e4m3fn / e5m2, keys read as
//                                   stored * k_scale, values * v_scale), the chunk's own K/V already written
//   block_tables [R, M]             int32; token t of request r lives in block block_tables[r, t / bs]
//   query_starts, query_lens, seq_lens  (host lists, R each): request r's rows are
//                                   query_starts[r] .. + query_lens[r], at context positions
//                                   seq_lens[r] - query_lens[r] .. seq_lens[r] - 1
//   sliding_window                  0 = none, else a query at p sees keys p - W + 1 .. p
//   logits_soft_cap                 0 = none, else scores become cap * tanh(score / cap) before the mask
//                                   and softmax (Gemma 2)
//   sinks        [H] or None        float32, contiguous: a logit per head that joins the softmax's
//                                   denominator and adds no value row (gpt-oss's attention sinks)
//
// Why: PyTorch's CPU flash attention is slow on a prompt's few small heads (and no faster in
// bfloat16; docs/benchmarks.md has the timings), and a prompt with a cached prefix went through a gather of
// the context and a masked SDPA. Here a work item is (request, kv head, tile of 64 query rows) with
// the G query heads that share the kv head. For each segment of 256 keys the item widens K (transposed,
// so a score row is a run of 16-lane FMAs over D) and V to float32 once, then for kQueryRows rows at a
// time computes the scores, an online-softmax update (a max and a rescale per segment, not per key)
// and the weighted V sum. All arithmetic is float32 (a bfloat16 query and cache on a CPU with AVX512_BF16
// multiply in bf16 pairs instead: prefill_bf16.h); k_scale is folded into the score scale and v_scale
// into the final 1 / sum (both exactly 1 unless the cache is fp8).
//
// Keys are visited in segments and chunks of 16 at fixed absolute positions, and a chunk or segment a
// row cannot see adds exactly nothing, so a query row's result depends only on its position and
// context: not on how the prompt was chunked, on a cached prefix, on the batch or on the thread count.
#include "fp8.h"
#include "kernels.h"
#include "prefill_bf16.h"
#include "simd.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using namespace tram::simd;

constexpr int64_t kChunk = 16;     // keys per score vector
constexpr int64_t kSegment = 256;  // keys per online-softmax step
constexpr int64_t kTile = 64;      // query rows per work item
// Query rows computed together: eight score vectors stay in registers with AVX-512's 32 (and reuse each
// key and value load twice as often as four did); AVX2's 16 hold four.
constexpr int64_t kQueryRows = TRAM_VF16_NATIVE ? 8 : 4;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kMaxHeadDim = 512;  // an fp8 key row is widened on the stack

struct Request {
  int64_t q_start, q_len, seq_len;
  const int32_t* table;
};

struct Item {
  int64_t req, kv_head, tile;
};

// Per-thread scratch of one work item; the bf16 path (prefill_bf16.h) keeps its queries, keys, values
// and probabilities as bfloat16 pairs in qw, kw, vw and p instead of q, kt and v.
struct Scratch {
  std::vector<float> q, o, m, l, kt, v, s;
  std::vector<uint32_t> qw, kw;
  std::vector<uint16_t> vw, p;
  Scratch(int64_t G, int64_t D, bool bf16)
      : q(bf16 ? 0 : G * kTile * D), o(G * kTile * D), m(G * kTile), l(G * kTile), kt(bf16 ? 0 : kSegment * D),
        v(bf16 ? 0 : kSegment * D), s(kQueryRows * kSegment), qw(bf16 ? G * kTile * D / 2 : 0),
        kw(bf16 ? kSegment * D / 2 : 0), vw(bf16 ? kSegment * D : 0), p(bf16 ? kQueryRows * kSegment : 0) {}
};

// Whether (T, C) runs the bf16-pair path: a bfloat16 query and cache on a CPU with AVX512_BF16.
template <typename T, typename C>
constexpr bool kPairs = TRAM_PREFILL_BF16_DOT && std::is_same_v<T, c10::BFloat16> && std::is_same_v<C, T>;

// The item's key range [lo, hi): what its first row may see from, what its last row sees up to.
TRAM_INLINE void key_range(int64_t p_first, int64_t p_last, int64_t window, int64_t* lo, int64_t* hi) {
  *lo = window > 0 ? std::max<int64_t>(0, p_first - window + 1) : 0;
  *hi = p_last + 1;
}

// An fp8 cache row of D (a multiple of 16) elements widened to float32.
TRAM_INLINE void widen_row(const c10::Float8_e4m3fn* src, int64_t D, float* dst) {
  for (int64_t d = 0; d < D; d += 16) vstore(dst + d, tram::fp8::widen16(src + d));
}

TRAM_INLINE void widen_row(const c10::Float8_e5m2* src, int64_t D, float* dst) {
  for (int64_t d = 0; d < D; d += 16) vstore(dst + d, tram::fp8::widen16(src + d));
}

// Widen keys [first, end) of one kv head, a stretch of the segment that starts at key k0, into kt
// (chunk-major: [chunk][d][16]) and v ([key][d]), each key at its index from k0; the tail of the last
// chunk is zeros (finite, and masked anyway). C: the cache's element type.
template <typename C>
void load_segment(const C* k_cache, const C* v_cache, const Request& rq, int64_t kv_head, int64_t k0, int64_t first,
                  int64_t end, int64_t bs, int64_t row_stride, int64_t D, float* kt, float* v) {
  const int64_t j_end = (end - k0 + kChunk - 1) / kChunk * kChunk;
  for (int64_t j = first - k0; j < j_end; ++j) {
    float* kt_chunk = kt + (j / kChunk) * D * kChunk + (j % kChunk);
    float* v_row = v + j * D;
    const int64_t t = k0 + j;
    if (t >= end) {
      for (int64_t d = 0; d < D; ++d) kt_chunk[d * kChunk] = 0.f, v_row[d] = 0.f;
      continue;
    }
    const int64_t offset = (static_cast<int64_t>(rq.table[t / bs]) * bs + t % bs) * row_stride + kv_head * D;
    const C* k_row = k_cache + offset;
    const C* v_src = v_cache + offset;
    if constexpr (std::is_same_v<C, c10::Float8_e4m3fn> || std::is_same_v<C, c10::Float8_e5m2>) {
      // Whole vectors widened, then the key scattered into its transposed column.
      float k_wide[kMaxHeadDim];
      widen_row(k_row, D, k_wide);
      for (int64_t d = 0; d < D; ++d) kt_chunk[d * kChunk] = k_wide[d];
      widen_row(v_src, D, v_row);
    } else {
      for (int64_t d = 0; d < D; ++d) kt_chunk[d * kChunk] = load1(k_row + d);
      for (int64_t d = 0; d < D; ++d) v_row[d] = load1(v_src + d);
    }
  }
}

// Scores of kQueryRows query rows (positions p[r], -1 = padding row) against the chunks [c0, c1) of a
// segment starting at key k0, soft-capped when kCap, masked, into s ([row][key]); returns each row's
// maximum. kCap is a template argument so that the uncapped loop stays as it was.
// kPairs: q and kt are the bf16 path's words (Scratch::qw, kw), else float32.
template <bool kCap, bool kPairs>
TRAM_INLINE void score_rows(const void* q, int64_t D, const void* kt, int64_t k0, int64_t c0, int64_t c1,
                            const int64_t* p, int64_t window, float scale, float cap, float* s, float* row_max) {
  const vi16 iota = iota16();
  vf16 mx[kQueryRows];
  for (int r = 0; r < kQueryRows; ++r) mx[r] = splat16(kNegInf);
  for (int64_t c = c0; c < c1; ++c) {
    vf16 acc[kQueryRows] = {};
    if constexpr (kPairs) {
#if TRAM_PREFILL_BF16_DOT
      __m512 dots[kQueryRows];
      const uint32_t* ktc = static_cast<const uint32_t*>(kt) + c * (D / 2) * kChunk;
      tram::prefill_bf16::score_chunk<kQueryRows>(static_cast<const uint32_t*>(q), D / 2, ktc, kChunk, dots);
      for (int r = 0; r < kQueryRows; ++r) acc[r] = (vf16)dots[r];
#endif
    } else {
      const float* qf = static_cast<const float*>(q);
      const float* ktc = static_cast<const float*>(kt) + c * D * kChunk;
      for (int64_t d = 0; d < D; ++d) {
        const vf16 k = vload<vf16>(ktc + d * kChunk);
        for (int r = 0; r < kQueryRows; ++r) acc[r] += qf[r * D + d] * k;
      }
    }
    const int64_t first = k0 + c * kChunk;
    const vi16 pos = iota + static_cast<int32_t>(first);
    for (int r = 0; r < kQueryRows; ++r) {
      vf16 sc = acc[r] * scale;
      if constexpr (kCap) sc = tanh16(sc / cap) * cap;
      const bool partial = first + kChunk - 1 > p[r] || (window > 0 && first <= p[r] - window);
      if (partial) {
        const vi16 pr = vi16{} + static_cast<int32_t>(p[r]);
        const vi16 keep = window > 0 ? ((pos <= pr) & (pos > pr - static_cast<int32_t>(window))) : (pos <= pr);
        sc = select(keep, sc, splat16(kNegInf));
      }
      vstore(s + r * kSegment + c * kChunk, sc);
      mx[r] = select(mx[r] < sc, sc, mx[r]);
    }
  }
  for (int r = 0; r < kQueryRows; ++r) row_max[r] = hmax(mx[r]);
}

// Online softmax over one segment for kQueryRows rows: rescale o/l to the new maxima, turn the scores in s
// into exp(score - max), add them to l and their weighted V rows to o (kPairs: v is the bf16 path's
// value words and p its scratch for the rounded probabilities).
template <bool kPairs>
TRAM_INLINE void accumulate_rows(float* s, const void* v, uint16_t* p, int64_t D, int64_t c0, int64_t c1,
                                 const float* row_max, float* m, float* l, float* o) {
  for (int r = 0; r < kQueryRows; ++r) {
    float* sr = s + r * kSegment;
    if (row_max[r] == kNegInf) {  // the row sees nothing here: it adds exactly nothing
      for (int64_t c = c0; c < c1; ++c) vstore(sr + c * kChunk, vf16{});
      continue;
    }
    if (row_max[r] > m[r]) {
      const float alpha = m[r] == kNegInf ? 0.f : std::exp(m[r] - row_max[r]);
      for (int64_t d = 0; d < D; ++d) o[r * D + d] *= alpha;
      l[r] *= alpha;
      m[r] = row_max[r];
    }
    vf16 sum{};
    const vf16 mr = splat16(m[r]);
    for (int64_t c = c0; c < c1; ++c) {
      const vf16 e = exp_nonpos(vload<vf16>(sr + c * kChunk) - mr);
      vstore(sr + c * kChunk, e);
      sum += e;
    }
    l[r] += hsum(sum);
  }
  if constexpr (kPairs) {
#if TRAM_PREFILL_BF16_DOT
    for (int r = 0; r < kQueryRows; ++r)
      for (int64_t c = c0; c < c1; ++c)
        tram::prefill_bf16::round_to_bf16(s + r * kSegment + c * kChunk, p + r * kSegment + c * kChunk);
    tram::prefill_bf16::weighted_values<kQueryRows>(p, kSegment, static_cast<const uint16_t*>(v), D, c0, c1, kChunk,
                                                    o);
#endif
    return;
  }
  const float* vf = static_cast<const float*>(v);
  for (int64_t dv = 0; dv < D; dv += 16) {
    vf16 acc[kQueryRows];
    for (int r = 0; r < kQueryRows; ++r) acc[r] = vload<vf16>(o + r * D + dv);
    for (int64_t j = c0 * kChunk; j < c1 * kChunk; ++j) {
      const vf16 vj = vload<vf16>(vf + j * D + dv);
      for (int r = 0; r < kQueryRows; ++r) acc[r] += s[r * kSegment + j] * vj;
    }
    for (int r = 0; r < kQueryRows; ++r) vstore(o + r * D + dv, acc[r]);
  }
}

// A sink joins a row's online softmax (running max m, sum l) at the end: its output o / l becomes
// o / (l + exp(sink - m)), computed as num * o / den against the larger of m and the sink (no overflow).
TRAM_INLINE void add_sink(float m, float sink, float* num, float* den) {
  if (sink > m) {
    const float a = std::exp(m - sink);  // 0 for a row that saw no key
    *num *= a;
    *den = *den * a + 1.f;
  } else {
    *den += std::exp(sink - m);
  }
}

template <typename T, typename C>
void run_item(const Item& it, const Request& rq, const T* q_ptr, int64_t qs0, int64_t qs1, int64_t qs2,
              const C* k_cache, const C* v_cache, int64_t bs, int64_t Hkv, int64_t G, int64_t D, float scale,
              float v_scale, int64_t window, float cap, const float* sinks, T* out, int64_t H, Scratch& sc) {
  const int64_t i0 = it.tile * kTile, rows = std::min(kTile, rq.q_len - i0);
  const int64_t ctx0 = rq.seq_len - rq.q_len;  // position of the chunk's first query row
  const int64_t padded = (rows + kQueryRows - 1) / kQueryRows * kQueryRows;
  constexpr bool pairs = kPairs<T, C>;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = it.kv_head * G + g;
    for (int64_t i = 0; i < padded; ++i) {
      const T* qs = q_ptr + (rq.q_start + i0 + i) * qs0 + h * qs1;
      if constexpr (pairs) {
        uint32_t* qw = sc.qw.data() + (g * kTile + i) * (D / 2);
        for (int64_t d = 0; d < D; d += 2)
          qw[d / 2] = i < rows ? (static_cast<uint32_t>(qs[(d + 1) * qs2].x) << 16) | qs[d * qs2].x : 0u;
      } else {
        float* qd = sc.q.data() + (g * kTile + i) * D;
        for (int64_t d = 0; d < D; ++d) qd[d] = i < rows ? load1(qs + d * qs2) : 0.f;
      }
    }
  }
  std::fill(sc.o.begin(), sc.o.end(), 0.f);
  std::fill(sc.m.begin(), sc.m.end(), kNegInf);
  std::fill(sc.l.begin(), sc.l.end(), 0.f);
  int64_t lo, hi;
  key_range(ctx0 + i0, ctx0 + i0 + rows - 1, window, &lo, &hi);
  const int64_t row_stride = Hkv * D;
  for (int64_t k0 = lo / kSegment * kSegment; k0 < hi; k0 += kSegment) {
    const int64_t k1 = std::min(k0 + kSegment, hi);
    // The first chunk any row of the item sees; chunk indices below count from k0.
    const int64_t c_base = (std::max(k0, lo / kChunk * kChunk) - k0) / kChunk;
    if constexpr (pairs) {
#if TRAM_PREFILL_BF16_DOT
      tram::prefill_bf16::load_segment(k_cache, v_cache, rq, it.kv_head, k0, k0 + c_base * kChunk, k1, bs,
                                       row_stride, D, kChunk, sc.kw.data(), sc.vw.data());
#endif
    } else {
      load_segment(k_cache, v_cache, rq, it.kv_head, k0, k0 + c_base * kChunk, k1, bs, row_stride, D, sc.kt.data(),
                   sc.v.data());
    }
    for (int64_t r0 = 0; r0 < padded; r0 += kQueryRows) {
      int64_t p[kQueryRows];
      for (int r = 0; r < kQueryRows; ++r) p[r] = r0 + r < rows ? ctx0 + i0 + r0 + r : -1;
      const int64_t p_hi = p[0] + std::min<int64_t>(kQueryRows, rows - r0) - 1;
      // Chunks these rows may see: up to the last row's position, from the first row's window start.
      const int64_t first_key = window > 0 ? std::max<int64_t>(k0, p[0] - window + 1) : k0;
      const int64_t c0 = std::max(c_base, (first_key - k0) / kChunk);
      const int64_t c1 = std::min((k1 - k0 + kChunk - 1) / kChunk, (p_hi - k0) / kChunk + 1);
      if (p_hi < k0 || c1 <= c0) continue;
      const void* kt = pairs ? static_cast<const void*>(sc.kw.data()) : sc.kt.data();
      const void* v = pairs ? static_cast<const void*>(sc.vw.data()) : sc.v.data();
      for (int64_t g = 0; g < G; ++g) {
        const int64_t base = g * kTile + r0;
        const void* q = pairs ? static_cast<const void*>(sc.qw.data() + base * (D / 2)) : sc.q.data() + base * D;
        float row_max[kQueryRows];
        if (cap > 0.f)
          score_rows<true, pairs>(q, D, kt, k0, c0, c1, p, window, scale, cap, sc.s.data(), row_max);
        else
          score_rows<false, pairs>(q, D, kt, k0, c0, c1, p, window, scale, cap, sc.s.data(), row_max);
        accumulate_rows<pairs>(sc.s.data(), v, sc.p.data(), D, c0, c1, row_max, sc.m.data() + base,
                               sc.l.data() + base, sc.o.data() + base * D);
      }
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = it.kv_head * G + g;
    for (int64_t i = 0; i < rows; ++i) {
      const float* o = sc.o.data() + (g * kTile + i) * D;
      float num = v_scale, den = sc.l[g * kTile + i];
      if (sinks) add_sink(sc.m[g * kTile + i], sinks[h], &num, &den);
      const float inv = num / den;
      T* dst = out + ((rq.q_start + i0 + i) * H + h) * D;
      for (int64_t d = 0; d < D; ++d) store(o[d] * inv, dst + d);
    }
  }
}

// T: the query's and the output's type; C: the cache's (T, or an fp8 type).
template <typename T, typename C>
void prefill_impl(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache, const std::vector<Request>& reqs,
                  float scale, float v_scale, int64_t window, float cap, const float* sinks) {
  const int64_t H = query.size(1), D = query.size(2);
  const int64_t N = kv_cache.size(1), bs = kv_cache.size(2), Hkv = kv_cache.size(3), G = H / Hkv;
  const C* k_cache = kv_cache.data_ptr<C>();
  const C* v_cache = k_cache + N * bs * Hkv * D;
  // Later tiles see more keys: hand them out first so the threads finish together.
  std::vector<Item> items;
  int64_t max_tiles = 0;
  for (const Request& rq : reqs) max_tiles = std::max(max_tiles, (rq.q_len + kTile - 1) / kTile);
  for (int64_t t = max_tiles - 1; t >= 0; --t)
    for (int64_t r = 0; r < static_cast<int64_t>(reqs.size()); ++r)
      if (t * kTile < reqs[r].q_len)
        for (int64_t kh = 0; kh < Hkv; ++kh) items.push_back({r, kh, t});
  const int64_t num_items = static_cast<int64_t>(items.size());
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), num_items));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    Scratch sc(G, D, kPairs<T, C>);
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < num_items;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      run_item<T, C>(items[i], reqs[items[i].req], query.data_ptr<T>(), query.stride(0), query.stride(1),
                     query.stride(2), k_cache, v_cache, bs, Hkv, G, D, scale, v_scale, window, cap, sinks,
                     out.data_ptr<T>(), H, sc);
    }
  });
}

// The cache is the query's type (checked by the caller) or fp8.
template <typename T>
void dispatch_cache(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                    const std::vector<Request>& reqs, float scale, float v_scale, int64_t window, float cap,
                    const float* sinks) {
  switch (kv_cache.scalar_type()) {
    case at::kFloat8_e4m3fn:
      return prefill_impl<T, c10::Float8_e4m3fn>(out, query, kv_cache, reqs, scale, v_scale, window, cap, sinks);
    case at::kFloat8_e5m2:
      return prefill_impl<T, c10::Float8_e5m2>(out, query, kv_cache, reqs, scale, v_scale, window, cap, sinks);
    default:
      return prefill_impl<T, T>(out, query, kv_cache, reqs, scale, v_scale, window, cap, sinks);
  }
}

}  // namespace

namespace tram {

void paged_prefill_attention_(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                              const at::Tensor& block_tables, const std::vector<int64_t>& query_starts,
                              const std::vector<int64_t>& query_lens, const std::vector<int64_t>& seq_lens,
                              double scale, int64_t sliding_window, double k_scale, double v_scale,
                              double logits_soft_cap, const c10::optional<at::Tensor>& sinks) {
  TORCH_CHECK(out.device().is_cpu() && query.device().is_cpu() && kv_cache.device().is_cpu() &&
                  block_tables.device().is_cpu(),
              "paged_prefill_attention_: CPU tensors only");
  TORCH_CHECK(query.dim() == 3 && out.sizes() == query.sizes() && out.is_contiguous(),
              "query must be [T, H, D] and out a contiguous tensor of the same shape");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "kv_cache must be a contiguous [2, num_blocks, block_size, Hkv, D]");
  const bool fp8 = kv_cache.scalar_type() == at::kFloat8_e4m3fn || kv_cache.scalar_type() == at::kFloat8_e5m2;
  TORCH_CHECK((fp8 || query.scalar_type() == kv_cache.scalar_type()) && out.scalar_type() == query.scalar_type(),
              "query and out must have one dtype, and kv_cache that dtype or fp8");
  const int64_t T = query.size(0), H = query.size(1), D = query.size(2), Hkv = kv_cache.size(3);
  TORCH_CHECK(kv_cache.size(4) == D && D % 16 == 0 && D > 0, "head_dim must match the cache and be a multiple of 16");
  TORCH_CHECK(!fp8 || D <= kMaxHeadDim, "head_dim ", D, " is over ", kMaxHeadDim, " for an fp8 cache");
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, "num_heads ", H, " is not a multiple of num_kv_heads ", Hkv);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt,
              "block_tables must be an int32 [R, max_blocks]");
  const int64_t R = block_tables.size(0);
  TORCH_CHECK(static_cast<int64_t>(query_starts.size()) == R && static_cast<int64_t>(query_lens.size()) == R &&
                  static_cast<int64_t>(seq_lens.size()) == R,
              "query_starts, query_lens and seq_lens need one entry per block table row");
  TORCH_CHECK(sliding_window >= 0, "sliding_window must be >= 0 (0 = none)");
  TORCH_CHECK(logits_soft_cap >= 0, "logits_soft_cap must be >= 0 (0 = none)");
  const float* sinks_ptr = tram::sinks_data(sinks, H, "paged_prefill_attention_");
  const at::Tensor tables = block_tables.contiguous();
  const int64_t bs = kv_cache.size(2), N = kv_cache.size(1), width = tables.size(1);
  std::vector<Request> reqs;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t qs = query_starts[r], ql = query_lens[r], sl = seq_lens[r];
    TORCH_CHECK(ql >= 1 && qs >= 0 && qs + ql <= T && sl >= ql && sl <= width * bs, "request ", r,
                ": rows ", qs, "..", qs + ql, " of ", T, " with context ", sl, " do not fit (", width * bs,
                " slots in its block table)");
    const int32_t* table = tables.data_ptr<int32_t>() + r * width;
    for (int64_t b = 0; b < (sl + bs - 1) / bs; ++b)
      TORCH_CHECK(table[b] >= 0 && table[b] < N, "request ", r, ": block id ", table[b], " out of range [0, ", N, ")");
    reqs.push_back({qs, ql, sl, table});
  }
  if (reqs.empty()) return;
  // x 1 is exact: a 16/32-bit cache's results are bit for bit what they were without the scales.
  const float fscale = static_cast<float>(scale * k_scale), fv_scale = static_cast<float>(v_scale);
  const float cap = static_cast<float>(logits_soft_cap);
  switch (query.scalar_type()) {
    case at::kFloat:
      return dispatch_cache<float>(out, query, kv_cache, reqs, fscale, fv_scale, sliding_window, cap, sinks_ptr);
    case at::kBFloat16:
      return dispatch_cache<c10::BFloat16>(out, query, kv_cache, reqs, fscale, fv_scale, sliding_window, cap,
                                           sinks_ptr);
    case at::kHalf:
      return dispatch_cache<c10::Half>(out, query, kv_cache, reqs, fscale, fv_scale, sliding_window, cap, sinks_ptr);
    default:
      TORCH_CHECK(false, "paged_prefill_attention_: unsupported dtype ", query.scalar_type());
  }
}

}  // namespace tram
