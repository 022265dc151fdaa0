// Router and routing-metadata kernels (SPEC §3 kernels 1-2, §5 token rounding), bit-for-bit the
// choices of the CPU backend: top-K on z with ties to the lower expert, rows sorted by expert and
// stable by token, each token's rows in ascending expert order. No float atomics anywhere; the
// integer counters use shared-memory atomics whose totals do not depend on order.
#pragma once
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cstdint>

#include "cuda/kernels/warp.cuh"
#include "cuda/launchers.h"
#include "token_rounding.h"

namespace leanmoe::cuda::kernels {

constexpr int kRouterWarps = 4;        // tokens per block of the per-token router kernels
constexpr int kTileTokens = 32;        // tokens per warp in the metadata kernels (one per lane)
constexpr int kScanThreads = 256;
constexpr int kLossChunk = 256;        // tokens per partial sum of the loss reductions

// (v, e) comes before (pv, pe) in the top-K order: larger z first, then lower expert index.
__device__ __forceinline__ bool topk_before(float v, int e, float pv, int pe) {
  return v > pv || (v == pv && e < pe);
}

// One warp per token. Shared memory: kRouterWarps * (E floats + K ints).
__global__ void router_topk_softmax_kernel(float* __restrict__ zp, int T, int E, int K,
                                           int32_t* __restrict__ topk_experts, float* __restrict__ lse,
                                           float* __restrict__ sum_chosen, uint8_t* __restrict__ code) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* row = smem + warp * E;
  int* chosen = reinterpret_cast<int*>(smem + kRouterWarps * E) + warp * K;
  const int t = blockIdx.x * kRouterWarps + warp;
  if (t >= T) return;
  float* zt = zp + int64_t(t) * E;
  for (int e = lane; e < E; e += 32) row[e] = zt[e];
  __syncwarp();

  // Top-K by repeated "next in order": round k takes the best (z, e) strictly after round k-1's.
  float prev_v = INFINITY;
  int prev_e = -1;
  for (int k = 0; k < K; ++k) {
    float best_v = -INFINITY;
    int best_e = E;  // sentinel, loses every comparison against a real expert
    for (int e = lane; e < E; e += 32) {
      const float v = row[e];
      const bool after_prev = topk_before(prev_v, prev_e, v, e);
      if (after_prev && (best_e == E || topk_before(v, e, best_v, best_e))) best_v = v, best_e = e;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFullMask, best_v, o);
      const int oe = __shfl_xor_sync(kFullMask, best_e, o);
      if (oe != E && (best_e == E || topk_before(ov, oe, best_v, best_e))) best_v = ov, best_e = oe;
    }
    if (best_e == E) best_e = 0;  // only reachable with NaN logits (rejected by check_finite)
    if (lane == 0) chosen[k] = best_e;
    prev_v = best_v, prev_e = best_e;
  }
  __syncwarp();

  const float lse_t = warp_softmax_in_place(row, E, lane);
  for (int e = lane; e < E; e += 32) {
    zt[e] = row[e];
    bool in_set = false;
    for (int k = 0; k < K; ++k) in_set |= chosen[k] == e;
    code[int64_t(t) * E + e] = in_set ? kChosen : kNotRouted;
  }
  if (lane == 0) {
    float s = 0.f;  // sequential in k, as the CPU backend sums it
    for (int k = 0; k < K; ++k) {
      s += row[chosen[k]];
      topk_experts[int64_t(t) * K + k] = chosen[k];
    }
    sum_chosen[t] = s;
    lse[t] = lse_t;
  }
}

