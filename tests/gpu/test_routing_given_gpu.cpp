// Routing given by the caller on the CUDA backend against the CPU backend, end to end through
// reference::run_backend (outputs and workspaces poisoned with NaN bytes first): the metadata
// built from the caller's ids (rows per expert must be equal, not close), the output, dx, both
// expert weight gradients and d_topk_weights (the dS scatter), on random routings, sentinel ids,
// a token without experts, an expert listed twice, one expert taking every row, empty experts,
// T = 0, 1 and many tiles, bf16 and f32 routing weights; a CUDA graph capture; every activation x
// expert biases on/off x W1 row order x weight layout; and gpt-oss's experts (clamped SwiGLU,
// interleaved, transposed, biases) at a width with partial tiles. Skipped when no GPU is visible.
//
// Tolerance: as tests/gpu/test_cuda_backend.cpp (kBf16Tol = 2e-2; both backends round at the same
// points and differ by fp32 summation order). d_topk_weights is dS itself: the GPU sums it from
// per-column-tile partials of the dH epilogue, the CPU row by row, both <dA', a> in fp32.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "../../src/activation.h"
#include "leanmoe/leanmoe.h"
#include "graph_launcher.h"
#include "naive_moe.h"

namespace {

using namespace leanmoe;
using reference::HostLayerInputs;
using reference::HostLayerOutputs;

constexpr double kBf16Tol = 2e-2;

#define REQUIRE_GPU() \
  if (!backend_available(Device::cuda)) GTEST_SKIP() << "no CUDA device visible"

MoEConfig given_config(int64_t E = 8, int64_t K = 2) {
  MoEConfig c;
  c.d = 128;  // the expert GEMMs take multiples of 64
  c.n = 64;
  c.E = E;
  c.K = K;
  c.routing = Routing::given;
  return c;
}

void expect_same(const HostLayerInputs& in, const std::string& what) {
  SCOPED_TRACE(what + ": " + in.cfg.describe() + " T=" + std::to_string(in.T));
  const HostLayerOutputs cpu = reference::run_backend(in, Device::cpu);
  const HostLayerOutputs gpu = reference::run_backend(in, Device::cuda);
  EXPECT_EQ(gpu.expert_counts, cpu.expert_counts);
  EXPECT_EQ(gpu.topk_counts, cpu.topk_counts);
  EXPECT_LE(reference::rel_error(gpu.out, cpu.out), kBf16Tol) << "out";
  EXPECT_LE(reference::rel_error(gpu.dx, cpu.dx), kBf16Tol) << "dx";
  EXPECT_LE(reference::rel_error(gpu.d_gate_up, cpu.d_gate_up), kBf16Tol) << "d_gate_up";
  EXPECT_LE(reference::rel_error(gpu.d_down, cpu.d_down), kBf16Tol) << "d_down";
  EXPECT_LE(reference::rel_error(gpu.d_topk_weights, cpu.d_topk_weights), kBf16Tol) << "d_topk_weights";
  EXPECT_LE(reference::rel_error(gpu.d_gate_up_bias, cpu.d_gate_up_bias), kBf16Tol) << "d_gate_up_bias";
  EXPECT_LE(reference::rel_error(gpu.d_down_bias, cpu.d_down_bias), kBf16Tol) << "d_down_bias";
  for (size_t i = 0; i < in.topk_experts.size(); ++i)
    if (in.topk_experts[i] < 0 || in.topk_experts[i] >= in.cfg.E)
      EXPECT_EQ(gpu.d_topk_weights[i], 0.f) << "sentinel slot " << i;
}

HostLayerInputs inputs(const MoEConfig& c, int64_t T, uint64_t seed) {
  return reference::random_inputs(c, T, DType::bf16, seed);
}

TEST(CudaRoutingGiven, RandomRouting) {
  REQUIRE_GPU();
  expect_same(inputs(given_config(), 300, 1), "E=8 K=2");
  expect_same(inputs(given_config(16, 4), 1000, 2), "E=16 K=4, T not a multiple of the tile");
}

// f32 weights over bf16 storage: d_topk_weights comes back in f32.
TEST(CudaRoutingGiven, Fp32Weights) {
  REQUIRE_GPU();
  HostLayerInputs in = inputs(given_config(), 257, 3);
  in.weights_dtype = DType::f32;
  for (float& w : in.topk_weights) w *= 1.0001f;
  expect_same(in, "f32 weights");
}

TEST(CudaRoutingGiven, SentinelsAndATokenWithoutExperts) {
  REQUIRE_GPU();
  const MoEConfig c = given_config(8, 3);
  HostLayerInputs in = inputs(c, 301, 4);
  const int32_t sentinels[] = {-1, 8, 1 << 30, std::numeric_limits<int32_t>::min()};
  for (int64_t t = 0; t < in.T; ++t)
    if (t % 3 != 1) in.topk_experts[t * 3 + t % 3] = sentinels[t % 4];
  for (int64_t k = 0; k < 3; ++k) in.topk_experts[7 * 3 + k] = -1;
  expect_same(in, "sentinels");
}

TEST(CudaRoutingGiven, ExpertListedTwiceAndHotAndEmptyExperts) {
  REQUIRE_GPU();
  HostLayerInputs in = inputs(given_config(), 200, 5);
  for (int64_t t = 0; t < in.T; t += 2) in.topk_experts[t * 2 + 1] = in.topk_experts[t * 2];
  expect_same(in, "duplicates");
  HostLayerInputs hot = inputs(given_config(8, 1), 333, 6);
  for (int32_t& e : hot.topk_experts) e = 6;  // every row on expert 6, the others empty
  expect_same(hot, "one expert takes every row");
  HostLayerInputs both = inputs(given_config(8, 2), 129, 7);
  for (int32_t& e : both.topk_experts) e = 2;  // every token lists expert 2 twice
  expect_same(both, "expert 2 twice per token");
}

// Past one block of the metadata scans (256 tiles of 32 tokens, 4096 token counts).
TEST(CudaRoutingGiven, ManyTokensAndExperts) {
  REQUIRE_GPU();
  expect_same(inputs(given_config(64, 4), 9000, 8), "T=9000 E=64");
  expect_same(inputs(given_config(256, 8), 2000, 9), "T=2000 E=256 K=8");
}

TEST(CudaRoutingGiven, SingleTokenAndNoTokens) {
  REQUIRE_GPU();
  expect_same(inputs(given_config(), 1, 10), "T=1");
  const HostLayerOutputs none = reference::run_backend(inputs(given_config(), 0, 11), Device::cuda);
  EXPECT_TRUE(none.out.empty() && none.dx.empty() && none.d_topk_weights.empty());
  for (float v : none.d_gate_up) ASSERT_EQ(v, 0.f);
  for (float v : none.d_down) ASSERT_EQ(v, 0.f);
}

// forward_routed + backward_routed captured into one CUDA graph in global capture mode (no host
// synchronisation), then replayed bit for bit equal to the eager run.
TEST(CudaRoutingGiven, CaptureIntoOneGraph) {
  REQUIRE_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const reference::LayerLauncher in_a_graph = leanmoe::testing::graph_launcher(stream);
  HostLayerInputs in = inputs(given_config(), 333, 12);
  in.topk_experts[5] = -1;
  const HostLayerOutputs eager = reference::run_backend(in, Device::cuda);
  const HostLayerOutputs graph = reference::run_backend(in, Device::cuda, stream, in_a_graph);
  EXPECT_EQ(graph.out, eager.out);
  EXPECT_EQ(graph.dx, eager.dx);
  EXPECT_EQ(graph.d_gate_up, eager.d_gate_up);
  EXPECT_EQ(graph.d_down, eager.d_down);
  EXPECT_EQ(graph.d_topk_weights, eager.d_topk_weights);
  cudaStreamDestroy(stream);
}

// Every activation (gated and plain), with and without both expert biases, both row orders of
// W1 for the gated ones, both weight layouts (HF [E, W, d] / [E, d, n], transposed [E, d, W] /
// [E, n, d]): ragged routing with T not a multiple of 128, an empty expert (expert 3 listed by no
// token), one expert taking every row, and T = 0. H, dH, the bias gradients and dS's <dO, b2> term
// all come through the outputs compared (out, dx, both weight and bias gradients, d_topk_weights).
std::vector<MoEConfig> every_expert_function(int64_t E = 8, int64_t K = 2) {
  std::vector<MoEConfig> configs;
  for (Activation a : leanmoe::act::kAll)
    for (bool interleaved : {false, true})
      for (bool transposed : {false, true}) {
        if (interleaved && !activation_is_gated(a)) continue;
        MoEConfig c = given_config(E, K);
        c.activation = a;
        c.interleaved = interleaved;
        c.transposed = transposed;
        // inside the pre-activations' range: both clamps (or up's soft cap) act
        if (a == Activation::swiglu_clamped || a == Activation::swiglu_softcapped) c.act_limit = 1.5f;
        configs.push_back(c);
      }
  return configs;
}

TEST(CudaRoutingGiven, EveryActivationBiasAndLayout) {
  REQUIRE_GPU();
  uint64_t seed = 100;
  for (const MoEConfig& c : every_expert_function())
    for (bool biased : {false, true}) {
      const std::string what = std::string(biased ? "biased" : "no bias");
      auto with_biases = [&](HostLayerInputs in) {
        if (biased) reference::add_random_biases(in, seed++);
        return in;
      };
      HostLayerInputs ragged = inputs(c, 300, seed++);
      for (int32_t& e : ragged.topk_experts)
        if (e == 3) e = 4;  // expert 3 empty
      expect_same(with_biases(ragged), what + ", ragged, expert 3 empty");
      HostLayerInputs hot = inputs(c, 257, seed++);
      for (int32_t& e : hot.topk_experts) e = 5;  // every row on expert 5
      expect_same(with_biases(hot), what + ", one expert takes every row");
      const HostLayerOutputs none = reference::run_backend(with_biases(inputs(c, 0, seed++)), Device::cuda);
      for (float v : none.d_gate_up) ASSERT_EQ(v, 0.f);
      for (float v : none.d_down) ASSERT_EQ(v, 0.f);
      for (float v : none.d_gate_up_bias) ASSERT_EQ(v, 0.f);
      for (float v : none.d_down_bias) ASSERT_EQ(v, 0.f);
    }
}

// Wider n than one up tile (n = 192: the gated tile takes 128 gate columns, the plain one 256
// columns; the last column tile is partial) and more tiles of rows.
TEST(CudaRoutingGiven, EveryActivationWideN) {
  REQUIRE_GPU();
  uint64_t seed = 400;
  for (MoEConfig c : every_expert_function(16, 4)) {
    c.n = 192;
    c.d = 192;
    HostLayerInputs in = inputs(c, 1000, seed++);
    reference::add_random_biases(in, seed++);
    expect_same(in, "n = d = 192, biased");
  }
}

// gpt-oss's experts as its checkpoints store them (clamped SwiGLU over interleaved gate/up columns,
// both biases, the transposed layout), read in place, at d = n = 320: like gpt-oss's 2880, not a
// multiple of 128, so every GEMM ends in a partial tile; sentinel ids and an empty expert.
TEST(CudaRoutingGiven, GptOssExperts) {
  REQUIRE_GPU();
  MoEConfig c = given_config(16, 4);
  c.d = c.n = 320;
  c.activation = Activation::swiglu_clamped;
  c.act_limit = 1.5f;
  c.interleaved = c.transposed = true;
  ASSERT_EQ(unsupported_reason(c, DType::bf16, Device::cuda, true), "");
  HostLayerInputs in = inputs(c, 700, 15);
  reference::add_random_biases(in, 16);
  for (int64_t t = 0; t < in.T; ++t) {
    if (t % 7 == 0) in.topk_experts[t * 4 + 1] = -1;
    for (int64_t k = 0; k < 4; ++k)
      if (in.topk_experts[t * 4 + k] == 9) in.topk_experts[t * 4 + k] = 10;  // expert 9 empty
  }
  expect_same(in, "gpt-oss experts, d = n = 320");
}

}  // namespace
