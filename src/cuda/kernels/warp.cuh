// Warp-level helpers shared by the router kernels. Butterfly reductions visit lanes in a fixed
// pattern, so their results are deterministic for a given E.
#pragma once
#include <cuda_runtime.h>

namespace leanmoe::cuda::kernels {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Softmax of one token's logits held in shared memory `row` (E values), computed by one warp.
// Same formula as the CPU backend: p = exp(z - max) / sum, lse = max + log(sum). Overwrites row with p.
__device__ __forceinline__ float warp_softmax_in_place(float* row, int E, int lane) {
  float m = -INFINITY;
  for (int e = lane; e < E; e += 32) m = fmaxf(m, row[e]);
  m = warp_max(m);
  float s = 0.f;
  for (int e = lane; e < E; e += 32) s += expf(row[e] - m);
  s = warp_sum(s);
  for (int e = lane; e < E; e += 32) row[e] = expf(row[e] - m) / s;
  __syncwarp();
  return m + logf(s);
}

}  // namespace leanmoe::cuda::kernels
