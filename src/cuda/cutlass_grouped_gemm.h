// down_proj and dx_expert on CUTLASS's sm_90a grouped GEMM (kernels/sm90_cutlass_grouped_gemm.cuh);
// called from expert_gemms.cu, which keeps the hand-written kernels selectable for comparisons.
// Plain C++ header: no CUTLASS here.
#pragma once
#include <cuda_runtime.h>

#include "expert_gemms.h"

namespace leanmoe::cuda {

// LEANMOE_GEMM_CUTLASS, read at every launch (tests switch it within one process):
// "0" -> the hand-written kernels; "pingpong" / "cooperative" -> force that CUTLASS config (for
// tuning); anything else or unset -> CUTLASS with the shape heuristic (cutlass_grouped_gemm.cu).
bool cutlass_gemms_enabled();

// Same contracts as down_proj / dx_expert (expert_gemms.h); `workspace` holds at least
// expert_gemm_workspace_bytes(rows.E) bytes, or is nullptr (see expert_gemms.h).
void cutlass_down_proj(const RoutedRows& rows, const ExpertShape& s, const void* a, const void* w2, void* y,
                       void* workspace, cudaStream_t stream);
void cutlass_dx_expert(const RoutedRows& rows, const ExpertShape& s, const void* dh, const void* w1, void* dx_exp,
                       void* workspace, cudaStream_t stream);

}  // namespace leanmoe::cuda