// Shared-memory histogram per block, then one global add per (block, expert): global atomics on
// E counters straight from T*K pairs serialise (38 us at T*K = 196608, E = 128 on an H200).
__global__ void count_topk_kernel(const int32_t* __restrict__ topk_experts, int64_t pairs, int E,
                                  int32_t* __restrict__ counts) {
  extern __shared__ int hist_topk[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist_topk[e] = 0;
  __syncthreads();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < pairs; i += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(&hist_topk[topk_experts[i]], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    if (hist_topk[e]) atomicAdd(&counts[e], hist_topk[e]);
}

// Partial sums over chunks of kLossChunk tokens, in double: P[chunk][e] = sum p, Z[chunk] = sum lse^2.
__global__ void loss_partials_kernel(const float* __restrict__ p, const float* __restrict__ lse, int T, int E,
                                     double* __restrict__ partial_P, double* __restrict__ partial_Z) {
  using Reduce = cub::BlockReduce<double, kLossChunk>;
  __shared__ typename Reduce::TempStorage tmp;
  const int t0 = blockIdx.x * kLossChunk, t1 = min(T, t0 + kLossChunk);
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    double s = 0.0;
    for (int t = t0; t < t1; ++t) s += p[int64_t(t) * E + e];
    partial_P[int64_t(blockIdx.x) * E + e] = s;
  }
  const int t = t0 + threadIdx.x;
  const double l = t < T ? double(lse[t]) : 0.0;
  const double z = Reduce(tmp).Sum(l * l);
  if (threadIdx.x == 0) partial_Z[blockIdx.x] = z;
}

__global__ void loss_final_kernel(const double* __restrict__ partial_P, const double* __restrict__ partial_Z,
                                  int chunks, const int32_t* __restrict__ counts, int T, int E, int K,
                                  float* __restrict__ losses) {
  using Reduce = cub::BlockReduce<double, kLossChunk>;
  __shared__ typename Reduce::TempStorage tmp;
  double aux = 0.0;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    double P = 0.0;
    for (int c = 0; c < chunks; ++c) P += partial_P[int64_t(c) * E + e];
    aux += double(counts[e]) / (double(T) * K) * (P / double(T));
  }
  aux = Reduce(tmp).Sum(aux);
  __syncthreads();
  double z = 0.0;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) z += partial_Z[c];
  z = Reduce(tmp).Sum(z);
  if (threadIdx.x == 0) {
    losses[0] = float(double(E) * aux);
    losses[1] = float(z / double(T));
  }
}

// Priority of (t, e) as a 32-bit key, larger = kept first: bit 31 = chosen (every chosen pair
// outranks every unchosen one, as q in (0,1] vs p-1 in [-1,0)), bits 30..0 = the value (q =
// p / sum_chosen, or p; non-negative floats order like their bit patterns). Equal keys are
// ordered by token index in the final pass (ties -> lower token).
__device__ __forceinline__ uint32_t rounding_key(float p, float sum_chosen, uint8_t code) {
  const bool is_chosen = code == kChosen;
  const float v = is_chosen ? p / sum_chosen : p;
  return (uint32_t(is_chosen) << 31) | (__float_as_uint(v) & 0x7fffffffu);
}

constexpr int kKeyTile = 32;

// keys[e][t] = rounding_key(t, e): a tiled transpose, so the per-expert selection below reads
// each column contiguously (reading the [T, E] matrices column-wise 8 times cost 476 us at
// T = 24576, E = 128). Block (32, 8) per 32x32 tile.
__global__ void rounding_keys_kernel(const float* __restrict__ p, const float* __restrict__ sum_chosen,
                                     const uint8_t* __restrict__ code, int T, int E, uint32_t* __restrict__ keys) {
  __shared__ uint32_t tile[kKeyTile][kKeyTile + 1];
  const int e0 = blockIdx.x * kKeyTile, t0 = blockIdx.y * kKeyTile;
  for (int i = threadIdx.y; i < kKeyTile; i += blockDim.y) {
    const int t = t0 + i, e = e0 + threadIdx.x;
    if (t < T && e < E) {
      const int64_t at = int64_t(t) * E + e;
      tile[i][threadIdx.x] = rounding_key(p[at], sum_chosen[t], code[at]);
    }
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kKeyTile; i += blockDim.y) {
    const int e = e0 + i, t = t0 + threadIdx.x;
    if (t < T && e < E) keys[int64_t(e) * T + t] = tile[threadIdx.x][i];
  }
}

constexpr int kRoundThreads = 512;

