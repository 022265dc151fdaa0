// Backward overlapped (dW2, dx_expert and dW1 on the backend's GEMM stream, the router chain, the dx
// gather-sum, the bias sums and the callbacks on the caller's) against backward sequential (every
// step on the caller's stream): the same kernels on the same inputs, so every output must be
// bitwise equal (compared as bytes), whatever SMs the GEMMs leave free: none, the heuristic's, 8,
// or all but one 2-CTA cluster (side_sms past the SM count), which slows the GEMMs so that a missing
// wait shows. Through reference::run_backend (outputs and workspaces poisoned with NaN bytes first):
// top-K under both router conventions with the losses, token rounding, expert biases with
// interleaved W1, a hot and an empty expert, routing given, T = 1, the legacy default stream and a
// non-blocking one, a CUDA-graph capture. Then the in-backward callbacks as the in-backward
// optimizer uses them: dW1 and dW2 in one buffer, each callback snapshots its gradient on the
// stream, then overwrites the weight (an in-place update) and the gradient (the buffer reused):
// the snapshots must equal the gradients of a sequential run without callbacks, in the documented
// order, and dx and d_router too (no step reads a weight after its callback).
// Skipped when no GPU is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "../../src/cuda/backward_overlap.h"
#include "../../src/cuda/gemm_config.h"
#include "graph_launcher.h"
#include "leanmoe/bf16.h"
#include "leanmoe/leanmoe.h"
#include "naive_moe.h"
#include "../reference_checks.h"

