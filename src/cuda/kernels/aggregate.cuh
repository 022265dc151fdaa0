// Gather-and-sum kernels (docs/SPEC.md §3 kernel 5, §4 kernel 5): each token reads its own rows and sums
// them in fp32, in the order token_rows lists them (ascending expert), then rounds once to bf16.
// One block per token and 8 bf16 (16 bytes) per thread per load; no atomics.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/kernels/chained_grid.cuh"
#include "cuda/kernels/offsets.cuh"

namespace leanmoe::cuda::kernels {

constexpr int kVec = 8;  // bf16 per 16-byte vector

struct alignas(16) Bf16x8 {
  __nv_bfloat162 v[4];
};

__device__ __forceinline__ void add_scaled(float (&acc)[kVec], const Bf16x8& x, float s) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(x.v[i]);
    acc[2 * i] += s * f.x;
    acc[2 * i + 1] += s * f.y;
  }
}

__device__ __forceinline__ Bf16x8 to_bf16x8(const float (&acc)[kVec]) {
  Bf16x8 r;
#pragma unroll
  for (int i = 0; i < 4; ++i) r.v[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  return r;
}

// out[t] = bf16(sum_rows gate[row] * (y[row] + bias[e(row)])); with gate == nullptr the weights are 1
// and `extra` (fp32 [T, d], may be null) is added before the rounding (dX = sum dX_exp + dz·Wr).
// bias (the experts' down bias [E, d], may be null) needs expert_offsets to find each row's expert.
__global__ void gather_sum_kernel(const Bf16x8* __restrict__ rows_data, const float* __restrict__ gate,
                                  const float* __restrict__ extra, const int32_t* __restrict__ token_offsets,
                                  const int32_t* __restrict__ token_rows, int d, Bf16x8* __restrict__ out,
                                  const Bf16x8* __restrict__ bias = nullptr,
                                  const int32_t* __restrict__ expert_offsets = nullptr, int E = 0) {
  chain_after_prior_grid();
  const int t = blockIdx.x;
  const int vecs = d / kVec;
  const int begin = token_offsets[t], end = token_offsets[t + 1];
  for (int c = threadIdx.x; c < vecs; c += blockDim.x) {
    float acc[kVec] = {};
    for (int i = begin; i < end; ++i) {
      const int row = token_rows[i];
      const float s = gate ? gate[row] : 1.f;
      add_scaled(acc, rows_data[int64_t(row) * vecs + c], s);
      if (bias) add_scaled(acc, bias[int64_t(segment_of(expert_offsets, E, row)) * vecs + c], s);
    }
    if (extra) {
      const float4* x = reinterpret_cast<const float4*>(extra + int64_t(t) * d) + 2 * c;
      const float4 a = x[0], b = x[1];
      acc[0] += a.x, acc[1] += a.y, acc[2] += a.z, acc[3] += a.w;
      acc[4] += b.x, acc[5] += b.y, acc[6] += b.z, acc[7] += b.w;
    }
    out[int64_t(t) * vecs + c] = to_bf16x8(acc);
  }
}

__global__ void reduce_ds_kernel(const float* __restrict__ partial, int parts, const int32_t* __restrict__ routed,
                                 int64_t rows_capacity, float* __restrict__ dS) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= rows_capacity || r >= *routed) return;
  float s = 0.f;
  for (int j = 0; j < parts; ++j) s += partial[r * parts + j];
  dS[r] = s;
}

// Routed rows with a down bias: dS[r] = sum_j partial[r * parts + j] + <dO[row_token[r]], b2[e(r)]>
// (y = W2·a + b2 adds <dO, b2> to <dO, y>). One warp per row, lanes over d in 16-byte vectors, the
// lanes' sums added in a fixed butterfly order.
__global__ void reduce_ds_bias_kernel(const float* __restrict__ partial, int parts,
                                      const int32_t* __restrict__ expert_offsets, int E, int64_t rows_capacity,
                                      const Bf16x8* __restrict__ d_out, const int32_t* __restrict__ row_token,
                                      const Bf16x8* __restrict__ b2, int d, float* __restrict__ dS) {
  const int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows_capacity || r >= expert_offsets[E]) return;  // whole warps leave together
  const int vecs = d / kVec;
  const Bf16x8* o = d_out + int64_t(row_token[r]) * vecs;
  const Bf16x8* b = b2 + int64_t(segment_of(expert_offsets, E, int(r))) * vecs;
  float dot = 0.f;
  for (int c = lane; c < vecs; c += 32) {
    const Bf16x8 ov = o[c], bv = b[c];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = __bfloat1622float2(ov.v[i]), y = __bfloat1622float2(bv.v[i]);
      dot += x.x * y.x + x.y * y.y;
    }
  }
#pragma unroll
  for (int o2 = 16; o2 > 0; o2 >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o2);
  if (lane == 0) {
    float s = 0.f;
    for (int j = 0; j < parts; ++j) s += partial[r * parts + j];
    dS[r] = s + dot;
  }
}

// Per-expert column sums (the bias gradients): out[e, c] = bf16(sum over expert e's rows r of
// scale[r] · src[row_index[r], c]) (scale null: 1; row_index null: row r itself), 0 for an empty
// expert. Block (64-column slice, expert): 16 warps take every 16th row, each lane two columns, and
// the warps' fp32 sums are added in warp order: deterministic, no atomics.
constexpr int kColumnSumWarps = 16;
__global__ void expert_column_sums_kernel(const __nv_bfloat16* __restrict__ src, int64_t width,
                                          const int32_t* __restrict__ row_index, const float* __restrict__ scale,
                                          const int32_t* __restrict__ expert_offsets,
                                          __nv_bfloat16* __restrict__ out) {
  __shared__ float2 partial[kColumnSumWarps][32];
  const int e = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t col = int64_t(blockIdx.x) * 64 + 2 * lane;
  const int begin = expert_offsets[e], end = expert_offsets[e + 1];
  float2 sum = {0.f, 0.f};
  if (col < width)
    for (int r = begin + warp; r < end; r += kColumnSumWarps) {
      const int64_t src_row = row_index ? row_index[r] : r;
      const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(src + src_row * width + col));
      const float s = scale ? scale[r] : 1.f;
      sum.x += s * v.x;
      sum.y += s * v.y;
    }
  partial[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && col < width) {
    float2 total = partial[0][lane];
    for (int w = 1; w < kColumnSumWarps; ++w) total.x += partial[w][lane].x, total.y += partial[w][lane].y;
    *reinterpret_cast<__nv_bfloat162*>(out + int64_t(e) * width + col) = __floats2bfloat162_rn(total.x, total.y);
  }
}

__global__ void sum_halves_kernel(const float* __restrict__ src, int64_t count, __nv_bfloat16* __restrict__ dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i] + src[count + i]);
}

template <class V>
__global__ void nonfinite_kernel(const V* __restrict__ data, int64_t count, int32_t* __restrict__ flag) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(float(data[i]));
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;  // every writer stores the same value
}

}  // namespace leanmoe::cuda::kernels
