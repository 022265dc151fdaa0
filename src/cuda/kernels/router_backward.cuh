// Router backward (DESIGN.md "Router backward"), one warp per token, from the recomputed logits:
// p = softmax(z); dp from the rows' dS through the gate convention, plus the aux-loss term;
// dz = p ⊙ (dp − <p, dp>) + z-loss term. Writes dz in place of z, and its bf16 split [hi | lo].
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/kernels/offsets.cuh"
#include "cuda/kernels/warp.cuh"
#include "cuda/launchers.h"

namespace leanmoe::cuda::kernels {

constexpr int kRouterBwdWarps = 4;

// One warp per token. Per block, computed once: the aux-loss term of dp per expert (the same
// expression per element as before, two divisions each, which per token cost ~E/8 instructions
// per lane) and expert_offsets, which the per-row binary search then reads from shared memory
// instead of through log2(E) dependent global loads. Per warp: p and dp (E floats each) and
// S_t as a bitmask (E/32 words). Shared memory: (kRouterBwdWarps * (2E + E/32) + 2E + 1) * 4 bytes.
__global__ void __launch_bounds__(32 * kRouterBwdWarps) router_backward_kernel(RouterBackwardArgs a) {
  extern __shared__ float smem[];
  const int E = int(a.E), K = int(a.K), T = int(a.T);
  const int words = (E + 31) / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* aux = smem;                                               // [E]
  int32_t* offsets = reinterpret_cast<int32_t*>(aux + E);          // [E + 1]
  float* p = aux + 2 * E + 1 + warp * (2 * E + words);
  float* dp = p + E;
  uint32_t* in_S = reinterpret_cast<uint32_t*>(dp + E);            // [words]
  const float c_aux = a.d_losses ? a.d_losses[0] : a.c_aux;
  const float c_z = a.d_losses ? a.d_losses[1] : a.c_z;
  for (int e = threadIdx.x; e <= E; e += blockDim.x) {
    offsets[e] = a.expert_offsets[e];
    if (e < E) {
      // Top-K routing: the top-K counts are the rows per expert (topk_counts null).
      const int count = a.topk_counts ? a.topk_counts[e] : a.expert_offsets[e + 1] - a.expert_offsets[e];
      aux[e] = c_aux * float(E) * (float(count) / float(T * K)) / float(T);
    }
  }
  __syncthreads();
  const int t = blockIdx.x * kRouterBwdWarps + warp;
  if (t >= T) return;

  const int32_t* S = a.topk_experts + int64_t(t) * K;
  float* zt = a.zdz + int64_t(t) * E;
  for (int e = lane; e < E; e += 32) {
    p[e] = zt[e];
    dp[e] = aux[e];
  }
  for (int w = lane; w < words; w += 32) in_S[w] = 0;
  __syncwarp();
  for (int k = lane; k < K; k += 32) atomicOr(&in_S[S[k] / 32], 1u << (S[k] % 32));
  __syncwarp();
  const float lse = warp_softmax_in_place(p, E, lane);

  float sum_chosen = 0.f;  // sequential in k, as forward computed it
  for (int k = 0; k < K; ++k) sum_chosen += p[S[k]];
  const float D = a.renormalised ? sum_chosen : 1.f;

  // The token's rows have distinct experts, so lanes update dp without conflicts.
  float chosen_weighted = 0.f;  // sum over the token's kept chosen rows of dS * p_e
  const int begin = a.token_offsets[t], end = a.token_offsets[t + 1];
  for (int i = begin + lane; i < end; i += 32) {
    const int row = a.token_rows[i];
    const float ds = a.dS[row];
    const int e = segment_of(offsets, E, row);  // offsets in shared memory
    if ((in_S[e / 32] >> (e % 32)) & 1u) {
      dp[e] += ds / D;
      chosen_weighted += ds * p[e];
    } else {
      dp[e] += ds;
    }
  }
  chosen_weighted = warp_sum(chosen_weighted);
  __syncwarp();
  if (a.renormalised)
    for (int k = lane; k < K; k += 32) dp[S[k]] -= chosen_weighted / (D * D);
  __syncwarp();

  float p_dot_dp = 0.f;
  for (int e = lane; e < E; e += 32) p_dot_dp += p[e] * dp[e];
  p_dot_dp = warp_sum(p_dot_dp);
  const float z_scale = c_z * 2.f * lse / float(T);
  auto* hi = static_cast<__nv_bfloat16*>(a.dz_split) + int64_t(t) * 2 * E;
  auto* lo = hi + E;
  for (int e = lane; e < E; e += 32) {
    const float dz = p[e] * (dp[e] - p_dot_dp) + z_scale * p[e];
    zt[e] = dz;
    const __nv_bfloat16 h = __float2bfloat16_rn(dz);
    hi[e] = h;
    lo[e] = __float2bfloat16_rn(dz - __bfloat162float(h));
  }
}

}  // namespace leanmoe::cuda::kernels
