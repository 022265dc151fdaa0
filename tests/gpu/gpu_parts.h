// The two Hopper parts the kernel heuristics were measured on, as choose_gemm_config sees them
// (GpuTraits: SM count, peak DRAM GB/s = 2 x memory clock x bus width), for host-only tests.
#pragma once
#include "../../src/cuda/expert_gemms.h"

namespace leanmoe::testing {

inline constexpr cuda::GpuTraits kH200{132, 4916};
inline constexpr cuda::GpuTraits kH100{132, 3352};

}  // namespace leanmoe::testing
