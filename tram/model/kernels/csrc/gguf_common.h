// What the GGUF kernels (gguf_linear.cpp, gguf_int8.cpp) share: the ggml type ids, the fp16 scales
// inside the blocks, and the dispatch from a type id to a file's block decoder.
#pragma once

#include "simd.h"

#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

namespace tram::gguf {

enum GgmlType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

// An fp16 scale (exact in float32); one F16C instruction where there is one.
TRAM_INLINE float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
#if defined(__F16C__)
  return _cvtsh_ss(bits);
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

// fn(F{}) for the F among Formats whose kType is `type`; an error naming the kept types otherwise.
template <typename... Formats, typename Fn>
void with_one_of(int64_t type, const char* who, Fn&& fn) {
  const bool found = ((type == Formats::kType ? (fn(Formats{}), true) : false) || ...);
  TORCH_CHECK(found, who, ": ggml type ", type, " is not supported (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)");
}

}  // namespace tram::gguf
