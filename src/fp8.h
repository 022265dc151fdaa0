// FP8 (e4m3) block quantization of the expert GEMM operands (cfg.precision = fp8; docs/DESIGN.md
// "FP8"). One definition for the CPU backend, the naive reference and, being __host__ __device__, the
// GPU's quantizing epilogues and kernels, which must reproduce it bit for bit:
//
//   code  = encode(v * inverse_scale(s)), value = decode(code) * s, per scale tile of 128 values
//           along the GEMM's K (1x128 for activations and gradients, 128x128 blocks for weights);
//   s     = scale_of(amax): the smallest power of two with amax <= 448 * s (2^-126 at least), amax
//           the largest |v| of the tile's non-NaN values; amax = +Inf gives s = +Inf, inverse 0.
//
// Powers of two because v * 2^-k is exact: dividing and multiplying by the reciprocal give the same
// code, a GPU epilogue needs one multiply per element, and decode(code) * s is exact, so a GEMM on
// the dequantized values is sum(s_a s_b sum(q_a q_b)) up to the order of fp32 sums. They cost at most
// one of e4m3's 18 binades at the bottom of a tile; normal values keep their 3-bit mantissa whatever
// the scale (DeepSeek-V3's plain fp32 amax/448 scales differ only there; V3.1 and DeepGEMM's UE8M0
// scales are powers of two).
//
// encode() is NVIDIA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3), i.e. the GPU's
// cvt.rn.satfinite.e4m3x2.f32: round to nearest, ties to even (subnormals included), finite values
// and +-Inf beyond 448 saturate to +-448, NaN becomes the NaN code 0x7f (never a finite value),
// a negative value that rounds to zero keeps its sign (0x80). decode(0x7f / 0xff) is NaN.
// NaN and Inf never become finite in a quantized tile: a NaN element encodes as NaN; an Inf makes
// the tile's scale +Inf, so its elements encode as 0 or NaN (Inf * 0) and decode to NaN (0 * Inf).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "host_device.h"

