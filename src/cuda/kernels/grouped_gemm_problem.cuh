// The problem the gather kernel (sm90_grouped_gemm_gather.cuh) solves for each of its four GEMM
// kinds: operand layouts, the launch arguments and the varlen-M tile table over (expert, m-tile).
// Device-only header.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "../expert_gemms.h"  // GemmKind, kMaxGemmExperts
#include "activation.cuh"
#include "offsets.cuh"

namespace leanmoe::cuda::kernels {

using bf16 = __nv_bfloat16;

// Up and dH are "varlen-M", dW2 and dW1 "varlen-K" (is_varlen_k, gemm_config.h); both varlen-K GEMMs
// run on dW2's kernel (expert_gemms.cu run_dw). (Down and dx, the other two, run on CUTLASS.)
// Operand A of every gather-kernel kind is a token-indexed tensor (X or dO) read through row_token.
// Whether B is stored [N, K] (K contiguous) rather than [K, N]: a property of the kind and the
// weights' layout. The HF layout's W1 [W, d] is up's B in K-major order and W2 [d, n] dH's in
// MN-major order; the transposed layout (W1 [d, W], W2 [n, d]) flips both. The varlen-K kinds'
// operands are activations and do not depend on it (expert_gemms.cu swaps their roles instead).
constexpr bool b_is_k_major(GemmKind k, bool transposed) { return (k == GemmKind::Up) != transposed; }

struct GemmArgs {
  const int32_t* expert_offsets;  // [E+1]
  const int32_t* row_token;       // [R_max]
  const float* row_gate;          // [R_max]
  int E;
  // The experts' function (up, dH; gated also dW1's width): gated: W = 2n, else n; W1's row order
  // (gated: [gate; up] or interleaved, H and dH follow it). In E's padding, and act, b1 below in the
  // 16 bytes up to 128: the struct keeps its size, the tensor map parameter its offset, and the
  // default kernels their SASS (a 144-byte GemmArgs rescheduled up's).
  bool gated, interleaved;
  int64_t d, n;
  const bf16* a;       // operand A (see the table in problem_dims)
  const bf16* b;       // operand B
  const bf16* h;       // H [R, W], read by the dH epilogue
  bf16* out;           // H, dH, dW2, dW1
  bf16* out2;          // A (up-proj) or A' (dH)
  float* ds_partial;   // [R, ds_tiles] (dH)
  int ds_tiles;
  int n_tiles, m_tiles;  // column tiles; row tiles of dW (varlen-K)
  int band;              // tile order: varlen-M column tiles, varlen-K row units walked together
  ActConstants act;  // the clamped SwiGLU's constants
  const bf16* b1;    // up: [E, W] in W1's row order, or null
};
static_assert(sizeof(GemmArgs) == 128, "GemmArgs grew: the default kernels' SASS changes with it (see gated)");
// The FP8 kernels' arguments (up, dH): a and b hold e4m3 codes (K-major, as the bf16 values), with
// their scales (docs/DESIGN.md "FP8"): a_scales [T, K/128] per gathered token row, b_scales
// [E, N/128, K/128] per 128x128 weight block (N along the weight rows as loaded: up W1's W rows,
// dH W2t's n rows). A separate type, so that GemmArgs (and the bf16 kernels) stay as they are.
// out_q: up's A or dH's dH also quantized in the epilogue (codes [R, C], scales [R, C/128], C = n
// resp. W, 1x128 tiles along the row as fp8_quantize_rows writes them); null codes: not asked for.
struct Fp8RowsOut {
  uint8_t* codes;
  float* scales;
};
struct Fp8GemmArgs : GemmArgs {
  const float* a_scales;
  const float* b_scales;
  Fp8RowsOut out_q;
};
template <class Tile>
using GemmArgsOf = std::conditional_t<Tile::kFp8, Fp8GemmArgs, GemmArgs>;

// Per-expert problem: C[M, N] = sum_k A[m, k] B[k, n].
// W = 2n for a gated activation, n for a plain one (H's, dH's and W1's width).
//   kind     M     N    K     A (layout, row stride)        B (layout, row stride; transposed weights)
//   up       rows  W    d     X[tok]   [M,K] ld d           W1_e [N,K] ld d   (W1t_e [K,N] ld W)
//   dh       rows  n    d     dO[tok]  [M,K] ld d           W2_e [K,N] ld n   (W2t_e [N,K] ld d)
//   dw2      d     n    rows  dO[tok]  [K,M] ld d           A'   [K,N] ld n
//   dw1      W     d    rows  dH       [K,M] ld W           X[tok] [K,N] ld d
// (up's and dH's B comes by TMA, so only its major-ness, b_is_k_major, enters the kernel.)
struct ProblemDims {
  int64_t M, N, K;  // the varlen one is 0
  int64_t lda, ldb;
  int64_t b_expert_stride;    // elements between two experts' weights (varlen-M), 0 for varlen-K
  int64_t out_expert_stride;  // elements between two experts' dW (varlen-K)
};

// W in a kernel: fixed by the activation's kind for up and dH, args.gated's for the varlen-K kinds
// (Act void).
template <class Act>
__host__ __device__ constexpr int64_t gemm_width(const GemmArgs& args) {
  if constexpr (std::is_void_v<Act>)
    return args.gated ? 2 * args.n : args.n;
  else
    return Act::kGated ? 2 * args.n : args.n;
}

template <GemmKind kKind>
__host__ __device__ constexpr ProblemDims problem_dims(int64_t d, int64_t n, int64_t w) {
  static_assert(kKind == GemmKind::Up || kKind == GemmKind::Dh || kKind == GemmKind::Dw2, "a gather-kernel kind");
  switch (kKind) {
    case GemmKind::Up: return {0, w, d, d, d, w * d, 0};
    case GemmKind::Dh: return {0, n, d, d, n, d * n, 0};
    case GemmKind::Dw2: return {d, n, 0, d, n, 0, d * n};
    default: return {};
  }
}

// ---- varlen-M tile table: the m-tiles of expert 0, then expert 1, ... are "slots" 0, 1, ...;
//      prefix[e] = first slot of expert e, prefix[E] = number of slots. Built once per CTA by one
//      warp (a 32-wide scan per chunk of experts), then each tile maps to its expert by binary
//      search instead of a scan over all experts per tile. ----

// The m-tile counts of experts base .. base + 31 (ceil(rows / tile_m), 0 past E), one per lane, and
// their inclusive prefix sum across the warp. Run by one whole warp.
struct MTileScan {
  int count, inclusive;
};
__device__ __forceinline__ MTileScan warp_scan_m_tiles(const int32_t* expert_offsets, int E, int tile_m, int base) {
  const int lane = threadIdx.x & 31, e = base + lane;
  const int count = e < E ? (expert_offsets[e + 1] - expert_offsets[e] + tile_m - 1) / tile_m : 0;
  int inclusive = count;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += v;
  }
  return {count, inclusive};
}
__device__ __forceinline__ void build_m_tile_prefix(const int32_t* expert_offsets, int E, int tile_m, int* prefix) {
  const int lane = threadIdx.x & 31;
  int running = 0;
  for (int base = 0; base < E; base += 32) {
    const MTileScan scan = warp_scan_m_tiles(expert_offsets, E, tile_m, base);
    if (base + lane < E) prefix[base + lane + 1] = running + scan.inclusive;
    running += __shfl_sync(0xffffffffu, scan.inclusive, 31);
  }
  if (lane == 0) prefix[0] = 0;
}

}  // namespace leanmoe::cuda::kernels
