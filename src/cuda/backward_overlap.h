// How the CUDA backend's backward places its memory-bound steps against the expert GEMMs
// (cuda_backend.cpp; docs/kernels.md "Backward streams"). The library always runs the default;
// tests and benchmarks set another to compare the schedules (`leanmoe bench --bwd-overlap`).
// Either schedule runs the same kernels on the same inputs: results are bitwise identical.
// Plain C++: no CUDA here.
#pragma once

namespace leanmoe::cuda {

struct BackwardOverlap {
  // true: dW2, dx_expert and dW1 run on the backend's GEMM stream while the caller's stream runs
  // the router chain, the dx gather-sum and the callbacks; false: everything on the caller's stream.
  bool overlapped = true;
  // SMs those GEMMs leave free for the steps beside them (their CTAs: SM count minus this, at
  // least one 2-CTA cluster); -1: backward_side_sms (gemm_heuristics.h).
  int side_sms = -1;
};

// Process-wide, read at the start of each backward call. Throws leanmoe::Error for side_sms < -1.
void set_backward_overlap(const BackwardOverlap& overlap);
BackwardOverlap backward_overlap();

}  // namespace leanmoe::cuda
