// The expert optimizer on the GPU (src/cuda/optim_update.cu) against the CPU path, and the MoEStack
// on Device::cuda in standard vs in-backward mode. Skipped when no GPU is visible.
//
// Tolerance: none. Every element of the fused update is a fixed sequence of correctly rounded fp32
// operations on both devices (explicit __fmul_rn/__fadd_rn/__fdiv_rn/__fsqrt_rn on the GPU, no FMA
// contraction on the x86-64 CPU build) and one round-to-nearest-even to bf16, so parameters,
// moments and master copies must be equal bit for bit; a single contracted FMA would show up as a
// one-ulp difference in some element of these millions.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "leanmoe/optim.h"

namespace {

using namespace leanmoe;
using namespace leanmoe::optim;

bool have_cuda() { return backend_available(Device::cuda); }

#define REQUIRE_GPU() \
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device visible"

// Host bytes of n elements of dtype, values v(i) rounded to dtype.
template <class F>
std::vector<char> host_values(DType dtype, int64_t n, F v) {
  std::vector<char> b(size_t(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::bf16)
      reinterpret_cast<bf16*>(b.data())[i] = float_to_bf16(v(i));
    else
      reinterpret_cast<float*>(b.data())[i] = v(i);
  }
  return b;
}

std::vector<char> to_host(const Tensor& t) {
  std::vector<char> h(t.nbytes());
  copy_to_host(t.device, h.data(), t.data, h.size());
  return h;
}

// The same tensor on the CPU and on the GPU. `offset` elements into its buffers: an offset that
// breaks 16-byte alignment sends the GPU update down its element-by-element path.
struct Twin {
  DType dtype;
  int64_t numel, offset;
  std::vector<char> cpu_bytes;
  Buffer gpu;
  Twin(DType t, int64_t n, int64_t off)
      : dtype(t), numel(n), offset(off), cpu_bytes(size_t(n + off) * dtype_size(t)),
        gpu(Device::cuda, size_t(n + off) * dtype_size(t)) {}
  Tensor cpu_view() { return Tensor::contiguous(cpu_bytes.data() + offset * dtype_size(dtype), dtype, Device::cpu, {numel}); }
  Tensor gpu_view() const {
    return Tensor::contiguous(static_cast<char*>(gpu.data()) + offset * dtype_size(dtype), dtype, Device::cuda, {numel});
  }
  void set(const std::vector<char>& bytes) {
    std::memcpy(cpu_bytes.data() + offset * dtype_size(dtype), bytes.data(), bytes.size());
    copy_to_device(Device::cuda, gpu_view().data, bytes.data(), bytes.size());
  }
};

struct UpdateCase {
  const char* name;
  Rule rule;
  DType param, grad;
  bool master;
  int64_t numel, offset;
  DType moments = DType::f32;
};

// Gradients over 24 binades (1e-22 .. 1e2, so g*g reaches fp32 subnormals and underflow), with
// signs and exact zeros; parameters N(0, 1).
void run_update_case(const UpdateCase& c) {
  SCOPED_TRACE(c.name);
  std::mt19937_64 rng(42);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> exponent(-22.f, 2.f);
  Twin param(c.param, c.numel, c.offset), grad(c.grad, c.numel, c.offset);
  const std::vector<char> initial = host_values(c.param, c.numel, [&](int64_t) { return normal(rng); });
  param.set(initial);
  ExpertOptimizer cpu(c.rule), gpu(c.rule);
  cpu.register_tensor("w", param.cpu_view(), c.master, c.moments);
  gpu.register_tensor("w", param.gpu_view(), c.master, c.moments);
  for (int step = 0; step < 5; ++step) {
    grad.set(host_values(c.grad, c.numel, [&](int64_t i) {
      return i % 97 == 0 ? 0.f : normal(rng) * std::pow(10.f, exponent(rng));
    }));
    const float lr = 1e-2f / float(1 + step), grad_scale = step == 3 ? 0.25f : 1.f;
    cpu.set_lr(lr);
    gpu.set_lr(lr);
    cpu.step("w", grad.cpu_view(), grad_scale);
    gpu.step("w", grad.gpu_view(), grad_scale);
    synchronize(Device::cuda);
    const std::vector<char> want = to_host(param.cpu_view()), got = to_host(param.gpu_view());
    ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size()), 0) << "parameters differ after step " << step;
    for (StateKind k : {StateKind::exp_avg, StateKind::exp_avg_sq, StateKind::momentum, StateKind::master}) {
      const Tensor sc = cpu.state("w", k), sg = gpu.state("w", k);
      ASSERT_EQ(sc.data == nullptr, sg.data == nullptr) << state_kind_name(k);
      if (!sc.data) continue;
      ASSERT_EQ(sg.dtype, k == StateKind::master ? DType::f32 : c.moments) << state_kind_name(k);
      const std::vector<char> a = to_host(sc), b = to_host(sg);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << state_kind_name(k) << " differs after step " << step;
    }
  }
  // The comparison means something only if the parameters moved.
  EXPECT_NE(std::memcmp(initial.data(), to_host(param.gpu_view()).data(), initial.size()), 0);
}

