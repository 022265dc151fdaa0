// Router and routing-metadata kernels (docs/SPEC.md §3 kernels 1-2, §5 token rounding), bit-for-bit the
// choices of the CPU backend: top-K on z with ties to the lower expert, rows sorted by expert and
// stable by token, each token's rows in ascending expert order. No float atomics anywhere; the
// integer counters use shared-memory atomics whose totals do not depend on order.
#pragma once
#include <cuda_bf16.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cstdint>

#include "cuda/kernels/chained_grid.cuh"
#include "cuda/kernels/warp.cuh"
#include "cuda/launchers.h"
#include "token_rounding.h"

namespace leanmoe::cuda::kernels {

constexpr int kRouterThreads = 128;     // router kernel block: small blocks even out the one wave of tokens
// Tokens per warp in the code-matrix metadata kernels (token rounding): 8, not 32, so that small T
// still fills the GPU (T = 8192: 1024 warps instead of 256; scatter_routes took 99 us with 32).
constexpr int kTileTokens = 8;
constexpr int kScanThreads = 256;
constexpr int kLossChunk = 256;        // tokens per partial sum of the loss reductions

// z as an unsigned key that orders like the float compare (-0 == +0, so both map to +0's key);
// every value, -inf included, maps above 0, which marks "no candidate".
__device__ __forceinline__ uint32_t topk_key(float v) {
  const uint32_t u = v == 0.f ? 0u : __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float topk_key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Max / min over the kLanes lanes of this thread's group (lanes aligned to kLanes): butterflies
// within the group; `mask` = the lanes taking part (the whole warp, or the group in a branch of its own).
template <int kLanes>
__device__ __forceinline__ uint32_t group_max(uint32_t v, unsigned mask) {
  for (int o = kLanes / 2; o > 0; o /= 2) v = max(v, __shfl_xor_sync(mask, v, o));
  return v;
}
template <int kLanes>
__device__ __forceinline__ uint32_t group_min(uint32_t v, unsigned mask) {
  for (int o = kLanes / 2; o > 0; o /= 2) v = min(v, __shfl_xor_sync(mask, v, o));
  return v;
}

// kV consecutive floats at row[e..e+kV) (zeros past E): one vector access when `vec` (E % kV == 0
// and the rows 4kV-byte aligned), else element by element.
template <int kV>
__device__ __forceinline__ void load_run(const float* row, int e, int E, bool vec, float* v) {
  if (vec && e + kV <= E) {
    if constexpr (kV == 4) *reinterpret_cast<float4*>(v) = *reinterpret_cast<const float4*>(row + e);
    else if constexpr (kV == 2) *reinterpret_cast<float2*>(v) = *reinterpret_cast<const float2*>(row + e);
    else v[0] = row[e];
  } else {
#pragma unroll
    for (int i = 0; i < kV; ++i) v[i] = e + i < E ? row[e + i] : 0.f;
  }
}
template <int kV>
__device__ __forceinline__ void store_run(float* row, int e, int E, bool vec, const float* v) {
  if (vec && e + kV <= E) {
    if constexpr (kV == 4) *reinterpret_cast<float4*>(row + e) = *reinterpret_cast<const float4*>(v);
    else if constexpr (kV == 2) *reinterpret_cast<float2*>(row + e) = *reinterpret_cast<const float2*>(v);
    else row[e] = v[0];
  } else {
#pragma unroll
    for (int i = 0; i < kV; ++i)
      if (e + i < E) row[e + i] = v[i];
  }
}

// Top-K + softmax of one token per group of kGroup = 32 / kWidth lanes (kWidth tokens per warp;
// one warp per token cost 32 us at T = 24576, E = 128: the K serial rounds of warp-wide reductions
// left 31 of 32 lanes idle). Lane q of a group holds e = kWidth q + c + 32 j (c < kWidth, j <
// kChunks) in slot s = kWidth j + c, loaded kV = min(kWidth, 4) at a time; e % 32 = kWidth q + c, so
// each partial sum of the former one-warp layout (lane l: e = l + 32 j in j order) is one thread's
// and the softmax keeps its bits: leaf sums in j order, the cross-lane levels of the old butterfly
// (l xor 16, 8, ...) as group shuffles, its last log2(kWidth) levels within the thread.
//
// Top-K runs on packed keys: topk_key(z) with its low log2(32 kChunks) bits replaced by
// (32 kChunks - 1 - e), unique and ordered as (z desc, e asc) wherever the truncated keys differ.
// Round r takes the largest packed key below the previous one: max over (packed - previous) mod 2^32,
// one VIADDMNMX per slot (the exact compare-and-select scan cost 5 instructions per slot and round).
// If two of the first min(K + 1, E) picks share a truncated key (z within 2^bits ulp), the order may
// differ from the exact one, so that group redoes the K rounds on exact keys (ties -> lower
// expert), the former algorithm. Out: p in place of z, lse, sum_chosen (sequential in k),
// topk_experts by descending z; `code` (token rounding, else null): kChosen on S_t; `pair_experts`
// / `pair_gates` (top-K, else null): S_t in ascending expert order with each pair's gate.
// Shared memory per group: its p row (32 kChunks floats), then (after all rows) its K picks.
// Six blocks per SM (<= 80 registers, 96 unbounded) hold T = 24576, E = 128 in one wave of 3168 warps.
template <int kWidth, int kChunks>
__global__ void __launch_bounds__(kRouterThreads, kWidth == 8 ? 6 : 4)
    router_topk_softmax_kernel(float* __restrict__ zp, int T, int E, int K, bool renormalised, bool vec,
                               int32_t* __restrict__ topk_experts, float* __restrict__ lse,
                               float* __restrict__ sum_chosen, uint8_t* __restrict__ code,
                               int32_t* __restrict__ pair_experts, float* __restrict__ pair_gates) {
  chain_after_prior_grid();
  constexpr int kGroup = 32 / kWidth, kSlots = kWidth * kChunks, kV = kWidth < 4 ? kWidth : 4;
  constexpr int kGroups = kRouterThreads / kGroup, kPad = 32 * kChunks;
  constexpr uint32_t kIdx = kPad - 1;  // the packed key's index bits
  static_assert(kSlots <= 32, "`mine` has one bit per slot");
  extern __shared__ float router_smem[];
  const int lane = threadIdx.x % 32, q = lane % kGroup, group = threadIdx.x / kGroup;
  const int t = blockIdx.x * kGroups + group;
  if (t - group % kWidth >= T) return;  // the whole warp is past T
  // A group past T (in the last warp) reads and writes nothing (Et = 0) but keeps the warp whole,
  // so the shuffles outside the fallback run on the full mask (partial masks cost a convergence
  // check per shuffle).
  const bool live = t < T;
  const int Et = live ? E : 0;
  const unsigned gmask = kGroup == 32 ? kFullMask : ((1u << kGroup) - 1u) << (lane - q);
  float* zt = zp + int64_t(live ? t : 0) * E;
  float* prow = router_smem + group * kPad;
  int* picks = reinterpret_cast<int*>(router_smem + kGroups * kPad) + group * K;
  auto expert = [&](int s) { return kWidth * q + s % kWidth + 32 * (s / kWidth); };

  uint32_t key[kSlots];  // packed keys, 0 for padding; exact keys in the fallback
  uint32_t kmax = 0;
  {
    alignas(16) float z[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; s += kV) load_run<kV>(zt, expert(s), Et, vec, z + s);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const uint32_t k = expert(s) < Et ? topk_key(z[s]) : 0u;
      kmax = max(kmax, k);
      key[s] = expert(s) < Et ? (k & ~kIdx) | (kIdx - uint32_t(expert(s))) : 0u;
    }
  }

  uint32_t mine = 0;  // bit s: slot s is in S_t
  auto pick = [&](int r, int e) {
    if (q == 0) picks[r] = e;
    if ((e % 32) / kWidth == q) mine |= 1u << (kWidth * (e / 32) + e % kWidth);
  };
  bool near_tie = false;
  uint32_t below = 0;  // the previous pick's packed key; round 0 takes the max (every key >= 0)
  for (int r = 0; r < (K < E ? K + 1 : K); ++r) {  // the same trip count in every group
    uint32_t best0 = 0, best1 = 0;  // two chains for the scheduler
#pragma unroll
    for (int s = 0; s < kSlots; s += 2) {
      best0 = __viaddmax_u32(key[s], 0u - below, best0);
      if (s + 1 < kSlots) best1 = __viaddmax_u32(key[s + 1], 0u - below, best1);
    }
    const uint32_t top = group_max<kGroup>(max(best0, best1), kFullMask) + below;
    near_tie |= r > 0 && (top & ~kIdx) == (below & ~kIdx);
    if (r < K && !near_tie) pick(r, int(kIdx - (top & kIdx)));
    below = top;
  }
  if (near_tie) {  // exact rounds: each lane's best untaken (key, lowest slot), the group's max key, lowest expert
    mine = 0;
    {
      alignas(16) float z[kSlots];
#pragma unroll
      for (int s = 0; s < kSlots; s += kV) load_run<kV>(zt, expert(s), Et, vec, z + s);
#pragma unroll
      for (int s = 0; s < kSlots; ++s) key[s] = expert(s) < Et ? topk_key(z[s]) : 0u;
    }
    for (int r = 0; r < K; ++r) {
      uint32_t best = 0;
      int best_s = 0;
#pragma unroll
      for (int s = 0; s < kSlots; ++s)
        if (!((mine >> s) & 1u) && key[s] > best) best = key[s], best_s = s;
      const uint32_t top = group_max<kGroup>(best, gmask);
      const unsigned winner = group_min<kGroup>(best == top && best != 0 ? unsigned(expert(best_s)) : ~0u, gmask);
      pick(r, winner < unsigned(Et) ? int(winner) : 0);  // else only with NaN logits (check_finite) or past T
    }
  }

  // Softmax: v = max z is the shift; leaf sums in j order, then the former butterfly's levels.
  const float m = topk_key_value(group_max<kGroup>(kmax, kFullMask));
  alignas(16) float x[kSlots];
  float leaf[kWidth];
#pragma unroll
  for (int s = 0; s < kSlots; s += kV) load_run<kV>(zt, expert(s), Et, vec, x + s);
#pragma unroll
  for (int c = 0; c < kWidth; ++c) leaf[c] = 0.f;
#pragma unroll
  for (int s = 0; s < kSlots; ++s)
    if (expert(s) < Et) {
      x[s] = expf(x[s] - m);
      leaf[s % kWidth] += x[s];
    }
#pragma unroll
  for (int o = kGroup / 2; o > 0; o /= 2)
#pragma unroll
    for (int c = 0; c < kWidth; ++c) leaf[c] += __shfl_xor_sync(kFullMask, leaf[c], o);
#pragma unroll
  for (int w = kWidth / 2; w > 0; w /= 2)
#pragma unroll
    for (int c = 0; c < w; ++c) leaf[c] += leaf[c + w];
  const float sum = leaf[0];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) x[s] = x[s] / sum;  // padding: 0 / sum, never stored
#pragma unroll
  for (int s = 0; s < kSlots; s += kV) {
    store_run<kV>(zt, expert(s), Et, vec, x + s);
    store_run<kV>(prow, expert(s), kPad, true, x + s);
  }
  if (code) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (expert(s) < Et) code[int64_t(t) * E + expert(s)] = (mine >> s) & 1u ? kChosen : kNotRouted;
  }
  __syncwarp();

  float chosen_sum = 0.f;  // p of the k-th choice, summed in k order as on the CPU
  for (int r = 0; r < K; ++r) chosen_sum += prow[picks[r]];
  for (int r = q; r < K && live; r += kGroup) {
    const int e = picks[r];
    topk_experts[int64_t(t) * K + r] = e;
    if (pair_experts) {  // S_t in ascending expert order: the rank of e among the picks
      int rank = 0;
      for (int i = 0; i < K; ++i) rank += picks[i] < e;
      pair_experts[int64_t(t) * K + rank] = e;
      pair_gates[int64_t(t) * K + rank] = renormalised ? prow[e] / chosen_sum : prow[e];
    }
  }
  if (live && q == 0) {
    sum_chosen[t] = chosen_sum;
    lse[t] = m + logf(sum);
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
  chain_after_prior_grid();
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
  chain_after_prior_grid();
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

// Metadata pass 1, one warp per tile of kTileTokens tokens: tile_counts[tile][e] = routed pairs of e in
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
// expert_counts[e] = the column total. kScanItems consecutive tiles per thread: 1024 tiles (32768
// tokens of the code path, 262144 pairs of the pair path) per block-scan step.
constexpr int kScanItems = 4;
__global__ void __launch_bounds__(kScanThreads)
    scan_tiles_kernel(const int32_t* __restrict__ tile_counts, int tiles, int E,
                      int32_t* __restrict__ tile_base, int32_t* __restrict__ expert_counts) {
  chain_after_prior_grid();
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int e = blockIdx.x;
  int running = 0;
  for (int base = 0; base < tiles; base += kScanThreads * kScanItems) {
    const int first = base + threadIdx.x * kScanItems;
    int v[kScanItems];
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) v[j] = first + j < tiles ? tile_counts[int64_t(first + j) * E + e] : 0;
    int total;
    Scan(tmp).ExclusiveSum(v, v, total);
#pragma unroll
    for (int j = 0; j < kScanItems; ++j)
      if (first + j < tiles) tile_base[int64_t(first + j) * E + e] = running + v[j];
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

// Metadata pass 4, one warp per tile of kTileTokens tokens, lane = expert within a chunk of 32 experts.
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
  int my_token_written = 0;  // rows already listed for token t0 + lane (lanes < kTileTokens)
  const int my_token_offset = lane < kTileTokens && t0 + lane < T ? out.token_offsets[t0 + lane] : 0;
  for (int e0 = 0; e0 < E; e0 += 32) {
    const int e = e0 + lane;
    // All the tile's codes of this lane's expert first: independent loads in flight together.
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

// ---- Metadata from (token, slot) pairs: the top-K routing (S_t in ascending expert order, from
// the router kernel) and routing given by the caller (forward_routed). Pair i = t * K + k; rows
// are sorted by expert, stable by i; a token's rows are listed in pair order. Ids outside [0, E)
// get no row. Three passes over tiles of kTilePairs pairs: per-tile counts, the per-expert scan
// over tiles (scan_tiles_kernel), and one scatter that also derives expert_offsets (a block scan
// of the E totals, redone per block: E <= 1024 ints from L2) and token_offsets (each tile's base
// = the sum over experts of its tile_base row), so no single-block scan over T remains.

__device__ __forceinline__ bool given_valid(int32_t e, int E) { return e >= 0 && e < E; }

constexpr int kTilePairs = 256;              // pairs per tile = threads per block, one pair each
constexpr int kTileWarps = kTilePairs / 32;

// Pass 1: tile_counts[tile][e] = valid pairs of e in the tile (shared-memory histogram).
__global__ void __launch_bounds__(kTilePairs)
    count_pairs_kernel(const int32_t* __restrict__ pair_experts, int64_t pairs, int E,
                       int32_t* __restrict__ tile_counts) {
  chain_after_prior_grid();
  extern __shared__ int hist_pairs[];
  for (int e = threadIdx.x; e < E; e += kTilePairs) hist_pairs[e] = 0;
  __syncthreads();
  const int64_t i = int64_t(blockIdx.x) * kTilePairs + threadIdx.x;
  const int32_t e = i < pairs ? pair_experts[i] : -1;
  if (given_valid(e, E)) atomicAdd(&hist_pairs[e], 1);
  __syncthreads();
  for (int x = threadIdx.x; x < E; x += kTilePairs) tile_counts[int64_t(blockIdx.x) * E + x] = hist_pairs[x];
}

__device__ __forceinline__ float pair_weight(const void* weights, bool bf16, int64_t i) {
  return bf16 ? __uint_as_float(uint32_t(static_cast<const uint16_t*>(weights)[i]) << 16)
              : static_cast<const float*>(weights)[i];
}

// Pass 3, one block per tile, one pair per thread. A pair's row = expert_offsets[e] +
// tile_base[tile][e] + (pairs of e in earlier warps of the tile) + (lanes below with e, by
// __match_any_sync); its place in token_rows = the valid pairs before it (tile base + earlier
// warps + ballot prefix), which is token_offsets[t] + (valid slots of t before k).
// Dynamic shared memory: kTileWarps * E ints (per-warp expert counts).
__global__ void __launch_bounds__(kTilePairs)
    scatter_pairs_kernel(const int32_t* __restrict__ pair_experts, const void* __restrict__ weights,
                         bool weights_bf16, int T, int E, int K, const int32_t* __restrict__ tile_base,
                         const int32_t* __restrict__ expert_counts, const int32_t* __restrict__ x_rows,
                         MetadataOut out) {
  chain_after_prior_grid();
  using Scan = cub::BlockScan<int, kTilePairs>;
  using Reduce = cub::BlockReduce<int, kTilePairs>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } tmp;
  __shared__ int cursor[kMaxExperts];
  __shared__ int warp_valid[kTileWarps];
  __shared__ int s_tile_pair_base;
  extern __shared__ int warp_hist[];  // [kTileWarps][E]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t pairs = int64_t(T) * K;
  const int64_t i = int64_t(blockIdx.x) * kTilePairs + threadIdx.x;
  const int32_t e = i < pairs ? pair_experts[i] : -1;
  const bool valid = given_valid(e, E);
  const float w = valid ? pair_weight(weights, weights_bf16, i) : 0.f;
  const int32_t* base_row = tile_base + int64_t(blockIdx.x) * E;

  // cursor[x] = expert_offsets[x] + tile_base[tile][x]; the tile's pair base = sum_x tile_base.
  int running = 0, tile_pair_base = 0;
  for (int x0 = 0; x0 < E; x0 += kTilePairs) {
    const int x = x0 + threadIdx.x;
    const int count = x < E ? expert_counts[x] : 0;
    const int base = x < E ? base_row[x] : 0;
    int offset, total;
    Scan(tmp.scan).ExclusiveSum(count, offset, total);
    __syncthreads();
    tile_pair_base += Reduce(tmp.reduce).Sum(base);  // valid in thread 0 only
    __syncthreads();
    if (x < E) {
      cursor[x] = running + offset + base;
      if (blockIdx.x == 0) out.expert_offsets[x] = running + offset;
    }
    running += total;
  }
  if (threadIdx.x == 0) {
    s_tile_pair_base = tile_pair_base;
    if (blockIdx.x == 0) out.expert_offsets[E] = out.token_offsets[T] = running;
  }
  for (int x = threadIdx.x; x < kTileWarps * E; x += kTilePairs) warp_hist[x] = 0;
  __syncthreads();

  // Invalid lanes match each other only (key -1) and are masked out below.
  const unsigned same = __match_any_sync(kFullMask, valid ? e : -1);
  const unsigned valid_lanes = __ballot_sync(kFullMask, valid);
  const unsigned below = (1u << lane) - 1u;
  if (valid && lane == 31 - __clz(same)) warp_hist[warp * E + e] = __popc(same);  // the group's last lane
  if (lane == 0) warp_valid[warp] = __popc(valid_lanes);
  __syncthreads();

  int valid_before = s_tile_pair_base + __popc(valid_lanes & below);
  int row = valid ? cursor[e] + __popc(same & below) : 0;
  for (int v = 0; v < warp; ++v) {
    valid_before += warp_valid[v];
    if (valid) row += warp_hist[v * E + e];
  }
  if (i < pairs) {
    const int t = int(i / K);
    if (i - int64_t(t) * K == 0) out.token_offsets[t] = valid_before;
    if (valid) {
      out.row_token[row] = x_rows ? x_rows[t] : t;
      out.row_gate[row] = w;
      out.token_rows[valid_before] = row;
    }
  }
}

// backward_routed: d_weights[t, k] = dS of the slot's row, 0 for a slot with no expert.
__global__ void scatter_given_ds_kernel(const int32_t* __restrict__ topk, int T, int E, int K,
                                        const int32_t* __restrict__ token_offsets,
                                        const int32_t* __restrict__ token_rows, const float* __restrict__ dS,
                                        void* __restrict__ d_weights, bool bf16) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  int at = token_offsets[t];
  for (int k = 0; k < K; ++k) {
    const int64_t i = int64_t(t) * K + k;
    const float v = given_valid(topk[i], E) ? dS[token_rows[at++]] : 0.f;
    if (bf16)
      static_cast<__nv_bfloat16*>(d_weights)[i] = __float2bfloat16_rn(v);
    else
      static_cast<float*>(d_weights)[i] = v;
  }
}

// forward_routed: rows past the routed ones (sentinel slots leave R < R_max) are zeroed, so the
// saved state is a function of the inputs. Grid-stride over the tail only: no work without sentinels.
__global__ void zero_unrouted_rows_kernel(const int32_t* __restrict__ routed, int64_t rows_capacity, int64_t width,
                                          uint16_t* __restrict__ h, float* __restrict__ row_gate,
                                          int32_t* __restrict__ row_token, int32_t* __restrict__ token_rows) {
  const int64_t used = *routed;
  const int64_t step = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t i = used * width + first; i < rows_capacity * width; i += step) h[i] = 0;
  for (int64_t r = used + first; r < rows_capacity; r += step) {
    row_gate[r] = 0.f;
    row_token[r] = 0;
    token_rows[r] = 0;
  }
}

}  // namespace leanmoe::cuda::kernels
