// The CUDA backend against the CPU backend, end to end through reference::run_backend (which
// poisons every output and workspace with NaN bytes first, so an unwritten element fails): forward
// output, both losses, every gradient, and the routing itself (rows per expert after routing and
// the plain top-K counts must be equal, not close: both backends pin the same tie-breaks).
// Fresh random bf16 inputs per case; skipped when no GPU is visible.
//
// Tolerances. Both backends round to bf16 at the same points (docs/DESIGN.md), so they differ only
// through fp32 summation order (tensor-core vs OpenBLAS GEMM reductions, the order of the fp32
// sums): that flips single bf16 roundings (one bf16 step is 2^-8 = 3.9e-3 relative) in a fraction
// of the elements and the flips propagate through backward's chain (H -> dH -> dX, dW1). Measured
// differences are a few 1e-3; kBf16Tol = 2e-2 keeps a 4x margin while any indexing or routing
// error is O(1). The losses are fp32 reductions of fp32 values: kLossTol = 1e-4.
//
// No host synchronisation in forward/backward: ForwardAndBackwardCaptureIntoOneGraph captures both
// into one CUDA graph in global capture mode, where any host-synchronising call (a device-to-host
// copy, a stream, event or device synchronise, cudaMalloc) invalidates the capture.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
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
constexpr double kLossTol = 1e-4;

bool have_cuda() { return backend_available(Device::cuda); }

#define REQUIRE_GPU() \
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device visible"

MoEConfig base_config() {
  MoEConfig c;
  c.d = 128;  // the expert GEMMs take multiples of 64
  c.n = 64;
  c.E = 8;
  c.K = 2;
  return c;
}

// A constant input feature (x[:, 0] = 1) and router column 0 steer experts: a boost of +20 makes
// `hot` win every token's first slot, -20 keeps `cold` out of every top-K (logits elsewhere are
// ~N(0, 1)). The boosts are exact in bf16.
void steer(HostLayerInputs& in, int hot, int cold, float hot_boost = 20.f) {
  const int64_t d = in.cfg.d;
  for (int64_t t = 0; t < in.T; ++t) in.x[t * d] = 1.f;
  if (hot >= 0) in.router[hot * d] = hot_boost;
  if (cold >= 0) in.router[cold * d] = -20.f;
}

double rel_loss_error(float a, float b) { return std::fabs(double(a) - b) / std::max(1e-6, std::fabs(double(b))); }

void expect_same(const HostLayerInputs& in, const std::string& what) {
  SCOPED_TRACE(what + ": " + in.cfg.describe() + " T=" + std::to_string(in.T));
  const HostLayerOutputs cpu = reference::run_backend(in, Device::cpu);
  const HostLayerOutputs gpu = reference::run_backend(in, Device::cuda);
  EXPECT_EQ(gpu.topk_counts, cpu.topk_counts);
  EXPECT_EQ(gpu.expert_counts, cpu.expert_counts);
  EXPECT_LE(reference::rel_error(gpu.out, cpu.out), kBf16Tol) << "out";
  EXPECT_LE(reference::rel_error(gpu.dx, cpu.dx), kBf16Tol) << "dx";
  EXPECT_LE(reference::rel_error(gpu.d_router, cpu.d_router), kBf16Tol) << "d_router";
  EXPECT_LE(reference::rel_error(gpu.d_gate_up, cpu.d_gate_up), kBf16Tol) << "d_gate_up";
  EXPECT_LE(reference::rel_error(gpu.d_down, cpu.d_down), kBf16Tol) << "d_down";
  EXPECT_LE(reference::rel_error(gpu.d_gate_up_bias, cpu.d_gate_up_bias), kBf16Tol) << "d_gate_up_bias";
  EXPECT_LE(reference::rel_error(gpu.d_down_bias, cpu.d_down_bias), kBf16Tol) << "d_down_bias";
  EXPECT_LE(rel_loss_error(gpu.aux_loss, cpu.aux_loss), kLossTol) << "aux " << gpu.aux_loss << " vs " << cpu.aux_loss;
  EXPECT_LE(rel_loss_error(gpu.z_loss, cpu.z_loss), kLossTol) << "z " << gpu.z_loss << " vs " << cpu.z_loss;
}

void expect_same(const MoEConfig& cfg, int64_t T, uint64_t seed, const std::string& what) {
  expect_same(reference::random_inputs(cfg, T, DType::bf16, seed), what);
}