namespace leanmoe::fp8 {

constexpr int64_t kTile = 128;  // values per scale along K; weights use kTile x kTile blocks
constexpr float kMax = 448.f;   // largest finite e4m3 value (code 0x7e)
constexpr uint8_t kNaN = 0x7f;  // e4m3 has no infinities; 0x7f and 0xff are NaN

// The bits of a float and back (memcpy: defined behaviour, a register move on host and device).
template <class To, class From>
LEANMOE_HOST_DEVICE inline To bit_cast(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To t;
  memcpy(&t, &v, sizeof(To));
  return t;
}
LEANMOE_HOST_DEVICE inline uint32_t bits_of(float f) { return bit_cast<uint32_t>(f); }
LEANMOE_HOST_DEVICE inline float float_of(uint32_t u) { return bit_cast<float>(u); }

// Round to nearest even, in integers: the e4m3 multiple q of the grid spacing 2^(e-3) nearest to
// the fp32 value, with e the value's exponent clamped to e4m3's smallest normal exponent -6 (below
// it the spacing stays 2^-9: the subnormals). A carry (q = 16) moves to the next binade by itself.
LEANMOE_HOST_DEVICE inline uint8_t encode(float v) {
  const uint32_t u = bits_of(v);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kNaN;
  if (a >= 0x43e00000u) return sign | 0x7eu;  // |v| >= 448 (Inf included): 448 (ties at 464 go to 448 too)
  const int32_t eb = int32_t(a >> 23);        // fp32 biased exponent; 0: zero or an fp32 subnormal (< 2^-126)
  if (eb == 0) return sign;
  const int32_t e = eb - 127 < -6 ? -6 : eb - 127;
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;  // v = mant * 2^(eb - 150)
  const int32_t shift = 147 + e - eb;                 // v / 2^(e-3) = mant / 2^shift; 20 for normals
  if (shift > 25) return sign;                        // below 2^-11: rounds to 0
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return uint8_t(sign | uint32_t(((e + 7) << 3) + int32_t(q) - 8));
}

LEANMOE_HOST_DEVICE inline float decode(uint8_t code) {
  const uint32_t sign = uint32_t(code & 0x80u) << 24, e = (code >> 3) & 0xfu, m = code & 7u;
  if (e == 15 && m == 7) return float_of(0x7fc00000u | sign);
  if (e == 0) return float_of(sign | bits_of(float(m) * 0.001953125f));  // m * 2^-9
  return float_of(sign | ((e + 120u) << 23) | (m << 20));                // (1 + m/8) * 2^(e-7)
}

// The tile's running amax: NaN is skipped (fmax semantics, as the GPU's max.f32 and fmaxf; an
// integer max over the bits would pick NaN). Start from 0.
LEANMOE_HOST_DEVICE inline float amax_step(float amax, float v) { return std::fmax(amax, std::fabs(v)); }

// 2^k for amax = m * 2^E (1 <= m < 2): k = E - 8, or E - 7 when m > 1.75 (448 = 1.75 * 2^8); at
// least 2^-126 (zero and fp32 subnormals included), so 1/s = 2^-k stays a normal float too.
LEANMOE_HOST_DEVICE inline float scale_of(float amax) {
  const uint32_t a = bits_of(amax);
  if (a >= 0x7f800000u) return float_of(0x7f800000u);  // +Inf
  int32_t k = int32_t(a >> 23) - 127 - 8 + ((a & 0x7fffffu) > 0x600000u ? 1 : 0);
  if (k < -126) k = -126;
  return float_of(uint32_t(k + 127) << 23);
}

// 1 / s, exactly: 2^-k, or 0 for s = +Inf.
LEANMOE_HOST_DEVICE inline float inverse_scale(float s) {
  const uint32_t a = bits_of(s);
  return a >= 0x7f800000u ? 0.f : float_of(uint32_t(254 - int32_t(a >> 23)) << 23);
}

// The scale of one tile: `rows` rows of kTile values, row r at v + r * ld (rows = 1: an activation
// tile; rows = kTile: a weight block).
template <class Real>
LEANMOE_HOST_DEVICE inline float tile_scale(const Real* v, int64_t ld, int64_t rows) {
  float amax = 0.f;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < kTile; ++c) amax = amax_step(amax, float(v[r * ld + c]));
  return scale_of(amax);
}

// Host loops over a row-major [rows, cols] matrix in tiles of tile_rows x kTile (tile_rows = 1 for
// activations and gradients, kTile for weights); rows % tile_rows == 0 and cols % kTile == 0.

// codes [rows, cols]; scales [rows / tile_rows, cols / kTile]. What the GPU writes, bit for bit.
template <class Real>
inline void quantize(const Real* v, int64_t rows, int64_t cols, int64_t tile_rows, uint8_t* codes, float* scales) {
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const float s = tile_scale(v + r0 * cols + c0, cols, tile_rows), inv = inverse_scale(s);
      scales[(r0 / tile_rows) * (cols / kTile) + c0 / kTile] = s;
      for (int64_t r = r0; r < r0 + tile_rows; ++r)
        for (int64_t c = c0; c < c0 + kTile; ++c) codes[r * cols + c] = encode(float(v[r * cols + c]) * inv);
    }
}

// v <- decode(code) * s in place: the value a GEMM on the quantized operand multiplies (exact in fp32).
template <class Real>
inline void round_trip(Real* v, int64_t rows, int64_t cols, int64_t tile_rows) {
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const float s = tile_scale(v + r0 * cols + c0, cols, tile_rows), inv = inverse_scale(s);
      for (int64_t r = r0; r < r0 + tile_rows; ++r)
        for (int64_t c = c0; c < c0 + kTile; ++c) v[r * cols + c] = Real(decode(encode(float(v[r * cols + c]) * inv)) * s);
    }
}

}  // namespace leanmoe::fp8
