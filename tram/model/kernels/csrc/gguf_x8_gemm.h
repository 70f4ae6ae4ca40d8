// Q4_K x8 weights (gguf_q4k_x8.h) times many rows of x on AVX-512: two groups (16 rows of W) unpacked
// into one tile of gguf_q8k_gemm.h's GEMM, whose vpdpbusd multiplies 4 k of all 16 rows at once.
//
// Why: the x8 kernel's 256-bit steps multiply 8 rows of W per instruction; from a few dozen rows of x
// (prefill's projections, experts with many tokens) the 512-bit GEMM is faster even with its tile
// built per call, and building it from x8 is only shifts and masks (the scales are already bytes).
//
// Numerics: the GEMM computes the same exact integers I and Imin and takes the same float steps as
// Q4K::group_rows (acc and accm, then their sum), so a row's result is the same whichever kernel ran.
#pragma once

#include "gguf_q8k_gemm.h"
#include "gguf_x8.h"

#include <cstdint>
#include <vector>

namespace tram::x8 {

#if defined(TRAM_X8_KERNELS) && defined(TRAM_Q8K_GEMM) && defined(TRAM_Q8K_512) && defined(__AVX512VNNI__)
#define TRAM_X8_GEMM 1

using GemmF = tram::q8k::K4<false>;  // the GEMM's Q4_K tile layout
using tram::q8k::kPackRows;          // rows of W per tile: two groups

// Rows of x from which a Q4_K x8 weight takes the GEMM (measured: the x8 kernel is faster below 16).
constexpr int64_t kGemmMinRows = 16;

// The 32 bytes at a (group A's rows) then at b (group B's, or zeros where b is null) as one vector.
TRAM_INLINE __m512i two_groups(const uint8_t* a, const uint8_t* b) {
  const __m256i hi = b != nullptr ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)) : _mm256_setzero_si256();
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))), hi, 1);
}

TRAM_INLINE __m256i two_halves(const uint8_t* a, const uint8_t* b) {
  const __m128i hi = b != nullptr ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)) : _mm_setzero_si128();
  return _mm256_set_m128i(hi, _mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
}

// One block of groups A and B (B null: rows 8 .. 15 zero) as the GEMM's packed block.
TRAM_INLINE void unpack_block(const uint8_t* a, const uint8_t* b, tram::q8k::PackedBlock<GemmF>& out) {
  const auto at = [&](const uint8_t* g, int64_t off) { return g != nullptr ? g + off : nullptr; };
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (int64_t c = 0; c < 4; ++c) {
    for (int64_t j = 0; j < 8; ++j) {  // x8 step 8c + j: low nibbles k 64c + 4j, high ones 32 further
      const __m512i w = two_groups(a + 32 * (8 * c + j), at(b, 32 * (8 * c + j)));
      _mm512_store_si512(out.u + 64 * (16 * c + j), _mm512_and_si512(w, low4));
      _mm512_store_si512(out.u + 64 * (16 * c + 8 + j), _mm512_and_si512(_mm512_srli_epi16(w, 4), low4));
    }
  }
  const __m512i byte = _mm512_set1_epi32(0xff);
  for (int64_t g = 0; g < 8; ++g) {  // (sc, sc) byte pairs -> int32 sc
    const __m256i sc = two_halves(a + Q4K::kSc + 16 * g, at(b, Q4K::kSc + 16 * g));
    _mm512_store_si512(out.sp[g], _mm512_and_si512(_mm512_cvtepu16_epi32(sc), byte));
  }
  for (int64_t p = 0; p < 4; ++p) {  // (m_2p, m_2p+1) bytes -> int16 pairs
    const __m256i m = two_halves(a + Q4K::kMins + 16 * p, at(b, Q4K::kMins + 16 * p));
    _mm512_store_si512(out.sp[8 + p], _mm512_cvtepu8_epi16(m));
  }
  const __m512 d = _mm512_cvtph_ps(two_halves(a + Q4K::kD, at(b, Q4K::kD)));
  const __m512 dmin = _mm512_cvtph_ps(two_halves(a + Q4K::kDmin, at(b, Q4K::kDmin)));
  _mm512_store_ps(out.d, d);
  _mm512_store_ps(out.dmin, _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(dmin), _mm512_set1_epi32(INT32_MIN))));
}

// Groups g and g + 1 (only g where `pair` is false) of a Q4_K x8 weight, `blocks` blocks each, as a
// GEMM tile in a per-thread buffer.
inline const tram::q8k::PackedBlock<GemmF>* pack_tile(const uint8_t* group, int64_t blocks, bool pair) {
  thread_local std::vector<tram::q8k::PackedBlock<GemmF>> buffer;
  if (static_cast<int64_t>(buffer.size()) < blocks) buffer.resize(static_cast<size_t>(blocks));
  const int64_t group_bytes = blocks * Q4K::kBlockBytes;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* a = group + b * Q4K::kBlockBytes;
    unpack_block(a, pair ? a + group_bytes : nullptr, buffer[static_cast<size_t>(b)]);
  }
  return buffer.data();
}

// Rows n .. n + rows - 1 (n a multiple of 8, rows <= 16) of the Q4_K x8 weight at w (row_bytes per row)
// times rows p_begin .. p_end - 1 of x: store(p, out) gets row p's 16 outputs (the first `rows` used).
template <typename Store>
void gemm_rows(const tram::q8k::Rows& x, int64_t p_begin, int64_t p_end, const uint8_t* w, int64_t row_bytes,
               int64_t K, int64_t n, int64_t rows, const Store& store) {
  const int64_t blocks = K / tram::q8k::kBlock;
  const auto* tile = pack_tile(w + n * row_bytes, blocks, rows > kRows);
  tram::q8k::gemm_tile<GemmF>(x, p_begin, p_end, tile, blocks, store);
}
#endif

}  // namespace tram::x8