constexpr AdamW kAdamW{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
// 8·400000 + 5: a 5-element tail after the 8-wide groups, several grid-stride sweeps on a large GPU.
constexpr int64_t kNumel = 8 * 400000 + 5;

}  // namespace

TEST(OptimGpu, AdamWBf16BitwiseEqualsCpu) {
  REQUIRE_GPU();
  run_update_case({"adamw bf16", kAdamW, DType::bf16, DType::bf16, false, kNumel, 0});
  run_update_case({"adamw bf16 + master", kAdamW, DType::bf16, DType::bf16, true, kNumel, 0});
  run_update_case({"adamw bf16, f32 grad", kAdamW, DType::bf16, DType::f32, true, kNumel, 0});
}

TEST(OptimGpu, AdamWFp32BitwiseEqualsCpu) {
  REQUIRE_GPU();
  run_update_case({"adamw f32", kAdamW, DType::f32, DType::f32, false, kNumel, 0});
  run_update_case({"adamw f32, bf16 grad", kAdamW, DType::f32, DType::bf16, false, kNumel, 0});
}

TEST(OptimGpu, SgdBitwiseEqualsCpu) {
  REQUIRE_GPU();
  run_update_case({"sgd momentum bf16 + master", SGD{0.05f, 0.9f, 1e-4f, false}, DType::bf16, DType::bf16, true, kNumel, 0});
  run_update_case({"sgd nesterov f32", SGD{0.05f, 0.9f, 1e-2f, true}, DType::f32, DType::f32, false, kNumel, 0});
  run_update_case({"sgd no momentum bf16", SGD{0.05f, 0.f, 0.f, false}, DType::bf16, DType::bf16, false, kNumel, 0});
}

// bf16 moments (what torch keeps for bf16 parameters): the same fp32 math, the moments rounded on
// store; 16-byte moment accesses, the tail, the unaligned path.
TEST(OptimGpu, Bf16MomentsBitwiseEqualsCpu) {
  REQUIRE_GPU();
  const DType b = DType::bf16;
  run_update_case({"adamw bf16, bf16 moments", kAdamW, b, b, false, kNumel, 0, b});
  run_update_case({"adamw bf16, f32 grad, bf16 moments", kAdamW, b, DType::f32, false, kNumel, 0, b});
  run_update_case({"sgd nesterov bf16, bf16 moments", SGD{0.05f, 0.9f, 1e-4f, true}, b, b, false, kNumel, 0, b});
  run_update_case({"adamw bf16 unaligned, bf16 moments", kAdamW, b, b, false, 10001, 1, b});
  run_update_case({"adamw bf16 numel 3, bf16 moments", kAdamW, b, b, false, 3, 0, b});
}

TEST(OptimGpu, UnalignedViewsAndTinyTensors) {
  REQUIRE_GPU();
  // One element in: not 16-byte aligned, so the element-by-element kernel runs.
  run_update_case({"adamw bf16 unaligned", kAdamW, DType::bf16, DType::bf16, true, 10001, 1});
  run_update_case({"sgd f32 unaligned", SGD{0.05f, 0.9f, 0.f, true}, DType::f32, DType::bf16, false, 10001, 3});
  // Fewer elements than one vector group: only the tail loop runs.
  run_update_case({"adamw bf16 numel 3", kAdamW, DType::bf16, DType::bf16, false, 3, 0});
  run_update_case({"adamw f32 numel 1", kAdamW, DType::f32, DType::f32, false, 1, 0});
}

