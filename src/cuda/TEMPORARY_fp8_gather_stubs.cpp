// TEMPORARY, branch fp8layer only: DELETE AT MERGE with branch fp8gather, which defines these two
// launchers on the gather kernel. They exist here so that cuda_backend.cpp's FP8 layer and
// leanmoe_bench_gemms --fp8 link on this branch; calling them throws.
#include "expert_gemms.h"

namespace leanmoe::cuda {

void up_proj_act_fp8(const RoutedRows&, const ExpertShape&, const ExpertFunction&, Fp8Operand, Fp8Operand,
                     const void*, void*, void*, Fp8Output, cudaStream_t, const GemmConfig*) {
  throw leanmoe::Error("up_proj_act_fp8: not built on this branch");
}

void dh_act_bwd_fp8(const RoutedRows&, const ExpertShape&, const ExpertFunction&, Fp8Operand, Fp8Operand,
                    const void*, void*, void*, float*, Fp8Output, cudaStream_t, const GemmConfig*) {
  throw leanmoe::Error("dh_act_bwd_fp8: not built on this branch");
}

}  // namespace leanmoe::cuda
