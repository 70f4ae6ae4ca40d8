// Row argmax of float32 logits, as torch.argmax(dim=-1) answers it: the first index of the largest
// value, or the first NaN's index when a row holds one.
//
//   argmax_rows(logits [N, V] float32, last dim contiguous) -> [N] int64
//
// Why: greedy decoding takes the argmax of every row of [B, 32000+] logits each step, and
// PyTorch's CPU argmax makes a value-and-index comparison per element and reads far below the
// memory's bandwidth, which shows in a small model's step. Here one vector pass keeps, per lane, the
// largest value and its first index (NaN flagged on the side; a row with one is scanned again).
#include "kernels.h"
#include "simd.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace {

using namespace tram::simd;

constexpr int64_t kGrainRows = 4;
constexpr int64_t kLanes = 16;

int64_t first_nan(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(x[i])) return i;
  return -1;
}

// Each lane of each accumulator keeps the largest value seen at its positions and the first index
// holding it (replaced only by a strictly larger value, so the earliest stays); the row's answer is
// then the smallest index among the lanes that hold the row's maximum.
int64_t row_argmax(const float* x, int64_t n) {
  constexpr int kAcc = 4;  // independent chains hide the compare-and-select latency
  const vf16 ninf = splat16(-std::numeric_limits<float>::infinity());
  vf16 m[kAcc] = {ninf, ninf, ninf, ninf};
  vi16 idx[kAcc] = {};
  vi16 nan_seen{};
  const vi16 pos = iota16();
  int64_t i = 0;
  for (; i + kAcc * kLanes <= n && i + kAcc * kLanes < (int64_t{1} << 31); i += kAcc * kLanes) {
    for (int a = 0; a < kAcc; ++a) {
      const vf16 v = vload<vf16>(x + i + a * kLanes);
      // A NaN compares false both ways, so it never replaces a maximum; it is noted instead.
      nan_seen |= v != v;
      const vi16 gt = v > m[a];
      m[a] = select(gt, v, m[a]);
      idx[a] = select(gt, pos + static_cast<int32_t>(i + a * kLanes), idx[a]);
    }
  }
  float best = -std::numeric_limits<float>::infinity();
  int64_t best_idx = 0;
  for (int a = 0; a < kAcc; ++a) best = std::max(best, hmax(m[a]));
  bool any_lane = false;
  for (int a = 0; a < kAcc; ++a)
    for (int l = 0; l < kLanes; ++l)
      if (m[a][l] == best && (!any_lane || idx[a][l] < best_idx)) {
        best_idx = idx[a][l];
        any_lane = true;
      }
  bool has_nan = false;
  for (int l = 0; l < kLanes; ++l) has_nan |= nan_seen[l] != 0;
  if (!any_lane) best = -std::numeric_limits<float>::infinity();  // no vector part, or all -inf
  for (int64_t j = i; j < n; ++j) {  // the tail comes after every vector position
    has_nan |= std::isnan(x[j]);
    if (x[j] > best || (!any_lane && j == i)) {
      best = x[j];
      best_idx = j;
      any_lane = true;
    }
  }
  if (has_nan) return first_nan(x, n);
  return best_idx;
}

}  // namespace

namespace tram {

at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.scalar_type() == at::kFloat,
              "argmax_rows: logits must be a [N, V] float32 CPU tensor");
  TORCH_CHECK(logits.size(1) > 0, "argmax_rows: a row of zero logits has no argmax");
  const at::Tensor x = logits.stride(1) == 1 ? logits : logits.contiguous();
  const int64_t rows = x.size(0), n = x.size(1), stride = x.stride(0);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, kGrainRows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) op[r] = row_argmax(xp + r * stride, n);
  });
  return out;
}

}  // namespace tram