TEST(CudaBackend, TopKRaggedBothConventions) {
  REQUIRE_GPU();
  MoEConfig c = base_config();
  c.aux_loss_coef = 0.01f;
  c.z_loss_coef = 0.001f;
  c.router = RouterConvention::softmax_then_topk;
  expect_same(c, 300, 1, "softmax_then_topk");
  c.norm_topk_prob = true;
  expect_same(c, 300, 2, "softmax_then_topk norm");
  c.router = RouterConvention::topk_then_softmax;
  c.norm_topk_prob = false;
  expect_same(c, 300, 3, "topk_then_softmax");
}

TEST(CudaBackend, TokensNotAMultipleOfTheTile) {
  REQUIRE_GPU();
  MoEConfig c = base_config();
  c.E = 16;
  c.K = 4;
  c.d = 192;
  c.n = 128;
  c.router = RouterConvention::topk_then_softmax;
  expect_same(c, 1000, 4, "T=1000");
}

// Past the single-step sizes of the metadata scans (256 tiles of 32 tokens, 4096 token counts).
TEST(CudaBackend, ManyTokensAndExperts) {
  REQUIRE_GPU();
  MoEConfig c = base_config();
  c.E = 64;
  c.K = 4;
  c.aux_loss_coef = 0.01f;
  expect_same(c, 9000, 40, "T=9000 top-K");
  c.routing = Routing::token_rounding;
  expect_same(c, 9000, 41, "T=9000 rounding");
}

TEST(CudaBackend, SingleToken) {
  REQUIRE_GPU();
  MoEConfig c = base_config();
  c.aux_loss_coef = 0.02f;
  expect_same(c, 1, 5, "T=1 top-K");
  c.routing = Routing::token_rounding;
  c.tile = 4;
  c.rounding_mode = RoundingMode::up;
  expect_same(c, 1, 6, "T=1 rounding up");
}

TEST(CudaBackend, EmptyExpertAndHotExpert) {
  REQUIRE_GPU();
  MoEConfig c = base_config();
  c.aux_loss_coef = 0.01f;
  c.z_loss_coef = 0.001f;
  HostLayerInputs in = reference::random_inputs(c, 257, DType::bf16, 7);
  steer(in, /*hot=*/2, /*cold=*/5);
  expect_same(in, "hot expert 2, empty expert 5");

  // One expert takes every row.
  c.K = 1;
  c.router = RouterConvention::topk_then_softmax;
  HostLayerInputs all = reference::random_inputs(c, 200, DType::bf16, 8);
  steer(all, /*hot=*/6, /*cold=*/-1);
  expect_same(all, "every token on expert 6");
}

// The fused router with every activation (gated and plain), with and without both expert biases
// (b1 inside H, b2 in the aggregation, <dO, b2> in dS and so in d_router), both row orders of W1
// for the gated ones, both weight layouts (transposed: gpt-oss's [E, d, W] and [E, n, d], read in
// place, gradients in that layout): ragged top-K with T not a multiple of 128, a hot and an empty
// expert, one expert taking every row, token rounding, and T = 0 (the bias gradients 0).
TEST(CudaBackend, EveryActivationBiasAndLayout) {
  REQUIRE_GPU();
  uint64_t seed = 1000;
  for (Activation a : leanmoe::act::kAll)
    for (bool interleaved : {false, true})
      for (bool biased : {false, true})
        for (bool transposed : {false, true}) {
          if (interleaved && !activation_is_gated(a)) continue;
          MoEConfig c = base_config();
          c.activation = a;
          c.interleaved = interleaved;
          c.transposed = transposed;
          // both clamps (or up's soft cap) act on these pre-activations
          if (a == Activation::swiglu_clamped || a == Activation::swiglu_softcapped) c.act_limit = 1.5f;
          c.aux_loss_coef = 0.01f;
          c.z_loss_coef = 0.001f;
          const std::string what = std::string(biased ? "biased" : "no bias");
          auto make = [&](const MoEConfig& cfg, int64_t T) {
            HostLayerInputs in = reference::random_inputs(cfg, T, DType::bf16, seed++);
            if (biased) reference::add_random_biases(in, seed++);
            return in;
          };
          expect_same(make(c, 300), what + ", ragged top-K");
          HostLayerInputs steered = make(c, 257);
          steer(steered, /*hot=*/2, /*cold=*/5);
          expect_same(steered, what + ", hot expert 2, empty expert 5");
          MoEConfig one = c;
          one.K = 1;
          one.router = RouterConvention::topk_then_softmax;
          HostLayerInputs all = make(one, 200);
          steer(all, /*hot=*/6, /*cold=*/-1);
          expect_same(all, what + ", every token on expert 6");
          MoEConfig rounded = c;
          rounded.routing = Routing::token_rounding;
          rounded.tile = 16;
          expect_same(make(rounded, 301), what + ", token rounding");
          const HostLayerOutputs none = reference::run_backend(make(c, 0), Device::cuda);
          for (float v : none.d_gate_up_bias) ASSERT_EQ(v, 0.f);
          for (float v : none.d_down_bias) ASSERT_EQ(v, 0.f);
        }
}

