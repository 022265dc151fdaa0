// The default kernel of each expert GEMM kind (gemm_config.h): one heuristic per kind, from the
// shape and the GPU's SM count and DRAM bandwidth (GpuTraits, expert_gemms.h). The only place
// defaults live; the measurements behind each rule are in docs/kernels.md, the deciding number
// beside the rule in gemm_heuristics.cpp.
#pragma once
#include "expert_gemms.h"
#include "gemm_config.h"

namespace leanmoe::cuda {

// Fully specified (band and max_ctas included), and always one of compiled_gemm_configs(kind).
GemmConfig choose_gemm_config(GemmKind kind, const ExpertShape& s, const GpuTraits& gpu);

// SMs that backward's dW2, dx and dW1 leave free, when overlapped (backward_overlap.h), for the
// memory-bound steps the caller's stream runs beside them: the router chain and the dx gather-sum.
int backward_side_sms(const ExpertShape& s, int sm_count);

}  // namespace leanmoe::cuda
