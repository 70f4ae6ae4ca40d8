// The K-quants (Q4_K, Q5_K, Q6_K) times activations quantized per 256 k ("Q8_K", llama.cpp's
// activation type for these weights): integer sums over a whole super-block, one float step per
// block and row.
//
// Why: with one activation scale per 32 k (gguf_int8.cpp's other types) every 32 weights cost a
// float conversion, a scale product and an FMA per row of x, which made one-row decode of a Q6_K LM
// head compute-bound at 13 ms for 255 MB. Here the block's sub-scales enter as 16-bit integers
// (vpmaddubsw's pair sums times the sub-scale, vpdpwssd or vpmaddwd), so 64 weights cost two
// instructions per row of x and the floats appear once per 256.
//
// Activations, per row: q int8 [K] (round to nearest even of x / d, d = max|x| / 127 per 256 k),
// d float [K / 256], bs int16 [K / 16] (the sums of q per 16 k, which the blocks' minimums and zero
// points multiply). Per output and block b, with u the weights' unsigned quants:
//   Q4_K, Q5_K: w = d_w * sc_j * u - dmin_w * m_j (sub-block j of 32):
//     I = sum_j sc_j * sum(u * q) and Imin = sum_j m_j * bsum_j, exact integers
//   Q6_K: w = d_w * sc_g * (u - 32) (group g of 16): I = sum_g sc_g * (sum(u * q) - 32 * bs_g), Imin = 0
// then acc = fma(I, d_w * d_x, acc), accm = fma(Imin, -dmin_w * d_x, accm), and y = acc + accm (with
// AVX-512; the AVX2 dot_tile keeps I's 8 lanes apart until the end, see there). Each output's float
// operations depend on K alone: a row's result does not depend on the rows or threads it shares a
// call with, nor on which kernel (this one or gguf_q8k_gemm.h's) multiplied it.
#pragma once

#include "gguf_common.h"
#include "prefetch.h"
#include "simd.h"

#include <ATen/Parallel.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace tram::q8k {

using tram::gguf::half_at;

constexpr int64_t kBlock = 256;  // k per activation scale and per weight block
constexpr int64_t kSum = 16;     // k per partial sum of q

// Quantized activation rows: row m at q + m * ld, d + m * (ld / 256), bs + m * (ld / 16).
struct Rows {
  const int8_t* q;
  const float* d;
  const int16_t* bs;
  int64_t ld;
  const int8_t* q_at(int64_t m) const { return q + m * ld; }
  const float* d_at(int64_t m) const { return d + m * (ld / kBlock); }
  const int16_t* bs_at(int64_t m) const { return bs + m * (ld / kSum); }
};

// One row of K (a multiple of 256) values.
inline void quantize_row(const float* x, int64_t K, int8_t* q, float* d, int16_t* bs) {
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    int8_t* qb = q + b * kBlock;
    float amax = 0.0f;
    for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float db = amax / 127.0f;
    const float id = db != 0.0f ? 1.0f / db : 0.0f;
    for (int64_t i = 0; i < kBlock; ++i) {
      const float r = std::nearbyint(xb[i] * id);  // the default rounding: to nearest even
      qb[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, r)));
    }
    d[b] = db;
    for (int64_t g = 0; g < kBlock / kSum; ++g) {
      int32_t s = 0;
      for (int64_t i = 0; i < kSum; ++i) s += qb[g * kSum + i];
      bs[b * (kBlock / kSum) + g] = static_cast<int16_t>(s);
    }
  }
}

// Rows quantized per 256 k, owning their buffers: q [M, K], d [M, K / 256], bs [M, K / 16].
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int16_t> bs;
  int64_t K = 0;
  Rows rows() const { return {q.data(), d.data(), bs.data(), K}; }
  // Rows 0 .. M - 1 of x (stride ldx), K values each, in parallel.
  void quantize(const float* x, int64_t ldx, int64_t M, int64_t k) {
    K = k;
    q.resize(static_cast<size_t>(M * K));
    d.resize(static_cast<size_t>(M * K / kBlock));
    bs.resize(static_cast<size_t>(M * K / kSum));
    at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        quantize_row(x + m * ldx, K, q.data() + m * K, d.data() + m * (K / kBlock), bs.data() + m * (K / kSum));
      }
    });
  }
};