// DeepSeek-V4's experts (and GLM-5-Next's, HY-V4's): silu(min(g, l)) clamp(u, -l, l), swiglu_clamped
// with alpha 1 and up offset 0, [gate; up] in the HF layout without biases, as the model has them,
// and interleaved, transposed with biases; the limit inside the pre-activations' range.
TEST(CudaBackend, DeepSeekV4ClampedSwiGLU) {
  REQUIRE_GPU();
  uint64_t seed = 1900;
  for (bool other_layout : {false, true}) {
    MoEConfig c = base_config();
    c.activation = Activation::swiglu_clamped;
    c.act_alpha = 1.f;
    c.act_limit = 1.5f;
    c.act_up_offset = 0.f;
    c.interleaved = c.transposed = other_layout;
    c.aux_loss_coef = 0.01f;
    HostLayerInputs in = reference::random_inputs(c, 300, DType::bf16, seed++);
    if (other_layout) reference::add_random_biases(in, seed++);
    expect_same(in, other_layout ? "interleaved, transposed, biased" : "DeepSeek-V4's layout");
  }
}

TEST(CudaBackend, TokenRoundingAllModes) {
  REQUIRE_GPU();
  MoEConfig c = base_config();
  c.routing = Routing::token_rounding;
  c.aux_loss_coef = 0.01f;
  c.z_loss_coef = 0.001f;
  uint64_t seed = 10;
  for (RoundingMode mode : {RoundingMode::nearest, RoundingMode::up, RoundingMode::down}) {
    c.rounding_mode = mode;
    c.tile = 128;
    c.norm_topk_prob = mode != RoundingMode::up;
    expect_same(c, 1000, seed++, std::string("tile 128 ") + rounding_mode_name(mode));
    c.tile = 8;
    c.router = mode == RoundingMode::down ? RouterConvention::topk_then_softmax : RouterConvention::softmax_then_topk;
    expect_same(c, 300, seed++, std::string("tile 8 ") + rounding_mode_name(mode));
  }
}

// T < tile (issue 14 item 1): the targets are 0 and T; 'up' never lowers a count (every chosen
// expert takes all T tokens), 'nearest' gives T to an expert chosen by >= T/2 tokens, 'down' 0.
TEST(CudaBackend, TokenRoundingFewerTokensThanTheTile) {
  REQUIRE_GPU();
  MoEConfig c = base_config();
  c.routing = Routing::token_rounding;
  c.tile = 128;
  c.aux_loss_coef = 0.01f;
  const int64_t T = 100;
  uint64_t seed = 60;
  for (RoundingMode mode : {RoundingMode::nearest, RoundingMode::up, RoundingMode::down}) {
    c.rounding_mode = mode;
    HostLayerInputs in = reference::random_inputs(c, T, DType::bf16, seed++);
    steer(in, /*hot=*/1, /*cold=*/4, /*hot_boost=*/2.f);
    expect_same(in, std::string("T=100 tile 128 ") + rounding_mode_name(mode));
    const HostLayerOutputs gpu = reference::run_backend(in, Device::cuda);
    for (int64_t e = 0; e < c.E; ++e) {
      const int64_t f = gpu.topk_counts[e], r = gpu.expert_counts[e];
      SCOPED_TRACE(std::string(rounding_mode_name(mode)) + " expert " + std::to_string(e) + " f " + std::to_string(f));
      if (mode == RoundingMode::up) EXPECT_EQ(r, f > 0 ? T : 0);
      if (mode == RoundingMode::nearest) EXPECT_EQ(r, 2 * f >= T ? T : 0);
      if (mode == RoundingMode::down) EXPECT_EQ(r, 0);
    }
    EXPECT_EQ(gpu.expert_counts[1], mode == RoundingMode::down ? 0 : T) << "the hot expert";
  }
}

