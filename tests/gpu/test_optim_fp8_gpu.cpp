// The expert optimizer's FP8 copy on the GPU: the fused update + quantization kernel
// (fused_update_fp8_kernel, src/cuda/kernels/optim_update.cuh) against the CPU path, bit for bit
// after every step: parameter, moments, master, codes, scales and the transposed copy (NaNs compared
// as NaN: the CPU keeps payloads, the GPU writes its canonical NaN). Also against the GPU's plain
// update (no copy): the same parameter and state bits. Data: tests/optim_fp8_run.h (blocks 2^14
// apart, NaN, Inf, a master value whose bf16 overflows), buffers between guard bytes.
// Skipped when no GPU is visible, except the argument rules that need no kernel.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <vector>

#include "../expect_error.h"
#include "../optim_fp8_run.h"

namespace {

using namespace leanmoe;
using namespace leanmoe::optim;
using namespace leanmoe::testing;

bool have_cuda() { return backend_available(Device::cuda); }

#define REQUIRE_GPU() \
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device visible"

template <class T>
void expect_same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  std::string first;
  EXPECT_EQ(fp8_case_differences(got, want, first), 0) << what << ":" << first;
}

void expect_same_snapshot(const Fp8Snapshot& got, const Fp8Snapshot& want, const std::string& vs, bool copy) {
  expect_same(got.param, want.param, "parameter " + vs);
  for (int k = 0; k < 4; ++k) expect_same(got.state[k], want.state[k], std::string(state_kind_name(StateKind(k))) + " " + vs);
  if (!copy) return;
  expect_same(got.codes, want.codes, "codes " + vs);
  expect_same(got.scales, want.scales, "scales " + vs);
  expect_same(got.codes_t, want.codes_t, "codes_t " + vs);
  expect_same(got.scales_t, want.scales_t, "scales_t " + vs);
}

void run_gpu_case(const Fp8OptimCase& c) {
  SCOPED_TRACE(c.name);
  Fp8OptimRun gpu(c, Device::cuda, true), gpu_plain(c, Device::cuda, false), cpu(c, Device::cpu, true);
  bool guard_ok = true;
  expect_same_snapshot(gpu.snapshot(guard_ok), cpu.snapshot(guard_ok), "after set_fp8_copy (GPU vs CPU)", true);
  for (int step = 0; step < kFp8CaseSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    gpu.step(step);
    gpu_plain.step(step);
    cpu.step(step);
    const Fp8Snapshot g = gpu.snapshot(guard_ok), p = gpu_plain.snapshot(guard_ok), h = cpu.snapshot(guard_ok);
    expect_same_snapshot(g, h, "(GPU vs CPU)", true);
    expect_same_snapshot(g, p, "(GPU with copy vs plain GPU update)", false);
    const Fp8Snapshot want = fp8_case_quantize(c, g.param);  // of the GPU's own parameter
    expect_same(g.codes, want.codes, "codes vs fp8::quantize");
    expect_same(g.scales, want.scales, "scales vs fp8::quantize");
    if (c.transposed) expect_same(g.codes_t, want.codes_t, "codes_t vs fp8::quantize");
  }
  EXPECT_TRUE(guard_ok) << "a write outside the copy's buffers";
}

constexpr AdamW kAdamW{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};

TEST(OptimFp8Gpu, AdamWBitwiseEqualsCpu) {
  REQUIRE_GPU();
  run_gpu_case({"adamw + master, transposed", kAdamW, true, 3, 256, 384, true, DType::bf16, false});
  run_gpu_case({"adamw, f32 grad, transposed", kAdamW, false, 5, 384, 128, true, DType::f32, false});
  run_gpu_case({"adamw + master, no transposed", kAdamW, true, 4, 1024, 512, false, DType::bf16, false});
  run_gpu_case({"adamw + master, specials", kAdamW, true, 2, 256, 640, true, DType::bf16, true});
  run_gpu_case({"adamw, one block", kAdamW, false, 1, 128, 128, true, DType::bf16, true});
}

TEST(OptimFp8Gpu, SgdBitwiseEqualsCpu) {
  REQUIRE_GPU();
  run_gpu_case({"sgd momentum + master, transposed", SGD{0.05f, 0.9f, 1e-4f, false}, true, 3, 128, 384, true, DType::bf16, false});
  run_gpu_case({"sgd nesterov, f32 grad", SGD{0.05f, 0.9f, 1e-2f, true}, false, 2, 512, 256, true, DType::f32, false});
  run_gpu_case({"sgd no momentum + master, specials", SGD{0.05f, 0.f, 0.f, false}, true, 2, 256, 256, true, DType::bf16, true});
  run_gpu_case({"sgd momentum, specials, f32 grad", SGD{0.05f, 0.9f, 1e-4f, false}, false, 3, 384, 256, false, DType::f32, true});
}

