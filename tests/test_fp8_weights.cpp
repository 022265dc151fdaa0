// The weights' FP8 codes given to the layer (cfg.fp8_weights_given, MoEWeights::fp8): the argument
// rules (validate.cpp, the same on every device), the CPU backend's use of them (it quantizes per
// GEMM from the bf16 weights, so the copy changes nothing), and the MoEStack's copy on the CPU
// (tests/fp8_weights_stack.h; the GPU runs the same in tests/gpu/test_fp8_weights_gpu.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <vector>

#include "expect_error.h"
#include "fp8_weights_stack.h"
#include "leanmoe/optim.h"
#include "naive_moe.h"

namespace {

using namespace leanmoe;

MoEConfig fp8_cfg(bool transposed = false) {
  MoEConfig c{.d = 128, .n = 128, .E = 4, .K = 2};
  c.precision = Precision::fp8;
  c.fp8_weights_given = true;
  c.transposed = transposed;
  return c;
}

// One CPU layer call's arguments with the copy given (bf16, T = 8).
struct CpuLayer {
  MoEConfig cfg;
  int64_t T = 8;
  Buffer x, router, gate_up, down, out;
  MoEWeights w;
  std::optional<optim::Fp8WeightBuffers> fp8;
  std::optional<LayerMemory> mem;

  explicit CpuLayer(const MoEConfig& c) : cfg(c) {
    const int64_t d = c.d, n = c.n, E = c.E, W = up_width(c);
    auto bf16_buffer = [](int64_t numel, float scale) {
      Buffer b(Device::cpu, size_t(numel) * 2);
      for (int64_t i = 0; i < numel; ++i) static_cast<bf16*>(b.data())[i] = float_to_bf16(scale * float((i * 37) % 17 - 8));
      return b;
    };
    x = bf16_buffer(T * d, 0.1f), router = bf16_buffer(E * d, 0.01f), gate_up = bf16_buffer(E * W * d, 0.01f),
    down = bf16_buffer(E * d * n, 0.01f), out = Buffer(Device::cpu, size_t(T * d) * 2);
    w.router = router.view(DType::bf16, {E, d});
    w.gate_up_proj = c.transposed ? gate_up.view(DType::bf16, {E, d, W}) : gate_up.view(DType::bf16, {E, W, d});
    w.down_proj = c.transposed ? down.view(DType::bf16, {E, n, d}) : down.view(DType::bf16, {E, d, n});
    MoEConfig with_copy = c;  // the copy's buffers also for a config that must refuse them
    with_copy.precision = Precision::fp8;
    fp8.emplace(with_copy, Device::cpu);
    fp8->quantize(w);
    if (c.fp8_weights_given) w.fp8 = fp8->weights();
    mem.emplace(c, T, DType::bf16, Device::cpu);
  }
  void forward(const MoEConfig& c, const MoEWeights& weights) {
    leanmoe::forward(c, x.view(DType::bf16, {T, c.d}), weights, out.view(DType::bf16, {T, c.d}), Tensor{},
                     mem->saved(), mem->forward_workspace());
  }
  void forward() { forward(cfg, w); }
};

TEST(Fp8Weights, ConfigNeedsFp8Precision) {
  MoEConfig c = fp8_cfg();
  c.precision = Precision::storage;
  expect_error([&] { plan_layer(c, 8, DType::bf16, Device::cpu); },
               {"argument 'cfg'", "cfg.fp8_weights_given needs cfg.precision = fp8"});
  EXPECT_NE(fp8_cfg().describe().find("fp8_weights_given"), std::string::npos);
}

TEST(Fp8Weights, AllEightTensorsRequiredWhenGiven) {
  CpuLayer l(fp8_cfg());
  EXPECT_NO_THROW(l.forward());
  MoEWeights w = l.w;
  w.fp8 = {};
  expect_error([&] { l.forward(l.cfg, w); }, {"w.fp8.gate_up_proj.codes", "must be given"});
  w = l.w;
  w.fp8.down_proj.scales_t = Tensor{};
  expect_error([&] { l.forward(l.cfg, w); }, {"w.fp8.down_proj.scales_t", "must be given"});
}

// Given without the flag (with fp8 or with storage precision): refused by name, not ignored, since
// the workspaces were planned from cfg and a caller expecting the copy to be read must hear it is not.
TEST(Fp8Weights, RefusedWithoutTheFlag) {
  MoEConfig c = fp8_cfg();
  c.fp8_weights_given = false;
  CpuLayer l(c);
  MoEWeights w = l.w;
  w.fp8 = l.fp8->weights();
  expect_error([&] { l.forward(c, w); },
               {"w.fp8.gate_up_proj.codes", "must be undefined unless cfg.fp8_weights_given"});
  c.precision = Precision::storage;
  CpuLayer storage(c);
  expect_error([&] { storage.forward(c, w); },
               {"w.fp8.gate_up_proj.codes", "must be undefined unless cfg.fp8_weights_given"});
}

TEST(Fp8Weights, DtypeShapeDeviceAndAliasing) {
  for (bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "transposed" : "hf");
    CpuLayer l(fp8_cfg(transposed));
    EXPECT_NO_THROW(l.forward());
    MoEWeights w = l.w;
    w.fp8.gate_up_proj.codes.dtype = DType::bf16;
    expect_error([&] { l.forward(l.cfg, w); }, {"w.fp8.gate_up_proj.codes", "dtype e4m3"});
    w = l.w;
    w.fp8.down_proj.scales.dtype = DType::i32;
    expect_error([&] { l.forward(l.cfg, w); }, {"w.fp8.down_proj.scales", "dtype f32"});
    // The stored and transposed codes exchanged: the shapes name the layout's roles. W = 2n != d.
    w = l.w;
    std::swap(w.fp8.gate_up_proj.codes, w.fp8.gate_up_proj.codes_t);
    expect_error([&] { l.forward(l.cfg, w); }, {"w.fp8.gate_up_proj.codes", "3-D [E, "});
    w = l.w;
    w.fp8.gate_up_proj.scales_t.device = Device::cuda;
    expect_error([&] { l.forward(l.cfg, w); }, {"w.fp8.gate_up_proj.scales_t", "same device as x"});
    w = l.w;
    w.fp8.down_proj.codes_t.stride[1] = 1;  // not row-major
    expect_error([&] { l.forward(l.cfg, w); }, {"w.fp8.down_proj.codes_t", "contiguous"});
    w = l.w;
    w.fp8.down_proj.codes.data = nullptr;
    expect_error([&] { l.forward(l.cfg, w); }, {"w.fp8.down_proj.codes", "null data pointer"});
    // Written output over read codes.
    const Tensor over = Tensor::contiguous(l.w.fp8.gate_up_proj.codes.data, DType::bf16, Device::cpu, {l.T, l.cfg.d});
    expect_error([&] {
      leanmoe::forward(l.cfg, l.x.view(DType::bf16, {l.T, l.cfg.d}), l.w, over, Tensor{}, l.mem->saved(),
                       l.mem->forward_workspace());
    }, {"argument 'out'", "must not overlap w.fp8.gate_up_proj.codes"});
  }
}