// Q4_K / Q5_K's twelve bytes of 6-bit scales and minimums as sc[0..7], m[0..7]: j < 4 in the low
// six bits of bytes j and j + 4; j >= 4 split between the nibbles of bytes j + 4 and the top two
// bits of bytes j - 4 and j.
TRAM_INLINE void unpack_k4_scales(const uint8_t* p, uint8_t (&out)[16]) {
  uint32_t a, b, c;
  std::memcpy(&a, p, 4), std::memcpy(&b, p + 4, 4), std::memcpy(&c, p + 8, 4);
  const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, low2 = 0x03030303u;
  const uint32_t w[4] = {a & low6, (c & low4) | (((a >> 6) & low2) << 4), b & low6,
                         ((c >> 4) & low4) | (((b >> 6) & low2) << 4)};
  std::memcpy(out, w, 16);
}

// Which sub-scale each int16 lane of chunk c's products takes (runs of 8 or 16 lanes), as int16
// indices for a 512-bit permute, and for AVX2 as vpshufb masks per 32-byte half h of the chunk (byte
// p picks byte 2 * (index % 8) + p % 2 of a 128-bit lane holding 8 sub-scales).
struct ScaleIdx {
  int16_t i[4][32];
  int8_t b[4][2][32];
};

template <int kRun, int kPerChunk>
constexpr ScaleIdx scale_idx() {
  ScaleIdx t{};
  for (int c = 0; c < 4; ++c) {
    for (int i = 0; i < 32; ++i) t.i[c][i] = static_cast<int16_t>(kPerChunk * c + i / kRun);
    for (int h = 0; h < 2; ++h) {
      for (int p = 0; p < 32; ++p) t.b[c][h][p] = static_cast<int8_t>(2 * (t.i[c][16 * h + p / 2] % 8) + p % 2);
    }
  }
  return t;
}

#if defined(__AVX2__)

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define TRAM_Q8K_512 1
using V = __m512i;  // 64 bytes: one chunk of quants, or 32 int16, or 16 int32
TRAM_INLINE V vzero() { return _mm512_setzero_si512(); }
TRAM_INLINE V load64(const void* p) { return _mm512_loadu_si512(p); }
// acc += sum over pairs of (u * q) * scale, per int32 lane (u unsigned, q signed, scale int16).
TRAM_INLINE V dot_scaled(V acc, V u, V q, V scale) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u, q), scale);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, q), scale));
#endif
}
// The 8 int32 of v added to the low half of acc.
TRAM_INLINE V add_low(V acc, __m256i v) { return _mm512_add_epi32(acc, _mm512_zextsi256_si512(v)); }
// The 32 bytes at p in both halves, shifted right by lo bits in the first and hi in the second.
TRAM_INLINE V halves_shifted(const uint8_t* p, int lo, int hi) {
  const V v = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const V s = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(lo)), _mm256_set1_epi16(static_cast<int16_t>(hi)), 1);
  return _mm512_srlv_epi16(v, s);
}
TRAM_INLINE V bytes(uint8_t b) { return _mm512_set1_epi8(static_cast<char>(b)); }
TRAM_INLINE V vand(V a, V b) { return _mm512_and_si512(a, b); }
TRAM_INLINE V vor(V a, V b) { return _mm512_or_si512(a, b); }
TRAM_INLINE V shl4(V a) { return _mm512_slli_epi16(a, 4); }
// The 16 int16 at s (a block's sub-scales) in the low half of a register, for scale_lanes.
TRAM_INLINE V scale_vector(const int16_t* s) { return _mm512_zextsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(s))); }
// int16 lane i of chunk c takes sub-scale t.i[c][i] of v: one permute per chunk.
TRAM_INLINE V scale_lanes(V v, const ScaleIdx& t, int c) {
  return _mm512_permutexvar_epi16(_mm512_loadu_si512(t.i[c]), v);
}
#else
struct V {
  __m256i lo, hi;
};
TRAM_INLINE V vzero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
TRAM_INLINE V load64(const void* p) {
  const auto* c = static_cast<const __m256i*>(p);
  return {_mm256_loadu_si256(c), _mm256_loadu_si256(c + 1)};
}
TRAM_INLINE __m256i dot_scaled8(__m256i acc, __m256i u, __m256i q, __m256i scale) {
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
  return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, q), scale);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), scale));
