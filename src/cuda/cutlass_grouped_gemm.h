// down_proj and dx_expert on CUTLASS's sm_90a grouped GEMM (kernels/sm90_cutlass_grouped_gemm.cuh);
// called from expert_gemms.cu with the configuration resolve_gemm_config chose.
// Plain C++ header: no CUTLASS here.
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "expert_gemms.h"

namespace leanmoe::cuda {

// The CUTLASS configurations compiled for `kind` (down, dx; none for the other kinds).
std::vector<GemmConfig> cutlass_gemm_configs(GemmKind kind);

// Same contracts as down_proj / dx_expert (expert_gemms.h); `workspace` holds at least
// expert_gemm_workspace_bytes(rows.E) bytes, or is nullptr (see expert_gemms.h); `config` is one of
// cutlass_gemm_configs(kind) with max_ctas set.
void cutlass_down_proj(const RoutedRows& rows, const ExpertShape& s, const void* a, const void* w2, void* y,
                       void* workspace, const GemmConfig& config, cudaStream_t stream);
void cutlass_dx_expert(const RoutedRows& rows, const ExpertShape& s, const void* dh, const void* w1, void* dx_exp,
                       void* workspace, const GemmConfig& config, cudaStream_t stream);

}  // namespace leanmoe::cuda
