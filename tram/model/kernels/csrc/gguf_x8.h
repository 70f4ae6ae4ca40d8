// The K-quants repacked at load eight rows at a time (gguf_q4k_x8.h: Q4_K, gguf_q6k_x8.h: Q6_K), for
// int8 activations on AVX2: what the linear (gguf_x8.cpp) and the fused MoE kernel share.
#pragma once

#include "gguf_q4k_x8.h"
#include "gguf_q6k_x8.h"

namespace tram::x8 {

inline bool is_repacked(int64_t type) { return type == Q4K::kType || type == Q6K::kType; }

// fn(L{}) for the layout whose type id is `type`; false where none is.
template <typename Fn>
bool with_layout(int64_t type, Fn&& fn) {
  if (type == Q4K::kType) return fn(Q4K{}), true;
  if (type == Q6K::kType) return fn(Q6K{}), true;
  return false;
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
template <typename L, typename Store>
void group_times(const tram::q8k::Rows& x, int64_t m_begin, int64_t m_end, const uint8_t* group, int64_t blocks,
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
