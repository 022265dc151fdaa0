// bfloat16 storage type and exact conversions (round-to-nearest-even), shared by every backend.
#pragma once
#include <cstdint>
#include <cstring>

namespace leanmoe {

struct bf16 {
  uint16_t bits = 0;
};

inline float bf16_to_float(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even, NaN kept quiet: the same rounding the GPU's cvt.rn.bf16.f32 does.
inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  bf16 r;
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    r.bits = uint16_t((u >> 16) | 0x40u);
    return r;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  r.bits = uint16_t(u >> 16);
  return r;
}

// Rounds an fp32 value to the nearest bf16 and back: what a store to bf16 storage does.
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace leanmoe