TEST(CudaBackend, TokenRoundingWithEmptyExpert) {
  REQUIRE_GPU();
  MoEConfig c = base_config();
  c.routing = Routing::token_rounding;
  c.tile = 16;
  HostLayerInputs in = reference::random_inputs(c, 250, DType::bf16, 20);
  // A moderate boost: with +20 the hot expert's priorities q = p / sum_chosen all round to 1 in
  // fp32, and which of those tied tokens rounding drops would then hinge on the last bit of the
  // logits, which cuBLAS and OpenBLAS sum in different orders. The counts would still agree.
  steer(in, /*hot=*/0, /*cold=*/3, /*hot_boost=*/2.f);
  expect_same(in, "rounding, hot 0, cold 3");
}

TEST(CudaBackend, ExplicitLossWeights) {
  REQUIRE_GPU();
  MoEConfig c = base_config();
  c.aux_loss_coef = 0.01f;
  HostLayerInputs in = reference::random_inputs(c, 200, DType::bf16, 30);
  in.d_aux = 0.5f;  // differs from the config: run_backend passes d_losses
  in.d_z = 0.25f;
  expect_same(in, "d_losses given");
}

// Forward + backward captured into one CUDA graph on a non-blocking stream in global capture mode
// (any host-synchronising call in either would invalidate the capture: the issue's "no host
// synchronisation anywhere"), then launched once on freshly poisoned outputs and workspaces. The
// graph must reproduce the eager run on the default stream bit for bit: same kernels, same inputs,
// and no atomics whose order could change a float (integer counts only).
// cfg.check_finite stays off: that check is host-synchronising by nature (a host bool).
TEST(CudaBackend, ForwardAndBackwardCaptureIntoOneGraph) {
  REQUIRE_GPU();
  MoEConfig c = base_config();
  c.aux_loss_coef = 0.01f;
  c.z_loss_coef = 0.001f;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const reference::LayerLauncher in_a_graph = leanmoe::testing::graph_launcher(stream);
  uint64_t seed = 50;
  for (Routing routing : {Routing::topk, Routing::token_rounding}) {
    c.routing = routing;
    c.tile = 16;
    SCOPED_TRACE(c.describe());
    const HostLayerInputs in = reference::random_inputs(c, 333, DType::bf16, seed++);
    const HostLayerOutputs eager = reference::run_backend(in, Device::cuda);
    const HostLayerOutputs graph = reference::run_backend(in, Device::cuda, stream, in_a_graph);
    EXPECT_EQ(graph.out, eager.out);
    EXPECT_EQ(graph.aux_loss, eager.aux_loss);
    EXPECT_EQ(graph.z_loss, eager.z_loss);
    EXPECT_EQ(graph.dx, eager.dx);
    EXPECT_EQ(graph.d_router, eager.d_router);
    EXPECT_EQ(graph.d_gate_up, eager.d_gate_up);
    EXPECT_EQ(graph.d_down, eager.d_down);
    EXPECT_EQ(graph.expert_counts, eager.expert_counts);
  }
  cudaStreamDestroy(stream);
}

TEST(CudaBackend, RejectsF32Storage) {
  REQUIRE_GPU();
  const MoEConfig c = base_config();
  const int64_t T = 4;
  LayerMemory mem(c, T, DType::f32, Device::cuda);
  Buffer x(Device::cuda, T * c.d * 4), out(Device::cuda, T * c.d * 4), wr(Device::cuda, c.E * c.d * 4),
      w1(Device::cuda, c.E * 2 * c.n * c.d * 4), w2(Device::cuda, c.E * c.d * c.n * 4);
  const MoEWeights w{wr.view(DType::f32, {c.E, c.d}), w1.view(DType::f32, {c.E, 2 * c.n, c.d}),
                     w2.view(DType::f32, {c.E, c.d, c.n})};
  try {
    forward(c, x.view(DType::f32, {T, c.d}), w, out.view(DType::f32, {T, c.d}), Tensor{}, mem.saved(),
            mem.forward_workspace());
    FAIL() << "f32 storage on cuda was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16 only"), std::string::npos) << e.what();
  }
}

}  // namespace
