// Router and routing-metadata kernels (docs/SPEC.md §3 kernels 1-2, §5 token rounding), bit-for-bit the
// choices of the CPU backend: top-K on z with ties to the lower expert, rows sorted by expert and
// stable by token, each token's rows in ascending expert order. No float atomics anywhere; the
// integer counters use shared-memory atomics whose totals do not depend on order.
#pragma once
#include <cuda_bf16.h>

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

// ---- Routing given by the caller (forward_routed): the same four passes over (token, slot) pairs
// instead of the [T, E] code matrix. Pair i = t * K + k; rows are sorted by expert, stable by i
// (token, then slot); a token's rows are listed in slot order. Ids outside [0, E) get no row.

__device__ __forceinline__ bool given_valid(int32_t e, int E) { return e >= 0 && e < E; }

constexpr int kGivenCountThreads = 128;

// Pass 1, one block per tile of kTileTokens tokens: tile_counts[tile][e] = valid pairs of e in the
// tile (shared-memory histogram of E ints); token_counts[t] = valid slots of t.
__global__ void count_given_kernel(const int32_t* __restrict__ topk, int T, int E, int K,
                                   int32_t* __restrict__ tile_counts, int32_t* __restrict__ token_counts) {
  extern __shared__ int hist_given[];
  const int tile = blockIdx.x;
  const int t0 = tile * kTileTokens, t1 = min(T, t0 + kTileTokens);
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist_given[e] = 0;
  __syncthreads();
  for (int64_t i = int64_t(t0) * K + threadIdx.x; i < int64_t(t1) * K; i += blockDim.x) {
    const int32_t e = topk[i];
    if (given_valid(e, E)) atomicAdd(&hist_given[e], 1);
  }
  for (int t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
    int c = 0;
    for (int k = 0; k < K; ++k) c += given_valid(topk[int64_t(t) * K + k], E);
    token_counts[t] = c;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) tile_counts[int64_t(tile) * E + e] = hist_given[e];
}

constexpr int kGivenScatterWarps = 4;

__device__ __forceinline__ float given_weight(const void* weights, bool bf16, int64_t i) {
  return bf16 ? __uint_as_float(uint32_t(static_cast<const uint16_t*>(weights)[i]) << 16)
              : static_cast<const float*>(weights)[i];
}

// Pass 4, one warp per tile, 32 pairs at a time in pair order. Lanes holding the same expert rank
// themselves with __match_any_sync; each warp keeps the next free row of every expert in shared
// memory (kGivenScatterWarps * E ints), starting at expert_offsets[e] + tile_base[tile][e].
__global__ void scatter_given_kernel(const int32_t* __restrict__ topk, const void* __restrict__ weights,
                                     bool weights_bf16, int T, int E, int K, int tiles,
                                     const int32_t* __restrict__ tile_base, const int32_t* __restrict__ x_rows,
                                     MetadataOut out) {
  extern __shared__ int cursor_given[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int tile = blockIdx.x * kGivenScatterWarps + warp;
  if (tile >= tiles) return;
  int* cursor = cursor_given + warp * E;
  for (int e = lane; e < E; e += 32) cursor[e] = out.expert_offsets[e] + tile_base[int64_t(tile) * E + e];
  __syncwarp();
  const int t0 = tile * kTileTokens, t1 = min(T, t0 + kTileTokens);
  const int64_t first = int64_t(t0) * K, last = int64_t(t1) * K;
  for (int64_t base = first; base < last; base += 32) {
    const int64_t i = base + lane;
    const int32_t e = i < last ? topk[i] : -1;
    const bool valid = given_valid(e, E);
    // Invalid lanes match each other only (key -1) and are masked out below.
    const unsigned same = __match_any_sync(kFullMask, valid ? e : -1);
    const int rank = __popc(same & ((1u << lane) - 1u));
    const int start = valid ? cursor[e] : 0;
    __syncwarp();
    if (valid && lane == 31 - __clz(same)) cursor[e] = start + __popc(same);  // the group's last lane
    __syncwarp();
    if (!valid) continue;
    const int row = start + rank;
    const int t = int(i / K), k = int(i % K);
    int before = 0;  // valid slots of t before k: the row's place among the token's rows
    for (int j = 0; j < k; ++j) before += given_valid(topk[int64_t(t) * K + j], E);
    out.row_token[row] = x_rows ? x_rows[t] : t;
    out.row_gate[row] = given_weight(weights, weights_bf16, i);
    out.token_rows[out.token_offsets[t] + before] = row;
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
