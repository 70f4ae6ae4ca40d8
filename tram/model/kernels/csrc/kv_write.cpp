// A step's new keys and values written into their slots of the paged KV cache.
//
//   write_kv_cache_(kv_cache [2, num_blocks, block_size, Hkv, D], key [T, Hkv, D], value [T, Hkv, D],
//                   slot_mapping [T] int64 (slot = block * block_size + offset; < 0: a padding token, skipped))
//
// key, value and the cache share one dtype (an fp8 cache takes the PyTorch path, which quantizes).
// Why: in PyTorch this is two index_put_ through views of the cache, half a dozen dispatches per layer;
// at decode each costs 10-20 µs once a layer's weights have streamed through the caches.
#include "kernels.h"

#include <ATen/Parallel.h>

#include <cstring>

namespace tram {

void write_kv_cache_(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value,
                     const at::Tensor& slot_mapping) {
  TORCH_CHECK(kv_cache.device().is_cpu() && kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "write_kv_cache_: kv_cache must be a contiguous [2, num_blocks, block_size, Hkv, D] CPU tensor");
  const int64_t T = key.size(0), heads = kv_cache.size(3), D = kv_cache.size(4);
  for (const at::Tensor* t : {&key, &value}) {
    TORCH_CHECK(t->device().is_cpu() && t->dim() == 3 && t->size(0) == T && t->size(1) == heads && t->size(2) == D,
                "write_kv_cache_: key and value must be [T, ", heads, ", ", D, "] CPU tensors");
    TORCH_CHECK(t->scalar_type() == kv_cache.scalar_type(), "write_kv_cache_: key/value dtype ", t->scalar_type(),
                " is not the cache's ", kv_cache.scalar_type());
    TORCH_CHECK(t->stride(2) == 1 && t->stride(1) == D, "write_kv_cache_: each token's heads must be contiguous");
  }
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == T && slot_mapping.scalar_type() == at::kLong,
              "write_kv_cache_: slot_mapping must be [T] int64");
  const at::Tensor slots = slot_mapping.contiguous();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t slot_count = kv_cache.size(1) * kv_cache.size(2);
  const int64_t elem = kv_cache.element_size(), row = heads * D * elem;  // bytes of one token's K (or V)
  auto* cache = static_cast<char*>(kv_cache.data_ptr());
  const auto* k = static_cast<const char*>(key.data_ptr());
  const auto* v = static_cast<const char*>(value.data_ptr());
  const int64_t k_stride = key.stride(0) * elem, v_stride = value.stride(0) * elem;
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(slot[t] < slot_count, "write_kv_cache_: slot ", slot[t], " is past the cache's ", slot_count);
  }
  // A decode step's few tokens: copies of a few KB, no parallel region to wake.
  const int64_t grain = T * row < (int64_t{1} << 20) ? T : 16;
  at::parallel_for(0, T, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slot[t] < 0) continue;
      std::memcpy(cache + slot[t] * row, k + t * k_stride, static_cast<size_t>(row));
      std::memcpy(cache + (slot_count + slot[t]) * row, v + t * v_stride, static_cast<size_t>(row));
    }
  });
}

}  // namespace tram
