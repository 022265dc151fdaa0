// Device bodies of the FP8 quantization (docs/DESIGN.md "FP8"): e4m3 codes and power-of-two scales
// bit for bit with fp8::quantize, because every rule is src/fp8.h's own function (amax_step,
// scale_of, inverse_scale, encode), called here per element. The max is exact and fmax ignores NaN,
// so the order of the amax reduction does not change the scale; v * inverse_scale(s) is one IEEE
// multiply (no FTZ: the library is built without fast-math), the host's product.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "../../fp8.h"
#include "warp.cuh"  // kFullMask

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

}  // namespace fp8_detail

// ---- 1 x 128 tiles of a row-major [rows, cols] matrix -------------------------------------------
// With cols a multiple of 128 the tiles are consecutive runs of 128 values and tile t's scale is
// scales[t], so the matrix is a flat list of `tiles` tiles. Half a warp takes a tile: each lane one
// 16-byte load of 8 bf16 and one 8-byte store of their codes; a warp takes two tiles per step, its
// loop bound warp-uniform so the shuffles see all 32 lanes.
__global__ void __launch_bounds__(256) fp8_quantize_rows_kernel(const uint4* __restrict__ x, int64_t tiles,
                                                                uint2* __restrict__ codes,
                                                                float* __restrict__ scales) {
  using namespace fp8_detail;
  const int lane = threadIdx.x % 32, half = lane / 16, sub = lane % 16;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t pair = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; pair * 2 < tiles; pair += warps) {
    const int64_t tile = pair * 2 + half;
    const bool valid = tile < tiles;
    float v[8] = {};
    if (valid) unpack_bf16x8(x[tile * 16 + sub], v);
    float amax = amax_x8(0.f, v);
    // Within each half-warp (xor offsets below 16 stay in it); amax >= 0, so amax_step is fmax.
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fp8::amax_step(amax, __shfl_xor_sync(kFullMask, amax, o));
    if (!valid) continue;
    const float s = fp8::scale_of(amax);
    codes[tile * 16 + sub] = encode_x8(v, fp8::inverse_scale(s));
    if (sub == 0) scales[tile] = s;
  }
}

// ---- 128 x 128 blocks of [E, R, C] weights, optionally also written transposed ---------------------
// One CTA of 256 threads per block: thread (ty, tx) = (tid / 16, tid % 16) holds columns 8tx..8tx+7
// of rows ty + 16p, p < 8 (eight 16-byte loads, coalesced: 16 threads read a 256-byte row), keeps
// them in registers through the block's amax, then writes its codes row-major (8-byte stores) and,
// for the transposed copy, into shared memory, from which each lane reads one column c of the block
// and writes 16 consecutive r of codes_t's row c as one 16-byte store.
constexpr int kBlockThreads = 256;

__global__ void __launch_bounds__(kBlockThreads) fp8_quantize_blocks_kernel(
    const uint4* __restrict__ w, int64_t R, int64_t C, uint8_t* __restrict__ codes, float* __restrict__ scales,
    uint8_t* __restrict__ codes_t, float* __restrict__ scales_t) {
  using namespace fp8_detail;
  constexpr int kT = int(fp8::kTile), kRowsPerPass = kBlockThreads / 16, kPasses = kT / kRowsPerPass;
  __shared__ float warp_amax[kBlockThreads / 32];
  __shared__ __align__(16) uint8_t tile[kT][kT];  // the block's codes, [r][c]
  const int64_t nbr = R / kT, nbc = C / kT;
  const int64_t b = blockIdx.x, e = b / (nbr * nbc), br = b / nbc % nbr, bc = b % nbc;
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16, lane = tid % 32, warp = tid / 32;
  // Element (r, c) of the block is w[(e * R + br * 128 + r) * C + bc * 128 + c]; in 16-byte words:
  const int64_t origin = ((e * R + br * kT) * C + bc * kT) / 8;

  float v[kPasses][8];
  float amax = 0.f;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    unpack_bf16x8(w[origin + (ty + p * kRowsPerPass) * (C / 8) + tx], v[p]);
    amax = amax_x8(amax, v[p]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fp8::amax_step(amax, __shfl_xor_sync(kFullMask, amax, o));
  if (lane == 0) warp_amax[warp] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int i = 0; i < kBlockThreads / 32; ++i) amax = fp8::amax_step(amax, warp_amax[i]);
  const float s = fp8::scale_of(amax), inv = fp8::inverse_scale(s);
  if (tid == 0) {
    scales[(e * nbr + br) * nbc + bc] = s;
    if (scales_t) scales_t[(e * nbc + bc) * nbr + br] = s;
  }

#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int r = ty + p * kRowsPerPass;
    const uint2 q = encode_x8(v[p], inv);
    *reinterpret_cast<uint2*>(codes + (e * R + br * kT + r) * C + bc * kT + tx * 8) = q;
    if (codes_t) *reinterpret_cast<uint2*>(&tile[r][tx * 8]) = q;
  }
  if (!codes_t) return;  // uniform across the CTA
  __syncthreads();
  // codes_t[e][bc * 128 + c][br * 128 + r] = tile[r][c]: warp w takes the rows r0 = 16w .. 16w + 15,
  // its lanes the columns c = lane + 32k; each shared load reads 32 consecutive bytes of one row (no
  // bank conflict).
  const int r0 = warp * 16;
#pragma unroll
  for (int k = 0; k < kT / 32; ++k) {
    const int c = lane + 32 * k;
    uint32_t word[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      word[i] = uint32_t(tile[r0 + 4 * i][c]) | uint32_t(tile[r0 + 4 * i + 1][c]) << 8 |
                uint32_t(tile[r0 + 4 * i + 2][c]) << 16 | uint32_t(tile[r0 + 4 * i + 3][c]) << 24;
    *reinterpret_cast<uint4*>(codes_t + (e * C + bc * kT + c) * R + br * kT + r0) =
        make_uint4(word[0], word[1], word[2], word[3]);
  }
}

}  // namespace leanmoe::cuda::kernels
