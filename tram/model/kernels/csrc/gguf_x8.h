// GGUF weights repacked at load eight rows at a time for int8 activations (gguf_q4k_x8.h: Q4_K,
// gguf_q6k_x8.h: Q6_K, gguf_q5_0_x8.h: Q5_0 and Q8_0): what the linear (gguf_x8.cpp) and the fused MoE kernel
// share. The K-quants' layouts take x per 256 k (gguf_q8k.h's rows), the others per 32 k (gguf_x32.h's).
#pragma once

#include "gguf_q4k_x8.h"
#include "gguf_q5_0_x8.h"
#include "gguf_q6k_x8.h"

namespace tram::x8 {

inline bool is_repacked(int64_t type) {
  return type == Q4K::kType || type == Q6K::kType || type == Q50::kType || type == Q80::kType;
}

// fn(L{}) for the K-quant layout whose type id is `type` (what the fused MoE kernel takes); false where
// none is.
template <typename Fn>
bool with_layout(int64_t type, Fn&& fn) {
  if (type == Q4K::kType) return fn(Q4K{}), true;
  if (type == Q6K::kType) return fn(Q6K{}), true;
  return false;
}

// The same over every layout, Q5_0's too (the linear's).
template <typename Fn>
bool with_any_layout(int64_t type, Fn&& fn) {
  if (type == Q50::kType) return fn(Q50{}), true;
  if (type == Q80::kType) return fn(Q80{}), true;
  return with_layout(type, fn);
}

// Rows 0 .. 7 of the file's rows (row_bytes apart, `blocks` blocks each) into a group's packed blocks.
template <typename L>
void pack_group(const uint8_t* w, int64_t row_bytes, int64_t blocks, uint8_t* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t r = 0; r < kRows; ++r) L::pack_row(w + r * row_bytes + b * L::kSrcBytes, r, out + b * L::kBlockBytes);
  }
}

// The inverse: a group's packed blocks back into the file's 8 rows.
template <typename L>
void unpack_group(const uint8_t* in, int64_t blocks, int64_t row_bytes, uint8_t* w) {
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t r = 0; r < kRows; ++r) L::unpack_row(in + b * L::kBlockBytes, r, w + r * row_bytes + b * L::kSrcBytes);
  }
}

#if defined(TRAM_X8_KERNELS)
constexpr int64_t kRowsX = 4;  // rows of x per register tile

// Rows m_begin .. m_end - 1 of x against one group of layout L, in register tiles of kRowsX rows; every
// row takes the same steps whatever tile it falls in.
template <typename L, typename Rows, typename Store>
void group_times(const Rows& x, int64_t m_begin, int64_t m_end, const uint8_t* group, int64_t blocks,
                 const Store& store) {
  int64_t m = m_begin;
  for (; m + kRowsX <= m_end; m += kRowsX) L::template group_rows<kRowsX>(x, m, group, blocks, store);
  switch (m_end - m) {
    case 3: L::template group_rows<3>(x, m, group, blocks, store); break;
    case 2: L::template group_rows<2>(x, m, group, blocks, store); break;
    case 1: L::template group_rows<1>(x, m, group, blocks, store); break;
    default: break;
  }
}
#endif

}  // namespace tram::x8