#endif
}
TRAM_INLINE V dot_scaled(V acc, V u, V q, V scale) {
  return {dot_scaled8(acc.lo, u.lo, q.lo, scale.lo), dot_scaled8(acc.hi, u.hi, q.hi, scale.hi)};
}
TRAM_INLINE V halves_shifted(const uint8_t* p, int lo, int hi) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_srl_epi16(v, _mm_cvtsi32_si128(lo)), _mm256_srl_epi16(v, _mm_cvtsi32_si128(hi))};
}
TRAM_INLINE V bytes(uint8_t b) {
  const __m256i v = _mm256_set1_epi8(static_cast<char>(b));
  return {v, v};
}
TRAM_INLINE V vand(V a, V b) { return {_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)}; }
TRAM_INLINE V vor(V a, V b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
TRAM_INLINE V shl4(V a) { return {_mm256_slli_epi16(a.lo, 4), _mm256_slli_epi16(a.hi, 4)}; }
// The 16 int16 at s: sub-scales 0-7 in both 128-bit lanes of lo, 8-15 in both of hi, for vpshufb.
TRAM_INLINE V scale_vector(const int16_t* s) {
  return {_mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(s))),
          _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(s + 8)))};
}
// Each half of chunk c's lanes names sub-scales of one group of 8 (both tables' runs do): one
// in-lane byte shuffle per half (a cross-lane vpermd cost more on Zen 3).
TRAM_INLINE V scale_lanes(V v, const ScaleIdx& t, int c) {
  const __m256i lo = t.i[c][0] >= 8 ? v.hi : v.lo, hi = t.i[c][16] >= 8 ? v.hi : v.lo;
  return {_mm256_shuffle_epi8(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.b[c][0]))),
          _mm256_shuffle_epi8(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.b[c][1])))};
}
#endif

// ---- the weight blocks: load(b) once per block and row of W; quants(c) and scales(c) per chunk c
// of 64 k; min_sums(bs) (Imin) or zero_sums(bs) (the zero point's share of I) from the activations'
// partial sums ----------------------------------------------------------------------------------------