// One block per expert: radix-select the r_e-th largest key (4 passes of 8 bits) = v; keep every
// key > v and, among keys == v, the lowest tokens up to r_e in all.
__global__ void round_tokens_kernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ topk_counts,
                                    int T, int E, int64_t tile, RoundingMode mode, uint8_t* __restrict__ code) {
  using Scan = cub::BlockScan<int, kRoundThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ unsigned hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ unsigned s_rank;
  const int e = blockIdx.x;
  const int64_t f = topk_counts[e];
  const int64_t r = leanmoe::detail::rounded_count(f, tile, mode, T);
  if (r == f) return;
  const uint32_t* column = keys + int64_t(e) * T;

  uint32_t v = 0;        // the r-th largest key (r == 0: nothing kept)
  unsigned equal_kept = 0;  // how many keys == v are kept (the lowest tokens)
  if (r > 0) {
    uint32_t prefix = 0, mask = 0;
    if (threadIdx.x == 0) s_rank = unsigned(r);  // rank of v among the keys matching prefix
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
      __syncthreads();
      for (int t = threadIdx.x; t < T; t += blockDim.x) {
        const uint32_t key = column[t];
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        unsigned above = 0;
        int b = 255;
        for (; b > 0 && above + hist[b] < s_rank; --b) above += hist[b];
        s_rank -= above;
        s_prefix = prefix | (uint32_t(b) << shift);
      }
      __syncthreads();
      prefix = s_prefix;
      mask |= 255u << shift;
    }
    v = prefix;
    equal_kept = s_rank;  // after the last pass: the rank of v among the keys equal to v
  }

  // Rewrite the column in token order; a block scan ranks the keys equal to v by token.
  int equal_before = 0;
  for (int base = 0; base < T; base += kRoundThreads) {
    const int t = base + threadIdx.x;
    const uint32_t key = t < T ? column[t] : 0;
    const int is_equal = r > 0 && t < T && key == v;
    int rank, total;
    Scan(scan_tmp).ExclusiveSum(is_equal, rank, total);
    if (t < T) {
      const bool keep = r > 0 && (key > v || (is_equal && unsigned(equal_before + rank) < equal_kept));
      uint8_t& c = code[int64_t(t) * E + e];
      c = !keep ? kNotRouted : c == kChosen ? kChosen : kAdded;
    }
    equal_before += total;
    __syncthreads();
  }
}

// Metadata pass 1, one warp per tile of 32 tokens: tile_counts[tile][e] = routed pairs of e in
// the tile; token_counts[t] = routed pairs of t.
__global__ void count_routes_kernel(const uint8_t* __restrict__ code, int T, int E, int tiles,
                                    int32_t* __restrict__ tile_counts, int32_t* __restrict__ token_counts) {
  const int lane = threadIdx.x % 32;
  const int tile = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (tile >= tiles) return;
  const int t0 = tile * kTileTokens, t1 = min(T, t0 + kTileTokens);
  for (int e = lane; e < E; e += 32) {
    int c = 0;
    for (int t = t0; t < t1; ++t) c += code[int64_t(t) * E + e] != kNotRouted;
    tile_counts[int64_t(tile) * E + e] = c;
  }
  for (int t = t0; t < t1; ++t) {
    int c = 0;
    for (int e = lane; e < E; e += 32) c += code[int64_t(t) * E + e] != kNotRouted;
    c = warp_sum_int(c);
    if (lane == 0) token_counts[t] = c;
  }
}

// Metadata pass 2, one block per expert: tile_base[tile][e] = exclusive prefix over tiles;
// expert_counts[e] = the column total.
__global__ void scan_tiles_kernel(const int32_t* __restrict__ tile_counts, int tiles, int E,
                                  int32_t* __restrict__ tile_base, int32_t* __restrict__ expert_counts) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int e = blockIdx.x;
  int running = 0;
  for (int base = 0; base < tiles; base += kScanThreads) {
    const int tile = base + threadIdx.x;
    const int v = tile < tiles ? tile_counts[int64_t(tile) * E + e] : 0;
    int excl, total;
    Scan(tmp).ExclusiveSum(v, excl, total);
    if (tile < tiles) tile_base[int64_t(tile) * E + e] = running + excl;
    running += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) expert_counts[e] = running;
}