// ---------------------------------------------------------------------------------------------
// MoEStack on the GPU: in-backward vs standard, bit for bit after every step
// ---------------------------------------------------------------------------------------------
namespace {

constexpr int64_t kT = 256;

// Layers of different sizes (the CUDA expert GEMMs take d and n in multiples of 64), so the shared
// in-backward gradient workspace must be sized for the largest: layer 1, E*2n*d = 8*256*128. Layer 3
// is gpt-oss's experts (clamped SwiGLU, interleaved, transposed): in-backward updates of weights
// read in place in the transposed layout, their gradients written in it.
std::vector<MoEConfig> gpu_layer_configs() {
  MoEConfig a{.d = 128, .n = 64, .E = 4, .K = 2};
  MoEConfig b{.d = 128, .n = 128, .E = 8, .K = 2};
  b.router = RouterConvention::topk_then_softmax;
  MoEConfig c{.d = 128, .n = 64, .E = 8, .K = 3};
  c.aux_loss_coef = 0.01f;
  MoEConfig g{.d = 128, .n = 64, .E = 4, .K = 2};
  g.activation = Activation::swiglu_clamped;
  g.interleaved = g.transposed = true;
  return {a, b, c, g};
}

struct DeviceActivation {
  Buffer buf;
  std::vector<char> host;
  DeviceActivation(int64_t d, std::mt19937_64& rng) : buf(Device::cuda, size_t(kT * d) * 2) {
    std::normal_distribution<float> normal(0.f, 1.f);
    host = host_values(DType::bf16, kT * d, [&](int64_t) { return normal(rng); });
    copy_to_device(Device::cuda, buf.data(), host.data(), host.size());
  }
  Tensor view(int64_t d) const { return buf.view(DType::bf16, {kT, d}); }
};

// One training step; the data depend only on `step`. Loss 0.5*||out - target||^2 scaled by 8 so the
// deep layers' gradients are not tiny: d_out = 8*(out - target), computed on the host.
void train_step(MoEStack& s, int step) {
  std::mt19937_64 rng(1000 + step);
  const int64_t d = s.config(0).d;
  DeviceActivation x(d, rng), target(d, rng), d_out(d, rng);
  s.set_lr(1e-2f / float(1 + step % 5), 5e-3f);
  const Tensor out = s.forward(x.view(d));
  const std::vector<char> o = to_host(out);
  d_out.host = host_values(DType::bf16, kT * d, [&](int64_t i) {
    return 8.f * (bf16_to_float(reinterpret_cast<const bf16*>(o.data())[i]) -
                  bf16_to_float(reinterpret_cast<const bf16*>(target.host.data())[i]));
  });
  copy_to_device(Device::cuda, d_out.buf.data(), d_out.host.data(), d_out.host.size());
  s.backward(d_out.view(d));
  s.step();
}

std::string weights_bytes(const MoEStack& s) {
  std::string all;
  for (int64_t l = 0; l < s.num_layers(); ++l) {
    const MoEWeights& w = s.weights(l);
    for (const Tensor* t : {&w.router, &w.gate_up_proj, &w.down_proj}) {
      const std::vector<char> h = to_host(*t);
      all.append(h.data(), h.size());
    }
  }
  return all;
}

std::string optimizer_bytes(const ExpertOptimizer& o) {
  std::stringstream s;
  o.save(s);
  return s.str();
}

void run_stack_case(const char* name, Rule rule, bool master, DType moments = DType::f32) {
  SCOPED_TRACE(name);
  StackOptions opt;
  opt.expert_rule = rule;
  opt.fp32_master = master;
  opt.expert_moments = moments;
  opt.dense_max_grad_norm = 0.5f;
  opt.mode = ExpertUpdateMode::standard;
  MoEStack standard(gpu_layer_configs(), kT, DType::bf16, Device::cuda, opt, 7);
  opt.mode = ExpertUpdateMode::in_backward;
  MoEStack in_backward(gpu_layer_configs(), kT, DType::bf16, Device::cuda, opt, 7);
  const std::string initial = weights_bytes(standard);
  ASSERT_EQ(initial, weights_bytes(in_backward));
  for (int step = 0; step < 20; ++step) {
    train_step(standard, step);
    train_step(in_backward, step);
    ASSERT_EQ(weights_bytes(standard), weights_bytes(in_backward)) << "weights differ after step " << step;
    ASSERT_EQ(optimizer_bytes(standard.expert_optimizer()), optimizer_bytes(in_backward.expert_optimizer()))
        << "expert optimizer state differs after step " << step;
    ASSERT_EQ(optimizer_bytes(standard.dense_optimizer()), optimizer_bytes(in_backward.dense_optimizer()))
        << "dense optimizer state differs after step " << step;
  }
  const std::string final_weights = weights_bytes(in_backward);
  size_t off = 0;
  for (int64_t l = 0; l < in_backward.num_layers(); ++l) {
    for (const char* w : {"gate_up_proj", "down_proj"})
      EXPECT_EQ(in_backward.expert_optimizer().step_count("layers." + std::to_string(l) + "." + w), 20);
    const MoEWeights& w = in_backward.weights(l);
    for (const Tensor* t : {&w.router, &w.gate_up_proj, &w.down_proj}) {
      EXPECT_NE(initial.compare(off, t->nbytes(), final_weights, off, t->nbytes()), 0)
          << "layer " << l << " tensor unchanged by training";
      off += t->nbytes();
    }
  }
}

size_t free_device_bytes() {
  size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return free;
}

}  // namespace

