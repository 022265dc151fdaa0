// dev/fp8_grouped: CUTLASS's Hopper FP8 blockwise-scaled ptr-array grouped GEMM on the expert GEMMs
// down and dx (plain C++ side; fp8_gemm.cuh instantiates, bench.cu times).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fp8g {

// D_e[M_e, N] (bf16, row-major) = sum over k-blocks of sa * sb * (A_e[M_e, K] . B_e[N, K]^T), operands
// e4m3 with K contiguous, fp32 accumulation. M_e = expert_offsets[e+1] - expert_offsets[e] (device only).
// Scales (fp32, src/fp8.h's powers of two): A 1x128 along K, B 128x128 blocks.
//   sfa: [R, Kb] row-major (Kb = ceil(K / 128)): the layout src/fp8.h's quantize writes for the
//        expert-sorted rows; or, for candidates with sfa_mn, per expert a [Kb, M_e] block at row
//        offset begin (element offset begin * Kb): M contiguous, CUTLASS's default major-ness.
//   sfb: per expert [Nb, Kb] row-major (Nb = ceil(N / 128)) at e * sfb_expert_stride: quantize's
//        layout for the weight as stored [N, K].
struct Problem {
  const int32_t* expert_offsets;
  int E;
  int64_t N, K;
  const uint8_t* a;
  const float* sfa;
  const uint8_t* b;
  int64_t b_expert_stride;
  const float* sfb;
  int64_t sfb_expert_stride;
  __nv_bfloat16* d;
};

struct Candidate {
  std::string name;  // e.g. "coop128x128c1x2", "+sfamn": A's scales M-major
  bool sfa_mn;
  int stages;
  int smem_bytes;
  size_t (*workspace_bytes)(int E, int sms);
  // The per-group argument fill then the GEMM on `stream`, as the library's run<G> does for bf16.
  void (*launch)(const Problem& p, void* workspace, int sms, cudaStream_t stream);
};

// One translation unit per two kernels (ninja runs two nvcc at once; ccache keeps the rest).
void add_fp8_a(std::vector<Candidate>& out);
void add_fp8_b(std::vector<Candidate>& out);
void add_fp8_c(std::vector<Candidate>& out);

}  // namespace fp8g
