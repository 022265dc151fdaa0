// MoEStack with FP8 layers on either device (tests/test_fp8_weights.cpp on the CPU,
// tests/gpu/test_fp8_weights_gpu.cpp on the GPU): the expert optimizer's FP8 copy handed to the
// layers (StackOptions::fp8_weight_copy, cfg.fp8_weights_given) against every call quantizing the
// weights itself: the same codes, so the same weights bit for bit after every step, in both update
// modes; and the copy equal to fp8::quantize of the current weights after the steps and after load.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "leanmoe/optim.h"
#include "optim_fp8_run.h"

namespace leanmoe::testing {

constexpr int64_t kFp8StackT = 96;

// Three FP8 layers: HF SwiGLU; gpt-oss's experts (clamped SwiGLU, interleaved, transposed: the
// stored and transposed roles of the codes swap); a plain activation with n != d.
inline std::vector<MoEConfig> fp8_stack_configs() {
  MoEConfig a{.d = 128, .n = 128, .E = 4, .K = 2};
  a.precision = Precision::fp8;
  MoEConfig b = a;
  b.E = 8;
  b.K = 3;
  b.activation = Activation::swiglu_clamped;
  b.interleaved = b.transposed = true;
  MoEConfig g = a;
  g.activation = Activation::gelu;
  g.n = 256;
  g.router = RouterConvention::topk_then_softmax;
  return {a, b, g};
}

inline std::vector<char> fp8_host_bytes(const Tensor& t) {
  std::vector<char> h(t.nbytes());
  copy_to_host(t.device, h.data(), t.data, h.size());
  return h;
}

// A bf16 [T, d] tensor on `device` drawn from rng, and its host bits.
struct Fp8StackActivation {
  Buffer buf;
  std::vector<bf16> host;
  Fp8StackActivation(Device device, int64_t d, std::mt19937_64& rng)
      : buf(device, size_t(kFp8StackT * d) * 2), host(size_t(kFp8StackT * d)) {
    std::normal_distribution<float> normal(0.f, 1.f);
    for (bf16& v : host) v = float_to_bf16(normal(rng));
    upload();
  }
  void upload() { copy_to_device(buf.device(), buf.data(), host.data(), host.size() * 2); }
  Tensor view(int64_t d) const { return buf.view(DType::bf16, {kFp8StackT, d}); }
};

// One step; the data depend only on `step`: loss 0.5*||out - target||^2 scaled by 8.
inline void fp8_stack_step(optim::MoEStack& s, Device device, int step) {
  std::mt19937_64 rng(500 + step);
  const int64_t d = s.config(0).d;
  Fp8StackActivation x(device, d, rng), target(device, d, rng), d_out(device, d, rng);
  s.set_lr(1e-2f / float(1 + step % 3), 5e-3f);
  const std::vector<char> o = fp8_host_bytes(s.forward(x.view(d)));
  for (size_t i = 0; i < d_out.host.size(); ++i)
    d_out.host[i] = float_to_bf16(8.f * (bf16_to_float(reinterpret_cast<const bf16*>(o.data())[i]) -
                                         bf16_to_float(target.host[i])));
  d_out.upload();
  s.backward(d_out.view(d));
  s.step();
}

inline std::string fp8_stack_weights(const optim::MoEStack& s) {
  std::string all;
  for (int64_t l = 0; l < s.num_layers(); ++l) {
    const MoEWeights& w = s.weights(l);
    for (const Tensor* t : {&w.router, &w.gate_up_proj, &w.down_proj}) {
      const std::vector<char> h = fp8_host_bytes(*t);
      all.append(h.data(), h.size());
    }
  }
  return all;
}

// Every layer's MoEWeights::fp8 equals fp8::quantize of its current bf16 weights (codes, scales and
// both transposes), each weight seen as [E, R, C] as stored.
inline void expect_fp8_copy_current(const optim::MoEStack& s, const std::string& when) {
  for (int64_t l = 0; l < s.num_layers(); ++l) {
    const MoEWeights& w = s.weights(l);
    ASSERT_TRUE(s.config(l).fp8_weights_given) << "layer " << l;
    for (auto [name, weight, codes] : {std::tuple{"gate_up_proj", &w.gate_up_proj, &w.fp8.gate_up_proj},
                                       std::tuple{"down_proj", &w.down_proj, &w.fp8.down_proj}}) {
      Fp8OptimCase c{};
      c.E = weight->shape[0], c.R = weight->shape[1], c.C = weight->shape[2];
      const std::vector<char> bits = fp8_host_bytes(*weight);
      std::vector<uint16_t> param(size_t(c.numel()));
      std::memcpy(param.data(), bits.data(), bits.size());
      const Fp8Snapshot want = fp8_case_quantize(c, param);
      auto as = [](const std::vector<char>& b, auto sample) {
        using V = decltype(sample);
        std::vector<V> v(b.size() / sizeof(V));
        std::memcpy(v.data(), b.data(), b.size());
        return v;
      };
      const std::string what = when + ": layer " + std::to_string(l) + " " + name;
      EXPECT_EQ(as(fp8_host_bytes(codes->codes), uint8_t{}), want.codes) << what << " codes";
      EXPECT_EQ(as(fp8_host_bytes(codes->codes_t), uint8_t{}), want.codes_t) << what << " codes_t";
      // Scales compared as bits (a block of zeros, or a non-finite one, must match exactly too).
      EXPECT_EQ(fp8_host_bytes(codes->scales),
                std::vector<char>(reinterpret_cast<const char*>(want.scales.data()),
                                  reinterpret_cast<const char*>(want.scales.data() + want.scales.size())))
          << what << " scales";
      EXPECT_EQ(fp8_host_bytes(codes->scales_t),
                std::vector<char>(reinterpret_cast<const char*>(want.scales_t.data()),
                                  reinterpret_cast<const char*>(want.scales_t.data() + want.scales_t.size())))
          << what << " scales_t";
    }
  }
}

// Given copy vs per-call quantization, in `mode`, `steps` steps; then the copy after steps and after
// a load into a stack drawn from another seed.
inline void run_fp8_stack_case(Device device, optim::ExpertUpdateMode mode, int steps) {
  SCOPED_TRACE(std::string(device_name(device)) + " " + optim::expert_update_mode_name(mode));
  optim::StackOptions opt;
  opt.mode = mode;
  opt.dense_max_grad_norm = 0.5f;
  optim::MoEStack given(fp8_stack_configs(), kFp8StackT, DType::bf16, device, opt, 11);
  opt.fp8_weight_copy = false;
  optim::MoEStack per_call(fp8_stack_configs(), kFp8StackT, DType::bf16, device, opt, 11);
  for (int64_t l = 0; l < given.num_layers(); ++l) {
    ASSERT_TRUE(given.config(l).fp8_weights_given);
    ASSERT_FALSE(per_call.config(l).fp8_weights_given);
    ASSERT_FALSE(per_call.weights(l).fp8.gate_up_proj.codes.defined());
  }
  ASSERT_EQ(fp8_stack_weights(given), fp8_stack_weights(per_call));
  expect_fp8_copy_current(given, "initial");
  const std::string initial = fp8_stack_weights(given);
  for (int step = 0; step < steps; ++step) {
    fp8_stack_step(given, device, step);
    fp8_stack_step(per_call, device, step);
    ASSERT_EQ(fp8_stack_weights(given), fp8_stack_weights(per_call)) << "weights differ after step " << step;
  }
  EXPECT_NE(fp8_stack_weights(given), initial) << "training changed nothing";
  expect_fp8_copy_current(given, "after steps");

  std::stringstream checkpoint;
  given.save(checkpoint);
  optim::StackOptions with_copy = opt;
  with_copy.fp8_weight_copy = true;
  optim::MoEStack loaded(fp8_stack_configs(), kFp8StackT, DType::bf16, device, with_copy, 12);
  ASSERT_NE(fp8_stack_weights(loaded), fp8_stack_weights(given));
  loaded.load(checkpoint);
  ASSERT_EQ(fp8_stack_weights(loaded), fp8_stack_weights(given));
  expect_fp8_copy_current(loaded, "after load");
  fp8_stack_step(loaded, device, steps);  // the loaded copy trains as the original does
  fp8_stack_step(given, device, steps);
  EXPECT_EQ(fp8_stack_weights(loaded), fp8_stack_weights(given)) << "after a step from the checkpoint";
}

}  // namespace leanmoe::testing
