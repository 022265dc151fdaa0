// One heuristic per expert GEMM kind (gemm_heuristics.h). Each rule keeps the number that decided
// it; the tables, shapes and runs behind them are in docs/kernels.md. TFLOP/s and ms below are
// leanmoe_bench_gemms on one H200 (132 SMs).
#include "gemm_heuristics.h"

#include <algorithm>

namespace leanmoe::cuda {
namespace {

// The gather kernel, cooperative, 4 stages, per-warp staged epilogue. Ping-pong (two 128-row tiles
// in flight, one's epilogue under the other's MMAs) lost on every kind: up 60.4 vs 49.1 ms, dH 37.2
// vs 30.8 ms summed over 5 shapes; the 128x128 tiles' extra L2 traffic per FLOP costs more than the
// overlap gains. The staged epilogue beat register stores (dH 120B-n2048 446 vs 380 TFLOP/s).
// dW1 and dW2 (no activation, plain bf16 rows) leave their staging tiles to TMA stores the warps do
// not wait for: at the H100's power cap 120B-n2048 dW2 3.90 -> 3.84 ms, dW1 7.56 -> 7.49, 7B-n256
// dW1 0.638 -> 0.604; even at 30B-n1024.
GemmConfig gather(GemmKind kind, int tile_m, int tile_n, int cluster) {
  GemmConfig c;
  c.family = GemmFamily::Gather;
  c.schedule = GemmSchedule::Cooperative;
  c.tile_m = tile_m;
  c.tile_n = tile_n;
  c.stages = 4;
  c.epilogue = is_varlen_k(kind) ? GemmEpilogue::Tma : GemmEpilogue::Warp;
  c.cluster = cluster;
  return c;
}

// CUTLASS's grouped GEMM (down, dx): stages carved out by CUTLASS, TMA epilogue, clusters of two:
// 1x2 (pairs of n-tiles sharing the A tile) or 2x1 (pairs of m-tiles sharing the weight tile).
GemmConfig cutlass(GemmSchedule schedule, int tile_m, int tile_n, bool pairs_of_n_tiles) {
  GemmConfig c;
  c.family = GemmFamily::Cutlass;
  c.schedule = schedule;
  c.tile_m = tile_m;
  c.tile_n = tile_n;
  c.stages = 0;
  c.epilogue = GemmEpilogue::Tma;
  c.cluster = pairs_of_n_tiles ? 1 : 2;
  c.cluster_n = pairs_of_n_tiles ? 2 : 1;
  return c;
}

// 1x2 clusters (pairs of n-tiles) when the column tiles (ceil(d / tile_n)) pair up, else 2x1.
GemmConfig cutlass_paired(GemmKind kind, const ExpertShape& s, GemmSchedule schedule, int tile_m, int tile_n) {
  GemmConfig c = cutlass(schedule, tile_m, tile_n, true);
  if (gemm_column_tiles(kind, s, c) % 2 != 0) c = cutlass(schedule, tile_m, tile_n, false);
  return c;
}

// Parts with less DRAM bandwidth per SM than this (H100 SXM: 3352 GB/s over 132 SMs, 25; the H200
// 37) run bf16 down in 2x1 clusters along N and dx in 2x1 clusters with tiles from a counter where
// the 1x2 rule above re-reads the weight tiles from DRAM and waits on it: H100, 120B-n2048 dx reads
// 28.4 GB in 1x2 along M, 12.9 in 2x1 along N (10.27 -> 7.54 ms); the counter keeps the CTAs in
// one window of the order (3.8 GB in 2x1 on the H200), and the H100's backward at 120B-n2048 went
// 24.43 -> 23.62 ms against 2x1 along N (30B-n1024 12.56 -> 12.39; down with the counter even).
// On the H200 the 1x2 rule stays (2x1 along N there: 120B-n2048 dx 7.19 -> 7.32 ms, 30B-n1024
// 3.54 -> 3.72; 1x2 with the counter: backward 24.46 -> 24.37, within the rounds' spread).
constexpr int kDramBoundBelowGbPerSm = 30;

// dx (K = 2n, N = d): wherever d >= 2048 (11 or more n-tiles; gpt-oss-20b 8.85 -> 7.37 ms); at
// d <= 1536 1x2 stays ahead by 2-8%. down (K = n): only where n >= 2048 as well (120B-n2048 3.79 ->
// 3.51 ms); at n <= 1024 1x2 leads by up to 20%. The grid: docs/kernels.md.
bool weight_tiles_from_dram(GemmKind kind, const ExpertShape& s, const GpuTraits& gpu) {
  if (gpu.dram_gb_s_per_sm() >= kDramBoundBelowGbPerSm || s.d < 2048) return false;
  return kind == GemmKind::Dx || s.n >= 2048;
}

// bf16: ping-pong 128x192 in 1x2 clusters unless d makes an odd number of 192-wide n-tiles, or the
// part's DRAM cannot feed 1x2's weight re-reads (above).
// CUTLASS pads the n-tiles to whole clusters, so there 1x2 runs an empty half-cluster per column
// (d = 2048: 11 n-tiles run as 12) and 2x1 wins: olmoe (d = 2048) down 598 vs 577 TFLOP/s, dx 627 vs 564.
GemmConfig cutlass_pingpong(GemmKind kind, const ExpertShape& s, const GpuTraits& gpu) {
  GemmConfig c = cutlass_paired(kind, s, GemmSchedule::Pingpong, 128, 192);
  if (weight_tiles_from_dram(kind, s, gpu)) {
    c = cutlass(GemmSchedule::Pingpong, 128, 192, false);
    c.raster_n = kind == GemmKind::Down;
    c.dynamic = kind == GemmKind::Dx;
  }
  // Down at n <= 256 (K = 4 k-steps, too short to hide twelve 64x32 subtile stores): 64x64 subtiles,
  // 7B-n256 426 -> 470, 30B-n256 414 -> 490 TFLOP/s; at n = 512 -10% to +6%, so only there. Compiled
  // for 1x2 clusters alone.
  if (kind == GemmKind::Down && s.n <= 256 && c.cluster_n == 2) c.epilogue_n = 64;
  return c;
}

// FP8 blockwise (tiles at most 128 wide): cooperative 128x128 in 1x2 clusters (pairs of n-tiles
// sharing the A tile) was the fastest compiled config for down and dx on all 7 shapes measured
// (docs/kernels.md, the heuristics table): 120B-n2048 down 2.057 ms vs 2.349 in 2x1 and 3.203 for
// ping-pong 64x128, dx 4.717 vs 4.770 / 5.551; 30B-n1024 down 1.205 vs 1.294 / 1.505. 2x1
// only where d / 128 is odd (1x2 would pad a half-empty cluster per column, as for bf16 above).
GemmConfig cutlass_fp8(GemmKind kind, const ExpertShape& s) {
  return cutlass_paired(kind, s, GemmSchedule::Cooperative, 128, 128);
}

// Varlen-M tile order of up and dH: bands of 8 column tiles (about 16 m-tiles x 8 column tiles run
// together on 132 SMs: each gathered A tile is read once per band); 4 and 16 measured within 1.6%.
int band_of(GemmKind kind, const ExpertShape& s, const GemmConfig& c) {
  return int(std::min<int64_t>(gemm_column_tiles(kind, s, c), 8));
}

}  // namespace

GemmConfig choose_gemm_config(GemmKind kind, const ExpertShape& s, const GpuTraits& gpu) {
  GemmConfig c;
  switch (kind) {
    // FP8 (s.fp8) up and dH: the same tile, schedule and band on the FP8 kernel (128x256 with 128-deep
    // k-tiles, compiled_gemm_configs(kind, true): its one configuration per kind), both in 2x1 clusters.
    case GemmKind::Up:
      // bf16, no cluster: multicasting W1 gains at most 2% (gpt-oss-20b 7.83 -> 7.69 ms at the H100's cap)
      // and loses up to 6% (sparse-T16k-d4096-n1024-E256 4.30 -> 4.56: odd m-tile counts leave a CTA idle).
      // FP8, 2x1 clusters multicasting W1 (twice bf16's bytes per FLOP): 30B-n1024 2.844 -> 2.429 ms,
      // qwen3-30b-a3b 2.480 -> 2.114, olmoe-1b-7b 3.001 -> 2.700, 120B-n2048 5.326 -> 5.245;
      // 7B-n1024 0.419 -> 0.430 (+2.6%, noise level).
      c = gather(kind, 128, 256, s.fp8 ? 2 : 1);
      c.band = band_of(kind, s, c);
      break;
    case GemmKind::Dh:
      // 2x1 clusters multicasting W2: +22% at gpt-oss-20b when chosen; even (within 1%) with today's
      // producer, which leaves it as the kernel with half the L2 traffic for B.
      c = gather(kind, 128, 256, 2);
      c.band = band_of(kind, s, c);
      break;
    case GemmKind::Dw2:
    case GemmKind::Dw1:
      // One kernel for both (expert_gemms.cu run_dw): the gathered operand along M, the plain one by
      // TMA along N, 2x1 clusters multicasting it (pairs of m-tiles): dW2 at 120B-n2048 4.00 -> 3.92 ms,
      // gpt-oss-20b 4.20 -> 3.86. One row unit at a time (no band): dW1 in bands of 8 or 16 row units
      // moved the layer's backward by at most 0.6% on four rows, within the rounds' spread.
      c = gather(kind, 128, 256, 2);
      break;
    case GemmKind::Down:
    case GemmKind::Dx:
      // Summed over the 20 grid shapes: down 35.02 -> 33.20 ms, dx 66.65 -> 62.43 ms against the former
      // cooperative 128x256 / ping-pong 128x128 (per-shape best of 9 resp. 6 candidates: 32.28, 62.00;
      // 1x2 everywhere: 33.49, 63.44). Worst row: down at 30B-n256, 362 vs 403 for cooperative 128x256.
      c = runs_fp8(kind, s) ? cutlass_fp8(kind, s) : cutlass_pingpong(kind, s, gpu);
      break;
  }
  // Persistent kernels: at most one CTA per SM (fewer when there are fewer tiles or clusters fit).
  c.max_ctas = gpu.sm_count;
  return c;
}

int backward_side_sms(const ExpertShape&, int) {
  // 4 of 132: summed over 7B-n256, 1.4B-n256, olmoe-1b-7b and 120B-n2048 the overlapped backward
  // gained 0.40 ms as graph replays with 4 SMs left, 0.30 ms with none; 8 and 16 cost up to 0.35 and
  // 1.35 ms at 120B-n2048 (docs/kernels.md "Backward streams").
  return 4;
}

}  // namespace leanmoe::cuda
