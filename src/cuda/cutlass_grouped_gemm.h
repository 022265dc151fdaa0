// down_proj and dx_expert on CUTLASS's sm_90a grouped GEMM (kernels/sm90_cutlass_grouped_gemm.cuh);
// called from expert_gemms.cu with the configuration resolve_gemm_config chose.
// Plain C++ header: no CUTLASS here.
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "expert_gemms.h"

namespace leanmoe::cuda {

// The CUTLASS configurations compiled for `kind` (down, dx; none for the other kinds), bf16 or FP8.
std::vector<GemmConfig> cutlass_gemm_configs(GemmKind kind, bool fp8);

// Same contracts as down_proj / dx_expert (expert_gemms.h); `workspace` holds at least
// expert_gemm_workspace_bytes(rows.E) bytes, or is nullptr (see expert_gemms.h); `config` is one of
// cutlass_gemm_configs(kind) with max_ctas set.
void cutlass_down_proj(const RoutedRows& rows, const ExpertShape& s, const void* a, const void* w2, void* y,
                       void* workspace, const GemmConfig& config, cudaStream_t stream);
void cutlass_dx_expert(const RoutedRows& rows, const ExpertShape& s, const void* dh, const void* w1, void* dx_exp,
                       void* workspace, const GemmConfig& config, cudaStream_t stream);
// down_proj_fp8 (N = d, K = n) and dx_expert_fp8 (N = d, K = W): D [R, d] bf16 = A · Bᵀ per expert, A
// codes [R, K] with scales [R, K/128], B K-major codes [E, N, K] with scales [E, N/128, K/128]; N and K
// multiples of 128 (checked by the caller); `config` one of cutlass_gemm_configs(kind, true).
void cutlass_fp8(const RoutedRows& rows, int64_t N, int64_t K, Fp8Operand a, Fp8Operand b, void* d, void* workspace,
                 const GemmConfig& config, cudaStream_t stream, const char* what);

}  // namespace leanmoe::cuda
