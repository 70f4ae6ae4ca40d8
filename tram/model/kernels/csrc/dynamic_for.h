// Work handed out in chunks as threads come for it, where at::parallel_for gives each thread one
// fixed share.
//
// Why: on a shared machine with few cores one core is often slower for a while (a neighbour on the
// host, or the API server process on the same cores while `tram serve` streams). With fixed shares
// the other threads then wait for it at the end of every linear, in libgomp's barrier. Here each
// thread takes the next chunk of about 1/8 of its share from an atomic counter, so a slowed thread
// simply takes fewer. Which thread computes an output never
// changes its arithmetic, so the kernels stay bit for bit invariant to threads.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace tram::parallel {

constexpr int64_t kChunksPerThread = 8;

// fn(begin, end) over [0, n) in chunks of at least `grain`, on at::get_num_threads() threads.
template <typename Fn>
void dynamic_for(int64_t n, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  const int64_t threads = at::get_num_threads();
  const int64_t chunk = std::max(grain, (n + threads * kChunksPerThread - 1) / (threads * kChunksPerThread));
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (threads == 1 || chunks == 1 || at::in_parallel_region()) {
    fn(int64_t{0}, n);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(threads, chunks), 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(c * chunk, std::min(n, (c + 1) * chunk));
    }
  });
}

// fn(part, begin, end) over several parts' rows (sizes[i] each) as one range: one parallel region for
// weights that read the same x (q/k/v), begin and end counted within the part.
template <typename Fn>
void dynamic_for_parts(const std::vector<int64_t>& sizes, int64_t grain, const Fn& fn) {
  std::vector<int64_t> first(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) first[i + 1] = first[i] + sizes[i];
  dynamic_for(first.back(), grain, [&](int64_t begin, int64_t end) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t b = std::max(begin, first[i]), e = std::min(end, first[i + 1]);
      if (b < e) fn(i, b - first[i], e - first[i]);
    }
  });
}

}  // namespace tram::parallel
