// Device bodies shared by the FP8 quantizing kernels (docs/DESIGN.md "FP8"): e4m3 codes and
// power-of-two scales bit for bit with fp8::quantize. amax_step, scale_of and inverse_scale are
// src/fp8.h's own functions; the codes come from the GPU's cvt.rn.satfinite.e4m3x2.f32 (cuda_fp8.h's
// __nv_cvt_float2_to_fp8x2), equal to fp8::encode on every fp32 input (dev/fp8_vs_cuda_fp8.cpp) at
// one instruction per two values, where fp8::encode's integer rounding compiles to ~35 instructions
// and four branches per value (it made a quantizing pass instruction-bound, 2x slower). The max is exact and fmax
// ignores NaN, so the order of the amax reduction does not change the scale; v * inverse_scale(s) is
// one IEEE multiply (no FTZ: the library is built without fast-math), the host's product.
// Included by kernels/fp8_quantize.cuh (fp8_quantize_rows / fp8_quantize_blocks) and
// kernels/optim_update.cuh (the expert optimizer's update that writes the FP8 copy).
#pragma once
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../../fp8.h"
#include "warp.cuh"  // kFullMask

namespace leanmoe::cuda::kernels {

namespace fp8_detail {

// The low / high bf16 of a packed pair as a float (a bf16 is the top half of its fp32: exact).
__device__ __forceinline__ float bf16x2_lo(uint32_t w) { return fp8::float_of(w << 16); }
__device__ __forceinline__ float bf16x2_hi(uint32_t w) { return fp8::float_of(w & 0xffff0000u); }

// The 8 bf16 of a 16-byte word as floats.
__device__ __forceinline__ void unpack_bf16x8(const uint4& w, float (&v)[8]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = bf16x2_lo(words[i]);
    v[2 * i + 1] = bf16x2_hi(words[i]);
  }
}

// fp8::encode(lo) | fp8::encode(hi) << 8.
__device__ __forceinline__ uint32_t encode_x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

// Codes of 8 values scaled by inv, packed little-endian (value 0 in the lowest byte).
__device__ __forceinline__ uint2 encode_x8(const float (&v)[8], float inv) {
  uint32_t half[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) half[i] = encode_x2(v[2 * i] * inv, v[2 * i + 1] * inv);
  return make_uint2(half[0] | half[1] << 16, half[2] | half[3] << 16);
}

__device__ __forceinline__ float amax_x8(float amax, const float (&v)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fp8::amax_step(amax, v[i]);
  return amax;
}

}  // namespace fp8_detail

// ---- 128 x 128 blocks of [E, R, C] weights, optionally also written transposed ---------------------
// One CTA of 256 threads per block: thread (ty, tx) = (tid / 16, tid % 16) holds columns 8tx..8tx+7
// of rows ty + 16p, p < 8 (eight 16-byte loads, coalesced: 16 threads read a 256-byte row), keeps
// them in registers through the block's amax, then writes its codes row-major (8-byte stores) and,
// for the transposed copy, into shared memory, from which each lane reads one column c of the block
// and writes 16 consecutive r of codes_t's row c as one 16-byte store. Two kernels produce the
// values: fp8_quantize_blocks_kernel loads them, the expert optimizer's fused_update_fp8_kernel
// (optim_update.cuh) computes them by updating the parameter; both hand them to encode_block.
constexpr int kBlockThreads = 256;
constexpr int kBlockRowsPerPass = kBlockThreads / 16;
constexpr int kBlockPasses = int(fp8::kTile) / kBlockRowsPerPass;  // 8 rows per thread

// Block (e, br, bc) of [E, R, C] that CTA blockIdx.x encodes, and this thread's place in it.
struct BlockPlace {
  int64_t R, C, e, br, bc;
  int ty, tx;
  __device__ __forceinline__ BlockPlace(int64_t R_, int64_t C_) : R(R_), C(C_) {
    const int64_t nbr = R / fp8::kTile, nbc = C / fp8::kTile, b = blockIdx.x;
    e = b / (nbr * nbc);
    br = b / nbc % nbr;
    bc = b % nbc;
    ty = int(threadIdx.x) / 16;
    tx = int(threadIdx.x) % 16;
  }
  // Index in [E, R, C] of the thread's first element in pass p (8 consecutive elements from it).
  __device__ __forceinline__ int64_t at(int p) const {
    return (e * R + br * fp8::kTile + ty + p * kBlockRowsPerPass) * C + bc * fp8::kTile + tx * 8;
  }
};

struct BlockEncodeSmem {
  float warp_amax[kBlockThreads / 32];
  __align__(16) uint8_t tile[fp8::kTile][fp8::kTile];  // the block's codes, [r][c]
};

// The block's scale (amax over the CTA), its codes and, when codes_t is not null, the transposed
// codes and scale. w[p] holds the thread's 8 bf16 values at b.at(p), as stored (kept packed: 32
// registers instead of 64 floats, for the fused update's occupancy). Called by all threads of the CTA.
__device__ __forceinline__ void encode_block(const BlockPlace& b, const uint4 (&w)[kBlockPasses],
                                             uint8_t* __restrict__ codes, float* __restrict__ scales,
                                             uint8_t* __restrict__ codes_t, float* __restrict__ scales_t,
                                             BlockEncodeSmem& smem) {
  using namespace fp8_detail;
  constexpr int kT = int(fp8::kTile);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t nbr = b.R / kT, nbc = b.C / kT;
  float amax = 0.f;
#pragma unroll
  for (int p = 0; p < kBlockPasses; ++p) {
    float v[8];
    unpack_bf16x8(w[p], v);
    amax = amax_x8(amax, v);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fp8::amax_step(amax, __shfl_xor_sync(kFullMask, amax, o));
  if (lane == 0) smem.warp_amax[warp] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int i = 0; i < kBlockThreads / 32; ++i) amax = fp8::amax_step(amax, smem.warp_amax[i]);
  const float s = fp8::scale_of(amax), inv = fp8::inverse_scale(s);
  if (tid == 0) {
    scales[(b.e * nbr + b.br) * nbc + b.bc] = s;
    if (scales_t) scales_t[(b.e * nbc + b.bc) * nbr + b.br] = s;
  }

#pragma unroll
  for (int p = 0; p < kBlockPasses; ++p) {
    float v[8];
    unpack_bf16x8(w[p], v);
    const uint2 q = encode_x8(v, inv);
    *reinterpret_cast<uint2*>(codes + b.at(p)) = q;
    if (codes_t) *reinterpret_cast<uint2*>(&smem.tile[b.ty + p * kBlockRowsPerPass][b.tx * 8]) = q;
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
      word[i] = uint32_t(smem.tile[r0 + 4 * i][c]) | uint32_t(smem.tile[r0 + 4 * i + 1][c]) << 8 |
                uint32_t(smem.tile[r0 + 4 * i + 2][c]) << 16 | uint32_t(smem.tile[r0 + 4 * i + 3][c]) << 24;
    *reinterpret_cast<uint4*>(codes_t + (b.e * b.C + b.bc * kT + c) * b.R + b.br * kT + r0) =
        make_uint4(word[0], word[1], word[2], word[3]);
  }
}

}  // namespace leanmoe::cuda::kernels
