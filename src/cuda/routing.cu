// Host launchers of the router and routing-metadata kernels (kernels/routing.cuh).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/chained_launch.h"
#include "cuda/check.h"
#include "cuda/kernels/routing.cuh"
#include "cuda/launchers.h"

namespace leanmoe::cuda {

namespace {
int tiles_of(int64_t T) { return int((T + kernels::kTileTokens - 1) / kernels::kTileTokens); }
int64_t pair_tiles_of(int64_t pairs) { return (pairs + kernels::kTilePairs - 1) / kernels::kTilePairs; }
int loss_chunks(int64_t T) { return int((T + kernels::kLossChunk - 1) / kernels::kLossChunk); }
constexpr int kTileWarpsPerBlock = 4;
}  // namespace

namespace {
template <int kWidth, int kChunks>
void launch_router_topk(float* zp, int64_t T, int64_t E, int64_t K, bool renormalised, int32_t* topk_experts,
                        float* lse, float* sum_chosen, uint8_t* code, int32_t* pair_experts, float* pair_gates,
                        cudaStream_t stream) {
  constexpr int kGroups = kernels::kRouterThreads * kWidth / 32, kV = kWidth < 4 ? kWidth : 4;
  const bool vec = E % kV == 0 && reinterpret_cast<uintptr_t>(zp) % (4 * kV) == 0;
  const int blocks = int((T + kGroups - 1) / kGroups);
  const size_t smem = size_t(kGroups) * (32 * kChunks + K) * sizeof(float);  // p rows, picks
  launch_chained(kernels::router_topk_softmax_kernel<kWidth, kChunks>, blocks, kernels::kRouterThreads, smem, stream,
                 zp, int(T), int(E), int(K), renormalised, vec, topk_experts, lse, sum_chosen, code, pair_experts,
                 pair_gates);
  LEANMOE_CUDA_CHECK_LAUNCH("router_topk_softmax_kernel");
}
}  // namespace

void router_topk_softmax(float* zp, int64_t T, int64_t E, int64_t K, bool renormalised, int32_t* topk_experts,
                         float* lse, float* sum_chosen, uint8_t* code, int32_t* pair_experts, float* pair_gates,
                         cudaStream_t stream) {
  if (T == 0) return;
  // 32 kChunks >= E experts per row, kWidth = min(8, 32 / kChunks) per run: at most 32 logits per
  // thread (kMaxExperts = 1024 -> one token per warp), else 8 tokens per warp.
  static_assert(kMaxExperts <= 32 * 32, "the router kernel keeps at most 32 logits per thread");
  auto launch = [&](auto width, auto chunks) {
    launch_router_topk<decltype(width)::value, decltype(chunks)::value>(
        zp, T, E, K, renormalised, topk_experts, lse, sum_chosen, code, pair_experts, pair_gates, stream);
  };
  using std::integral_constant;
  if (E <= 32) launch(integral_constant<int, 8>{}, integral_constant<int, 1>{});
  else if (E <= 64) launch(integral_constant<int, 8>{}, integral_constant<int, 2>{});
  else if (E <= 128) launch(integral_constant<int, 8>{}, integral_constant<int, 4>{});
  else if (E <= 256) launch(integral_constant<int, 4>{}, integral_constant<int, 8>{});
  else if (E <= 512) launch(integral_constant<int, 2>{}, integral_constant<int, 16>{});
  else launch(integral_constant<int, 1>{}, integral_constant<int, 32>{});
}

void count_topk(const int32_t* topk_experts, int64_t T, int64_t E, int64_t K, int32_t* counts,
                cudaStream_t stream) {
  LEANMOE_CUDA_CHECK(cudaMemsetAsync(counts, 0, size_t(E) * sizeof(int32_t), stream));
  const int64_t pairs = T * K;
  // ~16 pairs per thread: few blocks, so few global adds of the per-block histograms.
  const int blocks = int(std::clamp<int64_t>((pairs + 4095) / 4096, 1, 256));
  kernels::count_topk_kernel<<<blocks, 256, size_t(E) * sizeof(int), stream>>>(topk_experts, pairs, int(E), counts);
  LEANMOE_CUDA_CHECK_LAUNCH("count_topk_kernel");
}

int64_t loss_partial_doubles(int64_t T, int64_t E) { return int64_t(loss_chunks(T)) * (E + 1); }

void router_losses(const float* p, const float* lse, const int32_t* topk_counts, int64_t T, int64_t E, int64_t K,
                   double* partial, float* losses, cudaStream_t stream) {
  const int chunks = loss_chunks(T);
  double* partial_P = partial;
  double* partial_Z = partial + int64_t(chunks) * E;
  launch_chained(kernels::loss_partials_kernel, chunks, kernels::kLossChunk, 0, stream, p, lse, int(T), int(E),
                 partial_P, partial_Z);
  LEANMOE_CUDA_CHECK_LAUNCH("loss_partials_kernel");
  launch_chained(kernels::loss_final_kernel, 1, kernels::kLossChunk, 0, stream, partial_P, partial_Z, chunks,
                 topk_counts, int(T), int(E), int(K), losses);
  LEANMOE_CUDA_CHECK_LAUNCH("loss_final_kernel");
}

void round_tokens(const float* p, const float* sum_chosen, const int32_t* topk_counts, int64_t T, int64_t E,
                  int64_t tile, RoundingMode mode, uint32_t* keys, uint8_t* code, cudaStream_t stream) {
  const dim3 key_grid(unsigned((E + kernels::kKeyTile - 1) / kernels::kKeyTile),
                      unsigned((T + kernels::kKeyTile - 1) / kernels::kKeyTile));
  kernels::rounding_keys_kernel<<<key_grid, dim3(kernels::kKeyTile, 8), 0, stream>>>(p, sum_chosen, code, int(T),
                                                                                     int(E), keys);
  LEANMOE_CUDA_CHECK_LAUNCH("rounding_keys_kernel");
  kernels::round_tokens_kernel<<<int(E), kernels::kRoundThreads, 0, stream>>>(keys, topk_counts, int(T), int(E), tile,
                                                                              mode, code);
  LEANMOE_CUDA_CHECK_LAUNCH("round_tokens_kernel");
}

// Code-matrix metadata (token rounding): tile_counts and tile_base [tiles, E],
// token_counts [T], expert_counts [E].
int64_t metadata_scratch_ints(int64_t T, int64_t E) { return 2 * int64_t(tiles_of(T)) * E + T + E; }

namespace {
struct MetadataScratch {
  int tiles;
  int32_t *tile_counts, *tile_base, *token_counts, *expert_counts;
  MetadataScratch(int32_t* scratch, int64_t T, int64_t E) : tiles(tiles_of(T)) {
    tile_counts = scratch;
    tile_base = tile_counts + int64_t(tiles) * E;
    token_counts = tile_base + int64_t(tiles) * E;
    expert_counts = token_counts + T;
  }
};

}  // namespace

void build_metadata(const uint8_t* code, const float* p, const float* sum_chosen, bool renormalised, int64_t T,
                    int64_t E, int32_t* scratch, const MetadataOut& out, cudaStream_t stream) {
  const MetadataScratch m(scratch, T, E);
  const int tile_blocks = (m.tiles + kTileWarpsPerBlock - 1) / kTileWarpsPerBlock;
  kernels::count_routes_kernel<<<tile_blocks, 32 * kTileWarpsPerBlock, 0, stream>>>(code, int(T), int(E), m.tiles,
                                                                                   m.tile_counts, m.token_counts);
  LEANMOE_CUDA_CHECK_LAUNCH("count_routes_kernel");
  kernels::scan_tiles_kernel<<<int(E), kernels::kScanThreads, 0, stream>>>(m.tile_counts, m.tiles, int(E),
                                                                           m.tile_base, m.expert_counts);
  LEANMOE_CUDA_CHECK_LAUNCH("scan_tiles_kernel");
  kernels::scan_offsets_kernel<<<2, kernels::kOffsetThreads, 0, stream>>>(m.expert_counts, int(E), out.expert_offsets,
                                                                        m.token_counts, int(T), out.token_offsets);
  LEANMOE_CUDA_CHECK_LAUNCH("scan_offsets_kernel");
  kernels::scatter_routes_kernel<<<tile_blocks, 32 * kTileWarpsPerBlock, 0, stream>>>(
      code, p, sum_chosen, renormalised, int(T), int(E), m.tiles, m.tile_base, out);
  LEANMOE_CUDA_CHECK_LAUNCH("scatter_routes_kernel");
}

// Pair metadata: tile_counts and tile_base [pair tiles, E], then expert_counts [E] (last).
int64_t pair_metadata_scratch_ints(int64_t pairs, int64_t E) { return 2 * pair_tiles_of(pairs) * E + E; }

void build_pair_metadata(const int32_t* pair_experts, const void* weights, bool weights_bf16, int64_t T, int64_t E,
                         int64_t K, int32_t* scratch, const MetadataOut& out, cudaStream_t stream,
                         const int32_t* x_rows) {
  const int64_t pairs = T * K;
  const int tiles = int(pair_tiles_of(pairs));
  int32_t* tile_counts = scratch;
  int32_t* tile_base = tile_counts + int64_t(tiles) * E;
  int32_t* expert_counts = tile_base + int64_t(tiles) * E;
  launch_chained(kernels::count_pairs_kernel, tiles, kernels::kTilePairs, size_t(E) * sizeof(int), stream,
                 pair_experts, pairs, int(E), tile_counts);
  LEANMOE_CUDA_CHECK_LAUNCH("count_pairs_kernel");
  launch_chained(kernels::scan_tiles_kernel, int(E), kernels::kScanThreads, 0, stream, tile_counts, tiles, int(E),
                 tile_base, expert_counts);
  LEANMOE_CUDA_CHECK_LAUNCH("scan_tiles_kernel");
  const size_t smem = size_t(kernels::kTileWarps) * E * sizeof(int);
  launch_chained(kernels::scatter_pairs_kernel, tiles, kernels::kTilePairs, smem, stream, pair_experts, weights,
                 weights_bf16, int(T), int(E), int(K), tile_base, expert_counts, x_rows, out);
  LEANMOE_CUDA_CHECK_LAUNCH("scatter_pairs_kernel");
}

int64_t routing_scratch_ints(const MoEConfig& cfg, int64_t T) {
  return cfg.routing == Routing::token_rounding ? metadata_scratch_ints(T, cfg.E)
                                                : pair_metadata_scratch_ints(T * cfg.K, cfg.E);
}

// Top-K: the router kernel lists S_t in ascending expert order with its gates, and the pair
// passes build the metadata from those T*K pairs (no [T, E] code matrix is written or read).
// Token rounding rewrites the code matrix, so it builds the metadata from that.
void route(const MoEConfig& cfg, int64_t T, const RoutingScratch& r, bool count, int32_t* topk_experts,
           const MetadataOut& out, cudaStream_t stream) {
  const int64_t E = cfg.E, K = cfg.K;
  const bool renormalised = gates_renormalised(cfg);
  if (cfg.routing != Routing::token_rounding) {
    router_topk_softmax(r.zp, T, E, K, renormalised, topk_experts, r.lse, r.sum_chosen, nullptr, r.pair_experts,
                        r.pair_gates, stream);
    build_pair_metadata(r.pair_experts, r.pair_gates, false, T, E, K, r.meta_scratch, out, stream);
    // Rows per expert are the top-K counts here: the E totals the scan left at the scratch's end.
    if (count)
      LEANMOE_CUDA_CHECK(cudaMemcpyAsync(r.topk_counts, r.meta_scratch + pair_metadata_scratch_ints(T * K, E) - E,
                                         size_t(E) * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  router_topk_softmax(r.zp, T, E, K, renormalised, topk_experts, r.lse, r.sum_chosen, r.code, nullptr, nullptr,
                      stream);
  count_topk(topk_experts, T, E, K, r.topk_counts, stream);
  round_tokens(r.zp, r.sum_chosen, r.topk_counts, T, E, cfg.tile, cfg.rounding_mode, r.keys, r.code, stream);
  build_metadata(r.code, r.zp, r.sum_chosen, renormalised, T, E, r.meta_scratch, out, stream);
}

void scatter_given_ds(const int32_t* topk_experts, int64_t T, int64_t E, int64_t K, const int32_t* token_offsets,
                      const int32_t* token_rows, const float* dS, void* d_weights, bool bf16, cudaStream_t stream) {
  kernels::scatter_given_ds_kernel<<<int((T + 255) / 256), 256, 0, stream>>>(
      topk_experts, int(T), int(E), int(K), token_offsets, token_rows, dS, d_weights, bf16);
  LEANMOE_CUDA_CHECK_LAUNCH("scatter_given_ds_kernel");
}

void zero_unrouted_rows(const int32_t* expert_offsets, int64_t E, int64_t rows_capacity, int64_t width, void* h,
                        const MetadataOut& out, cudaStream_t stream) {
  kernels::zero_unrouted_rows_kernel<<<132, 256, 0, stream>>>(expert_offsets + E, rows_capacity, width,
                                                              static_cast<uint16_t*>(h), out.row_gate, out.row_token,
                                                              out.token_rows);
  LEANMOE_CUDA_CHECK_LAUNCH("zero_unrouted_rows_kernel");
}

}  // namespace leanmoe::cuda