// The premise of the comparisons below: the CUDA backend's backward gives the same gradient bits
// on every run (no atomics or other order-dependent sums). If this fails, the in-backward tests
// fail for the backend's reason, not the optimizer's.
TEST(OptimGpuStack, StandardStackIsReproducible) {
  REQUIRE_GPU();
  StackOptions opt;
  opt.mode = ExpertUpdateMode::standard;
  MoEStack a(gpu_layer_configs(), kT, DType::bf16, Device::cuda, opt, 7);
  MoEStack b(gpu_layer_configs(), kT, DType::bf16, Device::cuda, opt, 7);
  for (int step = 0; step < 3; ++step) {
    train_step(a, step);
    train_step(b, step);
    ASSERT_EQ(weights_bytes(a), weights_bytes(b)) << "two identical standard runs differ after step " << step;
  }
}

TEST(OptimGpuStack, InBackwardBitwiseEqualsStandardAdamW) {
  REQUIRE_GPU();
  run_stack_case("adamw bf16", kAdamW, false);
}

TEST(OptimGpuStack, InBackwardBitwiseEqualsStandardAdamWBf16Moments) {
  REQUIRE_GPU();
  run_stack_case("adamw bf16, bf16 moments", kAdamW, false, DType::bf16);
}

TEST(OptimGpuStack, InBackwardBitwiseEqualsStandardAdamWMaster) {
  REQUIRE_GPU();
  run_stack_case("adamw bf16 + fp32 master", kAdamW, true);
}

TEST(OptimGpuStack, InBackwardBitwiseEqualsStandardSgd) {
  REQUIRE_GPU();
  run_stack_case("sgd nesterov bf16", SGD{0.05f, 0.9f, 1e-4f, true}, false);
}

// The gradient high-water mark: tracked bytes, and the device memory itself. Layers large enough
// that the gradient buffers dominate the cudaMalloc granularity (2 MiB): each layer's dW1 is 4 MiB
// and dW2 2 MiB, so standard holds 18 MiB of expert gradients and in-backward one 4 MiB workspace.
TEST(OptimGpuStack, GradientHighWaterMark) {
  REQUIRE_GPU();
  const MoEConfig c{.d = 512, .n = 256, .E = 8, .K = 2};
  const std::vector<MoEConfig> cfgs(3, c);
  const size_t dw1 = size_t(c.E * 2 * c.n * c.d) * 2, dw2 = size_t(c.E * c.d * c.n) * 2;
  {  // First use of the backend (library handles, lazily allocated workspaces) outside the measurement.
    MoEStack warm(cfgs, kT, DType::bf16, Device::cuda, StackOptions{}, 3);
    train_step(warm, 0);
  }
  size_t footprint[2] = {0, 0}, high_water[2] = {0, 0};
  for (ExpertUpdateMode mode : {ExpertUpdateMode::standard, ExpertUpdateMode::in_backward}) {
    StackOptions opt;
    opt.mode = mode;
    synchronize(Device::cuda);
    const size_t before = free_device_bytes();
    MoEStack s(cfgs, kT, DType::bf16, Device::cuda, opt, 3);
    size_t lowest = free_device_bytes();
    for (int step = 0; step < 2; ++step) {
      train_step(s, step);
      synchronize(Device::cuda);
      lowest = std::min(lowest, free_device_bytes());
    }
    footprint[int(mode)] = before - lowest;
    high_water[int(mode)] = s.expert_grad_high_water_bytes();
  }
  const int standard = int(ExpertUpdateMode::standard), in_backward = int(ExpertUpdateMode::in_backward);
  EXPECT_EQ(high_water[standard], 3 * (dw1 + dw2));
  EXPECT_EQ(high_water[in_backward], dw1);
  // Everything but the expert gradients is allocated identically in both modes; allow two 2 MiB
  // allocation pages of slack for the small buffers' sub-allocation (the expected saving is 14 MiB).
  const double saved = double(footprint[standard]) - double(footprint[in_backward]);
  const double expected = double(3 * (dw1 + dw2) - dw1);
  EXPECT_NEAR(saved, expected, double(4 << 20)) << "standard " << footprint[standard] << " B, in_backward "
                                                  << footprint[in_backward] << " B";
}
