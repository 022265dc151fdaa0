// The default kernel of each expert GEMM kind (gemm_config.h): one heuristic per kind, from the
// shape and the SM count. The only place defaults live; the measurements behind each rule are in
// docs/kernels.md, the deciding number beside the rule in gemm_heuristics.cpp.
#pragma once
#include "expert_gemms.h"
#include "gemm_config.h"

namespace leanmoe::cuda {

// Fully specified (band and max_ctas included), and always one of compiled_gemm_configs(kind).
GemmConfig choose_gemm_config(GemmKind kind, const ExpertShape& s, int sm_count);

}  // namespace leanmoe::cuda