constexpr int kOffsetThreads = 1024;
constexpr int kOffsetItems = 4;  // 4096 values per step: T = 40960 takes 10 steps

// Exclusive scan of `count` values into offsets[0..count] in one block.
__device__ void block_offsets(const int32_t* __restrict__ counts, int count, int32_t* __restrict__ offsets,
                              typename cub::BlockScan<int, kOffsetThreads>::TempStorage& tmp) {
  using Scan = cub::BlockScan<int, kOffsetThreads>;
  int running = 0;
  for (int base = 0; base < count; base += kOffsetThreads * kOffsetItems) {
    const int first = base + threadIdx.x * kOffsetItems;
    int v[kOffsetItems];
#pragma unroll
    for (int j = 0; j < kOffsetItems; ++j) v[j] = first + j < count ? counts[first + j] : 0;
    int total;
    Scan(tmp).ExclusiveSum(v, v, total);
#pragma unroll
    for (int j = 0; j < kOffsetItems; ++j)
      if (first + j < count) offsets[first + j] = running + v[j];
    running += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) offsets[count] = running;
}

// Metadata pass 3, block 0: expert_offsets; block 1: token_offsets.
__global__ void scan_offsets_kernel(const int32_t* __restrict__ expert_counts, int E,
                                    int32_t* __restrict__ expert_offsets, const int32_t* __restrict__ token_counts,
                                    int T, int32_t* __restrict__ token_offsets) {
  __shared__ typename cub::BlockScan<int, kOffsetThreads>::TempStorage tmp;
  if (blockIdx.x == 0) block_offsets(expert_counts, E, expert_offsets, tmp);
  else block_offsets(token_counts, T, token_offsets, tmp);
}

// Metadata pass 4, one warp per tile of 32 tokens, lane = expert within a chunk of 32 experts.
// Walking tokens in order gives each expert's rows stable by token; walking expert chunks in
// order, with a ballot per token, gives each token's rows in ascending expert order.
__global__ void scatter_routes_kernel(const uint8_t* __restrict__ code, const float* __restrict__ p,
                                      const float* __restrict__ sum_chosen, bool renormalised, int T, int E,
                                      int tiles, const int32_t* __restrict__ tile_base,
                                      MetadataOut out) {
  const int lane = threadIdx.x % 32;
  const int tile = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (tile >= tiles) return;
  const int t0 = tile * kTileTokens, t1 = min(T, t0 + kTileTokens);
  int my_token_written = 0;  // rows already listed for token t0 + lane
  const int my_token_offset = t0 + lane < T ? out.token_offsets[t0 + lane] : 0;
  for (int e0 = 0; e0 < E; e0 += 32) {
    const int e = e0 + lane;
    // All 32 codes of this lane's expert first: independent loads in flight together.
    uint8_t c[kTileTokens];
#pragma unroll
    for (int i = 0; i < kTileTokens; ++i) c[i] = (e < E && t0 + i < t1) ? code[int64_t(t0 + i) * E + e] : kNotRouted;
    int row = e < E ? out.expert_offsets[e] + tile_base[int64_t(tile) * E + e] : 0;
#pragma unroll
    for (int i = 0; i < kTileTokens; ++i) {
      const int t = t0 + i;
      const unsigned routed = __ballot_sync(kFullMask, c[i] != kNotRouted);
      const int written = __shfl_sync(kFullMask, my_token_written, i);
      const int token_offset = __shfl_sync(kFullMask, my_token_offset, i);
      if (c[i] != kNotRouted) {
        const float pe = p[int64_t(t) * E + e];
        out.row_token[row] = t;
        out.row_gate[row] = (c[i] == kChosen && renormalised) ? pe / sum_chosen[t] : pe;
        out.token_rows[token_offset + written + __popc(routed & ((1u << lane) - 1u))] = row;
        ++row;
      }
      if (lane == i) my_token_written += __popc(routed);
    }
  }
}

}  // namespace leanmoe::cuda::kernels