template <bool kFifthBit>
struct K4 {
  static constexpr int64_t kType = kFifthBit ? tram::gguf::kQ5_K : tram::gguf::kQ4_K;
  static constexpr int64_t kBytes = kFifthBit ? 176 : 144;
  static constexpr bool kMins = true;
  float d, dmin;
  alignas(32) int16_t s[16];  // sc[0..7], m[0..7]
  V sv;
  const uint8_t *qs, *qh;
  static constexpr ScaleIdx kIdx = scale_idx<16, 2>();  // lanes 0-15 of chunk c: sub-block 2c, 16-31: 2c + 1
  TRAM_INLINE void load(const uint8_t* b) {
    d = half_at(b), dmin = -half_at(b + 2);
    uint8_t u[16];
    unpack_k4_scales(b + 4, u);
    _mm256_store_si256(reinterpret_cast<__m256i*>(s), _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u))));
    sv = scale_vector(s);
    qh = b + 16, qs = b + (kFifthBit ? 48 : 16);
  }
  // Sub-block 2c (low nibbles of the 32 bytes at 32c) then 2c + 1 (high nibbles); Q5_K's fifth bit
  // of sub-block j's weight l is bit j of qh[l].
  TRAM_INLINE V quants(int c) const {
    V u = vand(halves_shifted(qs + 32 * c, 0, 4), bytes(15));
    if constexpr (kFifthBit) u = vor(u, shl4(vand(halves_shifted(qh, 2 * c, 2 * c + 1), bytes(1))));
    return u;
  }
  TRAM_INLINE V scales(int c) const { return scale_lanes(sv, kIdx, c); }
  // sum_j m_j * (bs[2j] + bs[2j + 1]) in 8 lanes.
  TRAM_INLINE __m256i min_sums(const int16_t* bs) const {
    const __m128i m = _mm_load_si128(reinterpret_cast<const __m128i*>(s + 8));
    const __m256i dup = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
    return _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs)), dup);
  }
};

// Q6_K: chunk c = 2h + j covers k 128h + 64j ..: low 4 bits from the 64 bytes at 64h (nibble j), bits
// 4-5 from the 32 bytes at 128 + 32h (shift 4j for the first 32 weights, 4j + 2 for the next 32).
struct Q6K {
  static constexpr int64_t kType = tram::gguf::kQ6_K, kBytes = 210;
  static constexpr bool kMins = false;
  float d, dmin = 0.0f;
  alignas(32) int16_t s[16];
  V sv;
  const uint8_t *ql, *qh;
  static constexpr ScaleIdx kIdx = scale_idx<8, 4>();  // lanes 8q .. 8q + 7 of chunk c: group 4c + q
  TRAM_INLINE void load(const uint8_t* b) {
    d = half_at(b + 208);
    _mm256_store_si256(reinterpret_cast<__m256i*>(s), _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192))));
    sv = scale_vector(s);
    ql = b, qh = b + 128;
  }
  TRAM_INLINE V quants(int c) const {
    const int h = c / 2, j = c % 2;
#if defined(TRAM_Q8K_512)
    const V l = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(ql + 64 * h), static_cast<unsigned>(4 * j)), bytes(15));
#else
    const __m128i sh = _mm_cvtsi32_si128(4 * j);
    const __m256i lo4 = _mm256_set1_epi8(15);
    const V l = {_mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h)), sh), lo4),
                 _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32)), sh), lo4)};
#endif
    return vor(l, shl4(vand(halves_shifted(qh + 32 * h, 4 * j, 4 * j + 2), bytes(3))));
  }
  TRAM_INLINE V scales(int c) const { return scale_lanes(sv, kIdx, c); }
  // -32 * sum_g sc_g * bs_g in 8 lanes (the zero point 32).
  TRAM_INLINE __m256i zero_sums(const int16_t* bs) const {
    const __m256i p = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs)),
                                        _mm256_load_si256(reinterpret_cast<const __m256i*>(s)));
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(p, 5));
  }
};

#if defined(TRAM_Q8K_512)
// The lane sums of four vectors at once (out[i] = sum of v[i]'s lanes): 14 instructions, where one
// reduction alone takes 9.
TRAM_INLINE void isum4(const V (&v)[4], int32_t* out) {
  const V ab = _mm512_add_epi32(_mm512_shuffle_i32x4(v[0], v[1], 0x44), _mm512_shuffle_i32x4(v[0], v[1], 0xEE));
  const V cd = _mm512_add_epi32(_mm512_shuffle_i32x4(v[2], v[3], 0x44), _mm512_shuffle_i32x4(v[2], v[3], 0xEE));
  const V abcd = _mm512_add_epi32(_mm512_shuffle_i32x4(ab, cd, 0x88), _mm512_shuffle_i32x4(ab, cd, 0xDD));
  const V s1 = _mm512_add_epi32(abcd, _mm512_shuffle_epi32(abcd, _MM_PERM_BADC));
  const V s2 = _mm512_add_epi32(s1, _mm512_shuffle_epi32(s1, _MM_PERM_CDAB));
  const V first = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s2);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_castsi512_si128(first));
}
TRAM_INLINE V widen(__m256i v) { return _mm512_zextsi256_si512(v); }

