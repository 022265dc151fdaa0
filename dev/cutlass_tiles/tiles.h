// dev/cutlass_tiles: the candidate CUTLASS grouped GEMMs for down and dx (plain C++ side).
// Each candidate_*.cu instantiates a few configurations through launch.cuh; bench.cu times them.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tiles {

enum class Kind { Down, Dx };  // down: B = W2_e [N=d, K=n] (K contiguous); dx: B = W1_e [K=2n, N=d] (N contiguous)

// One grouped GEMM as the library launches it: D_e[M_e, N] = A_e[M_e, K] · B_e, A and D row-major and
// expert-sorted, M_e = expert_offsets[e+1] - expert_offsets[e] read on the device only.
struct Problem {
  const int32_t* expert_offsets;
  int E;
  int64_t N, K;
  const void* a;
  const void* b;
  void* d;
  int64_t b_expert_stride;
};

struct Candidate {
  Kind kind;
  std::string name;  // e.g. "pp128x192c2x1", "coop128x256c2x1e64" (e64: epilogue tile N 64)
  int stages;        // mainloop stages CUTLASS carved out
  int smem_bytes;    // the kernel's shared storage
  size_t (*workspace_bytes)(int E, int sms);
  // Launches fill_group_args then the GEMM on `stream` (what the library's run<G> does);
  // along_n: the group scheduler's raster order (CUTLASS's default is along M).
  void (*launch)(const Problem& p, bool along_n, void* workspace, int sms, cudaStream_t stream);
};

// Registered per translation unit (candidates_*.cu), so that ninja/ccache rebuild only what changed.
void add_down_a(std::vector<Candidate>& out);
void add_down_b(std::vector<Candidate>& out);
void add_down_c(std::vector<Candidate>& out);
void add_dx_a(std::vector<Candidate>& out);
void add_dx_b(std::vector<Candidate>& out);
void add_dx_c(std::vector<Candidate>& out);
void add_down_d(std::vector<Candidate>& out);

}  // namespace tiles
