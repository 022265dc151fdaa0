// The CUDA FP8 layer with the weights' codes given (cfg.fp8_weights_given, MoEWeights::fp8) against
// the same layer quantizing them per call. Tolerance: none. The given codes are the expert
// optimizer's FP8 copy, bit-exact with fp8_quantize_blocks (tests/gpu/test_optim_fp8_gpu.cpp), and
// the GEMMs are deterministic (OptimGpuStack.StandardStackIsReproducible), so every output and
// gradient must be equal bit for bit. Also: the workspaces drop the weight codes, and the MoEStack's
// copy on the GPU (tests/fp8_weights_stack.h) in both update modes, whose in-backward updates
// rewrite the codes between dH/dX and the next step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "../expect_error.h"
#include "../fp8_weights_stack.h"
#include "leanmoe/leanmoe.h"
#include "naive_moe.h"

namespace {

using namespace leanmoe;

bool have_cuda() { return backend_available(Device::cuda); }

#define REQUIRE_GPU() \
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device visible"

MoEConfig fp8_config() {
  MoEConfig c{.d = 256, .n = 128, .E = 8, .K = 2};
  c.aux_loss_coef = 0.01f;
  c.z_loss_coef = 0.001f;
  c.precision = Precision::fp8;
  return c;
}

void expect_given_equals_per_call(reference::HostLayerInputs in, const std::string& what) {
  SCOPED_TRACE(what + ": " + in.cfg.describe() + " T=" + std::to_string(in.T));
  in.cfg.fp8_weights_given = false;
  const reference::HostLayerOutputs per_call = reference::run_backend(in, Device::cuda);
  in.cfg.fp8_weights_given = true;
  const reference::HostLayerOutputs given = reference::run_backend(in, Device::cuda);
  const std::pair<const char*, std::pair<const std::vector<float>*, const std::vector<float>*>> outputs[] = {
      {"out", {&given.out, &per_call.out}},
      {"dx", {&given.dx, &per_call.dx}},
      {"d_router", {&given.d_router, &per_call.d_router}},
      {"d_gate_up", {&given.d_gate_up, &per_call.d_gate_up}},
      {"d_down", {&given.d_down, &per_call.d_down}},
      {"d_gate_up_bias", {&given.d_gate_up_bias, &per_call.d_gate_up_bias}},
      {"d_down_bias", {&given.d_down_bias, &per_call.d_down_bias}},
      {"d_topk_weights", {&given.d_topk_weights, &per_call.d_topk_weights}}};
  for (const auto& [name, pair] : outputs) {
    EXPECT_EQ(pair.first->size(), pair.second->size()) << name;
    size_t differ = 0;
    for (size_t i = 0; i < std::min(pair.first->size(), pair.second->size()); ++i)
      differ += std::memcmp(&(*pair.first)[i], &(*pair.second)[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << name << ": elements whose bits differ";
  }
  EXPECT_EQ(given.aux_loss, per_call.aux_loss);
  EXPECT_EQ(given.z_loss, per_call.z_loss);
  EXPECT_EQ(given.expert_counts, per_call.expert_counts);
  std::printf("[fp8 weights given == per call] %s: %zu outputs, bit for bit\n", what.c_str(), given.out.size());
}

TEST(CudaFp8Weights, LayerGivenEqualsPerCall) {
  REQUIRE_GPU();
  expect_given_equals_per_call(reference::random_inputs(fp8_config(), 300, DType::bf16, 1), "swiglu T=300");
}

// The transposed layout reads codes_t forward and codes backward (the roles swap); W1's row order,
// biases, a plain activation, token rounding, routing given.
TEST(CudaFp8Weights, LayoutsBiasesRoutings) {
  REQUIRE_GPU();
  MoEConfig c = fp8_config();
  c.transposed = c.interleaved = true;
  c.activation = Activation::swiglu_clamped;
  reference::HostLayerInputs in = reference::random_inputs(c, 257, DType::bf16, 3);
  reference::add_random_biases(in, 4);
  expect_given_equals_per_call(in, "transposed interleaved clamped biases");
  c = fp8_config();
  c.activation = Activation::gelu;
  c.E = 16;
  c.K = 4;
  c.routing = Routing::token_rounding;
  expect_given_equals_per_call(reference::random_inputs(c, 1000, DType::bf16, 5), "gelu token rounding");
  c = fp8_config();
  c.routing = Routing::given;
  c.transposed = true;
  expect_given_equals_per_call(reference::random_inputs(c, 131, DType::bf16, 6), "routing given transposed");
}

// With the codes given, plan_layer's workspaces hold no weight codes: forward drops W1's and W2's
// (HF: as stored), backward also the stored direction's scratch of the transposed copy.
TEST(CudaFp8Weights, WorkspacesDropTheWeightCodes) {
  REQUIRE_GPU();
  for (bool transposed : {false, true}) {
    MoEConfig c = fp8_config();
    c.transposed = transposed;
    const LayerPlan per_call = plan_layer(c, 512, DType::bf16, Device::cuda);
    c.fp8_weights_given = true;
    const LayerPlan given = plan_layer(c, 512, DType::bf16, Device::cuda);
    const size_t codes = size_t(c.E * (up_width(c) * c.d + c.d * c.n));  // W1's and W2's e4m3 codes
    EXPECT_GE(per_call.forward_workspace_bytes, given.forward_workspace_bytes + codes) << transposed;
    EXPECT_GE(per_call.backward_workspace_bytes, given.backward_workspace_bytes + codes) << transposed;
    EXPECT_EQ(per_call.saved_bytes, given.saved_bytes);
  }
}

// On cuda the codes are read by TMA: 16-byte aligned, named.
TEST(CudaFp8Weights, MisalignedCodesRefused) {
  REQUIRE_GPU();
  MoEConfig c = fp8_config();
  c.fp8_weights_given = true;
  const int64_t T = 16, d = c.d, n = c.n, E = c.E, W = up_width(c);
  Buffer x(Device::cuda, size_t(T * d) * 2), wr(Device::cuda, size_t(E * d) * 2), w1(Device::cuda, size_t(E * W * d) * 2),
      w2(Device::cuda, size_t(E * d * n) * 2), out(Device::cuda, size_t(T * d) * 2), codes(Device::cuda, size_t(E * W * d) + 16);
  MoEWeights w{wr.view(DType::bf16, {E, d}), w1.view(DType::bf16, {E, W, d}), w2.view(DType::bf16, {E, d, n})};
  optim::Fp8WeightBuffers fp8(c, Device::cuda);
  fp8.quantize(w);
  w.fp8 = fp8.weights();
  w.fp8.gate_up_proj.codes.data = static_cast<char*>(codes.data()) + 8;
  LayerMemory mem(c, T, DType::bf16, Device::cuda);
  expect_error([&] {
    forward(c, x.view(DType::bf16, {T, d}), w, out.view(DType::bf16, {T, d}), Tensor{}, mem.saved(),
            mem.forward_workspace());
  }, {"w.fp8.gate_up_proj.codes", "16-byte aligned"});
}

TEST(CudaFp8Weights, StackCopyStandard) {
  REQUIRE_GPU();
  leanmoe::testing::run_fp8_stack_case(Device::cuda, optim::ExpertUpdateMode::standard, 4);
}

TEST(CudaFp8Weights, StackCopyInBackward) {
  REQUIRE_GPU();
  leanmoe::testing::run_fp8_stack_case(Device::cuda, optim::ExpertUpdateMode::in_backward, 4);
}

}  // namespace
