// Device data for the GPU benchmarks (leanmoe_bench_gemms and the dev/ benches; nvcc only): owned
// device buffers, reproducible uniform fills without a host copy, uniform random top-K routing in
// the layer's row order, and the max-difference reduction their outputs are checked with.
// The kernels are static: each includer is one benchmark translation unit.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_bench.h"

namespace leanmoe::tools {

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) {
    check_cuda(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), count(o.count) { o.ptr = nullptr; }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Uniform in [-1, 1) from a 32-bit integer hash of the index and a seed.
__device__ inline float hash_uniform(size_t i, uint32_t seed) {
  uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed ^ uint32_t(i >> 32) * 0x85EBCA77u;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  return float(h >> 8) * (2.f / 16777216.f) - 1.f;
}

// p[i] = bf16(scale · hash_uniform(i, seed)), grid-stride (any launch shape gives the same values).
static __global__ void fill_uniform_bf16(__nv_bfloat16* p, size_t count, float scale, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(scale * hash_uniform(i, seed));
}

// out[0] = max |x - ref| (a non-finite x counts as infinite), out[1] = max |ref|; out starts at 0
// (non-negative floats order as their bit patterns).
static __global__ void max_diff(const __nv_bfloat16* x, const __nv_bfloat16* ref, size_t count, unsigned* out) {
  float diff = 0.f, mag = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const float r = __bfloat162float(ref[i]), v = __bfloat162float(x[i]);
    diff = fmaxf(diff, isfinite(v) ? fabsf(v - r) : INFINITY);
    mag = fmaxf(mag, fabsf(r));
  }
  atomicMax(out, __float_as_uint(diff));
  atomicMax(out + 1, __float_as_uint(mag));
}

// Uniform random top-K routing: each token's K distinct experts by a partial Fisher-Yates shuffle.
// Returns each expert's tokens in token order (rows sorted by expert, stable by token: what routing
// emits).
inline std::vector<std::vector<int32_t>> uniform_topk_tokens(int64_t T, int64_t E, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> tokens_of(E);
  std::vector<int32_t> experts(E);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    for (int64_t k = 0; k < K; ++k) {
      std::swap(experts[k], experts[k + rng() % (E - k)]);
      tokens_of[experts[k]].push_back(int32_t(t));
    }
  }
  return tokens_of;
}

// expert_offsets [E + 1] of those rows.
inline std::vector<int32_t> expert_offsets_of(const std::vector<std::vector<int32_t>>& tokens_of) {
  std::vector<int32_t> off{0};
  for (const auto& rows : tokens_of) off.push_back(off.back() + int32_t(rows.size()));
  return off;
}

}  // namespace leanmoe::tools