// The lane sums of n vectors, four at a time.
template <int64_t N>
TRAM_INLINE void isums(const V (&v)[N], int32_t (&out)[N]) {
  constexpr int64_t kPadded = (N + 3) / 4 * 4;
  int32_t all[kPadded];
  for (int64_t i = 0; i < N; i += 4) {
    const V four[4] = {v[i], i + 1 < N ? v[i + 1] : vzero(), i + 2 < N ? v[i + 2] : vzero(), i + 3 < N ? v[i + 3] : vzero()};
    isum4(four, all + i);
  }
  for (int64_t i = 0; i < N; ++i) out[i] = all[i];
}
#endif

// The block's integer sums for rows m0 .. m0 + MB - 1 of x against NB rows of W: sums_b[m][j] per
// lane, before the minimums' or zero point's share.
template <typename F, int64_t MB, int64_t NB>
TRAM_INLINE void block_sums(const Rows& x, int64_t m0, int64_t b, const F (&blk)[NB], V (&sums_b)[MB][NB]) {
  for (int64_t m = 0; m < MB; ++m) {
    for (int64_t j = 0; j < NB; ++j) sums_b[m][j] = vzero();
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    V u[NB], sc[NB];
    for (int64_t j = 0; j < NB; ++j) u[j] = blk[j].quants(c), sc[j] = blk[j].scales(c);
    for (int64_t m = 0; m < MB; ++m) {
      const V q = load64(x.q_at(m0 + m) + b * kBlock + 64 * c);
      for (int64_t j = 0; j < NB; ++j) sums_b[m][j] = dot_scaled(sums_b[m][j], u[j], q, sc[j]);
    }
  }
}

template <typename F, int64_t NB>
TRAM_INLINE void load_blocks(const uint8_t* w, int64_t row_bytes, int64_t b, F (&blk)[NB]) {
  for (int64_t j = 0; j < NB; ++j) {
    const uint8_t* p = w + j * row_bytes + b * F::kBytes;
    blk[j].load(p);
    tram::simd::prefetch_ahead(p, F::kBytes);
  }
}

#if defined(TRAM_Q8K_512)
// One output's float steps per block b, the same in every kernel that multiplies these blocks (here
// and gguf_q8k_gemm.h), so that a row's result does not depend on which one ran: the block's exact
// integer sums I (sc-weighted products, zero point included) and Imin (minimums times the partial
// sums of q), then acc = fma(I, d_w * d_x, acc) and accm = fma(Imin, -dmin_w * d_x, accm); the
// output is acc + accm.
TRAM_INLINE float block_step(int32_t i, float dwdx, float acc) { return std::fma(static_cast<float>(i), dwdx, acc); }