// The CPU backend quantizes per GEMM from the bf16 weights: the copy (equal by contract) changes
// no bit of any output or gradient, in either layout.
TEST(Fp8Weights, CpuLayerIgnoresTheCopy) {
  for (bool transposed : {false, true}) {
    MoEConfig c = fp8_cfg(transposed);
    c.aux_loss_coef = 0.01f;
    reference::HostLayerInputs in = reference::random_inputs(c, 40, DType::bf16, 3);
    const reference::HostLayerOutputs given = reference::run_backend(in, Device::cpu);
    in.cfg.fp8_weights_given = false;
    const reference::HostLayerOutputs per_call = reference::run_backend(in, Device::cpu);
    EXPECT_EQ(given.out, per_call.out);
    EXPECT_EQ(given.dx, per_call.dx);
    EXPECT_EQ(given.d_gate_up, per_call.d_gate_up);
    EXPECT_EQ(given.d_down, per_call.d_down);
    EXPECT_EQ(given.d_router, per_call.d_router);
  }
}

TEST(Fp8Weights, BuffersNeedFp8) {
  MoEConfig c = fp8_cfg();
  c.precision = Precision::storage;
  c.fp8_weights_given = false;
  expect_error([&] { optim::Fp8WeightBuffers b(c, Device::cpu); }, {"Fp8WeightBuffers", "cfg.precision must be fp8"});
}

TEST(Fp8Weights, StackCopyStandard) {
  leanmoe::testing::run_fp8_stack_case(Device::cpu, optim::ExpertUpdateMode::standard, 2);
}

TEST(Fp8Weights, StackCopyInBackward) {
  leanmoe::testing::run_fp8_stack_case(Device::cpu, optim::ExpertUpdateMode::in_backward, 2);
}

}  // namespace
