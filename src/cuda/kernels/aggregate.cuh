// Gather-and-sum kernels (docs/SPEC.md §3 kernel 5, §4 kernel 5): each token reads its own rows and sums
// them in fp32, in the order token_rows lists them (ascending expert), then rounds once to bf16.
// One block per token and 8 bf16 (16 bytes) per thread per load; no atomics.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

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

// out[t] = bf16(sum_rows gate[row] * y[row]); with gate == nullptr the weights are 1 and
// `extra` (fp32 [T, d], may be null) is added before the rounding (dX = sum dX_exp + dz·Wr).
__global__ void gather_sum_kernel(const Bf16x8* __restrict__ rows_data, const float* __restrict__ gate,
                                  const float* __restrict__ extra, const int32_t* __restrict__ token_offsets,
                                  const int32_t* __restrict__ token_rows, int d, Bf16x8* __restrict__ out) {
  const int t = blockIdx.x;
  const int vecs = d / kVec;
  const int begin = token_offsets[t], end = token_offsets[t + 1];
  for (int c = threadIdx.x; c < vecs; c += blockDim.x) {
    float acc[kVec] = {};
    for (int i = begin; i < end; ++i) {
      const int row = token_rows[i];
      add_scaled(acc, rows_data[int64_t(row) * vecs + c], gate ? gate[row] : 1.f);
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