// sums[m][j] = row m0 + m of x times row j of W (rows at w + j * row_bytes), K = blocks * 256.
template <typename F, int64_t MB, int64_t NB>
TRAM_INLINE void dot_tile(const Rows& x, int64_t m0, const uint8_t* w, int64_t row_bytes, int64_t blocks,
                          float (&sums)[MB][NB]) {
  float acc[MB][NB] = {}, accm[MB][NB] = {};
  for (int64_t b = 0; b < blocks; ++b) {
    F blk[NB];
    load_blocks<F, NB>(w, row_bytes, b, blk);
    V sums_b[MB][NB];
    block_sums<F, MB, NB>(x, m0, b, blk, sums_b);
    constexpr int64_t kSums = F::kMins ? 2 * NB : NB;  // per row of x: I per row of W, then Imin per row
    V parts[MB * kSums];
    for (int64_t m = 0; m < MB; ++m) {
      const int16_t* bs = x.bs_at(m0 + m) + b * (kBlock / kSum);
      for (int64_t j = 0; j < NB; ++j) {
        if constexpr (F::kMins) {
          parts[m * kSums + j] = sums_b[m][j];
          parts[m * kSums + NB + j] = widen(blk[j].min_sums(bs));
        } else {
          parts[m * kSums + j] = add_low(sums_b[m][j], blk[j].zero_sums(bs));
        }
      }
    }
    int32_t ints[MB * kSums];
    isums(parts, ints);
    for (int64_t m = 0; m < MB; ++m) {
      const float dx = x.d_at(m0 + m)[b];
      for (int64_t j = 0; j < NB; ++j) {
        acc[m][j] = block_step(ints[m * kSums + j], blk[j].d * dx, acc[m][j]);
        if constexpr (F::kMins) accm[m][j] = block_step(ints[m * kSums + NB + j], blk[j].dmin * dx, accm[m][j]);
      }
    }
  }
  for (int64_t m = 0; m < MB; ++m) {
    for (int64_t j = 0; j < NB; ++j) sums[m][j] = acc[m][j] + accm[m][j];
  }
}
#else
// AVX2 (no GEMM kernel to agree with): each output keeps 8 float lanes across blocks,
// acc = fma(I_lanes, d_w * d_x, acc) then fma(Imin_lanes, -dmin_w * d_x, acc), summed once at the
// end. A per-block horizontal sum of the integers and a scalar FMA chain made one-row decode
// compute-bound; every row count still takes the same steps per output.
template <typename F, int64_t MB, int64_t NB>
TRAM_INLINE void dot_tile(const Rows& x, int64_t m0, const uint8_t* w, int64_t row_bytes, int64_t blocks,
                          float (&sums)[MB][NB]) {
  __m256 acc[MB][NB];
  for (int64_t m = 0; m < MB; ++m) {
    for (int64_t j = 0; j < NB; ++j) acc[m][j] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    F blk[NB];
    load_blocks<F, NB>(w, row_bytes, b, blk);
    V sums_b[MB][NB];
    block_sums<F, MB, NB>(x, m0, b, blk, sums_b);
    for (int64_t m = 0; m < MB; ++m) {
      const int16_t* bs = x.bs_at(m0 + m) + b * (kBlock / kSum);
      const float dx = x.d_at(m0 + m)[b];
      for (int64_t j = 0; j < NB; ++j) {
        __m256i i = _mm256_add_epi32(sums_b[m][j].lo, sums_b[m][j].hi);
        if constexpr (!F::kMins) i = _mm256_add_epi32(i, blk[j].zero_sums(bs));
        acc[m][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(blk[j].d * dx), acc[m][j]);
        if constexpr (F::kMins) {
          acc[m][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(blk[j].min_sums(bs)), _mm256_set1_ps(blk[j].dmin * dx), acc[m][j]);
        }
      }
    }
  }
  for (int64_t m = 0; m < MB; ++m) {
    for (int64_t j = 0; j < NB; ++j) sums[m][j] = tram::simd::hsum8(acc[m][j]);
  }
}
#endif

#define TRAM_Q8K_KERNELS 1
#endif  // __AVX2__

// fn(F{}) for Q4_K, Q5_K or Q6_K; false for any other type (or without AVX2: no such kernels).
template <typename Fn>
bool with_kquant(int64_t type, Fn&& fn) {
#if defined(TRAM_Q8K_KERNELS)
  switch (type) {
    case tram::gguf::kQ4_K: fn(K4<false>{}); return true;
    case tram::gguf::kQ5_K: fn(K4<true>{}); return true;
    case tram::gguf::kQ6_K: fn(Q6K{}); return true;
    default: return false;
  }
#else
  (void)type, (void)fn;
  return false;
#endif
}

}  // namespace tram::q8k
