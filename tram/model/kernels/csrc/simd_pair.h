// A 16-lane vector as two 8-lane halves, for targets without 512-bit registers (AVX2, the floor).
//
// Why: GCC lowers a 64-byte generic vector on an AVX2 target to pairs of 256-bit operations but keeps
// the variable itself in memory (no machine mode fits it), so every accumulator of a kernel loop went
// through a store and a reload, and the skinny and GGUF kernels ran many times slower than their
// AVX-512 builds on the same CPU (docs/benchmarks.md, "The C++ kernels on AVX2-only CPUs"). A struct
// of two register-sized vectors is split by GCC's scalar replacement of aggregates, and each half
// lives in a ymm register. Each lane does the same operations in the same
// order as in a 16-lane vector, so a kernel's results do not depend on which representation it got.
//
// What the vector extensions give a vf16 that a struct cannot (a vector `cond ? a : b`, shuffles,
// __builtin_convertvector, brace lists of 16 lanes) goes through the helpers in simd.h, which both
// representations implement.
#pragma once

#include <type_traits>
#include <utility>

namespace tram::simd {

template <typename H>  // H: an 8-lane GCC vector
struct Pair {
  H lo, hi;
  using Lane = std::remove_cv_t<std::remove_reference_t<decltype(std::declval<H>()[0])>>;
  TRAM_INLINE Lane operator[](int i) const { return i < 8 ? lo[i] : hi[i - 8]; }
  // A lane to write (the scalar fallbacks): GCC lets a vector's element type alias it.
  TRAM_INLINE Lane& operator[](int i) { return reinterpret_cast<Lane*>(this)[i]; }
};

template <typename T>
inline constexpr bool kIsScalar = std::is_arithmetic_v<T>;

template <typename T>
inline constexpr bool kIsPair = false;
template <typename H>
inline constexpr bool kIsPair<Pair<H>> = true;

// Lane-wise binary operators between two pairs, and between a pair and a scalar on either side.
#define TRAM_PAIR_BINARY(OP)                                                            \
  template <typename H>                                                               \
  TRAM_INLINE auto operator OP(const Pair<H>& a, const Pair<H>& b) {                  \
    using R = decltype(a.lo OP b.lo);                                                 \
    return Pair<R>{a.lo OP b.lo, a.hi OP b.hi};                                       \
  }                                                                                   \
  template <typename H, typename S, std::enable_if_t<kIsScalar<S>, int> = 0>          \
  TRAM_INLINE auto operator OP(const Pair<H>& a, S s) {                               \
    using R = decltype(a.lo OP s);                                                    \
    return Pair<R>{a.lo OP s, a.hi OP s};                                             \
  }                                                                                   \
  template <typename H, typename S, std::enable_if_t<kIsScalar<S>, int> = 0>          \
  TRAM_INLINE auto operator OP(S s, const Pair<H>& b) {                               \
    using R = decltype(s OP b.lo);                                                    \
    return Pair<R>{s OP b.lo, s OP b.hi};                                             \
  }

TRAM_PAIR_BINARY(+)
TRAM_PAIR_BINARY(-)
TRAM_PAIR_BINARY(*)
TRAM_PAIR_BINARY(/)
TRAM_PAIR_BINARY(&)
TRAM_PAIR_BINARY(|)
TRAM_PAIR_BINARY(^)
TRAM_PAIR_BINARY(<<)
TRAM_PAIR_BINARY(>>)
// Comparisons give a pair of lane masks (-1 true, 0 false), as the vector extensions do.
TRAM_PAIR_BINARY(<)
TRAM_PAIR_BINARY(>)
TRAM_PAIR_BINARY(<=)
TRAM_PAIR_BINARY(>=)
TRAM_PAIR_BINARY(==)
TRAM_PAIR_BINARY(!=)
#undef TRAM_PAIR_BINARY

#define TRAM_PAIR_COMPOUND(OP)                                                 \
  template <typename H, typename B>                                            \
  TRAM_INLINE Pair<H>& operator OP##=(Pair<H>& a, const B& b) {               \
    a = Pair<H>(a OP b);                                                       \
    return a;                                                                  \
  }

TRAM_PAIR_COMPOUND(+)
TRAM_PAIR_COMPOUND(-)
TRAM_PAIR_COMPOUND(*)
TRAM_PAIR_COMPOUND(&)
TRAM_PAIR_COMPOUND(|)
#undef TRAM_PAIR_COMPOUND

template <typename H>
TRAM_INLINE Pair<H> operator-(const Pair<H>& a) {
  return {-a.lo, -a.hi};
}

// mask ? a : b, lane by lane.
template <typename M, typename H>
TRAM_INLINE Pair<H> select(const Pair<M>& mask, const Pair<H>& a, const Pair<H>& b) {
  return {mask.lo ? a.lo : b.lo, mask.hi ? a.hi : b.hi};
}

}  // namespace tram::simd
