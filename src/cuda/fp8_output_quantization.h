// Where the CUDA layer's FP8 path (cuda_backend.cpp) quantizes up's A and dH's dH, the operands of
// down_proj_fp8 and dx_expert_fp8: by a fp8_quantize_rows pass over the bf16 output (`pass`, the
// library's default until measured otherwise, docs/kernels.md "FP8 up and dH"), or in the GEMMs'
// epilogues (`epilogue`: up_proj_act_fp8's a_q, with no bf16 A written; dh_act_bwd_fp8's dh_q beside
// the bf16 dH that dW1 reads). Both give the same codes and scales, so results are bitwise identical.
// Tests and benchmarks set it (`leanmoe bench --fp8-quant`). Plain C++: no CUDA here.
#pragma once

namespace leanmoe::cuda {

enum class Fp8OutputQuantization { pass, epilogue };

// Process-wide, read at the start of each forward and backward call.
void set_fp8_output_quantization(Fp8OutputQuantization where);
Fp8OutputQuantization fp8_output_quantization();

}  // namespace leanmoe::cuda
