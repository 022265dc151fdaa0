// The FP8 quantization kernels (launchers: src/cuda/fp8_quantize.cu): the device bodies and the
// rules they follow are in fp8_encode.cuh.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "fp8_encode.cuh"

namespace leanmoe::cuda::kernels {

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

// ---- 128 x 128 blocks of [E, R, C] weights (the CTA's layout and encode_block: fp8_encode.cuh) ----
__global__ void __launch_bounds__(kBlockThreads) fp8_quantize_blocks_kernel(
    const uint4* __restrict__ w, int64_t R, int64_t C, uint8_t* __restrict__ codes, float* __restrict__ scales,
    uint8_t* __restrict__ codes_t, float* __restrict__ scales_t) {
  __shared__ BlockEncodeSmem smem;
  const BlockPlace b(R, C);
  uint4 words[kBlockPasses];
#pragma unroll
  for (int p = 0; p < kBlockPasses; ++p) words[p] = w[b.at(p) / 8];
  encode_block(b, words, codes, scales, codes_t, scales_t, smem);
}

}  // namespace leanmoe::cuda::kernels
