// Helpers shared by the GPU benchmarks (leanmoe_bench_gemms and the dev/ benches that time CUDA
// launches): CUDA error checks, the median of per-launch event timings, comma lists.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace leanmoe::tools {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// Median time in ms of `iters` launches after `warmup` untimed ones, and then more untimed ones
// until `warm_seconds` of wall time have passed since the first, one event pair per timed launch on
// the default stream. launch(i) gets the launch's index (warm-up ones first), so that callers can
// rotate input sets with i % sets; `what` names the launches in an error. Why warm_seconds: a large
// GEMM loop reaches the H200's 700 W cap ~2 s after idle and the clock falls from 1980 to ~1.4-1.6
// GHz (docs/kernels.md "The power cap"); a few warm-up launches time the boost, not a training step.
// A process's first timing ran 4-11% slow at the cap even after 2 s of warm-up (docs/kernels.md
// "The dW epilogue by TMA store"): it is taken twice, the first dropped.
inline double median_launch_ms(int iters, int warmup, const std::function<void(int)>& launch, const char* what,
                               double warm_seconds = 0) {
  static bool first_timing = true;
  if (first_timing) {
    first_timing = false;
    median_launch_ms(iters, warmup, launch, what, warm_seconds);
  }
  const auto start = std::chrono::steady_clock::now();
  int i = 0;
  for (; i < warmup; ++i) launch(i);
  while (warm_seconds > 0) {
    for (const int end = i + 8; i < end; ++i) launch(i);
    check_cuda(cudaDeviceSynchronize(), what);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= warm_seconds) break;
  }
  warmup = i;
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) check_cuda(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < iters; ++i) {
    check_cuda(cudaEventRecord(ev[2 * i]), "cudaEventRecord");
    launch(warmup + i);
    check_cuda(cudaEventRecord(ev[2 * i + 1]), "cudaEventRecord");
  }
  check_cuda(cudaDeviceSynchronize(), what);
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) {
    float t = 0;
    check_cuda(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
    ms[i] = t;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
  return ms[iters / 2];
}

// "a,b,c" -> {"a", "b", "c"} ("" -> {""}).
inline std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  for (size_t b = 0; b <= list.size();) {
    const size_t e = std::min(list.find(',', b), list.size());
    out.push_back(list.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

}  // namespace leanmoe::tools
