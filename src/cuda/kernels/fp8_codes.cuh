// The per-element FP8 rules on the device, for the quantization kernels (fp8_quantize.cuh) and the
// gather kernel's quantizing epilogues (sm90_grouped_gemm_gather_epilogue.cuh): e4m3 codes and
// power-of-two scales bit for bit with fp8::quantize, because every rule is src/fp8.h's own function
// (amax_step, scale_of, inverse_scale, encode), called here per element. The max is exact and fmax
// ignores NaN, so the order of the amax reduction does not change the scale; v * inverse_scale(s) is
// one IEEE multiply (no FTZ: the library is built without fast-math), the host's product.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../../fp8.h"

namespace leanmoe::cuda::kernels {

namespace fp8_detail {

// The 8 bf16 of a 16-byte word as floats (a bf16 is the top half of its fp32: exact).
__device__ __forceinline__ void unpack_bf16x8(const uint4& w, float (&v)[8]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = fp8::float_of(words[i] << 16);
    v[2 * i + 1] = fp8::float_of(words[i] & 0xffff0000u);
  }
}

// Codes of 8 values scaled by inv, packed little-endian (value 0 in the lowest byte).
__device__ __forceinline__ uint2 encode_x8(const float (&v)[8], float inv) {
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo |= uint32_t(fp8::encode(v[i] * inv)) << (8 * i);
    hi |= uint32_t(fp8::encode(v[i + 4] * inv)) << (8 * i);
  }
  return make_uint2(lo, hi);
}

__device__ __forceinline__ float amax_x8(float amax, const float (&v)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fp8::amax_step(amax, v[i]);
  return amax;
}

// The amax step over the two bf16 of a packed word (low half first).
__device__ __forceinline__ float amax_bf16x2(float amax, uint32_t w) {
  return fp8::amax_step(fp8::amax_step(amax, fp8::float_of(w << 16)), fp8::float_of(w & 0xffff0000u));
}

// The amax of the rows a lane quad holds (the gather epilogues' fragment layout): xor 1, 2. The whole
// warp calls it.
__device__ __forceinline__ float quad_amax(float amax) {
  amax = fp8::amax_step(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  return fp8::amax_step(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
}

// The codes of 8 packed bf16 scaled by inv.
__device__ __forceinline__ uint2 encode_bf16x8(const uint4& w, float inv) {
  float v[8];
  unpack_bf16x8(w, v);
  return encode_x8(v, inv);
}

}  // namespace fp8_detail

}  // namespace leanmoe::cuda::kernels
