// The C++ CPU kernels one extension module exposes (bindings.cpp); each is documented in its file.
#pragma once

#include <torch/extension.h>

namespace tram {

// paged_decode.cpp: decode attention straight from the paged KV cache.
at::Tensor paged_decode_attention(const at::Tensor& query, const at::Tensor& kv_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                                  int64_t sliding_window);

// skinny_linear.cpp: y = x W^T + b for few rows of x.
at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias);

}  // namespace tram