// More CTAs than fit on the GPU at once (768 blocks of 128 x 128; 2 CTAs per SM fit).
// bf16 moments (the state torch keeps for bf16 parameters): one 16-byte access per moment per
// thread pass in the fused kernel, rounded on store.
TEST(OptimFp8Gpu, Bf16MomentsBitwiseEqualsCpu) {
  REQUIRE_GPU();
  const DType b = DType::bf16;
  run_gpu_case({"adamw, bf16 moments, transposed", kAdamW, false, 3, 256, 384, true, b, false, b});
  run_gpu_case({"adamw, bf16 moments, specials", kAdamW, false, 2, 256, 640, true, b, true, b});
  run_gpu_case({"adamw, bf16 moments, f32 grad", kAdamW, false, 2, 384, 128, false, DType::f32, false, b});
  run_gpu_case({"sgd momentum, bf16 moments, specials", SGD{0.05f, 0.9f, 1e-4f, false}, false, 3, 384, 256, true, b, true, b});
}

TEST(OptimFp8Gpu, ManyBlocksBitwiseEqualsCpu) {
  REQUIRE_GPU();
  run_gpu_case({"adamw + master, [3, 2048, 2048]", kAdamW, true, 3, 2048, 2048, true, DType::bf16, true});
}

// Device rules: buffers on the parameter's device, 16-byte alignment on the GPU (parameter, codes,
// codes_t, each step's gradient).
TEST(OptimFp8Gpu, DeviceAndAlignmentRules) {
  REQUIRE_GPU();
  const Fp8OptimCase c{"rules", kAdamW, false, 1, 128, 256, true, DType::bf16, false};
  Buffer w(Device::cuda, 2 * 128 * 256 + 64), g(Device::cuda, 2 * 128 * 256 + 64), codes(Device::cuda, 128 * 256 + 64),
      scales(Device::cuda, 64);
  std::vector<uint8_t> host_codes(128 * 256);
  std::vector<float> host_scales(2);
  ExpertOptimizer opt(kAdamW);
  opt.register_tensor("w", w.view(DType::bf16, {1, 128, 256}));
  auto* dc = static_cast<uint8_t*>(codes.data());
  auto* ds = static_cast<float*>(scales.data());
  expect_error([&] { opt.set_fp8_copy("w", {1, 128, 256, host_codes.data(), ds, nullptr, nullptr}); },
               {"'copy.codes'", "parameter's device"});
  expect_error([&] { opt.set_fp8_copy("w", {1, 128, 256, dc, host_scales.data(), nullptr, nullptr}); },
               {"'copy.scales'", "parameter's device"});
  expect_error([&] { opt.set_fp8_copy("w", {1, 128, 256, dc + 8, ds, nullptr, nullptr}); }, {"'copy.codes'", "16-byte aligned"});
  {
    ExpertOptimizer cpu(kAdamW);
    std::vector<bf16> hw(128 * 256);
    cpu.register_tensor("w", Tensor::contiguous(hw.data(), DType::bf16, Device::cpu, {1, 128, 256}));
    expect_error([&] { cpu.set_fp8_copy("w", {1, 128, 256, dc, host_scales.data(), nullptr, nullptr}); },
                 {"'copy.codes'", "parameter's device (cpu"});
  }
  {
    ExpertOptimizer shifted(kAdamW);
    Tensor p = w.view(DType::bf16, {1, 128, 256});
    p.data = static_cast<bf16*>(p.data) + 4;
    shifted.register_tensor("w", p);
    expect_error([&] { shifted.set_fp8_copy("w", {1, 128, 256, dc, ds, nullptr, nullptr}); }, {"'param'", "16-byte aligned"});
  }
  opt.set_fp8_copy("w", {1, 128, 256, dc, ds, nullptr, nullptr});
  Tensor grad = g.view(DType::bf16, {1, 128, 256});
  grad.data = static_cast<bf16*>(grad.data) + 1;
  expect_error([&] { opt.step("w", grad); }, {"ExpertOptimizer::step", "'w'", "'grad'", "16-byte aligned", "FP8 copy"});
  EXPECT_EQ(opt.step_count("w"), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
