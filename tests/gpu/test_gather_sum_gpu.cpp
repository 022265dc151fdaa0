// The gather-sum kernel (src/cuda/aggregate.cu: aggregate_rows, gather_dx) against a CPU loop that
// does the kernel's own arithmetic, bit for bit: per token and column an fp32 sum over the token's
// rows in token_rows order, each term one fused multiply-add (acc = fma(gate, y, acc), then
// fma(gate, b2, acc) with a down bias; gate 1 for dx, whose fp32 dz·Wr term is added last), one
// rounding to bf16. So the comparison is exact: a row read twice, skipped, read out of order, or
// summed in another order changes bits. Routings: 0 to 17 rows per token (a token with none gives 0;
// 17: beyond any K of the grid, and across batches of 4 or 8 should the kernel load rows in batches),
// d below, at and above one block's 128 vectors, T not a multiple of anything. Outputs are poisoned
// first. Skipped when no GPU is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../../src/cuda/launchers.h"
#include "expert_gemm_inputs.h"
#include "leanmoe/bf16.h"
#include "leanmoe/leanmoe.h"

namespace {

using leanmoe::bf16;
using leanmoe::bf16_to_float;
using leanmoe::float_to_bf16;
using leanmoe::testing::DeviceBuffer;
using leanmoe::testing::expert_of_row;

#define REQUIRE_GPU() \
  if (!leanmoe::backend_available(leanmoe::Device::cuda)) GTEST_SKIP() << "no CUDA device visible"

struct Case {
  int64_t T, d, E;
  bool gate, bias, extra;
};

struct Inputs {
  std::vector<int32_t> token_offsets, token_rows, expert_offsets;
  std::vector<bf16> y, b2;
  std::vector<float> gate, extra;
  int64_t R = 0;
};

// Rows are laid out by expert (expert_offsets), each token's rows a random subset of them listed in
// ascending row order, as the routing writes them.
Inputs make_inputs(const Case& c, std::mt19937& rng) {
  Inputs in;
  std::uniform_int_distribution<int> rows_per_token(0, 17), expert(0, int(c.E) - 1);
  std::vector<int> count(size_t(c.T));
  for (auto& k : count) k = rows_per_token(rng);
  in.R = std::accumulate(count.begin(), count.end(), int64_t(0));
  // Each row's expert; rows sorted by expert give expert_offsets.
  std::vector<int> row_expert(size_t(in.R));
  for (auto& e : row_expert) e = expert(rng);
  std::sort(row_expert.begin(), row_expert.end());
  in.expert_offsets.assign(size_t(c.E + 1), 0);
  for (int e : row_expert) ++in.expert_offsets[size_t(e + 1)];
  std::partial_sum(in.expert_offsets.begin(), in.expert_offsets.end(), in.expert_offsets.begin());
  std::vector<int32_t> perm(size_t(in.R));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  in.token_offsets.assign(size_t(c.T + 1), 0);
  for (int64_t t = 0, next = 0; t < c.T; ++t) {
    in.token_offsets[size_t(t + 1)] = in.token_offsets[size_t(t)] + count[size_t(t)];
    std::sort(perm.begin() + next, perm.begin() + next + count[size_t(t)]);
    next += count[size_t(t)];
  }
  in.token_rows = perm;
  std::normal_distribution<float> normal(0.f, 1.f);
  in.y.resize(size_t(in.R * c.d));
  for (auto& v : in.y) v = float_to_bf16(normal(rng));
  if (c.bias) {
    in.b2.resize(size_t(c.E * c.d));
    for (auto& v : in.b2) v = float_to_bf16(normal(rng));
  }
  if (c.gate) {
    in.gate.resize(size_t(in.R));
    for (auto& v : in.gate) v = std::fabs(normal(rng));
  }
  if (c.extra) {
    in.extra.resize(size_t(c.T * c.d));
    for (auto& v : in.extra) v = normal(rng);
  }
  return in;
}

std::vector<bf16> expected(const Case& c, const Inputs& in) {
  std::vector<bf16> out(size_t(c.T * c.d));
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t j = 0; j < c.d; ++j) {
      float acc = 0.f;
      for (int32_t i = in.token_offsets[size_t(t)]; i < in.token_offsets[size_t(t + 1)]; ++i) {
        const int32_t row = in.token_rows[size_t(i)];
        const float s = c.gate ? in.gate[size_t(row)] : 1.f;
        acc = std::fma(s, bf16_to_float(in.y[size_t(row * c.d + j)]), acc);
        if (c.bias)
          acc = std::fma(s, bf16_to_float(in.b2[size_t(expert_of_row(in.expert_offsets, row) * c.d + j)]), acc);
      }
      if (c.extra) acc += in.extra[size_t(t * c.d + j)];
      out[size_t(t * c.d + j)] = float_to_bf16(acc);
    }
  return out;
}

void check(const Case& c, uint32_t seed) {
  SCOPED_TRACE("T=" + std::to_string(c.T) + " d=" + std::to_string(c.d) + " gate=" + std::to_string(c.gate) +
               " bias=" + std::to_string(c.bias) + " extra=" + std::to_string(c.extra));
  std::mt19937 rng(seed);
  const Inputs in = make_inputs(c, rng);
  DeviceBuffer<int32_t> offsets(in.token_offsets), rows(in.token_rows), expert_offsets(in.expert_offsets);
  DeviceBuffer<bf16> y(in.y), b2(in.b2), out(size_t(c.T * c.d));
  DeviceBuffer<float> gate(in.gate), extra(in.extra);
  out.poison();
  if (c.gate || c.bias) {
    ASSERT_FALSE(c.extra) << "aggregate_rows takes no fp32 term";
    leanmoe::cuda::aggregate_rows(y.ptr, c.gate ? gate.ptr : nullptr, offsets.ptr, rows.ptr, c.T, c.d, out.ptr,
                                  nullptr, c.bias ? b2.ptr : nullptr, expert_offsets.ptr, c.E);
  } else {
    leanmoe::cuda::gather_dx(y.ptr, c.extra ? extra.ptr : nullptr, offsets.ptr, rows.ptr, c.T, c.d, out.ptr,
                             nullptr);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<bf16> got = out.download(size_t(c.T * c.d)), want = expected(c, in);
  int64_t differing = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i].bits != want[i].bits && differing++ == 0) first = int64_t(i);
  EXPECT_EQ(differing, 0) << "of " << got.size() << "; first at token " << first / c.d << " column " << first % c.d
                          << ": " << bf16_to_float(got[size_t(first)]) << " vs " << bf16_to_float(want[size_t(first)]);
}

TEST(GatherSum, ForwardAggregateMatchesFusedSumBitwise) {
  REQUIRE_GPU();
  uint32_t seed = 1;
  for (int64_t d : {64, 1024, 2880})  // one warp's vectors; one block's 128; a block looping 3 times
    for (bool bias : {false, true}) check({997, d, 7, true, bias, false}, seed++);
}

TEST(GatherSum, DxGatherMatchesFusedSumBitwise) {
  REQUIRE_GPU();
  uint32_t seed = 100;
  for (int64_t d : {64, 1024, 2880})
    for (bool extra : {false, true}) check({1013, d, 5, false, false, extra}, seed++);
}

TEST(GatherSum, EveryRowCountUpToTwoBatchesAndOne) {
  REQUIRE_GPU();
  // T = 1 and T = 2 tokens whose counts cover 0..17 over several seeds.
  for (uint32_t seed = 200; seed < 260; ++seed)
    check({int64_t(1 + seed % 2), 256, 3, seed % 3 == 0, false, seed % 3 == 1}, seed);
}

}  // namespace