namespace {

using namespace leanmoe;
using cuda::BackwardOverlap;
using reference::HostLayerInputs;
using reference::HostLayerOutputs;

#define REQUIRE_GPU() \
  if (!backend_available(Device::cuda)) GTEST_SKIP() << "no CUDA device visible"

// The schedules compared with the sequential one: side SMs (-1: the heuristic's).
constexpr int kSideSms[] = {-1, 0, 8, 100000};

// Restores the library's default schedule when a test ends, passed or not.
struct DefaultScheduleAtExit {
  ~DefaultScheduleAtExit() { cuda::set_backward_overlap(BackwardOverlap{}); }
};

BackwardOverlap sequential() { return {false, -1}; }
BackwardOverlap overlapped(int side_sms) { return {true, side_sms}; }

MoEConfig config() {
  MoEConfig c;
  c.d = 256;
  c.n = 128;
  c.E = 16;
  c.K = 4;
  c.router = RouterConvention::topk_then_softmax;
  c.aux_loss_coef = 0.01f;
  c.z_loss_coef = 0.001f;
  return c;
}

void expect_schedules_agree(const HostLayerInputs& in, const std::string& what, cudaStream_t stream = nullptr,
                            const reference::LayerLauncher& launch = nullptr) {
  SCOPED_TRACE(what + ": " + in.cfg.describe() + " T=" + std::to_string(in.T));
  DefaultScheduleAtExit restore;
  cuda::set_backward_overlap(sequential());
  const HostLayerOutputs ref = reference::run_backend(in, Device::cuda);
  for (int side : kSideSms) {
    SCOPED_TRACE("side_sms " + std::to_string(side));
    cuda::set_backward_overlap(overlapped(side));
    const HostLayerOutputs o = reference::run_backend(in, Device::cuda, stream, launch);
    leanmoe::testing::expect_bitwise_equal(o, ref);
    EXPECT_EQ(o.expert_counts, ref.expert_counts);
  }
}

TEST(BackwardOverlap, RefusesNegativeSideSms) {
  EXPECT_THROW(cuda::set_backward_overlap(overlapped(-2)), Error);
}

TEST(BackwardOverlap, TopKBothConventionsBitwise) {
  REQUIRE_GPU();
  MoEConfig c = config();
  expect_schedules_agree(reference::random_inputs(c, 1000, DType::bf16, 1), "topk_then_softmax");
  c.router = RouterConvention::softmax_then_topk;
  c.norm_topk_prob = true;
  HostLayerInputs in = reference::random_inputs(c, 777, DType::bf16, 2);
  in.d_aux = 0.5f;  // d_losses given
  in.d_z = 0.25f;
  expect_schedules_agree(in, "softmax_then_topk norm, d_losses given");
}

TEST(BackwardOverlap, TokenRoundingBitwise) {
  REQUIRE_GPU();
  MoEConfig c = config();
  c.routing = Routing::token_rounding;
  c.tile = 16;
  expect_schedules_agree(reference::random_inputs(c, 1001, DType::bf16, 3), "token rounding nearest");
  c.rounding_mode = RoundingMode::up;
  expect_schedules_agree(reference::random_inputs(c, 300, DType::bf16, 4), "token rounding up");
}

TEST(BackwardOverlap, BiasesHotAndEmptyExpertsBitwise) {
  REQUIRE_GPU();
  MoEConfig c = config();
  c.interleaved = true;
  HostLayerInputs in = reference::random_inputs(c, 513, DType::bf16, 5);
  reference::add_random_biases(in, 6);
  expect_schedules_agree(in, "biases, interleaved");
  // Expert 2 wins every token's first slot, expert 5 none (x[:, 0] = 1 and router column 0 steer).
  HostLayerInputs steered = reference::random_inputs(c, 257, DType::bf16, 7);
  for (int64_t t = 0; t < steered.T; ++t) steered.x[t * c.d] = 1.f;
  steered.router[2 * c.d] = 20.f;
  steered.router[5 * c.d] = -20.f;
  expect_schedules_agree(steered, "hot expert 2, empty expert 5");
  expect_schedules_agree(reference::random_inputs(c, 1, DType::bf16, 8), "T=1");
}

// The layer's GEMM configurations asked for (cuda::set_layer_gemm_configs, `leanmoe bench
// --gemm-config`) that change only the tile order (varlen-K bands, CUTLASS's order along N) give
// the heuristic's outputs bit for bit, in both schedules; one that is not compiled is refused by
// name. d = 512, n = 384: dW1 3 row tiles, dW2 2 pairs, dx 3 n-tiles (2x1 clusters), so each order
// differs from the default.
TEST(LayerGemmConfigs, TileOrderKeepsOutputsBitwise) {
  REQUIRE_GPU();
  struct DefaultConfigsAtExit {
    ~DefaultConfigsAtExit() { cuda::set_layer_gemm_configs({}); }
  } restore_configs;
  DefaultScheduleAtExit restore_schedule;
  MoEConfig c = config();
  c.d = 512;
  c.n = 384;
  const HostLayerInputs in = reference::random_inputs(c, 700, DType::bf16, 21);
  cuda::set_backward_overlap(sequential());
  const HostLayerOutputs ref = reference::run_backend(in, Device::cuda);
  cuda::set_layer_gemm_configs(cuda::layer_gemm_configs_from(
      "dx=cutlass:pingpong:128x192:auto:tma:c2:rN,dw1=gather:coop:128x256:s4:tma:c2:b2,"
      "dw2=gather:coop:128x256:s4:tma:c2:b3"));
  for (const BackwardOverlap& o : {sequential(), overlapped(-1)}) {
    SCOPED_TRACE(o.overlapped ? "overlapped" : "sequential");
    cuda::set_backward_overlap(o);
    leanmoe::testing::expect_bitwise_equal(reference::run_backend(in, Device::cuda), ref);
  }
  cuda::set_layer_gemm_configs(cuda::layer_gemm_configs_from("up=gather:pingpong:128x128:s6:warp:c1"));
  try {
    reference::run_backend(in, Device::cuda);
    ADD_FAILURE() << "an up configuration that is not compiled ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("up GEMM config 'gather:pingpong:128x128:s6:warp:c1'"), std::string::npos)
        << e.what();
  }
}

TEST(BackwardOverlap, RoutingGivenBitwise) {
  REQUIRE_GPU();
  MoEConfig c = config();
  c.routing = Routing::given;
  HostLayerInputs in = reference::random_inputs(c, 999, DType::bf16, 9);
  reference::add_random_biases(in, 10);
  expect_schedules_agree(in, "routing given");
}

TEST(BackwardOverlap, NonBlockingStreamAndGraphCaptureBitwise) {
  REQUIRE_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  MoEConfig c = config();
  const HostLayerInputs in = reference::random_inputs(c, 1000, DType::bf16, 11);
  expect_schedules_agree(in, "non-blocking stream", stream);
  expect_schedules_agree(in, "forward + backward in one graph", stream, leanmoe::testing::graph_launcher(stream));
  c.routing = Routing::given;
  expect_schedules_agree(reference::random_inputs(c, 1000, DType::bf16, 12), "routing given in one graph", stream,
                         leanmoe::testing::graph_launcher(stream));
  cudaStreamDestroy(stream);
}

// ---- in-backward callbacks --------------------------------------------------------------------

Buffer upload_bf16(const std::vector<float>& v) {
  std::vector<bf16> host(v.size());
  for (size_t i = 0; i < v.size(); ++i) host[i] = float_to_bf16(v[i]);
  Buffer b(Device::cuda, host.size() * sizeof(bf16));
  if (!host.empty()) copy_to_device(Device::cuda, b.data(), host.data(), b.bytes());
  return b;
}

std::vector<unsigned char> bytes_of(const void* p, size_t n) {
  std::vector<unsigned char> v(n);
  if (n) copy_to_host(Device::cuda, v.data(), p, n);
  return v;
}

TEST(BackwardOverlap, InBackwardCallbacksSeeFinalGradientsAndMayOverwriteWeights) {
  REQUIRE_GPU();
  DefaultScheduleAtExit restore;
  const MoEConfig c = config();
  const int64_t T = 1000, d = c.d, n = c.n, E = c.E, W = up_width(c);
  HostLayerInputs in = reference::random_inputs(c, T, DType::bf16, 20);
  reference::add_random_biases(in, 21);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

  const Buffer x = upload_bf16(in.x), d_out = upload_bf16(in.d_out), wr = upload_bf16(in.router);
  std::map<ExpertWeight, Buffer> weight;
  auto upload_weights = [&] {
    weight[ExpertWeight::gate_up_proj] = upload_bf16(in.gate_up);
    weight[ExpertWeight::down_proj] = upload_bf16(in.down);
    weight[ExpertWeight::gate_up_bias] = upload_bf16(in.gate_up_bias);
    weight[ExpertWeight::down_bias] = upload_bf16(in.down_bias);
  };
  upload_weights();
  auto weights = [&] {
    return MoEWeights{wr.view(DType::bf16, {E, d}), weight[ExpertWeight::gate_up_proj].view(DType::bf16, {E, W, d}),
                      weight[ExpertWeight::down_proj].view(DType::bf16, {E, d, n}),
                      weight[ExpertWeight::gate_up_bias].view(DType::bf16, {E, W}),
                      weight[ExpertWeight::down_bias].view(DType::bf16, {E, d})};
  };
  LayerMemory mem(c, T, DType::bf16, Device::cuda);
  Buffer out(Device::cuda, size_t(T * d) * 2);
  forward(c, x.view(DType::bf16, {T, d}), weights(), out.view(DType::bf16, {T, d}), Tensor{}, mem.saved(),
          mem.forward_workspace(), stream);

  // dx, d_router and the four expert gradients; with `shared`, dW2 lives in dW1's buffer.
  struct Grads {
    Buffer dx, d_router, d_gate_up, d_down, d_gate_up_bias, d_down_bias;
    MoEGrads view(const MoEConfig& c, int64_t T, bool shared) const {
      const int64_t d = c.d, n = c.n, E = c.E, W = up_width(c);
      return {dx.view(DType::bf16, {T, d}),
              d_router.view(DType::bf16, {E, d}),
              d_gate_up.view(DType::bf16, {E, W, d}),
              (shared ? d_gate_up : d_down).view(DType::bf16, {E, d, n}),
              d_gate_up_bias.view(DType::bf16, {E, W}),
              d_down_bias.view(DType::bf16, {E, d})};
    }
  };
  auto make_grads = [&] {
    return Grads{Buffer(Device::cuda, size_t(T * d) * 2), Buffer(Device::cuda, size_t(E * d) * 2),
                 Buffer(Device::cuda, size_t(E * W * d) * 2), Buffer(Device::cuda, size_t(E * d * n) * 2),
                 Buffer(Device::cuda, size_t(E * W) * 2), Buffer(Device::cuda, size_t(E * d) * 2)};
  };

  cuda::set_backward_overlap(sequential());
  const Grads ref = make_grads();
  const MoEGrads rg = ref.view(c, T, false);
  backward(c, d_out.view(DType::bf16, {T, d}), Tensor{}, weights(), mem.saved(), rg, mem.backward_workspace(),
           nullptr, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::map<ExpertWeight, std::vector<unsigned char>> expected = {
      {ExpertWeight::gate_up_proj, bytes_of(rg.d_gate_up_proj.data, rg.d_gate_up_proj.nbytes())},
      {ExpertWeight::down_proj, bytes_of(rg.d_down_proj.data, rg.d_down_proj.nbytes())},
      {ExpertWeight::gate_up_bias, bytes_of(rg.d_gate_up_bias.data, rg.d_gate_up_bias.nbytes())},
      {ExpertWeight::down_bias, bytes_of(rg.d_down_bias.data, rg.d_down_bias.nbytes())}};
  const std::vector<unsigned char> expected_dx = bytes_of(rg.dx.data, rg.dx.nbytes()),
                                   expected_dr = bytes_of(rg.d_router.data, rg.d_router.nbytes());

  std::vector<BackwardOverlap> schedules = {sequential()};
  for (int side : kSideSms) schedules.push_back(overlapped(side));
  for (const BackwardOverlap& schedule : schedules) {
    SCOPED_TRACE(std::string(schedule.overlapped ? "overlapped, side_sms " : "sequential") +
                 (schedule.overlapped ? std::to_string(schedule.side_sms) : ""));
    cuda::set_backward_overlap(schedule);
    upload_weights();  // the previous round's callbacks overwrote them
    const Grads grads = make_grads();
    const MoEGrads g = grads.view(c, T, /*shared=*/true);
    std::map<ExpertWeight, Buffer> snapshot;
    std::vector<ExpertWeight> order;
    const ExpertGradCallback callback = [&](ExpertWeight which, const Tensor& grad) {
      order.push_back(which);
      Buffer& snap = snapshot[which] = Buffer(Device::cuda, grad.nbytes());
      ASSERT_EQ(cudaMemcpyAsync(snap.data(), grad.data, grad.nbytes(), cudaMemcpyDeviceToDevice, stream), cudaSuccess);
      const Buffer& w = weight.at(which);
      ASSERT_EQ(cudaMemsetAsync(w.data(), 0xFF, w.bytes(), stream), cudaSuccess);  // NaN: "updated in place"
      ASSERT_EQ(cudaMemsetAsync(grad.data, 0xFF, grad.nbytes(), stream), cudaSuccess);  // the buffer reused
    };
    backward(c, d_out.view(DType::bf16, {T, d}), Tensor{}, weights(), mem.saved(), g, mem.backward_workspace(),
             callback, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(order, (std::vector<ExpertWeight>{ExpertWeight::down_proj, ExpertWeight::down_bias,
                                                ExpertWeight::gate_up_proj, ExpertWeight::gate_up_bias}));
    for (auto& [which, snap] : snapshot)
      EXPECT_TRUE(bytes_of(snap.data(), snap.bytes()) == expected.at(which)) << "gradient " << int(which);
    EXPECT_TRUE(bytes_of(g.dx.data, g.dx.nbytes()) == expected_dx) << "dx";
    EXPECT_TRUE(bytes_of(g.d_router.data, g.d_router.nbytes()) == expected_dr) << "d_router";
  }
  cudaStreamDestroy(stream);
}

}  // namespace
