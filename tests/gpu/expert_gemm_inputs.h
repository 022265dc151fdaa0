// What the expert GEMM tests (test_expert_gemms.cpp, test_gather_gemms_fp8.cpp) share: a random
// ragged routing sorted by expert, and a device buffer that can be poisoned and read back.
#pragma once
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace leanmoe::testing {

struct Routing {
  int64_t T = 0, E = 0, R = 0;
  std::vector<int32_t> expert_offsets, row_token;
  std::vector<float> row_gate;
};

// Each token picks K distinct experts at random, never `empty_expert` (-1: none excluded); with
// all_to_one every token goes to expert E-1 only (K must be 1). Rows sorted by expert, stable by token.
inline Routing make_routing(int64_t T, int64_t E, int64_t K, int64_t empty_expert, bool all_to_one, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> tokens_of(E);
  for (int64_t t = 0; t < T; ++t) {
    if (all_to_one) {
      tokens_of[E - 1].push_back(int32_t(t));
      continue;
    }
    std::vector<int64_t> experts;
    for (int64_t e = 0; e < E; ++e)
      if (e != empty_expert) experts.push_back(e);
    std::shuffle(experts.begin(), experts.end(), rng);
    for (int64_t k = 0; k < K; ++k) tokens_of[experts[k]].push_back(int32_t(t));
  }
  Routing r;
  r.T = T;
  r.E = E;
  std::uniform_real_distribution<float> gate(0.05f, 1.f);
  r.expert_offsets.push_back(0);
  for (int64_t e = 0; e < E; ++e) {
    for (int32_t t : tokens_of[e]) {
      r.row_token.push_back(t);
      r.row_gate.push_back(gate(rng));
    }
    r.expert_offsets.push_back(int32_t(r.row_token.size()));
  }
  r.R = int64_t(r.row_token.size());
  return r;
}

// The expert owning routed row r, rows laid out by expert as expert_offsets [E+1] says.
inline int64_t expert_of_row(const std::vector<int32_t>& expert_offsets, int64_t r) {
  return int64_t(std::upper_bound(expert_offsets.begin(), expert_offsets.end(), int32_t(r)) -
                 expert_offsets.begin()) - 1;
}
inline int64_t expert_of_row(const Routing& rt, int64_t r) { return expert_of_row(rt.expert_offsets, r); }

// Device buffer of `count` elements of T, freed on scope exit.
template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) { EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess); }
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    EXPECT_EQ(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void poison() { EXPECT_EQ(cudaMemset(ptr, 0xFF, std::max<size_t>(count, 1) * sizeof(T)), cudaSuccess); }
  std::vector<T> download(size_t n) const {
    std::vector<T> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

}  // namespace leanmoe::testing
