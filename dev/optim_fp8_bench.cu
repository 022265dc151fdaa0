// dev/optim_fp8_bench: what the FP8 copy costs in the expert optimizer's update (issue 16).
// For one layer's expert tensors (default 120B-n2048: W1 [64, 4096, 4096], W2 [64, 4096, 2048], bf16
// with fp32 master, AdamW, bf16 gradients), median over reps of each, timed with CUDA events:
//   update           ExpertOptimizer::step without an FP8 copy (fused_update_kernel)
//   update+copy      step with set_fp8_copy (fused_update_fp8_kernel: codes, scales, transposed)
//   update, quantize step without copy, then fp8_quantize_blocks of the parameter (two passes)
//   quantize         fp8_quantize_blocks alone
// GB/s counts the bytes each pass must move (update: 28 per element; copy +2; quantize 2 + 2).
// Then fused_update_fp8_kernel launched directly with __launch_bounds__ asking registers for 1, 2
// or 3 CTAs per SM (the library launches 2): which occupancy the update + copy wants.
// Not part of the library or CI; built as leanmoe_dev_optim_fp8 in CUDA builds.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../src/cuda/kernels/optim_update.cuh"
#include "../src/cuda/launchers.h"
#include "leanmoe/optim.h"
#include "dev_cuda_check.h"

using namespace leanmoe;
using namespace leanmoe::optim;

namespace {

template <class F>
double median_ms(int reps, F&& f) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < reps + 2; ++i) {  // two untimed
    CHECK(cudaEventRecord(a));
    f();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 2) t.push_back(ms);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Row {
  double update, fused, two_pass, quantize;
};

Row bench_tensor(const char* name, int64_t E, int64_t R, int64_t C, int reps) {
  const int64_t numel = E * R * C;
  Buffer param(Device::cuda, size_t(numel) * 2), grad(Device::cuda, size_t(numel) * 2), codes(Device::cuda, size_t(numel)),
      codes_t(Device::cuda, size_t(numel)), scales(Device::cuda, size_t(numel / (128 * 128)) * 4),
      scales_t(Device::cuda, size_t(numel / (128 * 128)) * 4);
  CHECK(cudaMemset(param.data(), 0x3c, param.bytes()));  // bf16 0x3c3c = 0.0115
  CHECK(cudaMemset(grad.data(), 0x3a, grad.bytes()));    // bf16 0x3a3a = 7.1e-4
  const Tensor p = param.view(DType::bf16, {E, R, C}), g = grad.view(DType::bf16, {E, R, C});
  const AdamW rule{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
  ExpertOptimizer plain(rule), with_copy(rule);
  plain.register_tensor(name, p, true);
  with_copy.register_tensor(name, p, true);
  const Fp8Copy copy{E, R, C, static_cast<uint8_t*>(codes.data()), static_cast<float*>(scales.data()),
                     static_cast<uint8_t*>(codes_t.data()), static_cast<float*>(scales_t.data())};
  with_copy.set_fp8_copy(name, copy);
  auto quantize = [&] {
    cuda::fp8_quantize_blocks(param.data(), E, R, C, copy.codes, copy.scales, copy.codes_t, copy.scales_t, nullptr);
  };
  Row r;
  r.update = median_ms(reps, [&] { plain.step(name, g); });
  r.fused = median_ms(reps, [&] { with_copy.step(name, g); });
  r.two_pass = median_ms(reps, [&] {
    plain.step(name, g);
    quantize();
  });
  r.quantize = median_ms(reps, quantize);
  // The kernel itself at each occupancy (AdamW scalars of a late step; the bits do not matter here).
  cuda::optim::UpdateArgs a;
  a.param = param.data();
  a.grad = grad.data();
  a.master = static_cast<float*>(with_copy.state(name, StateKind::master).data);
  a.m = with_copy.state(name, StateKind::exp_avg).data;
  a.v = with_copy.state(name, StateKind::exp_avg_sq).data;
  a.numel = numel;
  a.decay = 1.f - 1e-5f;
  a.beta1 = 0.9f, a.one_minus_beta1 = 0.1f, a.beta2 = 0.95f, a.one_minus_beta2 = 0.05f;
  a.step_size = 1e-4f, a.inv_sqrt_bc2 = 1.f, a.eps = 1e-8f;
  const cuda::optim::Fp8Args q{R, C, copy.codes, copy.scales, copy.codes_t, copy.scales_t};
  const unsigned grid = unsigned(numel / (128 * 128));
  using cuda::optim::Rule;
  using bf = __nv_bfloat16;
  const double k1 = median_ms(reps, [&] { cuda::optim::fused_update_fp8_kernel<Rule::adamw, bf, float, 1><<<grid, 256>>>(a, q); });
  const double k2 = median_ms(reps, [&] { cuda::optim::fused_update_fp8_kernel<Rule::adamw, bf, float, 2><<<grid, 256>>>(a, q); });
  const double k3 = median_ms(reps, [&] { cuda::optim::fused_update_fp8_kernel<Rule::adamw, bf, float, 3><<<grid, 256>>>(a, q); });
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  const double gb = double(numel) * 1e-9;
  std::printf("%-4s [%lld, %lld, %lld]  update %.3f ms (%.0f GB/s)  update+copy %.3f ms (%.0f GB/s)  update, quantize "
              "%.3f ms  quantize %.3f ms (%.0f GB/s)  copy costs %+.3f ms, saves %.3f ms\n",
              name, (long long)E, (long long)R, (long long)C, r.update, 28 * gb / r.update * 1e3, r.fused,
              30 * gb / r.fused * 1e3, r.two_pass, r.quantize, 4 * gb / r.quantize * 1e3, r.fused - r.update,
              r.two_pass - r.fused);
  std::printf("%-4s fused_update_fp8_kernel, registers for 1 / 2 / 3 CTAs per SM: %.3f / %.3f / %.3f ms (%.0f / %.0f / %.0f GB/s)\n",
              name, k1, k2, k3, 30 * gb / k1 * 1e3, 30 * gb / k2 * 1e3, 30 * gb / k3 * 1e3);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t E = argc > 1 ? std::atoll(argv[1]) : 64, d = argc > 2 ? std::atoll(argv[2]) : 4096,
                n = argc > 3 ? std::atoll(argv[3]) : 2048;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 10;
  try {
    const Row w2 = bench_tensor("W2", E, d, n, reps), w1 = bench_tensor("W1", E, 2 * n, d, reps);
    std::printf("OPTIM_FP8 layer (W1 + W2): update %.3f ms, update+copy %.3f ms, update then quantize %.3f ms: "
                "the fused copy costs %.3f ms over the update and saves %.3f ms against a separate pass\n",
                w1.update + w2.update, w1.fused + w2.fused, w1.two_pass + w2.two_pass,
                w1.fused + w2.fused - w1.update - w2.update, w1.two_pass + w2.two_pass - w1.fused - w2.fused);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
