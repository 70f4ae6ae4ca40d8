// The AMX tile unit, where the build and the OS both offer it: whether this process may use it, the
// switch that keeps it off (TRAM_CPU_AMX=0, cpu_amx(False)), and the tile configuration the kernels
// load. Its users: gguf_q8k_gemm.h (int8 tiles) and moe_amx.h (bfloat16 tiles).
#pragma once

#if defined(__AMX_TILE__) && defined(__linux__)
#define TRAM_AMX 1

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace tram::amx {

// Linux hands a process the tile registers only on request; where it refuses, the vector loops run.
inline bool granted() {
  static const bool yes = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtileData) == 0;
  }();
  return yes;
}

inline std::atomic<bool> enabled{true};

inline bool usable() { return enabled.load(std::memory_order_relaxed) && granted(); }

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0 .. count - 1 as 16 rows of 64 bytes. Loaded per call and released after (_tile_release):
// other code on the thread (oneDNN) configures the tiles its own way.
inline void configure(int count) {
  TileConfig c;
  for (int t = 0; t < count; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  _tile_loadconfig(&c);
}

}  // namespace tram::amx
#endif

#include <optional>

namespace tram::amx {

// cpu_amx(enable): allow or forbid the tiles when enable is given, then say whether the kernels use
// them. Each extension module that has tile code (the GGUF and MoE families) holds its own switch,
// so each binds this.
inline bool cpu_amx(std::optional<bool> enable) {
#if defined(TRAM_AMX)
  if (enable.has_value()) enabled.store(*enable);
  return usable();
#else
  (void)enable;
  return false;
#endif
}

}  // namespace tram::amx
