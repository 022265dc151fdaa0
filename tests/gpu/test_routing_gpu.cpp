// The GPU routing kernels (src/cuda/routing.cu, through cuda::route and cuda::build_pair_metadata)
// against the CPU routing functions (src/cpu/router.h) on the same fp32 logits, element by
// element: top-K ids, rows per expert, row_token, token_rows, both offset arrays must be equal;
// row_gate and sum_chosen must be exactly what the CPU computes from the GPU's own p (so the
// fp32 gates are the same divisions of the same values, not merely close); p and lse are fp32
// softmaxes in another summation order and exp implementation: <= 1e-5 relative (sums of up to
// E = 1024 terms, ~sqrt(E) ulp = 2e-6 typical). Token rounding is checked from the GPU's p on
// both sides, so near-ties of priorities decide the same way. Logits are quantised to steps of 1/4 with signed zeros,
// so ties in z (and equal p) are frequent. Every case runs twice: the results must be
// bitwise the same (no order-dependent atomics). Skipped when no GPU is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../src/carver.h"
#include "../../src/cpu/router.h"
#include "../../src/cuda/launchers.h"
#include "leanmoe/leanmoe.h"

namespace {

using namespace leanmoe;

#define REQUIRE_GPU() \
  if (!backend_available(Device::cuda)) GTEST_SKIP() << "no CUDA device visible"

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

size_t sz(int64_t count) { return size_t(count); }

struct DeviceBlock {
  void* ptr = nullptr;
  explicit DeviceBlock(size_t bytes) {
    if (cudaMalloc(&ptr, bytes) == cudaSuccess) cudaMemset(ptr, 0xff, bytes);  // poison: NaN floats, -1 ints
  }
  ~DeviceBlock() { cudaFree(ptr); }
};

template <class V>
std::vector<V> download(const V* p, int64_t count) {
  std::vector<V> h(sz(std::max<int64_t>(count, 0)));
  if (count > 0) {
    EXPECT_EQ(cudaMemcpy(h.data(), p, size_t(count) * sizeof(V), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return h;
}

std::vector<float> quantised_logits(int64_t T, int64_t E, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.5f);
  std::uniform_int_distribution<int> coin(0, 15);
  std::vector<float> z(sz(T * E));
  for (float& v : z) {
    v = std::round(normal(rng) * 4.f) / 4.f;
    if (v == 0.f && coin(rng) < 8) v = -0.f;
  }
  return z;
}

struct GpuRouting {
  std::vector<float> p, lse, sum_chosen, row_gate;
  std::vector<int32_t> topk, topk_counts, expert_offsets, token_offsets, row_token, token_rows;
  bool operator==(const GpuRouting& o) const {
    auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    return same_bits(p, o.p) && same_bits(lse, o.lse) && same_bits(sum_chosen, o.sum_chosen) &&
           same_bits(row_gate, o.row_gate) && topk == o.topk && topk_counts == o.topk_counts &&
           expert_offsets == o.expert_offsets && token_offsets == o.token_offsets && row_token == o.row_token &&
           token_rows == o.token_rows;
  }
};

GpuRouting run_gpu_route(const MoEConfig& cfg, int64_t T, const std::vector<float>& z) {
  const int64_t E = cfg.E, K = cfg.K, R_max = max_routed_rows(cfg, T);
  detail::Carver measure;
  const cuda::RoutingScratch sized(measure, cfg, T);
  // The same takes as below, one by one: the carver aligns each.
  measure.take<int32_t>(T * K);  // topk
  measure.take<int32_t>(R_max);  // row_token
  measure.take<float>(R_max);    // row_gate
  measure.take<int32_t>(R_max);  // token_rows
  measure.take<int32_t>(T + 1);  // token_offsets
  measure.take<int32_t>(E + 1);  // expert_offsets
  DeviceBlock block(measure.used());
  GpuRouting g;
  EXPECT_NE(block.ptr, nullptr);
  if (!block.ptr) return g;
  detail::Carver c(block.ptr);
  const cuda::RoutingScratch r(c, cfg, T);
  int32_t* topk = c.take<int32_t>(T * K);
  int32_t* row_token = c.take<int32_t>(R_max);
  float* row_gate = c.take<float>(R_max);
  int32_t* token_rows = c.take<int32_t>(R_max);
  int32_t* token_offsets = c.take<int32_t>(T + 1);
  int32_t* expert_offsets = c.take<int32_t>(E + 1);
  EXPECT_EQ(cudaMemcpy(r.zp, z.data(), z.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  cuda::route(cfg, T, r, /*count=*/true, topk, {row_token, row_gate, token_rows, token_offsets, expert_offsets},
              nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  g.p = download(r.zp, T * E);
  g.lse = download(r.lse, T);
  g.sum_chosen = download(r.sum_chosen, T);
  g.topk = download(topk, T * K);
  g.topk_counts = download(r.topk_counts, E);
  g.expert_offsets = download(expert_offsets, E + 1);
  g.token_offsets = download(token_offsets, T + 1);
  const int64_t R = g.expert_offsets.empty() ? 0 : g.expert_offsets[E];
  EXPECT_GE(R, 0);
  EXPECT_LE(R, R_max);
  if (R < 0 || R > R_max) return g;
  g.row_token = download(row_token, R);
  g.row_gate = download(row_gate, R);
  g.token_rows = download(token_rows, R);
  return g;
}

void expect_routing_matches_cpu(const MoEConfig& cfg, int64_t T, uint64_t seed) {
  SCOPED_TRACE(cfg.describe() + " T=" + std::to_string(T) + " seed " + std::to_string(seed));
  const int64_t E = cfg.E, K = cfg.K;
  const std::vector<float> z = quantised_logits(T, E, seed);
  const GpuRouting g = run_gpu_route(cfg, T, z);
  ASSERT_FALSE(g.expert_offsets.empty());
  EXPECT_TRUE(run_gpu_route(cfg, T, z) == g) << "a second run differs";

  // Values: p and lse close to the CPU softmax; sum_chosen exactly the CPU's sum of the GPU's p.
  std::vector<float> p(sz(T * E)), lse(sz(T));
  cpu::softmax_rows(z.data(), T, E, p.data(), lse.data());
  int bad = 0;
  for (size_t i = 0; i < p.size() && bad < 5; ++i)
    if (!(std::fabs(g.p[i] - p[i]) <= 1e-5f * std::fabs(p[i]) + 1e-30f))
      ++bad, ADD_FAILURE() << "p[" << i << "] " << g.p[i] << " vs " << p[i];
  for (size_t t = 0; t < lse.size() && bad < 5; ++t)
    if (!(std::fabs(g.lse[t] - lse[t]) <= 1e-5f * std::max(1.f, std::fabs(lse[t]))))
      ++bad, ADD_FAILURE() << "lse[" << t << "] " << g.lse[t] << " vs " << lse[t];

  std::vector<int32_t> topk(sz(T * K));
  cpu::topk_rows(z.data(), T, E, K, topk.data());
  EXPECT_EQ(g.topk, topk);
  std::vector<float> sum_chosen(sz(T));
  cpu::chosen_prob_sums(g.p.data(), topk.data(), T, E, K, sum_chosen.data());
  EXPECT_EQ(0, std::memcmp(g.sum_chosen.data(), sum_chosen.data(), sum_chosen.size() * sizeof(float)));
  std::vector<int32_t> counts(sz(E));
  cpu::topk_counts(topk.data(), T, E, K, counts.data());
  EXPECT_EQ(g.topk_counts, counts);

  // Metadata from the CPU's codes on the GPU's p and sum_chosen.
  std::vector<int32_t> code(sz(T * E)), scratch(sz(T * E));
  cpu::mark_topk_pairs(topk.data(), T, E, K, code.data());
  if (cfg.routing == Routing::token_rounding)
    cpu::round_tokens(g.p.data(), g.sum_chosen.data(), T, E, cfg.tile, cfg.rounding_mode, code.data(), scratch.data());
  std::vector<float> den(size_t(T), 1.f);
  if (gates_renormalised(cfg)) den = g.sum_chosen;
  const int64_t R_max = max_routed_rows(cfg, T);
  std::vector<int32_t> row_token(sz(R_max)), token_rows(sz(R_max)), eo(sz(E + 1)), to(sz(T + 1));
  std::vector<float> row_gate(sz(R_max));
  const int64_t R = cpu::build_metadata(code.data(), g.p.data(), den.data(), T, E, scratch.data(),
                                        {row_token.data(), row_gate.data(), eo.data(), to.data(), token_rows.data()});
  row_token.resize(sz(R)), row_gate.resize(sz(R)), token_rows.resize(sz(R));
  EXPECT_EQ(g.expert_offsets, eo);
  EXPECT_EQ(g.token_offsets, to);
  EXPECT_EQ(g.row_token, row_token);
  EXPECT_EQ(g.token_rows, token_rows);
  ASSERT_EQ(g.row_gate.size(), row_gate.size());
  EXPECT_EQ(0, std::memcmp(g.row_gate.data(), row_gate.data(), row_gate.size() * sizeof(float))) << "row_gate bits";
}

MoEConfig routing_config(int64_t E, int64_t K, RouterConvention router = RouterConvention::topk_then_softmax) {
  MoEConfig c;
  c.d = 64;
  c.n = 64;
  c.E = E;
  c.K = K;
  c.router = router;
  return c;
}

// E over every layout of the router kernel (E <= 32, 64, 128, 256, 512, 1024), E not a multiple of
// 32 or of 4 (element-wise loads), K from 1 to 16 and K = E, T below one warp, not a multiple of the
// tokens per block or the 256-pair tile, and past 1024 tiles (the scan's single step). The
// quantised logits tie often, so both the packed-key rounds and their exact fallback run.
TEST(CudaRouting, TopKMatchesCpu) {
  REQUIRE_GPU();
  uint64_t seed = 100;
  for (int64_t E : {8, 40, 64, 128, 256, 512, 1024})
    for (int64_t K : {1, 2, 8, 16})
      for (int64_t T : {1, 5, 31, 33, 1001}) {
        if (K > E) continue;
        expect_routing_matches_cpu(routing_config(E, K), T, seed++);
      }
  expect_routing_matches_cpu(routing_config(8, 8), 77, seed++);  // every expert on every token
  expect_routing_matches_cpu(routing_config(99, 8), 77, seed++);  // rows not 16-byte aligned
  MoEConfig c = routing_config(128, 8, RouterConvention::softmax_then_topk);
  expect_routing_matches_cpu(c, 4099, seed++);
  c.norm_topk_prob = true;
  expect_routing_matches_cpu(c, 513, seed++);
  expect_routing_matches_cpu(routing_config(64, 16), 20000, seed++);  // 1250 pair tiles
}

TEST(CudaRouting, TokenRoundingMatchesCpu) {
  REQUIRE_GPU();
  uint64_t seed = 200;
  for (RoundingMode mode : {RoundingMode::nearest, RoundingMode::up, RoundingMode::down})
    for (int64_t E : {8, 64, 128, 256, 512})
      for (int64_t tile : {8, 128}) {
        MoEConfig c = routing_config(E, E >= 16 ? 8 : 2);
        c.routing = Routing::token_rounding;
        c.rounding_mode = mode;
        c.tile = tile;
        for (int64_t T : {3, 300}) expect_routing_matches_cpu(c, T, seed++);
      }
  MoEConfig c = routing_config(64, 16, RouterConvention::softmax_then_topk);
  c.routing = Routing::token_rounding;
  c.tile = 16;
  expect_routing_matches_cpu(c, 2001, seed++);
}

// Routing given: the pair passes against cpu::build_given_metadata on random ids with sentinels
// (-1, E), duplicates within a token and fp32 weights.
TEST(CudaRouting, GivenPairsMatchCpu) {
  REQUIRE_GPU();
  uint64_t seed = 300;
  for (int64_t E : {8, 64, 256, 1024})
    for (int64_t K : {1, 3, 8, 16})
      for (int64_t T : {1, 31, 257, 3001}) {
        SCOPED_TRACE("E=" + std::to_string(E) + " K=" + std::to_string(K) + " T=" + std::to_string(T));
        std::mt19937_64 rng(seed++);
        std::uniform_int_distribution<int32_t> id(-1, int32_t(E));
        std::uniform_real_distribution<float> weight(0.f, 1.f);
        std::vector<int32_t> ids(sz(T * K));
        std::vector<float> w(ids.size());
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = id(rng), w[i] = weight(rng);
        const int64_t R_max = T * K;
        std::vector<int32_t> row_token(sz(R_max)), token_rows(sz(R_max)), eo(sz(E + 1)),
            to(sz(T + 1)), cursor(sz(E));
        std::vector<float> row_gate(sz(R_max));
        const int64_t R = cpu::build_given_metadata(ids.data(), w.data(), T, E, K, cursor.data(),
                                                    {row_token.data(), row_gate.data(), eo.data(), to.data(),
                                                     token_rows.data()});

        const int64_t scratch_ints = cuda::pair_metadata_scratch_ints(T * K, E);
        DeviceBlock block(size_t(scratch_ints + 5 * R_max + T + E + 2) * 4);
        ASSERT_NE(block.ptr, nullptr);
        int32_t* d = static_cast<int32_t*>(block.ptr);
        int32_t* d_scratch = d;
        int32_t* d_ids = d_scratch + scratch_ints;
        float* d_w = reinterpret_cast<float*>(d_ids + R_max);
        int32_t* d_row_token = reinterpret_cast<int32_t*>(d_w + R_max);
        float* d_row_gate = reinterpret_cast<float*>(d_row_token + R_max);
        int32_t* d_token_rows = reinterpret_cast<int32_t*>(d_row_gate + R_max);
        int32_t* d_to = d_token_rows + R_max;
        int32_t* d_eo = d_to + T + 1;
        CUDA_OK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(d_w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
        cuda::build_pair_metadata(d_ids, d_w, false, T, E, K, d_scratch,
                                  {d_row_token, d_row_gate, d_token_rows, d_to, d_eo}, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_EQ(download(d_eo, E + 1), eo);
        EXPECT_EQ(download(d_to, T + 1), to);
        row_token.resize(sz(R)), row_gate.resize(sz(R)), token_rows.resize(sz(R));
        EXPECT_EQ(download(d_row_token, R), row_token);
        EXPECT_EQ(download(d_row_gate, R), row_gate);
        EXPECT_EQ(download(d_token_rows, R), token_rows);
      }
}

}  // namespace
